"""Schema migrations of chartcite's own databases (registry, Bulk rounds, audit) with Alembic, run
at the start of the server, the worker and every command.

Each store keeps its revisions in a folder of its own and its version in a table of its own
(registry and rounds share one database). The first revision of each is the schema of the release
before migrations existed, written so that it also brings a database made by that release or an
older one to it (tables created where missing, columns added in place, as the old start-up
helper did); every later change is a revision, so an index, a NOT NULL, a rename or a type change
(SQLite through Alembic's batch mode) reaches existing installations, PostgreSQL included.

Several processes start together on one database (gunicorn workers, Celery workers, beat): each
upgrade runs in one transaction that takes the write lock first on SQLite, so they take turns
and the later ones find the schema at head.
"""
from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import create_engine, event, inspect, text


def migrate(url: str, location: Path, version_table: str) -> str:
    """Upgrade the database at `url` to the newest revision in `location`; the revision it is at."""
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(location))
    script = ScriptDirectory.from_config(config)
    engine = migration_engine(url)
    try:
        with engine.begin() as connection:
            with EnvironmentContext(config, script, destination_rev="head",
                                    fn=lambda revision, _: script._upgrade_revs("head", revision)) as env:
                env.configure(connection=connection, version_table=version_table, render_as_batch=True,
                              transactional_ddl=True)
                with env.begin_transaction():
                    env.run_migrations()
        return script.get_current_head() or ""
    finally:
        engine.dispose()


def current_revision(url: str, version_table: str) -> str:
    engine = create_engine(url, future=True)
    try:
        with engine.connect() as connection:
            if version_table not in inspect(connection).get_table_names():
                return ""
            return connection.execute(text(f"SELECT version_num FROM {version_table}")).scalar() or ""
    finally:
        engine.dispose()


def migration_engine(url: str):
    """An engine whose transactions hold the database's write lock from their first statement on
    SQLite (BEGIN IMMEDIATE, waiting up to a minute for another migrating process), so DDL and the
    version stamp commit together or not at all."""
    if not url.startswith("sqlite"):
        return create_engine(url, future=True)
    engine = create_engine(url, future=True, connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _manual_transactions(dbapi_connection, _record):
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _write_lock(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class _Recorder:
    """Stands in for Alembic's `op` while a baseline's schema function runs, turning its
    create_table and create_index calls into a MetaData."""

    def __init__(self):
        self.metadata = sa.MetaData()

    def create_table(self, name, *items, **kw):
        sa.Table(name, self.metadata, *items, **kw)

    def create_index(self, name, table, columns, unique=False, **kw):
        sa.Index(name, *(self.metadata.tables[table].c[c] for c in columns), unique=unique)

    @staticmethod
    def f(name):
        return name


def upgrade_to_baseline(connection, schema, defaults: dict) -> None:
    """The baseline revision's upgrade: the tables its `schema(op)` describes, created where
    missing, and their columns added where an older release's table lacks them."""
    recorder = _Recorder()
    schema(recorder)
    recorder.metadata.create_all(connection)
    add_missing_columns(connection, recorder.metadata, defaults)


def add_missing_columns(connection, metadata, defaults: dict) -> list[str]:
    """Columns a release added to an existing table, added in place (nullable, existing rows given
    `defaults["table.column"]`). Only the baseline uses this: later changes are revisions."""
    inspector, added = inspect(connection), []
    for table in metadata.sorted_tables:
        if not inspector.has_table(table.name):
            continue
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            kind = column.type.compile(dialect=connection.dialect)
            default = defaults.get(f"{table.name}.{column.name}")
            clause = f" DEFAULT {default!r}" if isinstance(default, str) else (
                f" DEFAULT {int(default)}" if isinstance(default, (bool, int, float)) else "")
            connection.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}{clause}"))
            added.append(f"{table.name}.{column.name}")
    return added


def forward_only() -> None:
    """Every revision's downgrade: chartcite's databases only go forward (back up before upgrading)."""
    raise NotImplementedError("chartcite's databases are upgraded only; restore a backup to go back")

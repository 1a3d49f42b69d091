"""Schema migrations (Alembic) for the registry, Bulk rounds and audit databases: a database made by
the previous release is upgraded without losing a row, a later revision reaches existing
installations, and processes starting together migrate once."""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fhir_ingest.connection.registry import MIGRATIONS, Registry, shared_engine
from fhir_ingest.connection.rounds import Rounds
from fhir_ingest.connection.schema import current_revision, migrate
from smart_app.audit import AuditTrail

REPO = Path(__file__).resolve().parent.parent
PREVIOUS = REPO / "tests" / "data" / "release-167caf1"


def rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_the_previous_releases_databases_are_upgraded_without_losing_a_row(tmp_path):
    for name in ("registry.sqlite", "audit.sqlite"):
        shutil.copy(PREVIOUS / name, tmp_path / name)
    before = {t: rows(tmp_path / "registry.sqlite", t) for t in ("ehr", "signing_key", "bulk_cursor", "bulk_round")}
    registry_url, audit_url = f"sqlite:///{tmp_path / 'registry.sqlite'}", f"sqlite:///{tmp_path / 'audit.sqlite'}"
    assert current_revision(registry_url, "alembic_version_registry") == ""

    registry = Registry(registry_url, (PREVIOUS / "token").read_text(encoding="utf-8").strip())
    rounds = Rounds(shared_engine(registry_url))
    audit = AuditTrail(audit_url)

    assert {t: rows(tmp_path / "registry.sqlite", t) for t in before} == before
    ehr = registry.ehr("epic-prod")
    assert ehr.iss == "https://ehr.example.org/fhir" and ehr.client_id == "abc" and ehr.group_id == "g1"
    assert registry.frame_origins("epic-prod") == ["https://ehr.example.org"]
    assert registry.current_key() is not None          # the signing key still decrypts
    assert rounds.cursor("epic-prod", "g1").since == "2026-11-01T00:00:00Z"
    kinds = [e["kind"] for e in audit.entries()]
    assert kinds == ["draft-saved", "ask"] and audit.entries(kind="ask")[0]["evidence"] == ["Observation/1"]
    assert ehr.similar_patients is False           # off for a registration made before the option
    saved = audit.entries(kind="draft-saved")[0]            # named by a ref now, still found by it
    assert saved["id"] and audit.get(saved["id"])["draft"] == {"kind": "pre-visit"}
    for store in ("registry", "rounds"):
        assert current_revision(registry_url, f"alembic_version_{store}") == head(MIGRATIONS / store)
    assert current_revision(audit_url, "alembic_version_audit") == head(REPO / "smart_app" / "migrations" / "audit")


def head(location: Path) -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(location))
    return ScriptDirectory.from_config(config).get_current_head()


def test_a_fresh_database_is_made_at_head_and_a_second_start_changes_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.sqlite'}"
    AuditTrail(url).record("ask", "t", "c", "p", "q")
    AuditTrail(url)
    assert current_revision(url, "alembic_version_audit") == head(REPO / "smart_app" / "migrations" / "audit")
    assert rows(tmp_path / "audit.sqlite", "audit") == 1


LATER = '''
"""A later release: an index and a NOT NULL with a rename, as a real revision would be.

Revision ID: 9999
"""
import sqlalchemy as sa
from alembic import op

revision = "9999"
down_revision = "HEAD"


def upgrade():
    op.create_index("ix_audit_kind", "audit", ["kind"])
    with op.batch_alter_table("audit") as batch:
        batch.alter_column("question", new_column_name="asked", existing_type=sa.Text(), nullable=False)
'''


def test_a_later_revision_reaches_an_existing_installation(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.sqlite'}"
    shutil.copy(PREVIOUS / "audit.sqlite", tmp_path / "audit.sqlite")
    later = tmp_path / "migrations"
    shutil.copytree(REPO / "smart_app" / "migrations" / "audit", later)
    (later / "versions" / "9999_later.py").write_text(textwrap.dedent(LATER).replace("HEAD", head(later)), encoding="utf-8")
    assert migrate(url, later, "alembic_version_audit") == "9999"
    with sqlite3.connect(tmp_path / "audit.sqlite") as db:
        columns = {r[1]: r[3] for r in db.execute("PRAGMA table_info(audit)")}
        indexes = {r[1] for r in db.execute("PRAGMA index_list(audit)")}
        assert columns["asked"] == 1 and "question" not in columns and "ix_audit_kind" in indexes
        assert db.execute("SELECT asked FROM audit ORDER BY id").fetchall() == [("synthetic question",), ("",)]


RACE = """
import sys, time
from fhir_ingest.connection.registry import Registry
start = float(sys.argv[2])
while time.time() < start:
    pass
Registry(sys.argv[1], sys.argv[3])
print("ok")
"""


def test_processes_starting_together_migrate_once(tmp_path):
    from cryptography.fernet import Fernet

    url, key, start = f"sqlite:///{tmp_path / 'registry.sqlite'}", Fernet.generate_key().decode(), time.time() + 3
    procs = [subprocess.Popen([sys.executable, "-c", RACE, url, str(start), key], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, encoding="utf-8")
             for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [out.strip() for out, _ in results] == ["ok"] * 4, [err[-500:] for _, err in results]
    assert rows(tmp_path / "registry.sqlite", "alembic_version_registry") == 1


@pytest.mark.parametrize("store", ["registry", "rounds", "audit"])
def test_the_models_and_the_revisions_describe_one_schema(tmp_path, store):
    """A column added to a model without a revision would exist in new databases only: every
    change of a model needs its revision (alembic's autogenerate writes the first draft)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    import fhir_ingest.connection.rounds as rounds_module
    import smart_app.audit as audit_module
    from fhir_ingest.connection import registry as registry_module

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    location, metadata = {"registry": (MIGRATIONS / "registry", registry_module.Base.metadata),
                          "rounds": (MIGRATIONS / "rounds", rounds_module.Base.metadata),
                          "audit": (audit_module.MIGRATIONS, audit_module.Base.metadata)}[store]
    migrate(url, location, f"alembic_version_{store}")
    engine = create_engine(url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": f"alembic_version_{store}"})
        differences = [d for d in compare_metadata(context, metadata)
                       if not (d[0] == "remove_table" and d[1].name.startswith("alembic_version"))]
    engine.dispose()
    assert differences == [], f"the {store} models differ from its revisions: {differences}"

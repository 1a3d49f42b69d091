"""Job progress (fetched / indexed of total) that tasks write and the frame and `chartcite status` read,
and the deployment's running totals (syncs by outcome, EHR requests by status) that /metrics reads:
every process (web workers, Celery workers, `chartcite sync`) adds to the same totals.

Embedded default: a small SQLite file in the data directory, shared by the web app and a worker
on the same machine. Production: Redis, shared by every app and worker host.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ACTIVE = ("queued", "running")
STALE_AFTER = 600.0      # a queued/running job not updated for this long may be queued again


@dataclass
class Job:
    tenant: str
    patient_id: str
    state: str          # queued | running | waiting (the source was unreachable; retry at retry_at) | done | failed
    phase: str          # reading | fetching | words | embedding | retrying | done
    done: int
    total: int
    message: str
    updated_at: float
    retry_at: float = 0.0     # waiting: when the next attempt starts (a relaunch or Retry starts one at once)
    attempts: int = 0         # waiting: attempts so far that could not reach the source

    def to_dict(self) -> dict:
        d = asdict(self)
        d["percent"] = 100 if self.state == "done" else (int(100 * self.done / self.total) if self.total else 0)
        return d


class SqliteJobStore:
    SCHEMA = """CREATE TABLE IF NOT EXISTS jobs (
        tenant TEXT NOT NULL, patient_id TEXT NOT NULL, state TEXT NOT NULL, phase TEXT NOT NULL,
        done INTEGER NOT NULL, total INTEGER NOT NULL, message TEXT NOT NULL, updated_at REAL NOT NULL,
        PRIMARY KEY (tenant, patient_id))"""

    TALLY_SCHEMA = """CREATE TABLE IF NOT EXISTS tallies (
        name TEXT NOT NULL, label TEXT NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (name, label))"""

    ADDED_COLUMNS = {"retry_at": "REAL NOT NULL DEFAULT 0", "attempts": "INTEGER NOT NULL DEFAULT 0"}

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(self.SCHEMA)
            db.execute(self.TALLY_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for name, kind in self.ADDED_COLUMNS.items():
                if name not in present:       # a data dir from before: its jobs table grows in place
                    try:
                        db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
                    except sqlite3.OperationalError as exc:
                        if "duplicate column" not in str(exc):
                            raise

    def add(self, name: str, label: str, by: int = 1) -> None:
        with self._connect() as db:
            db.execute("INSERT INTO tallies VALUES (?,?,?) ON CONFLICT (name, label) DO UPDATE SET value = value + ?",
                       (name, label, by, by))

    def tallies(self) -> dict[tuple[str, str], int]:
        with self._connect() as db:
            return {(n, l): v for n, l, v in db.execute("SELECT name, label, value FROM tallies")}

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    COLUMNS = "tenant, patient_id, state, phase, done, total, message, updated_at, retry_at, attempts"

    def set(self, tenant, patient_id, state, phase="", done=0, total=0, message="", retry_at=0.0,
            attempts: int | None = None) -> None:
        """The job's state; `attempts` is kept as it was unless given (progress does not reset it)."""
        with self._connect() as db:
            db.execute(f"INSERT INTO jobs ({self.COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (tenant, patient_id) "
                       "DO UPDATE SET state=excluded.state, phase=excluded.phase, done=excluded.done, "
                       "total=excluded.total, message=excluded.message, updated_at=excluded.updated_at, "
                       "retry_at=excluded.retry_at, attempts=COALESCE(?, jobs.attempts)",
                       (tenant, patient_id, state, phase, done, total, message, time.time(), retry_at, attempts or 0,
                        attempts))

    def resume(self, tenant: str, patient_id: str) -> bool:
        """A scheduled retry takes the job only if it is still waiting for it: a relaunch or a
        Retry that started a sync meanwhile has superseded it."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            taken = db.execute("UPDATE jobs SET state='queued', phase='queued', updated_at=? WHERE tenant=? AND "
                               "patient_id=? AND state='waiting'", (time.time(), tenant, patient_id)).rowcount
            db.execute("COMMIT")
            return bool(taken)

    def claim(self, tenant: str, patient_id: str) -> bool:
        """Mark a job queued unless one is already queued or running (and not stale)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT state, updated_at FROM jobs WHERE tenant=? AND patient_id=?",
                             (tenant, patient_id)).fetchone()
            if row and row[0] in ACTIVE and time.time() - row[1] < STALE_AFTER:
                db.execute("COMMIT")
                return False
            db.execute(f"INSERT OR REPLACE INTO jobs ({self.COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (tenant, patient_id, "queued", "queued", 0, 0, "", time.time(), 0.0, 0))
            db.execute("COMMIT")
            return True

    def get(self, tenant: str, patient_id: str) -> Job | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {self.COLUMNS} FROM jobs WHERE tenant=? AND patient_id=?",
                             (tenant, patient_id)).fetchone()
        return Job(*row) if row else None

    def jobs(self) -> list[Job]:
        with self._connect() as db:
            return [Job(*row) for row in db.execute(f"SELECT {self.COLUMNS} FROM jobs ORDER BY tenant, updated_at")]


class RedisJobStore:
    def __init__(self, url: str):
        import redis

        self.redis = redis.Redis.from_url(url)
        self.prefix = "chartcite:job:"

    def _key(self, tenant: str, patient_id: str) -> str:
        return f"{self.prefix}{tenant}:{patient_id}"

    def set(self, tenant, patient_id, state, phase="", done=0, total=0, message="", retry_at=0.0,
            attempts: int | None = None) -> None:
        if attempts is None:
            held = self.get(tenant, patient_id)
            attempts = held.attempts if held else 0
        job = Job(tenant, patient_id, state, phase, done, total, message, time.time(), retry_at, attempts)
        self.redis.set(self._key(tenant, patient_id), json.dumps(asdict(job)))

    def resume(self, tenant: str, patient_id: str) -> bool:
        """As SqliteJobStore.resume, under WATCH."""
        import redis

        key = self._key(tenant, patient_id)
        with self.redis.pipeline() as pipe:
            try:
                pipe.watch(key)
                raw = pipe.get(key)
                job = Job(**json.loads(raw)) if raw else None
                if job is None or job.state != "waiting":
                    pipe.unwatch()
                    return False
                job.state, job.phase, job.updated_at = "queued", "queued", time.time()
                pipe.multi()
                pipe.set(key, json.dumps(asdict(job)))
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    def claim(self, tenant: str, patient_id: str) -> bool:
        """Compare-and-set under WATCH, so two launches of one patient queue a single sync."""
        import redis

        key = self._key(tenant, patient_id)
        queued = json.dumps(asdict(Job(tenant, patient_id, "queued", "queued", 0, 0, "", time.time())))
        with self.redis.pipeline() as pipe:
            try:
                pipe.watch(key)
                raw = pipe.get(key)
                if raw:
                    job = Job(**json.loads(raw))
                    if job.state in ACTIVE and time.time() - job.updated_at < STALE_AFTER:
                        pipe.unwatch()
                        return False
                pipe.multi()
                pipe.set(key, queued)
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    TALLIES = "chartcite:tallies"

    def add(self, name: str, label: str, by: int = 1) -> None:
        self.redis.hincrby(self.TALLIES, f"{name}\t{label}", by)

    def tallies(self) -> dict[tuple[str, str], int]:
        return {tuple(k.decode().split("\t", 1)): int(v) for k, v in self.redis.hgetall(self.TALLIES).items()}

    def get(self, tenant: str, patient_id: str) -> Job | None:
        raw = self.redis.get(self._key(tenant, patient_id))
        return Job(**json.loads(raw)) if raw else None

    def jobs(self) -> list[Job]:
        out = []
        for key in self.redis.scan_iter(f"{self.prefix}*"):
            raw = self.redis.get(key)
            if raw:
                out.append(Job(**json.loads(raw)))
        return sorted(out, key=lambda j: (j.tenant, j.updated_at))


def job_store(settings):
    return RedisJobStore(settings.redis_url) if settings.redis_url else SqliteJobStore(settings.state_path)


JobStore = SqliteJobStore   # the embedded default, by its old name

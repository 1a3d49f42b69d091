"""Job progress (fetched / indexed of total) that tasks write and the frame reads.

Kept in a small SQLite file in the data directory so a task in another process (a Celery
worker on the SQLite broker) and the web app see the same rows.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    tenant TEXT NOT NULL, patient_id TEXT NOT NULL, state TEXT NOT NULL, phase TEXT NOT NULL,
    done INTEGER NOT NULL, total INTEGER NOT NULL, message TEXT NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (tenant, patient_id)
);
"""
ACTIVE = ("queued", "running")


@dataclass
class Job:
    tenant: str
    patient_id: str
    state: str          # queued | running | done | failed
    phase: str          # reading | embedding | done
    done: int
    total: int
    message: str
    updated_at: float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["percent"] = 100 if self.state == "done" else (int(100 * self.done / self.total) if self.total else 0)
        return d


class JobStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def set(self, tenant: str, patient_id: str, state: str, phase: str = "", done: int = 0, total: int = 0,
            message: str = "") -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?)",
                       (tenant, patient_id, state, phase, done, total, message, time.time()))

    def claim(self, tenant: str, patient_id: str, stale_after: float = 600.0) -> bool:
        """Mark a job queued unless one is already queued or running (and not stale)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT state, updated_at FROM jobs WHERE tenant=? AND patient_id=?",
                             (tenant, patient_id)).fetchone()
            if row and row[0] in ACTIVE and time.time() - row[1] < stale_after:
                db.execute("COMMIT")
                return False
            db.execute("INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?)",
                       (tenant, patient_id, "queued", "queued", 0, 0, "", time.time()))
            db.execute("COMMIT")
            return True

    def get(self, tenant: str, patient_id: str) -> Job | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE tenant=? AND patient_id=?", (tenant, patient_id)).fetchone()
        return Job(*row) if row else None

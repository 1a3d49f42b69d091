"""Removals held back by the removal budget, kept in the data directory until the patient's record
is next replaced (or the removal is allowed), so that `chartcite check` can list them after the
run that reported them has scrolled away. Patient ids and file names only; no patient data."""
from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path


class HeldBackRemovals:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("CREATE TABLE IF NOT EXISTS held_back (tenant TEXT NOT NULL, patient_id TEXT NOT NULL, "
                   "input TEXT NOT NULL, words TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (tenant, patient_id))")
        return db

    def hold(self, tenant: str, patient_id: str, input_name: str, words: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute("INSERT OR REPLACE INTO held_back VALUES (?, ?, ?, ?, ?)",
                       (tenant, patient_id, input_name, words, time.time()))

    def clear(self, tenant: str, patient_id: str) -> None:
        """The patient's record was replaced since: what was held back is moot."""
        if not self.path.exists():
            return
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM held_back WHERE tenant = ? AND patient_id = ?", (tenant, patient_id))

    def listed(self, tenant: str) -> list[str]:
        """`<input>: <words>` for each patient of the tenant with a removal held back, oldest first."""
        if not self.path.exists():
            return []
        with closing(self._connect()) as db:
            rows = db.execute("SELECT input, words FROM held_back WHERE tenant = ? ORDER BY at", (tenant,))
            return [f"{input_name}: {words}" for input_name, words in rows]

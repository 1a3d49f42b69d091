"""A bulk export parked on disk and handed out one patient at a time.

A Group export of a hospital is gigabytes of NDJSON sorted by resource type, not by patient. Held
in memory it would cost the whole export; parked in a temporary SQLite file it costs one patient's
record while that patient is indexed.
"""
from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Iterator

from .chunk import shared_refs
from .load import PatientRecord
from .normalize import patient_of


class PatientStaging:
    def __init__(self, directory: str | Path | None = None):
        self._dir = tempfile.TemporaryDirectory(prefix="chartcite-bulk-", dir=directory)
        self.db = sqlite3.connect(Path(self._dir.name) / "staging.sqlite")
        self.db.executescript("""
            PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
            CREATE TABLE owned (patient_id TEXT NOT NULL, body TEXT NOT NULL);
            CREATE TABLE shared (ref TEXT PRIMARY KEY, body TEXT NOT NULL);
        """)
        self.resources = 0

    def __enter__(self) -> "PatientStaging":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, resource: dict) -> None:
        """Park one checked resource: under its patient, or as shared when it names none (a Medication)."""
        body = json.dumps(resource, separators=(",", ":"))
        pid = patient_of(resource)
        if pid:
            self.db.execute("INSERT INTO owned VALUES (?, ?)", (pid, body))
        else:
            self.db.execute("INSERT OR REPLACE INTO shared VALUES (?, ?)",
                            (f"{resource['resourceType']}/{resource['id']}", body))
        self.resources += 1

    def patient_ids(self) -> list[str]:
        self.db.execute("CREATE INDEX IF NOT EXISTS owned_patient ON owned (patient_id)")
        return [row[0] for row in self.db.execute("SELECT DISTINCT patient_id FROM owned ORDER BY patient_id")]

    def record(self, patient_id: str) -> PatientRecord:
        resources = [json.loads(body) for (body,) in
                     self.db.execute("SELECT body FROM owned WHERE patient_id = ? ORDER BY rowid", (patient_id,))]
        for ref in sorted(shared_refs(resources)):
            row = self.db.execute("SELECT body FROM shared WHERE ref = ?", (ref,)).fetchone()
            if row:
                resources.append(json.loads(row[0]))
        return PatientRecord(patient_id, resources)

    def records(self) -> Iterator[PatientRecord]:
        for pid in self.patient_ids():
            yield self.record(pid)

    def close(self) -> None:
        self.db.close()
        self._dir.cleanup()

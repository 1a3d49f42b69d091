"""Resources parked on disk and handed out one patient at a time (their type, id and patient are
checked before they are parked; their content when the patient's record is assembled).

A Group export of a hospital, or a folder of NDJSON, is gigabytes sorted by resource type, not by
patient. Held in memory it would cost the whole input; parked in a temporary SQLite file (inside
the data directory, which is private to chartcite) it costs one patient's record while that
patient is indexed. Resources are parked as `marshal` bytes: this process's own data for this
run only, written and read back several times faster than JSON.
"""
from __future__ import annotations

import marshal
import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .reader import NO_DOCUMENT, Document


@dataclass
class StagedResource:
    resource: dict
    origin: str
    document: str          # the key of the document it was read in ("" = a source with its own authority rule)


class PatientStaging:
    def __init__(self, directory: str | Path | None = None):
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        self._dir = tempfile.TemporaryDirectory(prefix="chartcite-staging-", dir=directory)
        os.chmod(self._dir.name, 0o700)
        # Records may be handed out on another thread than the one that parked them (indexing
        # reads the next patients while the model embeds), one thread at a time.
        self.db = sqlite3.connect(Path(self._dir.name) / "staging.sqlite", check_same_thread=False)
        self.db.executescript("""
            PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
            CREATE TABLE owned (patient_id TEXT NOT NULL, ref TEXT NOT NULL, origin TEXT NOT NULL,
                                document TEXT NOT NULL, body BLOB NOT NULL);
            CREATE TABLE shared (ref TEXT PRIMARY KEY, body BLOB NOT NULL);
            CREATE TABLE defines (document TEXT NOT NULL, patient_id TEXT NOT NULL);
            CREATE TABLE documents (key TEXT PRIMARY KEY, name TEXT NOT NULL, bundle INTEGER NOT NULL,
                                    everything_of TEXT NOT NULL);
        """)
        self.resources = 0

    def __enter__(self) -> "PatientStaging":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, resource: dict, patient_id: str, origin: str = "", document: Document = NO_DOCUMENT) -> None:
        """Park one checked resource: under its patient, or as shared when it names none (a Medication)."""
        body = marshal.dumps(resource)
        ref = f"{resource['resourceType']}/{resource['id']}"
        if patient_id:
            self.db.execute("INSERT INTO owned VALUES (?, ?, ?, ?, ?)", (patient_id, ref, origin, document.key, body))
            if document.key:
                self.db.execute("INSERT OR IGNORE INTO documents VALUES (?, ?, ?, ?)",
                                (document.key, document.name, int(document.bundle), document.everything_of))
            if resource["resourceType"] == "Patient" and document.key:
                self.db.execute("INSERT INTO defines VALUES (?, ?)", (document.key, patient_id))
        else:
            self.db.execute("INSERT OR REPLACE INTO shared VALUES (?, ?)", (ref, body))
        self.resources += 1

    def patient_ids(self) -> list[str]:
        # Indexed once everything is parked: indexes kept up while parking slow every insert.
        self.db.execute("CREATE INDEX IF NOT EXISTS owned_patient ON owned (patient_id)")
        self.db.execute("CREATE INDEX IF NOT EXISTS owned_document ON owned (document)")
        self.db.execute("CREATE INDEX IF NOT EXISTS defines_document ON defines (document)")
        return [row[0] for row in self.db.execute("SELECT DISTINCT patient_id FROM owned ORDER BY patient_id")]

    def owned(self, patient_id: str) -> list[StagedResource]:
        """The patient's resources in the order they were read."""
        rows = self.db.execute("SELECT body, origin, document FROM owned WHERE patient_id = ? ORDER BY rowid",
                               (patient_id,))
        return [StagedResource(marshal.loads(body), origin, document) for body, origin, document in rows]

    def shared(self, ref: str) -> dict | None:
        row = self.db.execute("SELECT body FROM shared WHERE ref = ?", (ref,)).fetchone()
        return marshal.loads(row[0]) if row else None

    def patients_defined(self, document: str) -> set[str]:
        """The patients whose Patient resource this document holds."""
        return {row[0] for row in self.db.execute("SELECT patient_id FROM defines WHERE document = ?", (document,))}

    def foreign_documents(self, patient_id: str) -> set[str]:
        """The documents holding resources of this patient that are not the patient's own: they
        hold another patient's resources (or Patient) and not this patient's Patient."""
        rows = self.db.execute("""
            SELECT DISTINCT o.document FROM owned o WHERE o.patient_id = ? AND o.document != ''
              AND NOT EXISTS (SELECT 1 FROM defines d WHERE d.document = o.document AND d.patient_id = ?)
              AND EXISTS (SELECT 1 FROM owned x WHERE x.document = o.document AND x.patient_id != ?)""",
                               (patient_id, patient_id, patient_id))
        return {row[0] for row in rows}

    def document(self, key: str) -> Document:
        row = self.db.execute("SELECT key, name, bundle, everything_of FROM documents WHERE key = ?", (key,)).fetchone()
        return Document(row[0], row[1], bool(row[2]), row[3]) if row else NO_DOCUMENT

    def close(self) -> None:
        self.db.close()
        self._dir.cleanup()

"""Resources parked on disk and handed out one patient at a time (their type, id and patient are
checked before they are parked; their content when the patient's record is assembled).

A Group export of a hospital, or a folder of NDJSON, is gigabytes sorted by resource type, not by
patient. Held in memory it would cost the whole input; parked in a temporary SQLite file (inside
the data directory, which is private to chartcite) it costs one patient's record while that
patient is indexed. Resources are parked as `marshal` bytes: this process's own data for this
run only, written and read back several times faster than JSON.
"""
from __future__ import annotations

import fcntl
import marshal
import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .reader import NO_DOCUMENT, Document


@dataclass
class StagedResource:
    resource: dict
    origin: str
    document: str          # the key of the document it was read in ("" = a source with its own authority rule)
    body: bytes | None = None      # when compacted: the whole resource; `resource` then holds only its identity

    def compacted(self) -> "StagedResource":
        """Held as bytes (a large record's, fhir_ingest/record/compact.py): `resource` keeps its
        type, id and what tells two versions of it apart (`meta.versionId`, `meta.lastUpdated`)."""
        meta = self.resource.get("meta") if isinstance(self.resource.get("meta"), dict) else {}
        identity = {"resourceType": self.resource["resourceType"], "id": self.resource["id"],
                    "meta": {k: meta[k] for k in ("versionId", "lastUpdated") if k in meta}}
        return StagedResource(identity, self.origin, self.document, marshal.dumps(self.resource))

    def whole(self) -> dict:
        return marshal.loads(self.body) if self.body is not None else self.resource


PREFIX = "chartcite-staging-"
# A staging folder without a lock file is one being made this instant, or one left by a chartcite
# from before the lock: the latter is removed once this old.
UNLOCKED_GRACE = 3600.0


def sweep_abandoned(directory: str | Path) -> int:
    """Remove the staging folders of processes that died without cleaning up (SIGKILL, a lost
    host): they hold patient data. A live process holds the lock of its folder's `in-use` file."""
    removed = 0
    for folder in Path(directory).glob(PREFIX + "*"):
        lock = folder / "in-use"
        if not lock.exists():
            if folder.is_dir() and time.time() - folder.stat().st_mtime > UNLOCKED_GRACE:
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
            continue
        try:
            with open(lock, "a", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, FileNotFoundError):
            continue                      # in use, or its owner removed it meanwhile
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


class PatientStaging:
    def __init__(self, directory: str | Path | None = None):
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            sweep_abandoned(directory)
        self._dir = tempfile.TemporaryDirectory(prefix=PREFIX, dir=directory)
        os.chmod(self._dir.name, 0o700)
        # Held until close: a sweep by another process knows this folder is in use.
        self._lock = open(Path(self._dir.name) / "in-use", "w", encoding="utf-8")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
                                    everything_of TEXT NOT NULL, partial TEXT NOT NULL, as_of TEXT NOT NULL);
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
                self.db.execute("INSERT OR IGNORE INTO documents VALUES (?, ?, ?, ?, ?, ?)",
                                (document.key, document.name, int(document.bundle), document.everything_of,
                                 document.partial, document.as_of))
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

    def owned(self, patient_id: str) -> Iterator[StagedResource]:
        """The patient's resources in the order they were read, parsed one at a time as they are
        taken (a large record is held compactly: fhir_ingest/record/compact.py)."""
        rows = self.db.execute("SELECT body, origin, document FROM owned WHERE patient_id = ? ORDER BY rowid",
                               (patient_id,))
        for body, origin, document in rows:
            yield StagedResource(marshal.loads(body), origin, document)

    def count(self, patient_id: str) -> int:
        """How many resources are parked for the patient (copies of one resource each counted)."""
        return self.db.execute("SELECT count(*) FROM owned WHERE patient_id = ?", (patient_id,)).fetchone()[0]

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
        row = self.db.execute("SELECT key, name, bundle, everything_of, partial, as_of FROM documents WHERE key = ?",
                              (key,)).fetchone()
        return Document(row[0], row[1], bool(row[2]), row[3], row[4], row[5]) if row else NO_DOCUMENT

    def close(self) -> None:
        self.db.close()
        self._lock.close()
        self._dir.cleanup()


class HeldInMemory:
    """A few patients' resources already read and checked elsewhere (a Bulk round's part, from its
    shared staging), offered to RecordAssembler as PatientStaging offers its own. They come from
    an export, not from documents: no document defines a patient or makes a record whole."""

    def __init__(self, owned: dict[str, list[tuple[dict, str]]], shared: dict[str, dict]):
        self._owned, self._shared = owned, shared

    def patient_ids(self) -> list[str]:
        return sorted(pid for pid, items in self._owned.items() if items)

    def owned(self, patient_id: str) -> list[StagedResource]:
        return [StagedResource(resource, origin, "") for resource, origin in self._owned.get(patient_id, [])]

    def count(self, patient_id: str) -> int:
        return len(self._owned.get(patient_id, []))

    def shared(self, ref: str) -> dict | None:
        return self._shared.get(ref)

    def patients_defined(self, document: str) -> set[str]:
        return set()

    def foreign_documents(self, patient_id: str) -> set[str]:
        return set()

    def document(self, key: str) -> Document:
        return NO_DOCUMENT

    def close(self) -> None:
        self._owned, self._shared = {}, {}

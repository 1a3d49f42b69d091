"""Where a Bulk round's downloaded resources wait until every file of the export is read, so that
any worker can then index any group of patients: a database every worker of the deployment
reaches (CHARTCITE_BULK_STAGING_URL; by default an SQLite file in the data directory, which the
compose file's workers share), one row per resource, under its round, file and line.

A resource is parked only once its type, id and patient passed the checks of the record room
(`fhir_ingest.record.load.checked`); its content is checked when its patient's record is
assembled, as for any input. Rows are zlib-compressed JSON: any worker, of any Python version,
reads them back. A round's rows are removed when the round ends, done or abandoned.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable

import orjson
from sqlalchemy import Column, Index, Integer, LargeBinary, MetaData, String, Table, delete, event, select, text

from .bulk import BulkExport, SinceCheck, ndjson_lines
from .registry import create_tables, shared_engine
from ..record.load import LoadReport, checked
from ..record.normalize import patient_of
from ..record.reader import MAX_LINE_BYTES, LineTooLong, RawResource, ReadProblem

# Lines parked per transaction: the file's progress (bytes and lines read) is recorded after each,
# so a broken transfer resumes at most this many lines back.
BATCH = 500

metadata = MetaData()
staged = Table(
    "bulk_staged", metadata,
    Column("round_id", String(40), nullable=False),
    Column("file_n", Integer, nullable=False),
    Column("line", Integer, nullable=False),
    Column("patient_id", String(200), nullable=False),      # "" = a resource of no patient (a Medication)
    Column("ref", String(300), nullable=False),
    Column("origin", String(300), nullable=False),
    Column("body", LargeBinary, nullable=False),
    Index("bulk_staged_patient", "round_id", "patient_id"),
    Index("bulk_staged_line", "round_id", "file_n", "line"),
)


def packed(resource: dict) -> bytes:
    try:
        raw = orjson.dumps(resource)
    except TypeError:             # an integer beyond 64 bits, a lone surrogate: `json` keeps them
        raw = json.dumps(resource).encode()
    return zlib.compress(raw, 1)


def unpacked(body: bytes) -> dict:
    return orjson.loads(zlib.decompress(body))


class StagedExport:
    def __init__(self, url: str):
        self.engine = shared_engine(url)
        if url.startswith("sqlite"):
            @event.listens_for(self.engine, "connect")
            def _shrinkable(connection, _record):
                # Takes effect on a new file: removed rounds give their pages back to the disk.
                connection.execute("PRAGMA auto_vacuum=INCREMENTAL")
        create_tables(self.engine, metadata)

    def add(self, rows: list[dict]) -> None:
        if rows:
            with self.engine.begin() as conn:
                conn.execute(staged.insert(), rows)

    def drop_after(self, round_id: str, file_n: int, line: int) -> None:
        """Rows of a file parked beyond what its progress records (a transfer that broke between
        parking a batch and recording it): they are read again."""
        with self.engine.begin() as conn:
            conn.execute(delete(staged).where(staged.c.round_id == round_id, staged.c.file_n == file_n,
                                              staged.c.line > line))

    def patients(self, round_id: str) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(staged.c.patient_id).distinct().where(
                staged.c.round_id == round_id, staged.c.patient_id != "").order_by(staged.c.patient_id))
            return [row[0] for row in rows]

    def owned(self, round_id: str, patient_ids: list[str]) -> dict[str, list[tuple[dict, str]]]:
        """Each patient's parked resources with where they were read, in the order they were read."""
        found: dict[str, list[tuple[dict, str]]] = {pid: [] for pid in patient_ids}
        with self.engine.connect() as conn:
            rows = conn.execute(select(staged.c.patient_id, staged.c.origin, staged.c.body).where(
                staged.c.round_id == round_id, staged.c.patient_id.in_(patient_ids))
                .order_by(staged.c.file_n, staged.c.line))
            for patient_id, origin, body in rows:
                found[patient_id].append((unpacked(body), origin))
        return found

    def shared(self, round_id: str, refs: Iterable[str]) -> dict[str, dict]:
        """The patient-less resources (Medications) by reference; the last read of each wins."""
        refs = sorted(set(refs))
        if not refs:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(select(staged.c.ref, staged.c.body).where(
                staged.c.round_id == round_id, staged.c.patient_id == "", staged.c.ref.in_(refs))
                .order_by(staged.c.file_n, staged.c.line))
            return {ref: unpacked(body) for ref, body in rows}

    def remove(self, round_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(staged).where(staged.c.round_id == round_id))
        if self.engine.url.get_backend_name() == "sqlite":
            with self.engine.connect() as conn:
                conn.execute(text("PRAGMA incremental_vacuum"))

    def round_ids(self) -> set[str]:
        with self.engine.connect() as conn:
            return {row[0] for row in conn.execute(select(staged.c.round_id).distinct())}


@dataclass
class FileProgress:
    """Where a file's download stands: lines and bytes read and parked, and the validator (ETag or
    Last-Modified) of the response they came from, without which the rest cannot be asked for."""
    lines: int = 0
    bytes: int = 0
    validator: str = ""


class FileRestarted(Exception):
    """A resumed file came whole (it changed, or the EHR does not resume): read from its start."""


def validator_of(response) -> str:
    """What `If-Range` may name: a strong ETag, else Last-Modified (a weak ETag may not be used)."""
    etag = response.headers.get("ETag", "")
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("Last-Modified", "")


def download_file(export: BulkExport, store: StagedExport, round_id: str, file_n: int, url: str, name: str,
                  requires_token: bool, start: FileProgress, report: LoadReport, since: SinceCheck,
                  recorded: Callable[[FileProgress], None]) -> FileProgress:
    """Read one output file into the staging from where `start` says it stood, parking checked
    resources a batch at a time and recording the progress after each (`recorded`). A broken
    transfer raises FhirUnavailable with everything before its last batch kept; a file that cannot
    be resumed unchanged raises FileRestarted with what was parked of it removed."""
    if start.bytes and not start.validator:
        store.drop_after(round_id, file_n, 0)
        raise FileRestarted(f"{name} broke off and its first response gave no ETag or Last-Modified to resume it "
                            f"by: read again from its start")
    store.drop_after(round_id, file_n, start.lines)
    response, resumed = export.open_file(url, requires_token, start.bytes, start.validator)
    if start.bytes and not resumed:
        response.close()
        store.drop_after(round_id, file_n, 0)
        raise FileRestarted(f"{name} changed since its transfer broke (the EHR sent it whole): read again from its "
                            f"start")
    progress, rows = FileProgress(start.lines, start.bytes, start.validator or validator_of(response)), []
    try:
        with response:
            for size, line in ndjson_lines(response):
                progress.lines, progress.bytes = progress.lines + 1, progress.bytes + size
                origin = f"{name}:{progress.lines}"
                if isinstance(line, LineTooLong):
                    rows += parked_item(round_id, file_n, progress.lines, ReadProblem(origin, too_long_words(line)),
                                        report, since)
                elif line.strip():
                    rows += parked_rows(round_id, file_n, progress.lines, origin, line, report, since)
                if len(rows) >= BATCH:
                    store.add(rows)
                    rows = []
                    recorded(progress)
    finally:
        # Every complete line read before a transfer broke is kept: the next attempt asks from there.
        store.add(rows)
        recorded(progress)
    return progress


def too_long_words(line: LineTooLong) -> str:
    return f"a line of {line.skipped:,} bytes, over the {MAX_LINE_BYTES // 2**20} MB a line may hold: not read"


def parked_rows(round_id: str, file_n: int, line_no: int, origin: str, line: bytes, report: LoadReport,
                since: SinceCheck) -> list[dict]:
    """The row of one NDJSON line, when it holds a resource that passes the identity checks."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        item = ReadProblem(origin, f"not JSON: {str(exc).split(':')[0]}")
    else:
        item = RawResource(value, origin) if isinstance(value, dict) and "resourceType" in value else \
            ReadProblem(origin, "line is not a FHIR resource")
    return parked_item(round_id, file_n, line_no, item, report, since)


def parked_item(round_id: str, file_n: int, line_no: int, item, report: LoadReport, since: SinceCheck) -> list[dict]:
    rows = []
    for raw in checked([item], report):
        since.see(raw.resource)
        rows.append({"round_id": round_id, "file_n": file_n, "line": line_no, "patient_id": patient_of(raw.resource),
                     "ref": f"{raw.resource['resourceType']}/{raw.resource['id']}", "origin": raw.origin,
                     "body": packed(raw.resource)})
    return rows

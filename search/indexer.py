"""Patient record → annotated, embedded chunks in a Backend.

Idempotent: chunk ids are stable, a chunk whose text (and model) is unchanged is neither
re-embedded nor rewritten, and chunks the record no longer produces are removed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import date
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

from fhir_ingest.chunk import ChunkProblem, PatientChunker
from fhir_ingest.load import ESSENTIAL_TYPES, PatientRecord
from fhir_ingest.normalize import INDEXED_TYPES, SUPPORT_TYPES, human_name

from search.nlp.annotate import canonical_names, default_annotator, record_terms_from_chunks
from search.backends.base import Backend
from search.models.embed import Embedder
from search.backends.embedded import text_hash

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]   # (phase, done, total)

# Vectors written this many at a time when the words went first: each batch makes more of the
# record searchable by meaning, and the frame's bar moves with it.
VECTOR_BATCH = 128


@dataclass
class IndexResult:
    patients: int = 0
    resources: int = 0
    chunks: int = 0
    embedded: int = 0
    unchanged: int = 0
    removed: int = 0
    problems: list[ChunkProblem] = field(default_factory=list)
    seconds: float = 0.0

    def merge(self, other: "IndexResult") -> None:
        for name in ("patients", "resources", "chunks", "embedded", "unchanged", "removed", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems.extend(other.problems)


def lexical_text(chunk) -> str:
    """What BM25 indexes: the chip label, the text, and the canonical names of asserted concepts,
    so "HTN", "water pill" or "Fosamax" in a question match the record's own words."""
    names = canonical_names(chunk.concepts)
    return f"{chunk.label}. {chunk.text}" + (" || " + " ; ".join(names) if names else "")


def patient_summary(record: PatientRecord, chunk_counts: dict[str, int], terms=(), vectors_pending: int = 0) -> dict:
    """What the index keeps about the patient: the banner, what the record holds, its terms, and
    how many of its chunks still wait for their vector (searchable by words only meanwhile)."""
    patient = record.patient
    birth = patient.get("birthDate", "")
    age = None
    if birth:
        try:
            b = date.fromisoformat(birth[:10])
            end = date.fromisoformat(patient["deceasedDateTime"][:10]) if patient.get("deceasedDateTime") else date.today()
            age = end.year - b.year - ((end.month, end.day) < (b.month, b.day))
        except ValueError:
            age = None
    counts = {}
    for r in record.resources:
        counts[r["resourceType"]] = counts.get(r["resourceType"], 0) + 1
    summary = {
        "patient_id": record.patient_id, "name": human_name(patient), "gender": patient.get("gender", ""),
        "birth_date": birth, "age": age, "deceased": bool(patient.get("deceasedDateTime") or patient.get("deceasedBoolean")),
        "resource_counts": counts, "chunk_counts": chunk_counts,
        "terms": [[t.phrase, t.key, t.display, t.semantic_type] for t in terms], "indexed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if vectors_pending:
        summary["vectors_pending"] = vectors_pending
    return summary


@dataclass
class PreparedRecord:
    """A record chunked and annotated: everything indexing needs before the model and the index."""
    record: PatientRecord
    chunks: list
    lexicals: list[str]
    terms: list
    problems: list[ChunkProblem]


def prepare_record(tenant: str, record: PatientRecord, budget) -> PreparedRecord:
    chunker = PatientChunker(tenant, record.patient_id, record.resources, budget)
    chunks = chunker.chunks()
    terms = record_terms_from_chunks(chunks)
    default_annotator().annotate_chunks(chunks, terms)
    return PreparedRecord(record, chunks, [lexical_text(c) for c in chunks], terms, chunker.problems)


def index_record(backend: Backend, embedder: Embedder, tenant: str, record: PatientRecord,
                 progress: Progress | None = None, words_first: bool = False,
                 prepared: PreparedRecord | None = None) -> IndexResult:
    """Index the record (`prepared`: already chunked and annotated). `words_first` (a patient's
    first sync, a clinician waiting): every chunk is written at once without its vector,
    searchable by its words and concepts within seconds; the vectors follow in batches, problems,
    medications and allergies first, and the patient summary says how many are still pending
    until the last one is written."""
    started = time.perf_counter()
    pid = record.patient_id
    prepared = prepared or prepare_record(tenant, record, embedder.budget())
    chunks, lexicals, terms = prepared.chunks, prepared.lexicals, prepared.terms
    existing = backend.indexed_texts(tenant, pid)
    changed = [(c, lx) for c, lx in zip(chunks, lexicals) if existing.get(c.chunk_id) != text_hash(c, lx)]
    counts: dict[str, int] = {}
    for c in chunks:
        counts[c.semantic_type] = counts.get(c.semantic_type, 0) + 1

    def remove_stale() -> int:
        return backend.delete_chunks(tenant, sorted(set(existing) - {c.chunk_id for c in chunks}))

    def store_record(pending: int) -> None:
        """The source resources (a chunk's first sentence reads them) and the patient summary."""
        backend.store_resources(tenant, pid, [r for r in record.resources if r["resourceType"] in INDEXED_TYPES | SUPPORT_TYPES])
        backend.upsert_patient(tenant, pid, patient_summary(record, counts, terms, pending))

    def report(done: int) -> None:
        if progress:
            progress("embedding", done, len(changed))

    report(0)
    if words_first and changed:
        # The record and a summary counting what is pending go first, so that a question asked
        # from the first chunk on knows the record is still being read.
        store_record(pending=len(changed))
        backend.index([c for c, _ in changed], [None] * len(changed), [lx for _, lx in changed])
        removed = remove_stale()
        # Essentials first; the rest shortest first, so each batch pads little (the model runs
        # a batch at the length of its longest text).
        ordered = sorted(changed, key=lambda pair: (pair[0].resource_type not in ESSENTIAL_TYPES, len(pair[0].text)))
        for start in range(0, len(ordered), VECTOR_BATCH):
            batch = ordered[start:start + VECTOR_BATCH]
            backend.add_vectors([c for c, _ in batch], embedder.encode([c.text for c, _ in batch]), [lx for _, lx in batch])
            done = start + len(batch)
            backend.upsert_patient(tenant, pid, patient_summary(record, counts, terms, len(ordered) - done))
            report(done)
    else:
        vectors = embedder.encode([c.text for c, _ in changed], progress=(lambda done, _: report(done)) if progress else None)
        backend.index([c for c, _ in changed], vectors, [lx for _, lx in changed])
        removed = remove_stale()
        store_record(pending=0)
    if progress:
        progress("done", len(changed), len(changed))
    return IndexResult(patients=1, resources=len(record.resources), chunks=len(chunks), embedded=len(changed),
                       unchanged=len(chunks) - len(changed), removed=removed, problems=prepared.problems,
                       seconds=time.perf_counter() - started)


def index_in_turn(backend: Backend, embedder: Embedder, tenant: str,
                  records: Iterable[PatientRecord]) -> Iterator[IndexResult]:
    """Index records one after another, each one's result as it is written. The next record is
    chunked and annotated on a thread while the current one is embedded and written: the model
    computes outside the interpreter lock, and measured on 2 cores this recovers about 40% of the
    preparation time. `records` is consumed on the caller's thread (it may read a database)."""
    budget = embedder.budget()
    with ThreadPoolExecutor(1, thread_name_prefix="chartcite-prepare") as pool:
        waiting = None      # the record before this one, being prepared
        for record in records:
            upcoming = pool.submit(prepare_record, tenant, record, budget)
            if waiting is not None:
                prepared = waiting.result()
                yield index_record(backend, embedder, tenant, prepared.record, prepared=prepared)
            waiting = upcoming
        if waiting is not None:
            prepared = waiting.result()
            yield index_record(backend, embedder, tenant, prepared.record, prepared=prepared)

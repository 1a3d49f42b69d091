"""Patient record → annotated, embedded chunks in a Backend.

Idempotent: chunk ids are stable, a chunk whose text (and model) is unchanged is neither
re-embedded nor rewritten, and chunks the record no longer produces are removed.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from itertools import islice
from typing import Callable, Iterable, Iterator

import numpy as np

from fhir_ingest.record.chunk import ChunkProblem, PatientChunker
from fhir_ingest.record.compact import type_counts
from fhir_ingest.record.kinds import ESSENTIAL_TYPES, INDEXED_TYPES, SUPPORT_TYPES
from fhir_ingest.record.load import PatientRecord
from fhir_ingest.record.normalize import human_name

from search.nlp.annotate import canonical_names, default_annotator, record_terms_from_chunks
from search.backends.base import Backend
from search.models.embed import Embedder
from search.similar.profile import build_profile, profile_keys, profile_text
from search.backends.embedded import text_hash

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]   # (phase, done, total)

# Vectors written this many at a time when the words went first: each batch makes more of the
# record searchable by meaning, and the frame's bar moves with it.
VECTOR_BATCH = 128
# Patients whose texts `index_in_turn` embeds in one call; the first call takes fewer, as the model waits for them.
PATIENTS_PER_ENCODE = 8
FIRST_GROUP = 2


@dataclass
class IndexResult:
    patients: int = 0
    resources: int = 0
    chunks: int = 0
    embedded: int = 0
    unchanged: int = 0
    removed: int = 0
    problems: list[ChunkProblem] = field(default_factory=list)

    def merge(self, other: "IndexResult") -> None:
        for name in ("patients", "resources", "chunks", "embedded", "unchanged", "removed"):
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
    counts = type_counts(record.resources)
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
    profile: dict = field(default_factory=dict)    # for similar patients and cohorts (search/similar/)


def prepare_record(tenant: str, record: PatientRecord, budget) -> PreparedRecord:
    chunker = PatientChunker(tenant, record.patient_id, record.resources, budget)
    chunks = chunker.chunks()
    terms = record_terms_from_chunks(chunks)
    default_annotator().annotate_chunks(chunks, terms)
    return PreparedRecord(record, chunks, [lexical_text(c) for c in chunks], terms, chunker.problems,
                          build_profile(record.patient_id, record.resources, chunks))


@dataclass
class RecordPlan:
    """What indexing a prepared record writes: the chunks whose text, annotations or vector the
    index lacks (`changed`), and the ones it holds that the record no longer produces."""
    prepared: PreparedRecord
    existing: dict[str, str]
    changed: list[tuple]          # (chunk, lexical text)
    counts: dict[str, int]

    @property
    def texts(self) -> list[str]:
        """What the model embeds: the changed chunks' texts, then the profile's (always: one text)."""
        return [c.text for c, _ in self.changed] + [profile_text(self.prepared.profile)]


def plan_record(backend: Backend, tenant: str, prepared: PreparedRecord) -> RecordPlan:
    existing = backend.indexed_texts(tenant, prepared.record.patient_id)
    changed = [(c, lx) for c, lx in zip(prepared.chunks, prepared.lexicals) if existing.get(c.chunk_id) != text_hash(c, lx)]
    counts: dict[str, int] = {}
    for c in prepared.chunks:
        counts[c.semantic_type] = counts.get(c.semantic_type, 0) + 1
    return RecordPlan(prepared, existing, changed, counts)


def remove_stale(backend: Backend, tenant: str, plan: RecordPlan) -> int:
    return backend.delete_chunks(tenant, sorted(set(plan.existing) - {c.chunk_id for c in plan.prepared.chunks}))


def store_record(backend: Backend, tenant: str, plan: RecordPlan, pending: int = 0) -> None:
    """The source resources (a chunk's first sentence reads them) and the patient summary."""
    record = plan.prepared.record
    backend.store_resources(tenant, record.patient_id,
                            [r for r in record.resources if r["resourceType"] in INDEXED_TYPES | SUPPORT_TYPES])
    backend.upsert_patient(tenant, record.patient_id, patient_summary(record, plan.counts, plan.prepared.terms, pending))


def write_record(backend: Backend, tenant: str, plan: RecordPlan, vectors) -> IndexResult:
    """The changed chunks with their vectors (`vectors` ends with the profile's), the stale ones
    out, the record, its summary and its profile: together, so that a stop between them leaves
    the patient as before, not half written."""
    if not plan.prepared.record.resources:
        return IndexResult()        # nothing of a patient the index does not hold passed the checks
    changed = len(plan.changed)
    with backend.written_together():
        backend.index([c for c, _ in plan.changed], vectors[:changed], [lx for _, lx in plan.changed])
        removed = remove_stale(backend, tenant, plan)
        store_record(backend, tenant, plan)
        store_profile(backend, tenant, plan, vectors[changed])
    return result_of(plan, removed)


def store_profile(backend: Backend, tenant: str, plan: RecordPlan, vector) -> None:
    """The patient's profile, rebuilt from the whole record each time the patient is indexed."""
    profile = plan.prepared.profile
    backend.put_profile(tenant, plan.prepared.record.patient_id, profile, profile_keys(profile), vector)


def rebuild_profiles(backend: Backend, embedder: Embedder, tenant: str, held: Iterable[tuple[str, list[dict], list]],
                     batch: int = VECTOR_BATCH) -> int:
    """Profiles rebuilt from what the index holds, each patient's (id, stored resources, chunks):
    after a removal the profile must not describe what is gone, and after a reindex it must be
    the new model's. A patient of whom nothing is held has no profile. Returns those written."""
    written = 0
    for group in iter(lambda: list(islice(held, batch)), []):
        kept = [(pid, build_profile(pid, resources, chunks)) for pid, resources, chunks in group if resources]
        for pid, _, _ in (entry for entry in group if not entry[1]):
            backend.delete_profile(tenant, pid)
        vectors = embedder.encode([profile_text(profile) for _, profile in kept]) if kept else []
        for (pid, profile), vector in zip(kept, vectors):
            backend.put_profile(tenant, pid, profile, profile_keys(profile), vector)
            backend.delete_profile(tenant, pid, keep_dimension=len(vector))    # another model's, if any
        written += len(kept)
    return written


def result_of(plan: RecordPlan, removed: int) -> IndexResult:
    prepared = plan.prepared
    return IndexResult(patients=1, resources=len(prepared.record.resources), chunks=len(prepared.chunks),
                       embedded=len(plan.changed), unchanged=len(prepared.chunks) - len(plan.changed), removed=removed,
                       problems=prepared.problems)


def index_record(backend: Backend, embedder: Embedder, tenant: str, record: PatientRecord,
                 progress: Progress | None = None, words_first: bool = False) -> IndexResult:
    """Index the record. `words_first` (a patient's first sync, a clinician waiting): every chunk
    is written at once without its vector, searchable by its words and concepts within seconds;
    the vectors follow in batches, problems, medications and allergies first, and the patient
    summary says how many are still pending until the last one is written."""
    plan = plan_record(backend, tenant, prepare_record(tenant, record, embedder.budget()))
    total = len(plan.changed)

    def report(done: int) -> None:
        if progress:
            progress("embedding", min(done, total), total)     # the profile's text is one more

    report(0)
    if not plan.prepared.record.resources:
        result = IndexResult()
    elif words_first and plan.changed:
        result = result_of(plan, write_words_then_vectors(backend, embedder, tenant, plan, report))
    else:
        result = write_record(backend, tenant, plan,
                              embedder.encode(plan.texts, progress=(lambda done, _: report(done)) if progress else None))
    if progress:
        progress("done", total, total)
    return result


def write_words_then_vectors(backend: Backend, embedder: Embedder, tenant: str, plan: RecordPlan, report) -> int:
    """The record and a summary counting what is pending go first, so that a question asked from
    the first chunk on knows the record is still being read; then every changed chunk without its
    vector; then the vectors. Returns the stale chunks removed."""
    record, changed = plan.prepared.record, plan.changed
    with backend.written_together():
        store_record(backend, tenant, plan, pending=len(changed))
        backend.index([c for c, _ in changed], [None] * len(changed), [lx for _, lx in changed])
        removed = remove_stale(backend, tenant, plan)
    # Essentials first; the rest shortest first, so each batch pads little (the model runs a
    # batch at the length of its longest text).
    ordered = sorted(changed, key=lambda pair: (pair[0].resource_type not in ESSENTIAL_TYPES, len(pair[0].text)))
    for start in range(0, len(ordered), VECTOR_BATCH):
        batch = ordered[start:start + VECTOR_BATCH]
        backend.add_vectors([c for c, _ in batch], embedder.encode([c.text for c, _ in batch]), [lx for _, lx in batch])
        done = start + len(batch)
        backend.upsert_patient(tenant, record.patient_id,
                               patient_summary(record, plan.counts, plan.prepared.terms, len(ordered) - done))
        report(done)
    store_profile(backend, tenant, plan, embedder.encode([profile_text(plan.prepared.profile)])[0])
    return removed


def index_in_turn(backend: Backend, embedder: Embedder, tenant: str, records: Iterable[PatientRecord],
                  group: int = PATIENTS_PER_ENCODE, in_parts: Callable[[PatientRecord], bool] = lambda record: False,
                  index_in_parts: Callable[..., IndexResult] | None = None) -> Iterator[IndexResult]:
    """Index records a few at a time, each one's result as it is written. The texts of a group
    of patients are embedded in one call (per-patient calls pad more: 8% slower on these
    records) while the next group is read from `records`, chunked and annotated on a thread (the
    model computes outside the interpreter lock), and the previous group is written: the model
    starts on a group before the one before it is written, so it never waits for the index.
    `records` is consumed on that thread, so a database it reads must allow it. This thread
    plans a group (reads what the index holds) before handing that one the next: a thread that
    waits on SQLite between two Python steps waits again for the lock each time the other holds
    it (reading records here, beside the preparation, cost 7 s in 80).
    A record `in_parts` says is too large to hold whole ends its group and is given to
    `index_in_parts` (search/record_parts.py) on this thread, the groups before it written first
    and the next one prepared after it (the annotator is not shared between threads)."""
    budget = embedder.budget()
    remaining = iter(records)

    def prepare_group(size: int) -> tuple[list[PreparedRecord], PatientRecord | None]:
        prepared = []
        for record in islice(remaining, size):
            if in_parts(record):
                return prepared, record
            prepared.append(prepare_record(tenant, record, budget))
        return prepared, None

    with ThreadPoolExecutor(1, thread_name_prefix="chartcite-prepare") as pool:
        # A small first group: the model waits for it.
        upcoming = pool.submit(prepare_group, FIRST_GROUP)
        unwritten: tuple[list[RecordPlan], Callable[[], np.ndarray]] | None = None
        while True:
            current, large = upcoming.result()
            if not current and large is None:
                break
            if current and unwritten and patients_of(unwritten[0]) & {prepared.record.patient_id for prepared in current}:
                # The same patient again: planned against the index as the earlier copy leaves it.
                yield from write_group(backend, tenant, *unwritten)
                unwritten = None
            plans = [plan_record(backend, tenant, prepared) for prepared in current]
            if large is None:
                upcoming = pool.submit(prepare_group, group)
            vectors = embedder.encode_soon([text for plan in plans for text in plan.texts]) if plans else None
            if unwritten:
                yield from write_group(backend, tenant, *unwritten)
            unwritten = (plans, vectors) if plans else None
            if large is not None:
                if unwritten:
                    yield from write_group(backend, tenant, *unwritten)
                    unwritten = None
                yield index_in_parts(backend, embedder, tenant, large)
                upcoming = pool.submit(prepare_group, group)
        if unwritten:
            yield from write_group(backend, tenant, *unwritten)


def patients_of(plans: list[RecordPlan]) -> set[str]:
    return {plan.prepared.record.patient_id for plan in plans}


def write_group(backend: Backend, tenant: str, plans: list[RecordPlan],
                vectors: Callable[[], np.ndarray]) -> Iterator[IndexResult]:
    """Each patient of a group written with its vectors, once the model has them."""
    computed = vectors()
    offset = 0
    for plan in plans:
        yield write_record(backend, tenant, plan, computed[offset:offset + len(plan.texts)])
        offset += len(plan.texts)

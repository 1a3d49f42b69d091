"""One large patient record indexed a part at a time, so that memory does not grow with it.

Indexing a record whole holds all of its chunks, their concepts and facts, and their vectors at
once: about 30 kB a resource, 2.77 GB for one patient of 30,577 resources (docs/performance.md,
"Large inputs"). Here the chunks are made, annotated, embedded and written `PART_RESOURCES`
resources at a time, and only what must be whole is kept whole:

- the record's resources, compactly: a record of more than `LARGE_RECORD` resources is held as
  bytes (fhir_ingest/record/compact.py), a part parsed while it is chunked and a reference when
  it is resolved (the removal rule and the reconcile with the record held have already run,
  `SearchService.as_indexed`);
- the record's phrases (`record_terms_from_chunks`): every chunk is annotated with the phrases
  of the whole record, so a first pass over the parts collects them before any part is annotated;
- the ids of the chunks made (a chunk the record no longer makes is removed) and the counts the
  patient summary keeps; what the profile reads of each part's facts (`ProfileBuilder`) and
  each problem's concepts, so its end does not read the whole record again.

The parts together write what indexing the record whole writes: the same chunks under the same
ids, the same concepts and vectors. What replaces or removes anything held (the stale chunks, the
stored resources, the summary, the profile) is written last, in one block, once every part is
written: a failure in a part leaves every held chunk and resource in place, and the next run
finds the parts already written unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fhir_ingest.record.chunk import ChunkProblem, PatientChunker
from fhir_ingest.record.compact import LARGE_RECORD, is_compact, only_types
from fhir_ingest.record.kinds import INDEXED_TYPES, SUPPORT_TYPES
from fhir_ingest.record.load import PatientRecord

from search.backends.base import Backend
from search.backends.embedded import text_hash
from search.indexer import IndexResult, lexical_text, patient_summary
from search.models.embed import Embedder
from search.nlp.annotate import default_annotator, record_terms_from_chunks
from search.similar.profile import ProfileBuilder, problem_concepts, profile_keys, profile_text

# Resources chunked, annotated, embedded and written together. A record of more is indexed in
# parts (and was assembled compactly); one of fewer (every shared record: the largest holds
# 1,177) is indexed whole as before. A part of 2,000 ordinary resources holds about 60 MB of
# chunks and vectors.
PART_RESOURCES = LARGE_RECORD


def in_parts(record: PatientRecord) -> bool:
    """A compact record is always indexed in parts: whole, it would be parsed whole."""
    return is_compact(record.resources) or len(record.resources) > PART_RESOURCES


@dataclass
class PartsWritten:
    """What the parts wrote, kept for the last block and the result: chunk ids, not chunks."""
    made: set[str] = field(default_factory=set)
    chunks: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    embedded: int = 0
    problem_concepts: dict[str, list[str]] = field(default_factory=dict)   # Condition ref → its concepts
    problems: list[ChunkProblem] = field(default_factory=list)


def parts_of(chunker: PatientChunker, resources, part: int, on_part=None):
    """Each part's chunks in the order `PatientChunker.chunks()` makes them, the trends last;
    `on_part` hears each part's resources (parsed for it) before its chunks are made."""
    for start in range(0, len(resources), part):
        resources_of_part = resources[start:start + part]
        if on_part:
            on_part(resources_of_part)
        chunks = chunker.chunks_of(resources_of_part)
        chunker.forget_rendered()
        yield chunks
    yield from trend_parts(chunker, part)


def trend_parts(chunker: PatientChunker, part: int):
    """The trend summaries in groups drawing on at most `part` readings together (a summary's
    fact holds each reading of its window): a large record's are most of its last block
    otherwise (178 summaries of 15,554 readings, 45 MB of JSON, at 16,465 resources)."""
    group, readings = [], 0
    for chunk in chunker.trend_pieces():
        if group and readings + len(chunk.refs) > part:
            yield group
            group, readings = [], 0
        group.append(chunk)
        readings += len(chunk.refs)
    if group:
        yield group


def whole_record_terms(chunker: PatientChunker, resources, part: int) -> list:
    """The record's phrases, as `record_terms_from_chunks` finds them in all its chunks at once
    (a later chunk's reading of a phrase wins there, and here)."""
    terms = {}
    for chunks in parts_of(chunker, resources, part):
        terms.update({(t.phrase, t.key): t for t in record_terms_from_chunks(chunks)})
    chunker.problems.clear()     # the second pass reports them
    return sorted(terms.values(), key=lambda t: (t.phrase, t.key))


def index_in_parts(backend: Backend, embedder: Embedder, tenant: str, record: PatientRecord,
                   progress=None, part: int | None = None) -> IndexResult:
    """Index a record `part` resources at a time (the module's docstring says what stays whole).
    `progress` hears ("embedding", resources done, resources) after each part."""
    if not record.resources:
        return IndexResult()        # nothing of a patient the index does not hold passed the checks
    part = part or PART_RESOURCES
    chunker = PatientChunker(tenant, record.patient_id, record.resources, embedder.budget())
    terms = whole_record_terms(chunker, record.resources, part)
    existing = backend.indexed_texts(tenant, record.patient_id)
    written = PartsWritten()
    profile = ProfileBuilder(record.patient_id)
    done = 0

    def to_profile(resources: list[dict]) -> None:
        for resource in resources:
            profile.add(resource, chunker.resolve)

    for chunks in parts_of(chunker, record.resources, part, to_profile):
        write_part(backend, embedder, chunks, terms, existing, written)
        done = min(done + part, len(record.resources))
        if progress:
            progress("embedding", done, len(record.resources))
    written.problems = list(chunker.problems)
    removed = finish_record(backend, embedder, tenant, record, terms, existing, written, profile)
    if progress:
        progress("done", len(record.resources), len(record.resources))
    return IndexResult(patients=1, resources=len(record.resources), chunks=written.chunks,
                       embedded=written.embedded, unchanged=written.chunks - written.embedded, removed=removed,
                       problems=written.problems)


def write_part(backend: Backend, embedder: Embedder, chunks: list, terms: list, existing: dict[str, str],
               written: PartsWritten) -> None:
    """One part annotated with the whole record's phrases, its changed chunks embedded and
    written (adding to what is held; nothing is removed here)."""
    default_annotator().annotate_chunks(chunks, terms)
    lexicals = [lexical_text(c) for c in chunks]
    changed = [(c, lx) for c, lx in zip(chunks, lexicals) if existing.get(c.chunk_id) != text_hash(c, lx)]
    if changed:
        vectors = embedder.encode([c.text for c, _ in changed])
        with backend.written_together():
            backend.index([c for c, _ in changed], vectors, [lx for _, lx in changed])
    written.chunks += len(chunks)
    for chunk in chunks:
        written.made.add(chunk.chunk_id)
        written.counts[chunk.semantic_type] = written.counts.get(chunk.semantic_type, 0) + 1
    written.problem_concepts = problem_concepts(chunks, written.problem_concepts)
    written.embedded += len(changed)


def finish_record(backend: Backend, embedder: Embedder, tenant: str, record: PatientRecord, terms: list,
                  existing: dict[str, str], written: PartsWritten, built: ProfileBuilder) -> int:
    """The stale chunks out, the resources, summary and profile in: together, after every part,
    as `write_record` writes them for a record indexed whole. Returns the chunks removed."""
    profile = built.profile(written.problem_concepts)
    vector = embedder.encode([profile_text(profile)])[0]
    with backend.written_together():
        removed = backend.delete_chunks(tenant, sorted(set(existing) - written.made))
        # Compact resources stay compact: each is parsed as its row is written.
        backend.store_resources(tenant, record.patient_id, only_types(record.resources, INDEXED_TYPES | SUPPORT_TYPES))
        backend.upsert_patient(tenant, record.patient_id, patient_summary(record, written.counts, terms))
        backend.put_profile(tenant, record.patient_id, profile, profile_keys(profile), vector)
    return removed

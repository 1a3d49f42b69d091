"""The `Backend` contract every index implements (embedded SQLite now, Elasticsearch later).

Scope is part of every call: tenant and patient go into the backend's own query, before any
scoring, so no caller can forget to filter and nothing is post-filtered.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np

from fhir_ingest.record.contract import Chunk


# The text hash a chunk written before its vector carries: it never equals a real hash, so a
# later run embeds the chunk even if the run that wrote it stopped before its vector.
VECTOR_PENDING = "vector pending"
# What `check` says of such chunks, on either backend.
PENDING_PROBLEM = ("chunks still wait for their vector (found by their words only): indexing is under way, "
                   "or it stopped; sync the patient again")


def summary_after_removal(summary: dict, chunk_types: list[str], pending: int, resource_refs: list[str]) -> dict:
    """The patient summary with removed chunks (their semantic types; `pending` of them still
    waiting for a vector) and removed stored resources taken off its counts, so it keeps agreeing
    with the index (`check`) and the patient list counts what is there."""
    chunk_counts = dict(summary.get("chunk_counts") or {})
    for semantic_type in chunk_types:
        chunk_counts[semantic_type] = chunk_counts.get(semantic_type, 0) - 1
    resource_counts = dict(summary.get("resource_counts") or {})
    for ref in resource_refs:
        resource_type = ref.split("/", 1)[0]
        resource_counts[resource_type] = resource_counts.get(resource_type, 0) - 1
    updated = dict(summary, chunk_counts={k: n for k, n in chunk_counts.items() if n > 0},
                   resource_counts={k: n for k, n in resource_counts.items() if n > 0})
    if summary.get("vectors_pending"):
        updated["vectors_pending"] = max(summary["vectors_pending"] - pending, 0)
    return updated


@dataclass
class ProfileGaps:
    """How the similarity profiles of a tenant disagree with its records (patient ids)."""
    missing: list[str]          # holding records, no profile: indexed before profiles existed, or interrupted
    orphaned: list[str]         # a profile, no records left: the patient's features must go with the record
    other_model: list[str]      # embedded by another model than the index's
    held: int                   # profiles held
    older: list[str] = field(default_factory=list)     # built by an earlier profile version


def profile_gaps(expected: set[str], dimensions: dict[str, list[int]], dimension: int,
                 versions: dict[str, int] | None = None, current: int = 0) -> ProfileGaps:
    """Every patient of whom the index holds source records (`expected`) has one profile, of the
    index's model and of the current profile version; no profile is left of a patient it holds
    nothing of."""
    return ProfileGaps(sorted(expected - set(dimensions)), sorted(set(dimensions) - expected),
                       sorted(pid for pid, sizes in dimensions.items()
                              if pid in expected and dimension and sizes != [dimension]),
                       sum(len(sizes) for sizes in dimensions.values()),
                       sorted(pid for pid, version in (versions or {}).items()
                              if pid in expected and version < current))


def profile_problems(gaps: ProfileGaps) -> tuple[dict, list[str], list[str]]:
    """What `check` says of the similarity profiles, on either backend: (counts, problems,
    warnings). A missing profile is a warning: answers are unaffected, the profile is built from
    the record the index already holds, and an index from before profiles existed must not fail
    its health check for it. A profile of a patient gone, or of another model, compares what
    should not be compared: a problem. A profile of an earlier version is read as it was built: a
    warning. `chartcite check --repair` mends all four."""
    problems, warnings = [], []
    if gaps.missing:
        warnings.append(f"{len(gaps.missing)} patients have no similarity profile yet (indexed before profiles "
                        f"existed, or interrupted), so similar patients and cohorts leave them out: "
                        f"`chartcite check --repair` builds them from the indexed records")
    if gaps.orphaned:
        problems.append(f"{len(gaps.orphaned)} similarity profiles belong to patients whose record the index no "
                        f"longer holds: `chartcite check --repair` removes them")
    if gaps.other_model:
        problems.append(f"{len(gaps.other_model)} similarity profiles were embedded by another model than the "
                        f"index's: `chartcite check --repair` (or `chartcite reindex`) rebuilds them")
    if gaps.older:
        warnings.append(f"{len(gaps.older)} similarity profiles were built by an earlier chartcite (their series "
                        f"may mix units), so similar patients and cohorts read them as they were: "
                        f"`chartcite check --repair` rebuilds them from the indexed records")
    return {"profiles": gaps.held}, problems, warnings


class BackendError(RuntimeError):
    """A clear, user-facing problem with the index (wrong model, unreachable cluster...)."""


class ModelMismatch(BackendError):
    pass


class BackendUnavailable(BackendError):
    """A fault that may pass (cluster unreachable, overloaded): worth retrying with backoff."""


@dataclass
class Hit:
    chunk_id: str
    score: float


@dataclass(frozen=True)
class Search:
    """One search of a batch: `text` (query: the words), `vector` (query: the question's vector),
    `concepts` (query: concept keys) or `latest`, inside a scope."""
    kind: str
    scope: Scope
    query: object = None
    n: int = 10


@dataclass
class IndexCheck:
    """What `chartcite check` reports: counts of each part of the index, and anything that disagrees."""
    counts: dict
    problems: list[str]
    warnings: list[str] = field(default_factory=list)    # worth a line, not a failed check


@dataclass
class StoredReading:
    """How answering read one chunk sentence by sentence, as the index keeps it
    (search/sentence_readings.py): the sentence spans of each piece of its text it split, and the
    vectors of the sentences it compared with a question."""
    chunk_id: str
    text_digest: str                   # text_digest(chunk.text) it was read from: another text makes it stale
    model: str                         # the embedding model of its vectors
    splits: dict[str, list]            # a piece of the chunk's text -> its sentences' [start, end] spans
    texts: list[str]                   # the texts whose vectors follow, in order
    vectors: np.ndarray                # float32, one row per text


def text_digest(text: str) -> str:
    """A short digest of a chunk's text: what a kept reading was read from."""
    import hashlib

    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


@dataclass
class Scope:
    tenant: str
    patient_id: str
    semantic_types: tuple[str, ...] = ()   # empty = all
    date_from: str = ""                    # ISO dates, inclusive; empty = open
    date_to: str = ""


class Backend(ABC):
    embedding_model: str

    def built_with(self) -> set[str]:
        """The embedding models the existing index was built with; empty for a new index."""
        return set()

    @abstractmethod
    def index(self, chunks: list[Chunk], vectors: np.ndarray, lexical_texts: list[str]) -> None:
        """Upsert chunks by chunk_id with their vectors and BM25 text. A vector of None writes the
        chunk without one: found by its words and concepts, not by dense search, until rewritten."""

    def add_vectors(self, chunks: list[Chunk], vectors: np.ndarray, lexical_texts: list[str]) -> None:
        """The vectors of chunks written before them (unchanged otherwise); a backend that can
        update a vector alone overrides this cheaper path."""
        self.index(chunks, vectors, lexical_texts)

    def written_together(self):
        """A block whose writes (this thread's) land together, all or none: one patient's chunks,
        resources and summary. A backend without transactions writes them one by one."""
        return nullcontext()

    def deferred_refresh(self):
        """A block whose writes (this thread's) become searchable together at its end rather than
        each at once; a backend whose writes are searchable on commit has nothing to defer."""
        return nullcontext()

    def answering(self):
        """A block of reads for a question's answer, on this thread: a backend may serve them from
        what it kept of earlier questions' reads (chunks parsed before and unchanged since). Reads
        outside it (indexing) keep nothing."""
        return nullcontext()

    @abstractmethod
    def delete_refs(self, tenant: str, patient_id: str, refs: list[str]) -> int:
        """Remove these resources ("Type/id") of this patient, and every chunk of the patient drawn
        from them, and take them off the patient summary's counts, in one write; another patient's
        resource of the same Type/id stays. Returns the chunks removed."""

    @abstractmethod
    def holders(self, tenant: str, refs: list[str]) -> dict[str, set[str]]:
        """The patients whose stored record holds each of these resources (a Type/id is one
        patient's at its EHR, but another input may have put it under another patient)."""

    @abstractmethod
    def delete_chunks(self, tenant: str, chunk_ids: list[str]) -> int: ...

    @abstractmethod
    def search_text(self, scope: Scope, query: str, n: int) -> list[Hit]:
        """BM25 over the lexical text, inside the scope."""

    @abstractmethod
    def search_vector(self, scope: Scope, vector: np.ndarray, n: int) -> list[Hit]:
        """Exact cosine similarity inside the scope."""

    @abstractmethod
    def search_concepts(self, scope: Scope, concept_keys: list[str], n: int) -> list[Hit]:
        """Chunks in scope that assert any of these concepts (most matches, then newest first)."""

    @abstractmethod
    def latest(self, scope: Scope, n: int) -> list[Hit]:
        """The newest chunks in scope."""

    def concepts_present(self, tenant: str, patient_id: str, concept_keys: list[str]) -> set[str]:
        """Which of these concepts some chunk of this patient's record asserts."""
        scope = Scope(tenant, patient_id)
        return {key for key in concept_keys if self.search_concepts(scope, [key], 1)}

    def search_many(self, searches: list[Search]) -> list[list[Hit]]:
        """Several searches of one tenant at once; a backend with a network between it and the
        process answers them in one round trip."""
        run = {"text": self.search_text, "vector": self.search_vector, "concepts": self.search_concepts}
        return [self.latest(s.scope, s.n) if s.kind == "latest" else run[s.kind](s.scope, s.query, s.n)
                for s in searches]

    @abstractmethod
    def has_terms(self, tenant: str, patient_id: str, terms: list[str], prefix: bool = False) -> set[str]:
        """Which words occur in this patient's indexed text (with `prefix`, which begin a word of
        it). Only one patient's: nothing a clinician sees may depend on another patient's record."""

    @abstractmethod
    def refs_in_scope(self, scope: Scope, refs: list[str]) -> set[str]:
        """Which of these resources have a chunk inside the scope (for filter-stage recall)."""

    @abstractmethod
    def count(self, scope: Scope) -> int: ...

    @abstractmethod
    def get_chunks(self, tenant: str, chunk_ids: list[str]) -> list[Chunk]: ...

    keeps_readings = False       # whether put_readings keeps anything

    def get_readings(self, tenant: str, chunk_ids: list[str]) -> dict[str, StoredReading]:
        """The readings the index keeps of these chunks. A backend that keeps none (on
        Elasticsearch they stay in each process's memory) returns nothing."""
        return {}

    def put_readings(self, tenant: str, readings: list[StoredReading]) -> bool:
        """Keep these readings beside their chunks (a chunk no longer held gets none); False when
        nothing was written (not kept by this backend, or the index was busy: a question never
        waits on it)."""
        return False

    def prune_readings(self, tenant: str) -> int:
        """Kept readings of chunks the index no longer holds removed (`check --repair`); how many."""
        return 0

    @abstractmethod
    def indexed_texts(self, tenant: str, patient_id: str) -> dict[str, str]:
        """chunk_id → hash of the text it was embedded from, for skipping unchanged chunks."""

    @abstractmethod
    def store_resources(self, tenant: str, patient_id: str, resources: list[dict]) -> None:
        """The patient's source resources are now exactly these (the side panel shows the record a
        chip cites; a merge starts from them): held ones not among them are removed."""

    @abstractmethod
    def patient_resources(self, tenant: str, patient_id: str) -> list[dict]:
        """Every stored source resource of the patient: the base an incremental sync merges into
        (a large record's as `CompactResources`, read row by row: fhir_ingest/record/compact.py)."""

    @abstractmethod
    def get_resource(self, tenant: str, patient_id: str, ref: str) -> dict | None:
        """The stored resource, only if it belongs to this patient."""

    def get_resources(self, tenant: str, patient_id: str, refs: list[str]) -> dict[str, dict]:
        """Several stored resources of one patient by reference (a networked backend reads them
        in one round trip); those it does not hold are left out."""
        found = {ref: self.get_resource(tenant, patient_id, ref) for ref in refs}
        return {ref: resource for ref, resource in found.items() if resource}

    @abstractmethod
    def upsert_patient(self, tenant: str, patient_id: str, summary: dict) -> None: ...

    @abstractmethod
    def get_patient(self, tenant: str, patient_id: str) -> dict | None: ...

    @abstractmethod
    def list_patients(self, tenant: str) -> list[dict]: ...

    def has_patients(self, tenant: str) -> bool:
        """Whether the index holds any patient of the tenant (an emptied or new index does not)."""
        return bool(self.list_patients(tenant))

    # --- patient profiles (similar patients, cohorts: search/similar/) ------------------------
    # One profile per patient: the typed features as a dict, its keys (what cohorts select on:
    # "problem:<code>", "drug:<ingredient>") and one vector. The tenant is inside every query.
    @abstractmethod
    def put_profile(self, tenant: str, patient_id: str, profile: dict, keys: list[str], vector: np.ndarray) -> None:
        """The patient's profile, replacing the one held."""

    @abstractmethod
    def nearest_profiles(self, tenant: str, patient_id: str, n: int) -> list[tuple[str, float]]:
        """The `n` patients of the tenant whose profile vector is nearest this patient's (cosine,
        best first; the patient itself left out); empty when the patient has no profile."""

    @abstractmethod
    def get_profiles(self, tenant: str, patient_ids: list[str]) -> dict[str, dict]:
        """The profiles of these patients of the tenant; those it does not hold are left out."""

    @abstractmethod
    def cohort_profiles(self, tenant: str, exposures: list[str], conditions: list[str], measure: str) -> list[dict]:
        """What a cohort reads of each profile of the tenant holding one of the `exposures` keys
        and one of the `conditions` keys, by patient id: {"patient_id", "medications", "measures":
        {measure: its dated series}}. Never the whole profile: every lab's dated series of a third
        of a 10,000-patient workspace took seconds to read."""

    @abstractmethod
    def key_frequencies(self, tenant: str, keys: list[str]) -> tuple[int, dict[str, int]]:
        """(how many profiles the tenant holds, how many of them hold each of these keys): how
        rare a problem or a drug is in the workspace."""

    @abstractmethod
    def delete_profile(self, tenant: str, patient_id: str, keep_dimension: int | None = None) -> None:
        """The patient's profile removed (the index no longer holds the record); with
        `keep_dimension`, only a profile whose vector is of another size (a reindex's new model
        has written the patient's again)."""

    @abstractmethod
    def profile_dimensions(self, tenant: str) -> dict[str, list[int]]:
        """Patient id -> the vector size of each profile the tenant holds for them (`check`)."""

    @abstractmethod
    def profile_versions(self, tenant: str) -> dict[str, int]:
        """Patient id -> the version of the profile held for them (0: before versions were kept)."""

    @abstractmethod
    def profile_gaps(self, tenant: str) -> ProfileGaps:
        """Profiles missing, orphaned or of another model (`check`, `check --repair`)."""

    @abstractmethod
    def check(self, tenant: str) -> IndexCheck:
        """Chunks, lexical rows, vectors and patient summaries agree; nothing is orphaned."""

    @abstractmethod
    def close(self) -> None: ...

"""What the command line, the web app and the workers call: one object over model + backend."""
from __future__ import annotations

import logging
import threading
import numpy as np
from contextlib import closing
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Callable, Iterable, Iterator

from fhir_ingest.record.kinds import CLINICAL_TYPES
from fhir_ingest.record.load import SOURCE, LoadReport, PatientRecord, RemovalBudget, against_held, assembled
from fhir_ingest.record.reader import DEFAULT_LIMITS, ReadLimits, read_path

from search.answering.flow import answer_in_parts, decide
from search.answering.grounded import GENERAL_BANNER, GENERAL_REFUSAL, grounded_answer
from search.answering.phi import Identifiers
from search.answering.steps import AnswerContext
from search.answering.types import Answer
from search.backends.base import Backend, BackendError
from search.held_back import HeldBackRemovals
from search.backends.elastic_options import ElasticOptions
from search.indexer import IndexResult, index_in_turn, index_record
from search.record_parts import in_parts, index_in_parts
from search.models.crossrank import CrossEncoderRanker, load_reranker
from search.models.embed import Embedder, RememberedQueries
from search.models.embedders import DEFAULT_INT8, load_embedder
from search.models.onnx_embed import variant_of
from search.models.llm import ChatClient, LlmError, LlmSettings, general_answer
from search.nlp.lexicon import clean_text
from search.sentence_readings import QuestionsUnderWay, SentenceReadings, Warmer
from search.retrieval.analysis import patient_terms
from search.retrieval.pipeline import retrieve

log = logging.getLogger(__name__)


@dataclass
class IndexSummary:
    load: LoadReport
    result: IndexResult


class SearchService:
    def __init__(self, backend_kind: str, index_path: Path, model_path: str = "", es: ElasticOptions | None = None,
                 reranker_path: str = "", llm: LlmSettings | None = None, precision: str = "int8",
                 model_cache: str | Path = "", read_limits: ReadLimits = DEFAULT_LIMITS, int8: str = DEFAULT_INT8,
                 removal_share: float = RemovalBudget.share):
        self.backend_kind = backend_kind
        self.removal_share = removal_share
        self.held_back = HeldBackRemovals(Path(index_path).parent / "held-back.sqlite")
        self.read_limits = read_limits
        self.precision = precision
        self.int8 = int8
        self.model_cache = str(model_cache) if model_cache else None
        self.llm = ChatClient(llm) if llm and llm.url else None
        self.reranker_path = reranker_path
        self.index_path = Path(index_path)
        self.model_path = model_path or None
        self.es_options = es or ElasticOptions()
        self._embedder: Embedder | None = None
        self._warm = False
        self._loading = threading.Lock()
        self._backend: Backend | None = None
        self._catalog: Backend | None = None
        self.readings = SentenceReadings(lambda: self.backend, lambda: self.embedder)
        self.warmer = Warmer(self.warm_notes)
        self.questions = QuestionsUnderWay()

    @property
    def embedder(self) -> Embedder:
        with self._loading:      # the warm-up thread and a first question must not load it twice
            if self._embedder is None:
                self._embedder = load_embedder(self.model_path, self.precision, self.model_cache, self.int8_variant(),
                                               str(self.index_path.parent))
        return self._embedder

    def int8_variant(self) -> str:
        """The int8 variant to run. `auto` keeps the one an existing index was built with, so a
        VM moved to another processor, or a worker on another host, goes on writing and searching
        the same vectors (another variant's would be refused); the processor's own choice is for
        a new index. A tenant moves to it by `chartcite reindex` with the variant named."""
        if self.precision != "int8" or self.int8 != "auto":
            return self.int8
        kept = {variant_of(model) for model in self.catalog.built_with()} - {None}
        if len(kept) == 1:
            return kept.pop()
        return "auto"

    @property
    def model_loaded(self) -> bool:
        """The model and the annotation pipeline are in: a question will not wait for either."""
        return self._warm

    def warm_up(self) -> None:
        """The model and the annotation pipeline, loaded now rather than on the first question
        (which would otherwise wait seconds for the pipeline, as would every question behind it)."""
        from search.nlp.annotate import default_annotator

        self.embedder
        default_annotator()
        self._warm = True

    @property
    def reranker(self) -> CrossEncoderRanker | None:
        return load_reranker(self.reranker_path) if self.reranker_path else None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            if self.backend_kind == "embedded":
                from search.backends.embedded import EmbeddedBackend

                self._backend = EmbeddedBackend(self.index_path, self.embedder.name, self.embedder.dimension)
            else:
                self._backend = self._elastic(self.embedder.name, self.embedder.dimension)
        return self._backend

    def _elastic(self, model: str | None, dimension: int = 0, check_model: bool = True):
        from search.backends.elastic import ElasticsearchBackend

        if not self.es_options.urls:
            raise BackendError("the Elasticsearch backend needs at least one URL (CHARTCITE_ES_URL)")
        return ElasticsearchBackend(list(self.es_options.urls), model, dimension, check_model=check_model,
                                    **self.es_options.connection())

    def reindex(self, tenant: str, progress: Callable[[str, int, int], None] | None = None) -> int:
        """Rebuild the tenant's index with the configured model into a new versioned index and swap
        the alias atomically: questions keep working on the old index until the swap."""
        if self.backend_kind != "elasticsearch":
            raise BackendError("reindex with an alias swap is for the Elasticsearch backend; the embedded index "
                               "is rebuilt by indexing into a new CHARTCITE_DATA_DIR")
        embedder = self.embedder
        old = self._elastic(None, check_model=False)
        chunks = list(old.scan_chunks(tenant))
        target = old.start_reindex(tenant, embedder.name, embedder.dimension)
        from search.indexer import lexical_text

        for start in range(0, len(chunks), 256):
            batch = chunks[start:start + 256]
            vectors = embedder.encode([c.text for c in batch])
            old.write_chunks(target, batch, vectors, [lexical_text(c) for c in batch])
            if progress:
                progress("reindexing", start + len(batch), len(chunks))
        old.finish_reindex(tenant, target)
        old.close()
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        # The profiles too: a new model's vectors are not comparable with the old one's, and a
        # record indexed before profiles existed gets its profile here.
        by_patient: dict[str, list] = {}
        for chunk in chunks:
            by_patient.setdefault(chunk.patient_id, []).append(chunk)
        patients = [p["patient_id"] for p in self.backend.list_patients(tenant)]
        if progress:
            progress("profiles", 0, len(patients))
        self.rebuild_profiles(tenant, patients, by_patient)
        for orphan in set(self.backend.profile_dimensions(tenant)) - set(patients):
            self.backend.delete_profile(tenant, orphan)
        if progress:
            progress("profiles", len(patients), len(patients))
        return len(chunks)

    def budget(self, allow_removals: bool = False) -> RemovalBudget:
        return RemovalBudget(self.removal_share, allow_removals)

    def index_records(self, tenant: str, records: list[PatientRecord],
                      progress: Callable[[str, int, int], None] | None = None, words_first: bool = False,
                      report: LoadReport | None = None) -> IndexResult:
        total = IndexResult()
        for record in records:
            total.merge(self.index_record(tenant, record, progress, words_first, report))
        return total

    def index_record(self, tenant: str, record: PatientRecord,
                     progress: Callable[[str, int, int], None] | None = None, words_first: bool = False,
                     report: LoadReport | None = None) -> IndexResult:
        """`words_first`: searchable by words and concepts at once, by meaning as the vectors
        follow (a first sync). `report` hears what indexing decided against the record held."""
        record = self.as_indexed(tenant, record, report)
        if in_parts(record):     # too large to hold whole: searchable part by part as it is written
            return index_in_parts(self.backend, self.embedder, tenant, record, progress)
        return index_record(self.backend, self.embedder, tenant, record, progress, words_first)

    def as_indexed(self, tenant: str, record: PatientRecord, report: LoadReport | None = None,
                   budget: RemovalBudget | None = None) -> PatientRecord:
        """The record as it replaces or is merged into what the index holds for the patient, under
        the one rule for what an input may remove (`fhir_ingest.record.load.against_held`)."""
        report = report if report is not None else LoadReport()
        before = len(report.held_back)
        indexed = against_held(record, self.held_resources(tenant, record.patient_id), report, budget or self.budget())
        if len(report.held_back) > before:
            held = report.held_back[-1]
            self.held_back.hold(tenant, record.patient_id, held.origin, held.reason)
        elif indexed.complete:
            self.held_back.clear(tenant, record.patient_id)
        return indexed

    def index_in_turn(self, tenant: str, records: Iterable[PatientRecord],
                      report: LoadReport | None = None, allow_removals: bool = False) -> Iterator[IndexResult]:
        """Many patients' records, each result as it is written; a group of patients is embedded
        in one call while the next group is prepared."""
        budget = self.budget(allow_removals)
        return index_in_turn(self.backend, self.embedder, tenant,
                             (self.as_indexed(tenant, r, report, budget) for r in records),
                             in_parts=in_parts, index_in_parts=index_in_parts)

    def deferred_refresh(self):
        """Writes in the block become searchable together at its end (a Bulk Data round)."""
        return self.backend.deferred_refresh()

    def index_paths(self, tenant: str, paths: list[str | Path],
                    on_patient: Callable[[int, int], None] | None = None, allow_removals: bool = False) -> IndexSummary:
        """Index files and folders a patient at a time; the input waits on disk in the data directory
        (not in memory) while it is regrouped by patient."""
        report, total = LoadReport(), IndexResult()
        items = (item for path in paths for item in read_path(path, self.read_limits))
        with assembled(items, report, self.index_path.parent) as assembler:
            patient_ids = assembler.patient_ids()
            records = (assembler.record(pid) for pid in patient_ids)
            with closing(self.index_in_turn(tenant, records, report, allow_removals)) as results:
                for done, result in enumerate(results, start=1):
                    total.merge(result)
                    if on_patient:
                        on_patient(done, len(patient_ids))
        return IndexSummary(report, total)

    def ask(self, tenant: str, patient_id: str, question: str, k: int = 5, pipeline: str = "full",
            question_id: str | None = None, ablate: tuple[str, ...] = (), use_llm: bool = True,
            today: date | None = None) -> dict:
        """The answer as the HTTP API and the command line emit it (the JSON contract)."""
        return self.answer(tenant, patient_id, question, k, pipeline, question_id, ablate, use_llm, today).to_dict()

    def answer(self, tenant: str, patient_id: str, question: str, k: int = 5, pipeline: str = "full",
               question_id: str | None = None, ablate: tuple[str, ...] = (), use_llm: bool = True,
               today: date | None = None) -> Answer:
        """The answer to a question, decided by search/answering/flow.py; a question of several
        parts is answered part by part. `today`: what "since last month" counts from (the clock's
        date unless a test or an evaluation fixes it)."""
        return answer_in_parts(clean_text(question), question_id, split=pipeline == "full", answer_one=lambda part:
                               self.answer_one(tenant, patient_id, part, k, pipeline, question_id, ablate, use_llm,
                                               today))

    def answer_one(self, tenant: str, patient_id: str, question: str, k: int, pipeline: str,
                   question_id: str | None, ablate: tuple[str, ...], use_llm: bool,
                   today: date | None = None) -> Answer:
        with self.questions.one():
            return self._answer_one(tenant, patient_id, question, k, pipeline, question_id, ablate, use_llm, today)

    def _answer_one(self, tenant: str, patient_id: str, question: str, k: int, pipeline: str,
                    question_id: str | None, ablate: tuple[str, ...], use_llm: bool, today: date | None) -> Answer:
        computed = self.readings.computed()
        # The chunks it reads may be served as parsed for an earlier question, unchanged since.
        with self.backend.answering():
            queries = RememberedQueries(self.embedder, question)
            retrieval = retrieve(self.backend, queries, question, tenant, patient_id, k=k, pipeline=pipeline,
                                 ablate=ablate, reranker=self.reranker)
            # The question's vector from retrieval (the full pipeline embeds it beside its text
            # with the synonyms added: compared with that one, the sentences chosen answered
            # fewer notes-dev questions, facts 0.840 -> 0.759).
            retrieval.similarity = self.similarity_to(question, queries.encode_query(question))
            # The sentences, as earlier questions split and embedded them (sentence_readings.py),
            # of the chunks it reads (among the candidates, a note that may deny the asked
            # concept), and afterwards what this one had to compute kept for the next.
            met = [ev.chunk for ev in retrieval.evidence] + [ev.chunk for ev in retrieval.candidates
                                                              if ev.chunk.semantic_type == "note"]

            def read_chunks(chunk_ids: list[str]) -> None:
                held = {c.chunk_id for c in met}
                more = self.backend.get_chunks(tenant, [c for c in dict.fromkeys(chunk_ids) if c not in held])
                self.readings.load(tenant, more)
                met.extend(more)

            self.readings.load(tenant, met)
            context = self.answer_context(tenant, patient_id, retrieval, use_llm)
            answer = decide(replace(context, today=today, question_id=question_id, read_chunks=read_chunks,
                                    general=lambda: self.general(question, tenant, patient_id, question_id,
                                                                 retrieval, use_llm)))
        self.readings.keep(tenant, met, since=computed)
        return answer

    def similarity_to(self, question: str, vector: np.ndarray | None = None):
        """Cosine similarity of texts (a note's sentences) to the question, by the index's embedder;
        `vector`: the question's, when retrieval embedded it already."""
        return self.readings.similarity(self.embedder.encode_query(question) if vector is None else vector)

    def warm_notes(self, tenant: str, patient_id: str) -> int:
        """The patient's notes read ahead of the first question (sentence_readings.py), pausing
        while a question is answered (splitting is Python: it would share the interpreter with
        the question); returns the note chunks read."""
        return self.readings.warm(tenant, patient_id, pause=self.questions.wait_for_none)

    def warm_notes_soon(self, tenant: str, patient_id: str, key: object) -> bool:
        """warm_notes on a background thread, once per record as `key` says it stands (the frame
        passes its chunk count): True when queued. Not before the model is loaded: loading it is
        the process's warm-up's work, and the first question would wait for it either way."""
        return self.model_loaded and self.warmer.soon(tenant, patient_id, key)

    def answer_context(self, tenant: str, patient_id: str, retrieval, use_llm: bool) -> AnswerContext:
        def grounded(result: Answer) -> Answer:
            # Names, MRNs, birth dates and addresses are scrubbed from all that is sent.
            ids = Identifiers.from_patient(self.resource(tenant, patient_id, f"Patient/{patient_id}"))
            return grounded_answer(self.llm, retrieval, result, ids, patient_terms(self.backend, tenant, patient_id))

        return AnswerContext(tenant, patient_id, retrieval, self.backend, lambda: self.patient(tenant, patient_id),
                             grounded if use_llm and self.llm is not None else None, CLINICAL_TYPES)

    def general(self, question: str, tenant: str, patient_id: str, question_id: str | None, retrieval,
                use_llm: bool) -> Answer:
        """A question about medicine rather than this patient: answered only by a configured
        model, under a banner, with no patient evidence attached."""
        refusal = Answer(question_id, patient_id, question, GENERAL_REFUSAL, [], [], [], "low", True,
                         {"pipeline": retrieval.pipeline, "stages": [s.to_dict() for s in retrieval.stages]},
                         generator="none", general=True)
        if not use_llm or self.llm is None:
            return refusal
        try:
            # A general question still may name the patient: scrubbed like any other.
            ids = Identifiers.from_patient(self.resource(tenant, patient_id, f"Patient/{patient_id}"))
            text = general_answer(self.llm, question, ids)
        except LlmError:
            return replace(refusal, answer="The language model is unavailable; try again later.")
        return replace(refusal, answer=text, banner=GENERAL_BANNER, abstained=False, generator=self.llm.name)

    @property
    def catalog(self) -> Backend:
        """The index opened without loading the model: patient lists and source records."""
        if self._backend is not None:
            return self._backend
        if self._catalog is None:
            if self.backend_kind == "embedded":
                from search.backends.embedded import EmbeddedBackend

                self._catalog = EmbeddedBackend(self.index_path, None)
            else:
                self._catalog = self._elastic(None, check_model=False)
        return self._catalog

    def patients(self, tenant: str) -> list[dict]:
        return self.catalog.list_patients(tenant)

    def has_patients(self, tenant: str) -> bool:
        """Whether the index holds any of the tenant's patients (a Bulk round on an emptied index
        starts from scratch, whatever its cursor says)."""
        return self.catalog.has_patients(tenant)

    def patient(self, tenant: str, patient_id: str) -> dict | None:
        return self.catalog.get_patient(tenant, patient_id)

    def held_resources(self, tenant: str, patient_id: str) -> list[dict]:
        """The source resources the index holds for the patient (what a merge starts from)."""
        return self.backend.patient_resources(tenant, patient_id)

    def delete_resources(self, tenant: str, patient_id: str, refs: list[str]) -> int:
        """These resources ("Type/id") of this patient leave the index, the patient's summary
        counting without them; another patient's of the same Type/id stay. Returns the chunks removed."""
        removed = self.backend.delete_refs(tenant, patient_id, refs)
        self.rebuild_profiles(tenant, [patient_id])
        return removed

    def rebuild_profiles(self, tenant: str, patient_ids: Iterable[str], chunks: dict[str, list] | None = None) -> int:
        """These patients' similarity profiles rebuilt from what the index now holds of them (or
        removed, when it holds nothing); `chunks`, their chunks when the caller has them read."""
        from search.indexer import rebuild_profiles

        def held():
            for pid in patient_ids:
                own = chunks.get(pid, []) if chunks is not None else \
                    self.backend.get_chunks(tenant, list(self.backend.indexed_texts(tenant, pid)))
                yield pid, self.backend.patient_resources(tenant, pid), own

        return rebuild_profiles(self.backend, self.embedder, tenant, held())

    def repair_profiles(self, tenant: str) -> dict[str, int]:
        """What `check --repair` mends of the similarity profiles, from what the index holds (no EHR
        is asked): the missing, another model's and an earlier version's built, those of patients
        gone removed."""
        gaps = self.backend.profile_gaps(tenant)
        built = self.rebuild_profiles(tenant, sorted({*gaps.missing, *gaps.other_model, *gaps.older}))
        for orphan in gaps.orphaned:
            self.backend.delete_profile(tenant, orphan)
        return {"built": built, "removed": len(gaps.orphaned)}

    def holders(self, tenant: str, refs: list[str]) -> dict[str, set[str]]:
        """The patients whose held record holds each of these resources ("Type/id")."""
        return self.backend.holders(tenant, refs)

    def resource(self, tenant: str, patient_id: str, ref: str) -> dict | None:
        return self.catalog.get_resource(tenant, patient_id, ref)

    def draft(self, tenant: str, patient_id: str, kind: str) -> dict:
        """A pre-visit summary or medication review draft, every line cited; never saved here."""
        from search.answering.drafts import DraftBuilder

        return DraftBuilder(kind, self.context(tenant, patient_id)).build()

    def reply(self, tenant: str, patient_id: str, message: str, urgent_text: str | None = None, words: int = 75,
              use_llm: bool = True) -> dict:
        """A reply draft to a patient's portal message, every sentence citing its evidence; never sent."""
        from search.reply.compose import DEFAULT_URGENT_TEXT, build_reply

        with self.questions.one():
            return build_reply(self, tenant, patient_id, message, urgent_text or DEFAULT_URGENT_TEXT, words,
                               use_llm=use_llm).to_dict()

    def context(self, tenant: str, patient_id: str, similar: bool = False) -> dict:
        """The structured context bundle (problems, medications, allergies, labs, vitals, encounters);
        with `similar` (the caller checked it is enabled), the similar patients too."""
        from fhir_ingest.record.context import context_bundle

        bundle = context_bundle(self.catalog.patient_resources(tenant, patient_id))
        if similar:
            bundle["similar_patients"] = self.similar(tenant, patient_id)
        return bundle

    def similar(self, tenant: str, patient_id: str, k: int = 5) -> dict:
        """The k most similar patients of the tenant, de-identified (search/similar/peers.py); the
        profiles hold their vectors, so no model is loaded."""
        from search.similar.peers import similar_patients

        return similar_patients(self.catalog, tenant, patient_id, k)

    def cohort(self, tenant: str, comparison) -> dict:
        """Aggregates over the tenant's patients (search/similar/cohort.py)."""
        from search.similar.cohort import compare

        return compare(self.catalog, tenant, comparison)

    def close(self) -> None:
        for backend in (self._backend, self._catalog):
            if backend is not None:
                backend.close()

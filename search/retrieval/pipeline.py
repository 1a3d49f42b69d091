"""Staged retrieval: each stage is a small function with typed input and output, timed and counted.

Pipelines:
  dense  — dense kNN over the patient's chunks (the baseline)
  hybrid — BM25 over concept-normalised text ∪ dense, fused with reciprocal rank fusion
  full   — analyse → filter (time, note type; recall guard) → recall with concept expansion →
           recovery of chunks sharing a question concept → deterministic feature rerank (plus an optional cross-encoder) → select
Stages of `full` can be switched off (`ablate`) to measure what each one earns.

The stage list and its runner; the types are in types.py, question analysis in analysis.py and
ranking in ranking.py."""
from __future__ import annotations

import time
from dataclasses import replace
from datetime import date, timedelta

from fhir_ingest.record.contract import Chunk
from search.backends.base import Backend, Scope, Search
from search.models.crossrank import CrossEncoderRanker
from search.models.embed import Embedder
from search.retrieval.timeline import anchor
from search.retrieval.types import (Analysis, Evidence, Retrieval, RetrievalState, Stage, StageReport, Tools,
                                    state_fields)
from search.retrieval.analysis import (NOTE_TYPES, absent_words, analyse, anchored_on_one_side, expanded_query,
                                       read_abbreviations_by_the_record, read_ambiguous_words_by_the_record,
                                       spans_notes, terms_of)
from search.retrieval.ranking import (RESULT_TYPES, SEVERAL_TIMES, in_window, is_result_of, rerank, rrf,
                                      same_test, select, series_ends, with_defining_orders, with_series_ends)


PIPELINES = ("dense", "hybrid", "full")
ABLATABLE = ("filter", "recovery", "rerank", "series")
RECALL_N = 50
RECOVERY_N = 40
FILTER_GUARD = 6          # a filter that leaves fewer chunks than this is widened, then dropped


# --- stage 3: filter ----------------------------------------------------------------------------

def _widen(day_iso: str, days: int) -> str:
    return (date.fromisoformat(day_iso) + timedelta(days=days)).isoformat()


def filter_scope(backend: Backend, scope: Scope, analysis: Analysis) -> tuple[Scope, str]:
    """Narrow by the asked-for dates and, for note questions, to notes; widen when too little is left."""
    candidates = []
    if analysis.date_from or analysis.date_to:
        base = replace(scope, date_from=analysis.date_from, date_to=analysis.date_to)
        wide = replace(scope, date_from=_widen(analysis.date_from, -31) if analysis.date_from else "",
                       date_to=_widen(analysis.date_to, 31) if analysis.date_to else "")
        candidates += [(base, "dates"), (wide, "dates ±1 month")]
    # "Insurance per the social history?" asks a note, unless the record holds the kind of record
    # the question names (a Coverage): then the structured record must stay in reach.
    named_kind_held = (bool(analysis.kinds) and not analysis.names_a_note
                       and backend.count(replace(scope, semantic_types=analysis.kinds)) > 0)
    if analysis.wants_note_content and not named_kind_held:
        candidates = [(replace(s, semantic_types=NOTE_TYPES), f"notes, {why}") for s, why in candidates] + candidates
        candidates.append((replace(scope, semantic_types=NOTE_TYPES), "notes"))
    for narrowed, why in candidates:
        if backend.count(narrowed) >= (1 if narrowed.semantic_types and narrowed.date_from else FILTER_GUARD):
            return narrowed, why
    return scope, "none"


def visits_named(backend: Backend, scope: Scope, analysis: Analysis) -> set[str]:
    """"The chief complaint at the Jan 2025 ER visit": the encounters in scope of the kind the
    question names, so that of several notes near the date, the one written at that visit ranks."""
    kinds = sorted(c["key"] for c in analysis.concepts if c["semantic_type"] == "encounter")
    if not (analysis.wants_note and kinds):
        return set()
    hits = backend.search_concepts(replace(scope, semantic_types=("encounter",)), kinds, 200)
    return {chunk.ref for chunk in backend.get_chunks(scope.tenant, [h.chunk_id for h in hits])}


def run_stages(stages: list[Stage], state: RetrievalState, tools: Tools) -> list[StageReport]:
    """The one runner: every stage timed and counted the same way."""
    reports: list[StageReport] = []
    for stage in stages:
        started = time.perf_counter()
        n_out, note = stage.run(state, tools)
        ms = (time.perf_counter() - started) * 1000
        if stage.reported:
            n_in = state.corpus if stage.whole_record or not reports else reports[-1].n_out
            reports.append(StageReport(stage.name, n_in, n_out, ms, n_out / state.corpus if state.corpus else 0.0, note))
            if state.evidence:      # what the ranking looks like after it: recall@k per stage (chartcite eval)
                state.ranked_after[stage.name] = [ev.chunk.refs or [ev.chunk.ref] for ev in state.evidence]
    return reports


# --- the stages -----------------------------------------------------------------------------------------

def count_scope(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.corpus = tools.backend.count(state.scope)
    return state.corpus, ""


def analyse_question(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    backend, tenant = tools.backend, state.tenant
    analysis = analyse(state.question, state.terms)
    if state.corpus:
        read_ambiguous_words_by_the_record(analysis, backend, tenant, state.patient_id)
        read_abbreviations_by_the_record(analysis, backend, tenant, state.patient_id)
    # A clinical word that this patient's record never uses is something the record cannot
    # answer: "breast" for a patient with prostate cancer, "monofilament" for a patient never
    # tested. Clinical by the general vocabulary, never by other patients' records
    # (search/nlp/vocabulary.py).
    absent = absent_words(backend, tenant, state.patient_id, analysis) if state.corpus else set()
    state.analysis, state.absent = analysis, absent
    return state.corpus, ", ".join(analysis.names + analysis.intents() + [f"absent: {t}" for t in sorted(absent)])


def analyse_with_record(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """The question read against the record's own terms (read once: the anchor stage uses them too),
    and how much of the record is still searchable by its words only."""
    summary = tools.backend.get_patient(state.tenant, state.patient_id) or {}
    state.terms, state.vectors_pending = terms_of(summary), int(summary.get("vectors_pending") or 0)
    return analyse_question(state, tools)


def anchor_in_time(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """"At the sore-throat visit", "the last three": the window and the count the question means."""
    analysis = state.analysis
    one_side = anchored_on_one_side(state.question)
    found = anchor(tools.backend, state.scope, state.question, state.terms,
                   explicit=bool(analysis.date_from or analysis.date_to)) if state.corpus and not one_side else None
    if found and found.missing:
        analysis.unplaced = found.missing
    elif found:
        analysis.date_from, analysis.date_to = found.date_from, found.date_to
    state.k = max(state.k, analysis.last_n)
    return state.corpus, found.note if found else ""


def narrow_scope(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.scope, why = filter_scope(tools.backend, state.scope, state.analysis)
    return (tools.backend.count(state.scope) if why != "none" else state.corpus), why


def _recalled(state: RetrievalState) -> int:
    return len({h.chunk_id for h in state.dense_hits} | {h.chunk_id for h in state.lexical_hits})


def recall_dense(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.dense_hits = tools.backend.search_vector(state.scope, tools.embedder.encode_query(state.question), RECALL_N)
    return _recalled(state), ""


def recall_hybrid(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    recall_dense(state, tools)
    state.lexical_hits = tools.backend.search_text(state.scope, " ".join(state.analysis.terms), RECALL_N)
    return _recalled(state), ""


def recall_expanded(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Both recalls with the question's concepts and their synonyms added, and the recovery
    stage's searches with them: one round trip to a networked backend instead of four."""
    analysis = state.analysis
    dense_text = f"{state.question} {' '.join(analysis.names + analysis.expansions)}".strip()
    searches = [Search("vector", state.scope, tools.embedder.encode_query(dense_text), RECALL_N),
                Search("text", state.scope, expanded_query(analysis), RECALL_N)] + recovery_searches(state)
    results = tools.backend.search_many(searches)
    state.dense_hits, state.lexical_hits = results[0], results[1]
    state.recovery_hits = [h for hits in results[2:] for h in hits]
    return _recalled(state), ""


def recovery_searches(state: RetrievalState) -> list[Search]:
    """Chunks asserting the question's concepts; for "her most recent note" without one, the newest."""
    analysis = state.analysis
    searches = [Search("concepts", state.scope, sorted(analysis.keys), RECOVERY_N)]
    if analysis.wants_latest and not analysis.keys:
        searches.append(Search("latest", state.scope, None, 10))
    return searches


def chunks_of(state: RetrievalState, tools: Tools, ids: list[str]) -> dict[str, Chunk]:
    """Chunks by id, read once per question."""
    missing = [c for c in ids if c not in state.chunk_cache]
    state.chunk_cache.update({c.chunk_id: c for c in tools.backend.get_chunks(state.tenant, missing)})
    return {c: state.chunk_cache[c] for c in ids if c in state.chunk_cache}


def _evidence(state: RetrievalState, tools: Tools, fused: dict[str, float]) -> tuple[int, str]:
    dense_scores = {h.chunk_id: h.score for h in state.dense_hits}
    dense_rank = {h.chunk_id: i for i, h in enumerate(state.dense_hits)}
    lexical_rank = {h.chunk_id: i for i, h in enumerate(state.lexical_hits)}
    ids = sorted(fused, key=lambda c: (-fused[c], c))
    # The recovery stage's chunks come in the same read (one mget, not two).
    prefetch = [h.chunk_id for h in state.recovery_hits or [] if h.chunk_id not in fused]
    chunks = chunks_of(state, tools, ids + list(dict.fromkeys(prefetch)))
    state.evidence = [Evidence(chunks[c], fused[c], dense_scores.get(c), lexical_rank.get(c), dense_rank.get(c))
                      for c in ids if c in chunks]
    return len(state.evidence), ""


def fuse_dense(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    return _evidence(state, tools, {h.chunk_id: h.score for h in state.dense_hits})


def fuse_rrf(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    return _evidence(state, tools, rrf(state.lexical_hits, state.dense_hits))


def recover_concepts(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Chunks that assert a concept of the question but neither recall found."""
    have = {ev.chunk.chunk_id for ev in state.evidence}
    hits = state.recovery_hits
    if hits is None:
        hits = [h for found in tools.backend.search_many(recovery_searches(state)) for h in found]
    missed = list(dict.fromkeys(h.chunk_id for h in hits if h.chunk_id not in have))
    floor = min((ev.score for ev in state.evidence), default=0.0)
    chunks = chunks_of(state, tools, missed)
    state.evidence += [Evidence(chunks[c], floor, recovered=True) for c in missed if c in chunks]
    return len(state.evidence), f"+{len(missed)}"


def keep_candidates(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.candidates = list(state.evidence)
    return len(state.evidence), ""


def name_visits(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """The encounters the question names ("the sore-throat visit"), for the rerank and the answer."""
    state.analysis.visit_refs = visits_named(tools.backend, state.scope, state.analysis)
    return len(state.evidence), ""


def rerank_features(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.evidence = rerank(state.evidence, state.analysis, tools.reranker)
    return len(state.evidence), f"cross-encoder {tools.reranker.name}" if tools.reranker else "features"


def select_top_k(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.evidence = select(state.evidence, state.k, by_fact=False)
    return len(state.evidence), ""


def select_facts(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Top-k by fact; lists and histories prefer facts not yet covered."""
    analysis = state.analysis
    per_note = NOTE_SHARE if spans_notes(analysis) else 0
    state.evidence = select(state.evidence, state.k, diverse=analysis.wants_list or analysis.wants_ever,
                            per_note=per_note)
    return len(state.evidence), f"at most {per_note} chunks a note" if per_note else ""


# A question that compares across notes ("the 2008 duplex vs at surgery") keeps room in its evidence for other notes: a long note is cut into many chunks
# that all rank well for its topic, and the other note's answering chunk fell below the top k.
NOTE_SHARE = 2


HISTORY_N = 200       # orders of one drug read to fold its history (decades of monthly refills)


def gather_histories(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Every order, in the whole record, of the drugs the selected evidence names (by the record's
    own drug codes and ingredients), so "still on", "first rx" and "latest" are answered over the drug's whole
    history and not over the few orders that ranked well."""
    codes = sorted({c["key"] for ev in state.evidence if ev.chunk.semantic_type == "medication"
                    for c in ev.chunk.concepts
                    if c.get("semantic_type") == "medication" and not c.get("negated")
                    and (c.get("role") == "member" or not c["key"].startswith("lex:"))})
    every = state.analysis.asks_every_medication
    if not codes and not every:
        return len(state.evidence), ""
    scope = Scope(state.tenant, state.patient_id, semantic_types=("medication",))
    # Asked for the medication list, the newest orders of the whole record too: an active order
    # that did not rank still answers "what is she on?".
    searches = ([Search("concepts", scope, codes, HISTORY_N)] if codes else []) + (
        [Search("latest", scope, None, HISTORY_N)] if every else [])
    hits = list({h.chunk_id: h for found in tools.backend.search_many(searches) for h in found}.values())
    chunks = chunks_of(state, tools, [h.chunk_id for h in hits])
    state.histories = [Evidence(chunks[h.chunk_id], 0.0) for h in hits if h.chunk_id in chunks]
    several = bool(SEVERAL_TIMES.search(state.question)) or state.analysis.wants_ever or state.analysis.wants_list
    state.evidence = with_defining_orders(state.evidence, state.histories, state.analysis.wants_first, keep=several)
    return len(state.evidence), f"{len(state.histories)} orders of {len(codes)} drug codes" + (
        " and the newest of the record" if every else "")


SERIES_N = 500        # results of one asked test read to find its end (decades of monthly weights)


def gather_series(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """For "latest" (or "first") of a test the selected evidence answers with results: the ends of
    that test's series over the whole record, in the place of the results that ranked. A long
    series of equal values ranks its dates at random; the answer must rest on its newest (and the
    one before it, which it states beside it) or its oldest, however many results there are."""
    analysis = state.analysis
    if not (analysis.wants_latest or analysis.wants_first) or analysis.wants_trend or analysis.last_n:
        return len(state.evidence), ""
    # The test the answer rests on: the first ranked result asserting an asked concept. One asked
    # word may be a broader concept several tests assert ("K+" is an electrolyte, as sodium is).
    top = next((ev.chunk for ev in state.evidence if any(is_result_of(ev.chunk, k) for k in analysis.keys)), None)
    if top is None:
        return len(state.evidence), ""
    asked = [key for key in sorted(analysis.keys) if is_result_of(top, key)][:1]
    wanted = state.scope.semantic_types
    scope = replace(state.scope, semantic_types=tuple(t for t in RESULT_TYPES if not wanted or t in wanted))
    found = tools.backend.search_many([Search("concepts", scope, [key], SERIES_N) for key in asked])
    chunks = chunks_of(state, tools, list(dict.fromkeys(h.chunk_id for hits in found for h in hits)))
    read = 0
    for key, hits in zip(asked, found):
        results = [chunks[h.chunk_id] for h in hits if h.chunk_id in chunks]
        # Within the window the question names ("latest A1c in 2022"), when the filter was widened.
        windowed = analysis.date_from or analysis.date_to
        series = sorted((c for c in results if is_result_of(c, key) and same_test(c, top)
                         and (not windowed or in_window(c, analysis))),
                        key=lambda c: (c.date, c.chunk_id))
        read += len(series)
        state.evidence = with_series_ends(state.evidence, key, series_ends(series, analysis.wants_first))
    return len(state.evidence), f"{read} results of {len(asked)} asked tests"


# --- the pipelines: lists of stages -----------------------------------------------------------------------

def step(name: str, run, reads: str, writes: str, **kind) -> Stage:
    return Stage(name, run, state_fields(reads), state_fields(writes), **kind)


# Each step with what it reads and writes of the state (checked against its source by the tests).
SCOPE = step("scope", count_scope, "corpus scope", "corpus", whole_record=True)
CANDIDATES = step("candidates", keep_candidates, "evidence", "candidates", reported=False)
FUSE_RRF = step("fuse", fuse_rrf, "chunk_cache dense_hits evidence lexical_hits recovery_hits tenant",
                "chunk_cache evidence")
STAGES = {
    "dense": [
        SCOPE,
        step("analyse", analyse_question, "corpus patient_id question tenant terms", "absent analysis",
             whole_record=True),
        step("recall", recall_dense, "dense_hits lexical_hits question scope", "dense_hits"),
        step("fuse", fuse_dense, "chunk_cache dense_hits evidence lexical_hits recovery_hits tenant",
             "chunk_cache evidence"),
        CANDIDATES,
        step("select", select_top_k, "evidence k", "evidence"),
    ],
    "hybrid": [
        SCOPE,
        step("analyse", analyse_question, "corpus patient_id question tenant terms", "absent analysis",
             whole_record=True),
        step("recall", recall_hybrid, "analysis dense_hits lexical_hits question scope", "dense_hits lexical_hits"),
        FUSE_RRF,
        CANDIDATES,
        step("select", select_top_k, "evidence k", "evidence"),
    ],
    "full": [
        SCOPE,
        step("analyse", analyse_with_record, "corpus patient_id question tenant terms",
             "absent analysis terms vectors_pending", whole_record=True),
        step("anchor", anchor_in_time, "analysis corpus k question scope terms", "analysis k", whole_record=True),
        step("filter", narrow_scope, "analysis corpus scope", "scope", whole_record=True),
        step("recall", recall_expanded, "analysis dense_hits lexical_hits question scope",
             "dense_hits lexical_hits recovery_hits"),
        FUSE_RRF,
        step("recovery", recover_concepts, "analysis chunk_cache evidence recovery_hits scope tenant",
             "chunk_cache evidence"),
        CANDIDATES,
        step("visits", name_visits, "analysis evidence scope", "analysis", reported=False),
        step("rerank", rerank_features, "analysis evidence", "evidence"),
        step("select", select_facts, "analysis evidence k", "evidence"),
        step("series", gather_series, "analysis chunk_cache evidence scope tenant", "chunk_cache evidence"),
        step("histories", gather_histories, "analysis chunk_cache evidence histories patient_id question tenant",
             "chunk_cache evidence histories"),
    ],
}


def pipeline_stages(pipeline: str, ablate: tuple[str, ...] = ()) -> list[Stage]:
    """The stages of a pipeline; ablating removes stages by name."""
    if pipeline not in STAGES:
        raise ValueError(f"unknown pipeline {pipeline!r}; choose one of {', '.join(PIPELINES)}")
    unknown = set(ablate) - set(ABLATABLE)
    if unknown:
        raise ValueError(f"cannot ablate {', '.join(sorted(unknown))}; choose from {', '.join(ABLATABLE)}")
    return [stage for stage in STAGES[pipeline] if stage.name not in ablate]


def retrieve(backend: Backend, embedder: Embedder, question: str, tenant: str, patient_id: str,
             k: int = 5, pipeline: str = "full", ablate: tuple[str, ...] = (),
             reranker: CrossEncoderRanker | None = None) -> Retrieval:
    stages = pipeline_stages(pipeline, ablate)
    state = RetrievalState(question, tenant, patient_id, k, Scope(tenant, patient_id))
    reports = run_stages(stages, state, Tools(backend, embedder, reranker))
    return Retrieval(question, pipeline, state.analysis, state.evidence, reports, state.corpus, state.scope,
                     state.candidates, state.absent, state.histories, state.ranked_after, state.vectors_pending)

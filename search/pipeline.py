"""Staged retrieval: each stage is a small function with typed input and output, timed and counted.

Pipelines:
  dense  — dense kNN over the patient's chunks (the baseline)
  hybrid — BM25 over concept-normalised text ∪ dense, fused with reciprocal rank fusion
  full   — hybrid with query expansion and a deterministic feature rerank (concepts, dates, recency)
"""
from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field
from datetime import date

from fhir_ingest.contract import Chunk

from .backend import Backend, Hit, Scope
from .embed import Embedder
from .lexicon import Match, content_tokens, default_lexicon

PIPELINES = ("dense", "hybrid", "full")
RECALL_N = 50
RRF_K = 60

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
MONTHS["sept"] = 9
_MONTH_RE = "|".join(sorted(MONTHS, key=len, reverse=True))
LATEST_WORDS = re.compile(r"\b(latest|last|most recent|recent|current|currently|now|today|newest)\b", re.I)
TREND_WORDS = re.compile(r"\b(trend|trending|over time|been|history of|changed|change|progress|control)\b", re.I)


@dataclass
class Analysis:
    question: str
    matches: list[Match]
    terms: list[str]                 # content words of the question
    concepts: list[str]              # canonical concept names found
    semantic_types: list[str]
    date_from: str = ""
    date_to: str = ""
    wants_latest: bool = False
    wants_trend: bool = False


@dataclass
class Evidence:
    chunk: Chunk
    score: float
    dense: float | None = None       # cosine similarity to the question, when the chunk was seen by dense recall
    lexical_rank: int | None = None
    dense_rank: int | None = None
    features: dict = field(default_factory=dict)


@dataclass
class StageReport:
    name: str
    n_in: int
    n_out: int
    ms: float
    corpus_ratio: float

    def to_dict(self) -> dict:
        return {"name": self.name, "in": self.n_in, "out": self.n_out, "ms": round(self.ms, 2),
                "corpus_ratio": round(self.corpus_ratio, 4)}


@dataclass
class Retrieval:
    question: str
    pipeline: str
    analysis: Analysis
    evidence: list[Evidence]
    stages: list[StageReport]
    corpus_size: int


# --- stage 2: analyse ---------------------------------------------------------------------------

def analyse(question: str) -> Analysis:
    lexicon = default_lexicon()
    matches = lexicon.find(question, in_question=True)
    concepts = sorted({m.canonical for m in matches} | {m.drug_class for m in matches if m.drug_class})
    semantic_types = sorted({m.semantic_type for m in matches})
    date_from, date_to = time_window(question)
    return Analysis(question, matches, content_tokens(question), concepts, semantic_types, date_from, date_to,
                    wants_latest=bool(LATEST_WORDS.search(question)), wants_trend=bool(TREND_WORDS.search(question)))


def time_window(question: str) -> tuple[str, str]:
    """Explicit dates in the question → an inclusive ISO window ('May 30, 2025', 'Oct 2022', 'since 2023')."""
    q = question.lower()
    m = re.search(r"\b(\d{4})-(\d{2})-(\d{2})\b", q)
    if m:
        return m.group(0), m.group(0)
    m = re.search(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", q)
    if m:
        d = date(int(m.group(3)), MONTHS[m.group(1)], int(m.group(2)))
        return d.isoformat(), d.isoformat()
    m = re.search(rf"\b({_MONTH_RE})\.?\s+(\d{{4}})\b", q)
    if m:
        year, month = int(m.group(2)), MONTHS[m.group(1)]
        last = calendar.monthrange(year, month)[1]
        since = re.search(rf"\b(since|after|from)\s+{re.escape(m.group(0))}", q)
        return f"{year:04d}-{month:02d}-01", ("" if since else f"{year:04d}-{month:02d}-{last:02d}")
    m = re.search(r"\b(since|after|from)\s+(\d{4})\b", q)
    if m:
        return f"{m.group(2)}-01-01", ""
    m = re.search(r"\b(?:in|during|of)\s+(\d{4})\b", q) or re.search(r"\b(19[5-9]\d|20[0-4]\d)\b", q)
    if m:
        return f"{m.group(1)}-01-01", f"{m.group(1)}-12-31"
    return "", ""


def expanded_query(analysis: Analysis) -> str:
    """The question's content words plus canonical concept names and classes (LLM-free expansion)."""
    return " ".join(analysis.terms + analysis.concepts)


# --- stage 4: recall and fusion -------------------------------------------------------------------

def rrf(*rankings: list[Hit]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking):
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + 1.0 / (RRF_K + rank + 1)
    return scores


# --- stage 6: rerank ------------------------------------------------------------------------------

def in_window(chunk: Chunk, analysis: Analysis) -> bool:
    d = chunk.date[:10]
    if not d or not (analysis.date_from or analysis.date_to):
        return False
    return (not analysis.date_from or d >= analysis.date_from) and (not analysis.date_to or d <= analysis.date_to)


def concept_overlap(chunk: Chunk, analysis: Analysis) -> float:
    if not analysis.concepts:
        return 0.0
    names = {c["display"].lower() for c in chunk.concepts}
    return sum(1 for c in analysis.concepts if c in names) / len(analysis.concepts)


def rerank(evidence: list[Evidence], analysis: Analysis) -> list[Evidence]:
    """Deterministic feature rerank: concept overlap, the asked-for dates, recency for 'latest'."""
    if not evidence:
        return evidence
    newest: dict[str, str] = {}
    for ev in evidence:
        for c in ev.chunk.concepts:
            key = c["display"].lower()
            if ev.chunk.date > newest.get(key, ""):
                newest[key] = ev.chunk.date
    top_fused = max(ev.score for ev in evidence) or 1.0
    for ev in evidence:
        f = {
            "fused": ev.score / top_fused,
            "concepts": concept_overlap(ev.chunk, analysis),
            "in_window": 1.0 if in_window(ev.chunk, analysis) else 0.0,
            "latest": 0.0,
            "type": 1.0 if ev.chunk.semantic_type in analysis.semantic_types else 0.0,
            "trend": 1.0 if analysis.wants_trend and ev.chunk.category == "trend" else 0.0,
        }
        if analysis.wants_latest and f["concepts"] > 0:
            matched = [c["display"].lower() for c in ev.chunk.concepts if c["display"].lower() in analysis.concepts]
            f["latest"] = 1.0 if any(ev.chunk.date and ev.chunk.date >= newest.get(m, "") for m in matched) else 0.0
        ev.features = f
        ev.score = (f["fused"] + 0.6 * f["concepts"] + 0.5 * f["in_window"] + 0.4 * f["latest"]
                    + 0.15 * f["type"] + 0.3 * f["trend"])
    return sorted(evidence, key=lambda e: (-e.score, e.chunk.chunk_id))


# --- stage 7: select ------------------------------------------------------------------------------

def select(evidence: list[Evidence], k: int) -> list[Evidence]:
    """Top-k without twins: one chunk per identical text, one note's twin forms once."""
    chosen, seen_text = [], set()
    for ev in evidence:
        key = " ".join(ev.chunk.text.split()).lower()
        if key in seen_text:
            continue
        seen_text.add(key)
        chosen.append(ev)
        if len(chosen) == k:
            break
    return chosen


# --- the pipeline -----------------------------------------------------------------------------------

class _Timer:
    def __init__(self, stages: list[StageReport], name: str, n_in: int, corpus: int):
        self.stages, self.name, self.n_in, self.corpus = stages, name, n_in, corpus

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def done(self, n_out: int) -> None:
        ms = (time.perf_counter() - self.t0) * 1000
        self.stages.append(StageReport(self.name, self.n_in, n_out, ms, n_out / self.corpus if self.corpus else 0.0))

    def __exit__(self, *exc):
        return False


def retrieve(backend: Backend, embedder: Embedder, question: str, tenant: str, patient_id: str,
             k: int = 5, pipeline: str = "full") -> Retrieval:
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; choose one of {', '.join(PIPELINES)}")
    stages: list[StageReport] = []
    scope = Scope(tenant, patient_id)

    t0 = time.perf_counter()
    corpus = backend.count(scope)
    stages.append(StageReport("scope", corpus, corpus, (time.perf_counter() - t0) * 1000, 1.0 if corpus else 0.0))

    with _Timer(stages, "analyse", corpus, corpus) as t:
        analysis = analyse(question)
        t.done(corpus)

    with _Timer(stages, "recall", corpus, corpus) as t:
        dense_text = question if pipeline == "dense" else f"{question} {' '.join(analysis.concepts)}".strip()
        dense_hits = backend.search_vector(scope, embedder.encode_query(dense_text), RECALL_N)
        lexical_hits = [] if pipeline == "dense" else backend.search_text(
            scope, expanded_query(analysis) if pipeline == "full" else " ".join(analysis.terms), RECALL_N)
        t.done(len({h.chunk_id for h in dense_hits} | {h.chunk_id for h in lexical_hits}))

    with _Timer(stages, "fuse", stages[-1].n_out, corpus) as t:
        if pipeline == "dense":
            fused = {h.chunk_id: h.score for h in dense_hits}
        else:
            fused = rrf(lexical_hits, dense_hits)
        dense_scores = {h.chunk_id: h.score for h in dense_hits}
        dense_rank = {h.chunk_id: i for i, h in enumerate(dense_hits)}
        lexical_rank = {h.chunk_id: i for i, h in enumerate(lexical_hits)}
        ids = sorted(fused, key=lambda c: (-fused[c], c))
        chunks = {c.chunk_id: c for c in backend.get_chunks(tenant, ids)}
        evidence = [Evidence(chunks[c], fused[c], dense_scores.get(c), lexical_rank.get(c), dense_rank.get(c))
                    for c in ids if c in chunks]
        t.done(len(evidence))

    if pipeline == "full":
        with _Timer(stages, "rerank", len(evidence), corpus) as t:
            evidence = rerank(evidence, analysis)
            t.done(len(evidence))

    with _Timer(stages, "select", len(evidence), corpus) as t:
        evidence = select(evidence, k)
        t.done(len(evidence))

    return Retrieval(question, pipeline, analysis, evidence, stages, corpus)

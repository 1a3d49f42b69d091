"""Ranking: fusion, the feature rerank (and the optional cross-encoder), selection of the top k,
and the series and order histories the ranked evidence is completed with."""
from __future__ import annotations

import re
from dataclasses import replace

from fhir_ingest.record.contract import Chunk
from fhir_ingest.record.notes import section_kind, section_kinds
from search.nlp.annotate import asserted_keys
from search.backends.base import Hit
from search.models.crossrank import CrossEncoderRanker
from search.retrieval.types import Analysis, Evidence


RRF_K = 60


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
    """Share of the question's concepts the chunk asserts."""
    if not analysis.keys:
        return 0.0
    return len(asserted_keys(chunk.concepts) & analysis.keys) / len(analysis.keys)


def negated_overlap(chunk: Chunk, analysis: Analysis) -> bool:
    """The chunk mentions a question concept only to deny it ("No Known Allergies.")."""
    keys = analysis.keys
    mentioned = {c["key"] for c in chunk.concepts if c["key"] in keys}
    return bool(mentioned) and not (mentioned & asserted_keys(chunk.concepts))


def newest_results(evidence: list[Evidence], analysis: Analysis) -> set[str]:
    """For "last 3 A1c values": the newest N single results asserting what was asked, one per day."""
    if not analysis.last_n:
        return set()
    results = sorted((ev.chunk for ev in evidence if ev.chunk.resource_type == "Observation"
                      and ev.chunk.category != "trend" and asserted_keys(ev.chunk.concepts) & analysis.keys),
                     key=lambda c: c.date, reverse=True)
    chosen, days = set(), set()
    for chunk in results:
        if chunk.date[:10] not in days and len(chosen) < analysis.last_n:
            days.add(chunk.date[:10])
            chosen.add(chunk.chunk_id)
    return chosen


def holds_asked_section(chunk: Chunk, analysis: Analysis) -> bool:
    """A note chunk that holds the section the question names ("presenting complaints" → Chief
    Complaint): of a note's pieces, that one answers."""
    asked = analysis.sections_asked
    if not asked or chunk.semantic_type != "note":
        return False
    # By the kind of section, as the answer reads them: "the impression" (asked as the assessment
    # and plan) is the note's IMPRESSION/PLAN or DISCUSSION AND PLAN, whatever it is titled.
    kinds = {section_kind(name) for name in asked} - {""}
    return any(heading.lower() in asked or kinds & set(section_kinds(heading)) for heading in chunk.sections)


# The feature rerank's weights. The fused recall score (an RRF score, about 0.02-0.03 at the
# top) orders chunks the features cannot tell apart; each feature is 0 or 1 except `concepts`
# (the share of the question's concepts a chunk asserts), so a weight says how many places a
# feature is worth against the others. Tuned on the dev questions, checked on questions nobody
# tuned on (README, "Retrieval quality").
RERANK_WEIGHTS = {
    "fused": 1.0,         # recall's own order
    "concepts": 0.8,      # asserts what was asked about: the strongest single signal
    "negated": -0.6,      # only mentions it to deny it ("no history of asthma")
    "in_window": 0.6,     # dated inside the window the question names
    "latest": 0.4,        # the newest of its concept, for "latest" questions
    "earliest": 0.4,      # the oldest of its concept, for "first" questions
    "type": 0.2,          # of a record type the question's words point at
    "trend": 0.4,         # a trend summary, for "trend" questions
    "structured": 0.3,    # a structured fact over a templated note line saying the same
    "kind": 1.0,          # of the kind asked for by name ("what procedures...")
    "section": 0.5,       # the note section asked for ("the assessment")
    "newest_n": 1.0,      # among the last N results asked for ("the last three A1c")
    "visit": 0.5,         # a note of the visit the question names
    "unasked": -1.0,      # the patient's demographics, when the question asks nothing of them
}
# What the Patient's own demographics passage answers ("birth date?", "how is the gender
# documented?"); to any other question it would only take a place from the clinical evidence.
ABOUT_THE_PATIENT = re.compile(r"\b(?:gender|sex|born|birth\w*|dob|age|old|language\w*|interpreter|deceased|died|"
                               r"death|alive|race|ethnic\w*|marital|married|demographic\w*)\b", re.I)


def rerank(evidence: list[Evidence], analysis: Analysis, reranker: CrossEncoderRanker | None = None) -> list[Evidence]:
    """Deterministic features: concepts asserted (not negated), the asked-for dates, the newest
    for 'latest', trend summaries for trends, structured facts over templated note lines; plus,
    when a cross-encoder is configured, its reading of question and text together."""
    if not evidence:
        return evidence
    newest: dict[str, str] = {}
    oldest: dict[str, str] = {}
    for ev in evidence:
        for key in asserted_keys(ev.chunk.concepts) & analysis.keys:
            if ev.chunk.date > newest.get(key, ""):
                newest[key] = ev.chunk.date
            if ev.chunk.date and ev.chunk.date < oldest.get(key, "9999"):
                oldest[key] = ev.chunk.date
    newest_any = max((ev.chunk.date for ev in evidence), default="")
    asked_n = newest_results(evidence, analysis)
    top_fused = max(ev.score for ev in evidence) or 1.0
    for ev in evidence:
        chunk = ev.chunk
        overlap = concept_overlap(chunk, analysis)
        matched = asserted_keys(chunk.concepts) & analysis.keys
        f = {
            "fused": ev.score / top_fused,
            "concepts": overlap,
            "negated": 1.0 if negated_overlap(chunk, analysis) else 0.0,
            "in_window": 1.0 if in_window(chunk, analysis) else 0.0,
            # A concept whose every record is undated has no newest or oldest: none of them is it.
            "latest": 1.0 if analysis.wants_latest and (
                any(k in newest and chunk.date >= newest[k] for k in matched) if analysis.keys
                else chunk.date[:10] == newest_any[:10]) else 0.0,
            "earliest": 1.0 if analysis.wants_first and chunk.category != "trend" and any(
                k in oldest and chunk.date <= oldest[k] for k in matched) else 0.0,
            "type": 1.0 if chunk.semantic_type in analysis.semantic_types else 0.0,
            "trend": 1.0 if analysis.wants_trend and chunk.category == "trend" else 0.0,
            "structured": 1.0 if overlap and chunk.semantic_type != "note" else 0.0,
            "kind": 1.0 if chunk.semantic_type in analysis.kinds else 0.0,
            "section": 1.0 if holds_asked_section(chunk, analysis) else 0.0,
            "newest_n": 1.0 if chunk.chunk_id in asked_n else 0.0,
            "visit": 1.0 if chunk.semantic_type == "note" and set(chunk.refs[1:]) & analysis.visit_refs else 0.0,
            "unasked": 1.0 if chunk.semantic_type == "demographics" and not ABOUT_THE_PATIENT.search(analysis.question)
            else 0.0,
        }
        ev.features = f
        ev.score = 0.0
        for name, weight in RERANK_WEIGHTS.items():   # summed in this order (ties are broken by id)
            ev.score += weight * f[name]
    ranked = sorted(evidence, key=lambda e: (-e.score, e.chunk.chunk_id))
    if reranker is not None:
        ranked = cross_rerank(ranked, analysis.question, reranker)
    return ranked


CROSS_WEIGHT = 1.0


def cross_rerank(ranked: list[Evidence], question: str, reranker: CrossEncoderRanker) -> list[Evidence]:
    """Add the cross-encoder's relevance to the best candidates' feature scores. The tail it does
    not read gets the lowest score it gave, so reading a candidate never costs it rank."""
    head = ranked[:reranker.max_pairs]
    scores = reranker.scores(question, [ev.chunk.text for ev in head])
    floor = min(scores, default=0.0)
    for i, ev in enumerate(ranked):
        cross = scores[i] if i < len(scores) else floor
        ev.features["cross"] = cross
        ev.score += CROSS_WEIGHT * cross
    return sorted(ranked, key=lambda e: (-e.score, e.chunk.chunk_id))


# --- stage 7: select ------------------------------------------------------------------------------

def fact_key(chunk: Chunk) -> str:
    """What makes two chunks the same fact: identical text, or for orders and results the same
    code (yearly renewals of one drug, the same analyte repeated on one day)."""
    if chunk.semantic_type == "medication" and chunk.codes:
        return "med:" + chunk.codes[0]["code"]
    if chunk.resource_type == "Observation" and chunk.category != "trend" and chunk.codes:
        return f"obs:{chunk.codes[0]['code']}:{chunk.date[:10]}:{measured_value(chunk)}"
    return "text:" + " ".join(chunk.text.split()).lower()


def measured_value(chunk: Chunk) -> str:
    """A result's value and components as its typed fact states them."""
    fact = chunk.fact or {}
    parts = [(fact.get("value") or {}).get("text", "")]
    parts += [f"{c['name']}: {c['value'].get('text', '')}" for c in fact.get("components") or []]
    return "; ".join(p for p in parts if p)


def select(evidence: list[Evidence], k: int, by_fact: bool = True, diverse: bool = False,
           per_note: int = 0) -> list[Evidence]:
    """Top-k without twins: one chunk per fact (identical text, a drug's renewals, repeated results).
    For lists and histories, a chunk that only repeats codes already chosen (the visit for a
    condition already listed) waits until the distinct facts are in. With `per_note`, a note's
    chunks beyond that many wait too, so one long note cannot fill the evidence of a question
    that spans notes."""
    chosen, deferred, seen, covered, of_note = [], [], set(), set(), {}
    for ev in evidence:
        key = fact_key(ev.chunk) if by_fact else "text:" + " ".join(ev.chunk.text.split()).lower()
        if key in seen:
            continue
        seen.add(key)
        codes = {f"{c['system']}|{c['code']}" for c in ev.chunk.codes} if diverse else set()
        note = ev.chunk.ref if ev.chunk.resource_type == "DocumentReference" else ""
        if (diverse and codes and codes <= covered) or (per_note and note and of_note.get(note, 0) >= per_note):
            deferred.append(ev)
            continue
        covered |= codes
        of_note[note] = of_note.get(note, 0) + 1
        chosen.append(ev)
        if len(chosen) == k:
            return chosen
    return (chosen + deferred)[:k]
RESULT_TYPES = ("lab", "vital", "social", "survey", "exam", "observation")


def is_result_of(chunk: Chunk, key: str) -> bool:
    """A single result (not a trend summary) asserting the concept."""
    return chunk.resource_type == "Observation" and chunk.category != "trend" and key in asserted_keys(chunk.concepts)


def same_test(chunk: Chunk, top: Chunk) -> bool:
    """A result of the top result's own test: a coding in common, or (where neither is coded) its name."""
    codes = {(c.get("system"), c.get("code")) for c in top.codes if c.get("code")}
    if codes:
        return any((c.get("system"), c.get("code")) in codes for c in chunk.codes)
    return not any(c.get("code") for c in chunk.codes) and chunk.label.partition(" on ")[0] == top.label.partition(" on ")[0]


def series_ends(series: list[Chunk], first: bool) -> list[Chunk]:
    """The newest result and the newest of an earlier day; for "first", the oldest and the newest."""
    if not series:
        return []
    newest = series[-1]
    if first:
        return [series[0]] + ([newest] if newest.chunk_id != series[0].chunk_id else [])
    before = [c for c in series if c.date[:10] < newest.date[:10]]
    return [newest] + before[-1:]


def with_series_ends(evidence: list[Evidence], key: str, ends: list[Chunk]) -> list[Evidence]:
    """`ends` where the first result of the test stood, taking its score; results of the test that
    are not an end give up their places, from the last, so that the evidence grows only when it
    held too few of them (the k passages an answer may rest on stay k)."""
    ends_ids = {c.chunk_id for c in ends}
    at = next(i for i, ev in enumerate(evidence) if is_result_of(ev.chunk, key))
    if [ev.chunk.chunk_id for ev in evidence[at:at + len(ends)]] == [c.chunk_id for c in ends]:
        return evidence
    # The ends in their order (newest, then the one before it) where the first result stood,
    # moved from wherever they ranked.
    before = [ev for ev in evidence[:at] if ev.chunk.chunk_id not in ends_ids]
    after = [ev for ev in evidence[at:] if ev.chunk.chunk_id not in ends_ids]
    out = before + [Evidence(c, evidence[at].score) for c in ends] + after
    for i in range(len(out) - 1, -1, -1):
        if len(out) <= len(evidence):
            break
        if is_result_of(out[i].chunk, key) and out[i].chunk.chunk_id not in ends_ids:
            del out[i]
    return out


SEVERAL_TIMES = re.compile(r"\b(both|each|every|times|all the)\b", re.I)


def with_defining_orders(evidence: list[Evidence], histories: list[Evidence], first: bool,
                         keep: bool = False) -> list[Evidence]:
    """Each drug's newest order (its oldest, for "first rx") in the place of the order of it that
    ranked: that is the order the answer rests on. The one it replaces goes to the end, unless the
    question asks about several of them ("same drug both times?"): then it stays after it."""
    have = {ev.chunk.chunk_id for ev in evidence}
    out, replaced = [], []
    for ev in evidence:
        if ev.chunk.semantic_type == "medication":
            codes = {c["key"] for c in ev.chunk.concepts if c.get("semantic_type") == "medication"
                     and not c["key"].startswith("lex:")}
            same = [h for h in histories if codes & {c["key"] for c in h.chunk.concepts}]
            pick = (min if first else max)(same, key=lambda h: h.chunk.date) if same else ev
            if pick.chunk.chunk_id not in have:
                have.add(pick.chunk.chunk_id)
                out.append(replace(pick, score=ev.score))
                if not keep:
                    replaced.append(ev)
                    continue
        out.append(ev)
    return out + replaced

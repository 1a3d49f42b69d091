"""Extractive answers: statements taken from the evidence, each citing where it came from.

No statement is written that the evidence does not contain. When the evidence does not mention
what the question asks about, the answer is the no-evidence sentence and cites nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .lexicon import STOP_WORDS, tokens
from .pipeline import Analysis, Evidence, Retrieval, concept_overlap

NO_EVIDENCE = "I don't have evidence for that in this patient's record."
NEW_PATIENT = "This is a new patient; I have no prior records."
MAX_STATEMENTS = 4

# Words of a question that say what kind of answer is wanted, not what it is about.
QUESTION_WORDS = frozenset("""
kind sort type which what when where why how many much ok okay give giving carry carrying using use used
getting going thinking ordering worked work-up workup brought bring happened happen show shows showed say says
said list lists listed document documented mention mentioned actually entries entry file on-file instead old
older new newer last few three two four five years year months month days day week weeks ago trend trended
trending changed change going up down draws draw checks check reading readings number numbers kid child adult
dx diagnosis diagnoses diagnosed problem problems any ever been has have had she he her his him they them
their per right now also again still next does did do done get got are was were be is it this that those these
the a an and or of for in on at to with from by as about into over under since until during while
""".split())


@dataclass
class Support:
    supported: bool
    coverage: float
    reason: str


def residual_terms(analysis: Analysis) -> list[str]:
    """Content words not covered by a recognised concept (e.g. 'pacemaker', 'breast')."""
    covered = set()
    for m in analysis.matches:
        covered.update(tokens(m.surface))
    return [t for t in analysis.terms
            if t not in covered and t not in QUESTION_WORDS and t not in STOP_WORDS and len(t) > 2 and not t.isdigit()]


def _stem(word: str) -> str:
    return word[:6] if len(word) > 6 else word.rstrip("s")


def term_in(term: str, text: str) -> bool:
    return re.search(rf"\b{re.escape(_stem(term))}", text, re.I) is not None


def judge_support(retrieval: Retrieval) -> Support:
    analysis, evidence = retrieval.analysis, retrieval.evidence
    if not evidence:
        return Support(False, 0.0, "no evidence retrieved")
    texts = " ".join(f"{e.chunk.label} {e.chunk.text} " + " ".join(c["display"] for c in e.chunk.concepts)
                     for e in evidence)
    residual = residual_terms(analysis)
    residual_hit = [t for t in residual if term_in(t, texts)]
    concept_hit = [c for c in analysis.concepts if any(concept_overlap(e.chunk, _only(analysis, c)) for e in evidence)]
    best_dense = max((e.dense for e in evidence if e.dense is not None), default=0.0)
    if analysis.concepts:
        if not concept_hit:
            return Support(False, 0.0, "the question's concepts are not in the record")
        if residual and not residual_hit and best_dense < 0.55:
            return Support(False, 0.5, "a qualifying term of the question is not in the record")
        items = len(analysis.concepts) + len(residual)
        return Support(True, (len(concept_hit) + len(residual_hit)) / items, "concepts found")
    if not residual:
        return Support(best_dense >= 0.35, 1.0 if best_dense >= 0.35 else 0.0, "semantic match only")
    coverage = len(residual_hit) / len(residual)
    if coverage >= 0.5 and best_dense >= 0.25:
        return Support(True, coverage, "terms found")
    return Support(False, coverage, "the question's terms are not in the record")


def _only(analysis: Analysis, concept: str) -> Analysis:
    return Analysis(analysis.question, [], [], [concept], [])


def statement_for(ev: Evidence, analysis: Analysis) -> str:
    """One or two sentences of a chunk: the whole fact for structured data, the best lines of a note."""
    text = ev.chunk.text
    if ev.chunk.semantic_type != "note":
        return text
    header, _, body = text.partition(". ")
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n", body) if s.strip()]
    wanted = set(analysis.terms) | {t for c in analysis.concepts for t in tokens(c)}
    scored = sorted(sentences, key=lambda s: -len(wanted & set(tokens(s))))
    best = [s for s in scored[:2] if wanted & set(tokens(s))] or sentences[:2]
    ordered = [s for s in sentences if s in best]
    return f"{header}: " + " ".join(ordered)


def relevant_evidence(retrieval: Retrieval) -> list[Evidence]:
    """The evidence worth a statement: it carries what was asked about, or is as close as the best."""
    analysis, evidence = retrieval.analysis, retrieval.evidence
    best_dense = max((e.dense for e in evidence if e.dense is not None), default=0.0)
    residual = residual_terms(analysis)
    keep = []
    for i, ev in enumerate(evidence):
        if analysis.concepts:
            ok = concept_overlap(ev.chunk, analysis) > 0
        else:
            ok = any(term_in(t, ev.chunk.text) for t in residual) or (ev.dense or 0) >= best_dense - 0.05
        if ok or i == 0:
            keep.append(ev)
    return keep


def compose(retrieval: Retrieval, patient_id: str, question_id: str | None = None) -> dict:
    base = {"id": question_id, "patient_id": patient_id, "question": retrieval.question}
    evidence_json = [
        {"rank": i + 1, "ref": e.chunk.ref, "refs": e.chunk.refs, "chunk_id": e.chunk.chunk_id,
         "score": round(e.score, 4), "label": e.chunk.label, "text": e.chunk.text}
        for i, e in enumerate(retrieval.evidence)
    ]
    diagnostics = {"pipeline": retrieval.pipeline, "corpus_size": retrieval.corpus_size,
                   "stages": [s.to_dict() for s in retrieval.stages]}
    if retrieval.corpus_size == 0:
        return {**base, "answer": NEW_PATIENT, "statements": [], "citations": [], "evidence": [],
                "confidence": "low", "abstained": True, "diagnostics": diagnostics}
    support = judge_support(retrieval)
    diagnostics["support"] = {"supported": support.supported, "coverage": round(support.coverage, 3),
                              "reason": support.reason}
    if not support.supported:
        return {**base, "answer": NO_EVIDENCE, "statements": [], "citations": [], "evidence": evidence_json,
                "confidence": "low", "abstained": True, "diagnostics": diagnostics}

    statements, citations = [], []
    for ev in relevant_evidence(retrieval):
        if len(statements) == MAX_STATEMENTS:
            break
        n = len(citations) + 1
        text = statement_for(ev, retrieval.analysis)
        if any(text == s["text"] for s in statements):
            continue
        citations.append({"n": n, "ref": ev.chunk.ref, "resource_type": ev.chunk.resource_type,
                          "date": ev.chunk.date[:10], "label": ev.chunk.label, "snippet": ev.chunk.text[:240]})
        statements.append({"text": text, "citations": [n]})
    answer = " ".join(f"{s['text']} [{s['citations'][0]}]" for s in statements)
    best_dense = max((e.dense for e in retrieval.evidence if e.dense is not None), default=0.0)
    if support.coverage >= 0.99 and best_dense >= 0.5:
        confidence = "high"
    elif support.coverage >= 0.5:
        confidence = "medium"
    else:
        confidence = "low"
    return {**base, "answer": answer, "statements": statements, "citations": citations, "evidence": evidence_json,
            "confidence": confidence, "abstained": False, "diagnostics": diagnostics}

"""Turning a language model's draft into an answer chartcite will show: every statement cites
evidence of this answer and is verified against it; the rest is removed and counted."""
from __future__ import annotations

import logging

from dataclasses import replace

from search.answering.answer import NO_EVIDENCE
from search.answering.phi import Identifiers
from search.answering.types import Answer, Citation, Statement
from search.answering.verify import verify_statement
from search.models.llm import UNAVAILABLE, ChatClient, LlmError, generate
from search.nlp.annotate import RecordTerm
from search.retrieval.types import Retrieval

log = logging.getLogger(__name__)
GENERAL_BANNER = "General clinical guidance, not from this patient's record"
GENERAL_REFUSAL = ("That is a general clinical question, not one about this patient's record. chartcite answers "
                   "general questions only when the hospital has configured a language model; it has not.")
LEVELS = ("low", "medium", "high")


def grounded_answer(client: ChatClient, retrieval: Retrieval, extractive: Answer, ids: Identifiers,
                    terms: list[RecordTerm]) -> Answer:
    """The model's verified statements, or the extractive answer when the model fails."""
    evidence = [(i + 1, ev.chunk.label, ev.chunk.text) for i, ev in enumerate(retrieval.evidence)]
    if not evidence:        # an answer built from the record's lists, not from retrieved passages
        return extractive
    try:
        draft = generate(client, retrieval.question, evidence, ids)
    except LlmError as exc:
        log.warning("language model failed (%s); extractive answer used", exc)
        return replace(extractive, generator="extractive", generator_note="language model unavailable",
                       banner=UNAVAILABLE)
    if draft is None:
        return replace(extractive, generator="extractive", generator_note="language model output was not valid JSON")
    kept, removed = [], []
    for item in draft.statements:
        cited = item["citations"]
        if not item["statement"]:
            continue
        if not cited or any(c not in draft.selected for c in cited):
            removed.append({"statement": item["statement"], "reason": "cites no evidence of this answer"})
            continue
        verdict = verify_statement(item["statement"], [retrieval.evidence[c - 1].chunk for c in cited], terms)
        if verdict.supported:
            kept.append(item)
        else:
            removed.append({"statement": item["statement"], "reason": verdict.reason})
    base = replace(extractive, generator=client.name, removed_statements=len(removed), removed=removed)
    if not kept:
        return replace(base, answer=NO_EVIDENCE, statements=[], citations=[], confidence="low", abstained=True)
    citations, numbers, statements = [], {}, []
    for item in kept:
        marks = []
        for c in item["citations"]:
            if c not in numbers:
                numbers[c] = len(citations) + 1
                citations.append(Citation.of(retrieval.evidence[c - 1], numbers[c]))
            marks.append(numbers[c])
        statements.append(Statement(item["statement"], marks, lead=not statements))
    for conflict in (s for s in extractive.statements if s.conflict):
        source = extractive.citations[conflict.citations[0] - 1]
        citations.append(source.renumbered(len(citations) + 1))
        statements.append(replace(conflict, citations=[len(citations)]))
    answer = " ".join(s.cited_text() for s in statements)
    confidence = extractive.confidence or "medium"
    if removed:   # the model tried to say something the record does not support
        confidence = LEVELS[max(0, LEVELS.index(confidence) - 1)]
    return replace(base, answer=answer, statements=statements, citations=citations, confidence=confidence,
                   abstained=False)

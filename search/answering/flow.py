"""How an answer is decided, in one ordered list: the answering counterpart of the retrieval
stages (search/retrieval/pipeline.py). The service retrieves, then hands the retrieval here.

Openings, each of which may end the answer before anything is composed:
  1. `impossible_date`: a question about a day that does not exist is told so, and nothing else;
  2. `unplaced_window`: "this admission" when the record holds no admission is told so;
  3. `general_question`: a question about medicine, not about this patient, gets the configured
     model's answer under a banner, or a refusal, and no patient evidence.
Then:
  4. `compose`: the extractive answer from the evidence (search/answering/answer.py);
  5. the steps of search/answering/steps.py, in their order (empty record, planned operation,
     the class never hidden, the model's grounded statements, "Yes" names the target, sentence
     citations, trend chart, the still-reading notice).
A question of several parts ("latest A1c and is she on metformin?") runs the list once a part and
the answers are combined (`answer_in_parts`); every answer leaves through `checked`.
"""
from __future__ import annotations

from typing import Callable

from search.answering.answer import compose, impossible_date_answer, unplaced_window_answer
from search.answering.invariants import checked
from search.answering.parts import combined, question_parts
from search.answering.steps import STEPS, AnswerContext, apply_steps
from search.answering.types import Answer
from search.models.llm import is_general_question
from search.retrieval.types import Retrieval

Opening = Callable[[AnswerContext], "Answer | None"]


def impossible_date(ctx: AnswerContext) -> Answer | None:
    if ctx.retrieval.analysis.impossible_dates:
        return impossible_date_answer(ctx.retrieval, ctx.patient_id, ctx.question_id)
    return None


def unplaced_window(ctx: AnswerContext) -> Answer | None:
    if ctx.retrieval.analysis.unplaced:
        return unplaced_window_answer(ctx.retrieval, ctx.patient_id, ctx.question_id)
    return None


def asks_about_medicine(retrieval: Retrieval) -> bool:
    """A question about medicine rather than this patient. Asking for a latest value, a trend, a
    list, a history or a date is asking about the record; so is asking for a kind of record ("the
    care plan", "her meds") or a measurement."""
    analysis = retrieval.analysis
    about_record = bool(analysis.intents() or analysis.date_from or analysis.date_to or analysis.kinds)
    measurement = any(c["semantic_type"] in ("lab", "vital") for c in analysis.concepts)
    return is_general_question(retrieval.question, about_record, measurement)


def general_question(ctx: AnswerContext) -> Answer | None:
    if ctx.general is None or not asks_about_medicine(ctx.retrieval):
        return None
    return ctx.general()


OPENINGS: tuple[Opening, ...] = (impossible_date, unplaced_window, general_question)


def decide(ctx: AnswerContext, openings: tuple[Opening, ...] = OPENINGS, steps=STEPS) -> Answer:
    """The answer to one question (or one part of it) from its retrieval."""
    for opening in openings:
        answer = opening(ctx)
        if answer is not None:
            return answer
    return apply_steps(compose(ctx.retrieval, ctx.patient_id, ctx.question_id), ctx, steps)


def answer_in_parts(question: str, question_id: str | None, answer_one: Callable[[str], Answer],
                    split: bool = True) -> Answer:
    """A question of several parts answered part by part (search/answering/parts.py), else whole."""
    parts = question_parts(question) if split else [question]
    if len(parts) > 1:
        return checked(combined(question, question_id, parts, [answer_one(part) for part in parts]))
    return checked(answer_one(question))

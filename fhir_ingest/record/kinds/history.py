"""The patient's history as told: family history (FamilyMemberHistory) and questionnaire answers
(QuestionnaireResponse: PHQ-9 and other instruments)."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import choice_text, comparator_quantity, concept_words
from ..facts import DetailFact
from ..normalize import code_keys, concept_text
from ..words import _join, _sentence, day
from .base import Kind, Resolver, clinical_date
from .care import detail_fact


def family_conditions(r: dict) -> list[str]:
    out = []
    for item in r.get("condition") or []:
        if not isinstance(item, dict):
            continue
        onset = choice_text(item, "onset")
        outcome = concept_text(item.get("outcome"))
        out.append(_sentence(concept_words(item.get("code")), f"(onset {onset})" if onset else "",
                             f"outcome {outcome}" if outcome else ""))
    return out


def family_fact(r: dict, resolve: Resolver) -> DetailFact:
    relative = concept_text(r.get("relationship")) or "relative"
    return detail_fact("family-history", r, relative, r.get("relationship"),
                       [("conditions", _join(family_conditions(r), "; ")), ("deceased", choice_text(r, "deceased"))])


def survey_fact(r: dict, resolve: Resolver) -> DetailFact:
    lines: list[str] = []
    questionnaire_items(r.get("item") or [], lines)
    return detail_fact("survey", r, questionnaire_name(r), None, [("answers", "; ".join(lines))])


def questionnaire_name(r: dict) -> str:
    source = r.get("questionnaire") if isinstance(r.get("questionnaire"), str) else ""
    return source.rstrip("/").rsplit("/", 1)[-1].split("|")[0] if source else "questionnaire"


def render_family(chunker, r) -> list[Chunk]:
    relative = concept_text(r.get("relationship")) or "relative"
    when = day(clinical_date(r))
    conditions = family_conditions(r)
    deceased = choice_text(r, "deceased")
    text = _sentence(
        f"Family history ({r.get('status', '')})" + (f" recorded {when}:" if when else ":"), f"{relative}:",
        f"{_join(conditions, '; ')}." if conditions else "no conditions recorded.",
        f"Deceased {deceased}." if deceased and deceased != "no" else "", chunker.notes_text(r),
    )
    codes = code_keys(*(c.get("code") for c in r.get("condition") or [] if isinstance(c, dict)))
    names = _join(concept_text(c.get("code")) for c in r.get("condition") or [] if isinstance(c, dict))
    return [chunker.new_chunk(r, "0", text, make_label(when, "Family hx", f"{relative}: {names}"),
                              "family-history", codes=codes, status=r.get("status", ""))]


def answer_words(answer: dict) -> str:
    if not isinstance(answer, dict):
        return ""
    coding = answer.get("valueCoding")
    if isinstance(coding, dict):
        return coding.get("display") or coding.get("code") or ""
    for kind in ("Decimal", "Integer", "String", "Date", "DateTime", "Time", "Uri"):
        if f"value{kind}" in answer:
            return str(answer[f"value{kind}"])
    if isinstance(answer.get("valueQuantity"), dict):
        return comparator_quantity(answer["valueQuantity"])
    if "valueBoolean" in answer:
        return "yes" if answer["valueBoolean"] is True else "no"
    if isinstance(answer.get("valueReference"), dict):
        return answer["valueReference"].get("display", "")
    return ""


def questionnaire_items(items: list, out: list[str]) -> None:
    """'Question: answer' for every answered item, groups' items in order, nested answers included."""
    for item in items or []:
        if not isinstance(item, dict):
            continue
        answers = [a for a in item.get("answer") or [] if isinstance(a, dict)]
        words = _join(answer_words(a) for a in answers)
        question = item.get("text") or item.get("linkId") or ""
        if words:
            out.append(f"{question.rstrip('?:')}: {words}")
        questionnaire_items(item.get("item") or [], out)
        for answer in answers:
            questionnaire_items(answer.get("item") or [], out)


def render_survey(chunker, r) -> list[Chunk]:
    when = day(clinical_date(r))
    name = questionnaire_name(r)
    lines: list[str] = []
    questionnaire_items(r.get("item") or [], lines)
    text = _sentence(f"Questionnaire response ({r.get('status', '')})" + (f" on {when}:" if when else ":"),
                     f"{name}.", "; ".join(lines) + "." if lines else "no answers recorded.")
    return [chunker.new_chunk(r, "0", text, make_label(when, "Survey", name), "survey", category="questionnaire",
                              status=r.get("status", ""))]


KINDS = [
    Kind("FamilyMemberHistory", "history", ("date",), render_family, family_fact, title="relationship"),
    Kind("QuestionnaireResponse", "history", ("authored",), render_survey, survey_fact),
]

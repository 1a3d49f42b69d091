"""The problem list (Condition) and allergies and intolerances (AllergyIntolerance), first-class:
onset and abatement of every type, clinical and verification status, reactions with severity."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import choice_text, concept_words
from ..facts import AllergyFact, ProblemFact, Reaction, codings_of
from ..normalize import code_keys, codings, concept_text, ref_id, status_code
from ..words import _join, _sentence, _strip_tag, day
from .base import Kind, Resolver, clinical_date


def onset_date(r: dict, name: str = "onset") -> str:
    """The onset (or abatement) as a date, when the record gives it as one."""
    for kind in ("DateTime", "Date"):
        if isinstance(r.get(f"{name}{kind}"), str):
            return r[f"{name}{kind}"]
    period = r.get(f"{name}Period")
    return str(period.get("start") or "") if isinstance(period, dict) else ""


def categories_of(r: dict) -> list[str]:
    out = []
    for c in r.get("category") or []:
        if isinstance(c, dict):
            out.append(concept_text(c) or (codings(c)[0].get("code", "") if codings(c) else ""))
        elif isinstance(c, str):
            out.append(c)
    return [x for x in out if x]


def problem_fact(r: dict, resolve: Resolver) -> ProblemFact:
    return ProblemFact(
        name=concept_text(r.get("code")), codes=codings_of(r.get("code")), date=clinical_date(r),
        status=status_code(r, "clinicalStatus"), notes=_join((n.get("text", "") for n in r.get("note") or []
                                                             if isinstance(n, dict)), " "),
        verification=status_code(r, "verificationStatus"), onset=choice_text(r, "onset"), onset_date=onset_date(r),
        abatement=choice_text(r, "abatement"), recorded=str(r.get("recordedDate") or ""),
        severity=concept_text(r.get("severity")), body_site=_join(concept_text(b) for b in r.get("bodySite") or []),
        categories=categories_of(r))


def allergy_fact(r: dict, resolve: Resolver) -> AllergyFact:
    reactions = []
    for reaction in r.get("reaction") or []:
        if isinstance(reaction, dict):
            reactions.append(Reaction([concept_text(m) for m in reaction.get("manifestation") or [] if concept_text(m)],
                                      str(reaction.get("severity") or ""), concept_text(reaction.get("substance"))))
    return AllergyFact(
        name=concept_text(r.get("code")), codes=codings_of(r.get("code")), date=clinical_date(r),
        status=status_code(r, "clinicalStatus"),
        notes=_join((n.get("text", "") for n in r.get("note") or [] if isinstance(n, dict)), " "),
        verification=status_code(r, "verificationStatus"), criticality=str(r.get("criticality") or ""),
        allergy_type=str(r.get("type") or ""), categories=categories_of(r), reactions=reactions,
        onset=choice_text(r, "onset"), recorded=str(r.get("recordedDate") or ""))


def render_condition(chunker, r) -> list[Chunk]:
    name = concept_words(r.get("code"))
    clinical = status_code(r, "clinicalStatus")
    verification = status_code(r, "verificationStatus")
    onset = choice_text(r, "onset")
    abated = choice_text(r, "abatement")
    recorded = day(r.get("recordedDate") or "")
    categories = _join(concept_text(c) or (codings(c)[0].get("code", "") if codings(c) else "") for c in r.get("category") or [])
    status = _join([clinical, verification])
    severity = concept_text(r.get("severity"))
    body = _join(concept_text(b) for b in r.get("bodySite") or [])
    text = _sentence(
        f"Problem / diagnosis ({status}):" if status else "Problem / diagnosis:",
        f"{name}.",
        f"Onset {onset}." if onset else "",
        f"Resolved {abated}." if abated and abated != "yes" else "Resolved." if abated else (
            "Still active." if clinical == "active" else ""),
        f"Severity: {severity}." if severity else "", f"Body site: {body}." if body else "",
        f"Category: {categories}." if categories else "",
        f"Recorded {recorded}." if recorded and recorded != onset else "",
        # Dated only by its encounter (MIMIC's diagnoses): the date is the visit's, and said so.
        f"Diagnosed at the encounter of {day(chunker.date_of(r))}." if not clinical_date(r) and chunker.date_of(r) else "",
        chunker.notes_text(r),
    )
    when = day(chunker.date_of(r))
    label = make_label(when, "Problem", f"{_strip_tag(concept_text(r.get('code')))} ({clinical})" if clinical
                       else _strip_tag(concept_text(r.get("code"))))
    enc = ref_id(r.get("encounter"))
    return [chunker.new_chunk(r, "0", text, label, "problem", category=clinical,
                              codes=code_keys(r.get("code")), refs=[enc] if enc in chunker.by_ref else [],
                              status=clinical)]


def render_allergy(chunker, r) -> list[Chunk]:
    name = concept_text(r.get("code"))
    clinical = status_code(r, "clinicalStatus")
    verification = status_code(r, "verificationStatus")
    when = day(clinical_date(r))
    reactions = []
    for reaction in r.get("reaction") or []:
        manifest = _join(concept_text(m) for m in reaction.get("manifestation") or [])
        severity = reaction.get("severity", "")
        substance = concept_text(reaction.get("substance"))
        reactions.append(_sentence(manifest, f"({severity})" if severity else "", f"to {substance}" if substance else ""))
    text = _sentence(
        f"Allergy / intolerance ({_join([clinical, verification])}):",
        f"{name}.",
        f"Type {r.get('type')}." if r.get("type") else "",
        f"Category: {_join(r.get('category') or [])}." if r.get("category") else "",
        f"Criticality {r.get('criticality')}." if r.get("criticality") else "",
        f"Reactions: {_join(reactions, '; ')}." if reactions else "",
        f"Recorded {when}." if when else "",
    )
    return [chunker.new_chunk(r, "0", text, make_label(when, "Allergy", _strip_tag(name)), "allergy",
                              category=_join(r.get("category") or []), codes=code_keys(r.get("code")),
                              status=clinical)]


KINDS = [
    Kind("Condition", "problems", ("onsetDateTime", "onsetPeriod", "recordedDate"), render_condition, problem_fact,
         essential=True, title="code"),
    Kind("AllergyIntolerance", "problems", ("onsetDateTime", "recordedDate"), render_allergy, allergy_fact,
         essential=True, title="code"),
]

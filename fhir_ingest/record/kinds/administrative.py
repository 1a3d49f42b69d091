"""Who the record is about and who pays: Patient (its demographics as a chunk; read too for the
banner and to decide what a document defines) and insurance coverage (Coverage)."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import concept_words, period_text
from ..facts import DetailFact, codings_of
from ..normalize import concept_text
from ..words import _join, _sentence, day
from .base import Kind, Resolver, clinical_date
from .care import reference_words


def coverage_fact(r: dict, resolve: Resolver) -> DetailFact:
    payors = _join(reference_words(resolve, p) for p in r.get("payor") or [])
    return DetailFact(kind="coverage", name=concept_words(r.get("type")) or payors, codes=codings_of(r.get("type")),
                      date=clinical_date(r), status=str(r.get("status") or ""),
                      details=[[label, words] for label, words in (("payer", payors), ("valid", period_text(r.get("period"))),
                                                                   ("relationship", concept_text(r.get("relationship"))))
                               if words])


def render_coverage(chunker, r) -> list[Chunk]:
    payors = _join(reference_words(chunker.resolve, p) for p in r.get("payor") or [])
    plan = concept_words(r.get("type"))
    period = period_text(r.get("period"))
    classes = _join(f"{concept_text(c.get('type'))} {c.get('name') or c.get('value') or ''}".strip()
                    for c in r.get("class") or [] if isinstance(c, dict))
    relationship = concept_text(r.get("relationship"))
    text = _sentence(f"Insurance coverage ({r.get('status', '')}):", f"{plan}." if plan else "",
                     f"Payer: {payors}." if payors else "", f"Plan: {classes}." if classes else "",
                     f"Valid {period}." if period else "",
                     f"Subscriber relationship: {relationship}." if relationship else "")
    return [chunker.new_chunk(r, "0", text, make_label(day(clinical_date(r)), "Coverage", payors or plan), "coverage",
                              status=r.get("status", ""))]



# US Core's demographic extensions: a coded value or, for race and ethnicity, a nested `text`.
US_CORE = "http://hl7.org/fhir/us/core/StructureDefinition/"
DEMOGRAPHIC_EXTENSIONS = (("birth sex", US_CORE + "us-core-birthsex"), ("sex", US_CORE + "us-core-sex"),
                          ("gender identity", US_CORE + "us-core-genderIdentity"),
                          ("race", US_CORE + "us-core-race"), ("ethnicity", US_CORE + "us-core-ethnicity"))


def extension_words(r: dict, url: str) -> str:
    for ext in r.get("extension") or []:
        if not isinstance(ext, dict) or ext.get("url") != url:
            continue
        nested = {e.get("url"): e.get("valueString") for e in ext.get("extension") or [] if isinstance(e, dict)}
        if isinstance(nested.get("text"), str):
            return nested["text"]
        for key, value in ext.items():
            if key.startswith("value"):
                return concept_text(value) if isinstance(value, dict) else str(value)
    return ""


def deceased_words(r: dict) -> str:
    if isinstance(r.get("deceasedDateTime"), str):
        return f"yes, on {day(r['deceasedDateTime'])}"
    if isinstance(r.get("deceasedBoolean"), bool):
        return "yes" if r["deceasedBoolean"] else "no"
    return ""


def languages_of(r: dict) -> str:
    return _join(concept_text(c.get("language")) + (" (preferred)" if c.get("preferred") else "")
                 for c in r.get("communication") or [] if isinstance(c, dict) and concept_text(c.get("language")))


def demographics(r: dict) -> list[tuple[str, str]]:
    """What the record says of the patient as a clinician asks it. Never names, identifiers,
    addresses or contacts: those are identifiers, not clinical content."""
    return [(label, words) for label, words in
            [("gender", str(r.get("gender") or "")), ("birth date", day(str(r.get("birthDate") or ""))),
             ("deceased", deceased_words(r)), ("language", languages_of(r)),
             ("marital status", concept_text(r.get("maritalStatus")))]
            + [(label, extension_words(r, url)) for label, url in DEMOGRAPHIC_EXTENSIONS] if words]


def patient_fact(r: dict, resolve: Resolver) -> DetailFact:
    return DetailFact(kind="demographics", name="demographics", date=clinical_date(r),
                      details=[[label, words] for label, words in demographics(r)])


def render_patient(chunker, r) -> list[Chunk]:
    """The patient's own demographics, so "birth date?" and "how is the gender documented?" are
    answered from the record."""
    parts = demographics(r)
    if not parts:
        return []
    text = _sentence("Patient demographics:", *(f"{label.capitalize()}: {words}." for label, words in parts))
    return [chunker.new_chunk(r, "0", text, make_label("", "Patient", "demographics"), "demographics",
                              )]


KINDS = [
    Kind("Coverage", "administrative", ("period",), render_coverage, coverage_fact),
    # Read as Patient/<id>, not searched; its demographics dated by birth.
    Kind("Patient", "administrative", ("birthDate",), render_patient, patient_fact, search=None, essential=True),
]

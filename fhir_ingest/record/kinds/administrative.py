"""Who the record is about and who pays: Patient (read for the banner and to decide what a
document defines) and insurance coverage (Coverage)."""
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



KINDS = [
    Kind("Coverage", "administrative", ("period",), render_coverage, coverage_fact),
    Kind("Patient", "administrative", search=None, essential=True),   # read as Patient/<id>, not searched
]

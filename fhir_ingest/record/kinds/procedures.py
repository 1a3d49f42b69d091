"""What was done: procedures, immunizations (and vaccines not given, with why), imaging studies."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import choice_text
from ..facts import ProcedureFact, codings_of
from ..normalize import code_keys, concept_text
from ..words import _join, _sentence, _strip_tag, day
from .base import Kind, Resolver, clinical_date
from .medications import reasons_of


def status_reason_of(r: dict) -> str:
    reason = r.get("statusReason")
    return concept_text(reason) if isinstance(reason, dict) else ""


def procedure_fact(r: dict, resolve: Resolver) -> ProcedureFact:
    return ProcedureFact(
        kind="procedure", name=concept_text(r.get("code")), codes=codings_of(r.get("code")), date=clinical_date(r),
        status=str(r.get("status") or ""), notes=_join((n.get("text", "") for n in r.get("note") or []
                                                      if isinstance(n, dict)), " "),
        status_reason=status_reason_of(r), reasons=reasons_of(r, resolve),
        body_site=_join(concept_text(b) for b in r.get("bodySite") or []), performed=choice_text(r, "performed"))


def immunization_fact(r: dict, resolve: Resolver) -> ProcedureFact:
    return ProcedureFact(
        kind="immunization", name=concept_text(r.get("vaccineCode")), codes=codings_of(r.get("vaccineCode")),
        date=clinical_date(r), status=str(r.get("status") or ""),
        notes=_join((n.get("text", "") for n in r.get("note") or [] if isinstance(n, dict)), " "),
        status_reason=status_reason_of(r), reasons=reasons_of(r, resolve),
        body_site=concept_text(r.get("site")), performed=choice_text(r, "occurrence"))


def imaging_fact(r: dict, resolve: Resolver) -> ProcedureFact:
    procedures = [concept_text(p) for p in r.get("procedureCode") or []]
    return ProcedureFact(
        kind="imaging", name=_join(procedures), codes=codings_of((r.get("procedureCode") or [None])[0]),
        date=clinical_date(r), status=str(r.get("status") or ""), reasons=reasons_of(r, resolve),
        body_site=_join((s.get("bodySite") or {}).get("display", "") for s in r.get("series") or [] if isinstance(s, dict)),
        performed=day(clinical_date(r)))


def render_procedure(chunker, r) -> list[Chunk]:
    name = concept_text(r.get("code"))
    when = day(clinical_date(r))
    reason = chunker.reason_text(r)
    location = (r.get("location") or {}).get("display", "")
    body = _join(concept_text(b) for b in r.get("bodySite") or [])
    text = _sentence(
        f"Procedure ({r.get('status', '')}) on {when}:", f"{name}.",
        f"Reason: {reason}." if reason else "", f"Body site: {body}." if body else "",
        f"Location: {location}." if location else "",
    )
    return [chunker.new_chunk(r, "0", text, make_label(when, "Procedure", _strip_tag(name)), "procedure",
                              codes=code_keys(r.get("code")), refs=chunker.reason_refs(r), status=r.get("status", ""))]


def render_immunization(chunker, r) -> list[Chunk]:
    name = concept_text(r.get("vaccineCode"))
    when = day(clinical_date(r))
    reason = status_reason_of(r)
    text = _sentence(f"Immunization / vaccine ({r.get('status', '')}) on {when}:", f"{name}.",
                     ("Not given" + (f": {reason}." if reason else ".")) if r.get("status") == "not-done" else
                     f"Status reason: {reason}." if reason else "", chunker.notes_text(r))
    return [chunker.new_chunk(r, "0", text, make_label(when, "Vaccine", name), "immunization",
                              codes=code_keys(r.get("vaccineCode")), status=r.get("status", ""))]


def render_imaging(chunker, r) -> list[Chunk]:
    when = day(clinical_date(r))
    series = r.get("series") or []
    modalities = _join((s.get("modality") or {}).get("display") or (s.get("modality") or {}).get("code", "") for s in series)
    sites = _join((s.get("bodySite") or {}).get("display", "") for s in series)
    procedures = _join(concept_text(p) for p in r.get("procedureCode") or [])
    text = _sentence(f"Imaging study on {when}:", f"{procedures}." if procedures else "",
                     f"Modality: {modalities}." if modalities else "", f"Body site: {sites}." if sites else "")
    return [chunker.new_chunk(r, "0", text, make_label(when, "Imaging", procedures or modalities), "imaging",
                              status=r.get("status", ""))]


KINDS = [
    Kind("Procedure", "procedures", ("performedDateTime", "performedPeriod"), render_procedure, procedure_fact,
         title="code"),
    Kind("Immunization", "procedures", ("occurrenceDateTime", "recorded"), render_immunization, immunization_fact,
         essential=True, title="vaccineCode"),
    Kind("ImagingStudy", "procedures", ("started",), render_imaging, imaging_fact, title="procedureCode"),
]

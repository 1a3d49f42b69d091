"""Visits (Encounter): class, type, reason, the diagnoses made at them, period and location."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..facts import EncounterFact, codings_of
from ..normalize import code_keys, concept_text, ref_id
from ..words import _join, _sentence, _strip_tag, day
from .base import Kind, Resolver, clinical_date

CLASS_NAMES = {"AMB": "ambulatory", "EMER": "emergency", "IMP": "inpatient", "ACUTE": "inpatient", "VR": "virtual",
               "HH": "home health", "OBSENC": "observation"}


def reasons_of(r: dict, resolve: Resolver) -> list[str]:
    reasons = [concept_text(c) for c in r.get("reasonCode") or []]
    reasons += [concept_text((resolve(ref_id(x)) or {}).get("code")) for x in r.get("reasonReference") or []]
    return reasons


def encounter_fact(r: dict, resolve: Resolver) -> EncounterFact:
    period = r.get("period") or {}
    types = r.get("type") or []
    diagnoses = [concept_text((resolve(ref_id(d.get("condition"))) or {}).get("code"))
                 for d in r.get("diagnosis") or [] if isinstance(d, dict)]
    return EncounterFact(
        name=_join(concept_text(t) for t in types), codes=codings_of(types[0]) if types else [],
        date=clinical_date(r), status=str(r.get("status") or ""),
        encounter_class=str((r.get("class") or {}).get("code", "")), types=[concept_text(t) for t in types],
        reasons=[x for x in reasons_of(r, resolve) if x], diagnoses=[d for d in diagnoses if d],
        end=str(period.get("end") or "") if isinstance(period, dict) else "",
        locations=[(loc.get("location") or {}).get("display", "") for loc in r.get("location") or []
                   if isinstance(loc, dict) and (loc.get("location") or {}).get("display")],
        part_of=part_of_words(r, resolve))


def part_of_words(r: dict, resolve: Resolver) -> str:
    """The encounter this one is part of (an ICU stay within a hospital admission), so the two
    are never taken for one another."""
    parent = resolve(ref_id(r.get("partOf")))
    if not parent:
        return ""
    enc_class = (parent.get("class") or {}).get("code", "")
    kind = _join(concept_text(t) for t in parent.get("type") or [])
    when = day(clinical_date(parent))
    return _sentence(f"the {CLASS_NAMES.get(enc_class, enc_class) or 'visit'} encounter",
                     f"({kind})" if kind else "", f"of {when}" if when else "")


def render_encounter(chunker, r) -> list[Chunk]:
    ref = f"Encounter/{r['id']}"
    when = day(chunker.date_of(r))
    part_of = part_of_words(r, chunker.resolve)
    kind = _join(concept_text(t) for t in r.get("type") or [])
    enc_class = (r.get("class") or {}).get("code", "")
    class_name = CLASS_NAMES.get(enc_class, enc_class)
    reasons = reasons_of(r, chunker.resolve)
    diagnoses = [concept_text(c.get("code")) for c in chunker.encounter_conditions(ref)]
    locations = [(loc.get("location") or {}).get("display", "") for loc in r.get("location") or []]
    period = r.get("period") or {}
    text = _sentence(
        f"Encounter ({class_name or 'visit'}) on {when}:" if when else f"Encounter ({class_name or 'visit'}):",
        f"{kind}." if kind else "",
        f"Part of {part_of}." if part_of else "",
        f"Reason: {_join(reasons)}." if any(reasons) else "",
        f"Diagnoses: {_join(diagnoses, '; ')}." if diagnoses else "",
        f"Ended {day(period.get('end', ''))}." if period.get("end") and day(period["end"]) != when else "",
        f"Location: {_join(locations)}." if any(locations) else "",
        f"Status: {r.get('status', '')}.",
    )
    words = _strip_tag(_join(reasons) or kind)
    return [chunker.new_chunk(r, "0", text, make_label(when, "Visit", words), "encounter",
                              category=class_name, codes=code_keys(*(r.get("type") or []), *(r.get("reasonCode") or [])),
                              status=r.get("status", ""))]


KINDS = [Kind("Encounter", "encounters", ("period",), render_encounter, encounter_fact, title="type")]

"""Observations (labs, vital signs, social history, surveys, exams) and the Specimen a result was
measured on. Every `value[x]` with its comparator and unit, `dataAbsentReason`, components (a
blood pressure's two sides in the right order), reference ranges, interpretation, the specimen's
condition ("hemolyzed") and the record's notes."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import concept_words, reference_range_text, value_text
from ..facts import Component, DetailFact, MeasurementFact, Point, Value, codings_of, reference_ranges_of, value_of
from ..normalize import code_keys, codings, concept_text, contained, quantity_text, ref_id
from ..words import _join, _sentence, day
from .base import Kind, Resolver, clinical_date

SYSTOLIC, DIASTOLIC = "8480-6", "8462-4"
SEMANTIC = {"vital-signs": "vital", "laboratory": "lab", "social-history": "social", "survey": "survey", "exam": "exam"}
LABEL = {"vital": "Vital", "lab": "Lab", "social": "Social", "survey": "Survey", "exam": "Exam"}


def blood_pressure(resource: dict) -> tuple[dict, dict] | None:
    """(systolic, diastolic) components of a blood-pressure Observation, whatever the component
    order (Synthea lists the diastolic first) and wherever LOINC sits among the codings (Epic puts
    its flowsheet code first); either side may lack a value. None for any other observation."""
    comps = {}
    for component in resource.get("component") or []:
        for coding in codings(component.get("code")):
            if coding.get("code") in (SYSTOLIC, DIASTOLIC):
                comps[coding["code"]] = component
    if SYSTOLIC in comps or DIASTOLIC in comps:
        return comps.get(SYSTOLIC, {}), comps.get(DIASTOLIC, {})
    return None


def blood_pressure_text(systolic: dict, diastolic: dict) -> str:
    """'120/80 mmHg'; a side without a value is said, never left blank ('109/(diastolic not recorded) mmHg')."""
    sys_q, dia_q = systolic.get("valueQuantity") or {}, diastolic.get("valueQuantity") or {}
    unit = sys_q.get("unit") or dia_q.get("unit") or "mm[Hg]"
    top = quantity_text({"value": sys_q.get("value")}) or "(systolic not recorded)"
    bottom = quantity_text({"value": dia_q.get("value")}) or "(diastolic not recorded)"
    return f"{top}/{bottom} {unit}"


def pressure_sides(fact) -> tuple | None:
    """(systolic, diastolic) Quantities (either may be None) of a blood-pressure fact, or None."""
    sides = {c.codes[i].code: c for c in fact.components for i in range(len(c.codes))
             if c.codes[i].code in (SYSTOLIC, DIASTOLIC)}
    if not sides:
        return None
    return tuple((sides[code].value.quantity if code in sides else None) for code in (SYSTOLIC, DIASTOLIC))


def measured_words(fact) -> str:
    """A measurement fact's value as the record gives it: a blood pressure as systolic/diastolic
    ('109/(diastolic not recorded) mmHg' when a side is missing), other components by name."""
    sides = pressure_sides(fact)
    if sides is not None:
        top, bottom = sides
        unit = (top.unit if top else "") or (bottom.unit if bottom else "") or "mm[Hg]"
        high = quantity_text({"value": top.value if top else None}) or "(systolic not recorded)"
        low = quantity_text({"value": bottom.value if bottom else None}) or "(diastolic not recorded)"
        return f"{high}/{low} {unit}"
    parts = [fact.value.text if fact.value else ""] + [f"{c.name}: {c.value.text or 'no value'}" for c in fact.components]
    return "; ".join(p for p in parts if p)


def observation_value(r: dict) -> str:
    bp = blood_pressure(r)
    if bp:
        return blood_pressure_text(*bp)
    parts = [f"{concept_text(c.get('code'))}: {value_text(c) or 'no value'}"
             for c in r.get("component") or [] if isinstance(c, dict)]
    return "; ".join(filter(None, [value_text(r), *parts]))


def observation_category(r: dict) -> str:
    for cat in r.get("category") or []:
        for c in codings(cat):
            if c.get("code"):
                return c["code"]
    return ""


def specimen_text(r: dict, resolve: Resolver) -> str:
    """What the result was measured on, when the record says ('Serum sample, hemolyzed')."""
    spec = resolve(ref_id(r.get("specimen"))) or contained(r, r.get("specimen"))
    if not spec:
        return (r.get("specimen") or {}).get("display", "") if isinstance(r.get("specimen"), dict) else ""
    collected = (spec.get("collection") or {}).get("collectedDateTime", "") if isinstance(spec.get("collection"), dict) else ""
    return _join([concept_text(spec.get("type")), _join(concept_text(c) for c in spec.get("condition") or []),
                  f"collected {day(collected)}" if collected else ""])


def interpretation_of(r: dict) -> str:
    return _join(concept_text(i) for i in r.get("interpretation") or [] if isinstance(i, dict))


def notes_of(r: dict) -> str:
    return _join((n.get("text", "") for n in r.get("note") or [] if isinstance(n, dict)), " ")


def components_of(r: dict) -> list[Component]:
    """Components in a reading's order: a blood pressure systolic first, whatever order it came in."""
    items = [c for c in r.get("component") or [] if isinstance(c, dict)]
    bp = blood_pressure(r)
    if bp:
        items = [c for c in bp if c] + [c for c in items if all(c is not side for side in bp)]
    return [Component(concept_text(c.get("code")), codings_of(c.get("code")), value_of(c) or Value("absent", "no value"))
            for c in items]


def point_of(r: dict) -> Point:
    ref = f"Observation/{r['id']}"
    return Point(ref, clinical_date(r), concept_text(r.get("code")), codings_of(r.get("code")), value_of(r),
                 components_of(r), interpretation_of(r), reference_ranges_of(r.get("referenceRange")),
                 str(r.get("status") or ""))


def measurement_fact(r: dict, resolve: Resolver) -> MeasurementFact:
    return MeasurementFact(
        name=concept_text(r.get("code")), codes=codings_of(r.get("code")), date=clinical_date(r),
        status=str(r.get("status") or ""), notes=notes_of(r), category=observation_category(r), value=value_of(r),
        components=components_of(r), ranges=reference_ranges_of(r.get("referenceRange")),
        interpretation=interpretation_of(r), specimen=specimen_text(r, resolve),
        method=concept_text(r.get("method")), body_site=concept_text(r.get("bodySite")))


def render_observation(chunker, r) -> list[Chunk]:
    name = concept_words(r.get("code"))
    when = day(clinical_date(r))
    value = observation_value(r)
    if not value and not r.get("hasMember"):
        value = "no value recorded"      # a result without a value must not read as one
    specimen = specimen_text(r, chunker.resolve)
    method, body = concept_text(r.get("method")), concept_text(r.get("bodySite"))
    category = observation_category(r)
    ranges = reference_range_text(r.get("referenceRange"))
    flags = interpretation_of(r)
    semantic = SEMANTIC.get(category, "observation")
    kind = LABEL.get(semantic, "Obs")
    text = _sentence(
        f"{kind} result on {when}:" if when else f"{kind} result:",
        f"{name} = {value}." if value else f"{name}.",
        f"Reference range {ranges}." if ranges else "",
        f"Interpretation: {flags}." if flags else "",
        f"Specimen: {specimen}." if specimen else "", f"Method: {method}." if method else "",
        f"Body site: {body}." if body else "",
        f"Status: {r.get('status', '')}." if r.get("status") not in (None, "final") else "",
        chunker.notes_text(r),
    )
    label = make_label(when, kind, f"{concept_text(r.get('code'))} {value}{' ' + flags if flags else ''}")
    return [chunker.new_chunk(r, "0", text, label, semantic, category=category,
                              codes=code_keys(r.get("code")), status=r.get("status", ""))]


def specimen_parts(r: dict) -> list[tuple[str, str]]:
    collection = r.get("collection") if isinstance(r.get("collection"), dict) else {}
    collected = collection.get("collectedDateTime") or (collection.get("collectedPeriod") or {}).get("start") or ""
    return [(label, words) for label, words in
            (("collected", day(collected) if isinstance(collected, str) else ""),
             ("received", day(r["receivedTime"]) if isinstance(r.get("receivedTime"), str) else ""),
             ("body site", concept_text(collection.get("bodySite"))), ("method", concept_text(collection.get("method"))),
             ("condition", _join(concept_text(c) for c in r.get("condition") or [])),
             ("quantity", quantity_text(collection.get("quantity")))) if words]


def specimen_fact(r: dict, resolve: Resolver) -> DetailFact:
    parts = specimen_parts(r)
    return DetailFact(kind="specimen", name=concept_text(r.get("type")) or "specimen", codes=codings_of(r.get("type")),
                      date=clinical_date(r), status=str(r.get("status") or ""),
                      details=[[label, words] for label, words in parts])


def render_specimen(chunker, r) -> list[Chunk]:
    """A specimen (what was collected, when, in what condition): a result refers to it, and "was
    the sample hemolyzed?" is asked of it."""
    parts = specimen_parts(r)
    name = concept_text(r.get("type")) or "specimen"
    when = day(clinical_date(r))
    status = r.get("status", "")
    text = _sentence(f"Specimen ({status}):" if status else "Specimen:", f"{name}.",
                     *(f"{label.capitalize()}: {words}." for label, words in parts), chunker.notes_text(r))
    return [chunker.new_chunk(r, "0", text, make_label(when, "Specimen", name), "lab", category="specimen",
                              codes=code_keys(r.get("type")), status=status)]


KINDS = [
    Kind("Observation", "observations", ("effectiveDateTime", "effectivePeriod", "effectiveInstant", "issued"),
         render_observation, measurement_fact, title="code"),
    Kind("Specimen", "observations", ("collection", "receivedTime"), render_specimen, specimen_fact, title="type"),
]

"""What a piece of evidence says, in clinical words, from the typed fact its chunk carries.

A `Fact` is one cited thing: a medication order with its dose and status, a measurement with its
values and dates, a problem, an allergy with its reactions, a procedure, a visit, a vaccine. The
answer's first sentence and its short supporting sentences are written from facts, so every word
of them comes from the record the [n] opens. The typed fact was read from the resource by its
kind when the record was indexed (fhir_ingest.record.kinds); nothing here reads FHIR.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date

from fhir_ingest.record import facts as typed
from fhir_ingest.record.kinds.observations import pressure_sides
from fhir_ingest.record.words import day

from search.answering.clinical import condition_name, dosage_words, drug_name, observation_name, unit, value_words
from search.nlp.terminology import ingredients_of
from search.retrieval.types import Evidence

NUMBER = re.compile(r"^\d[\d.,]*$")

CURRENT_ORDER = {"active", "on-hold"}
STOPPED_ORDER = {"stopped", "cancelled", "revoked"}
ENCOUNTER_CLASS = {"EMER": "emergency visit", "IMP": "hospital admission", "ACUTE": "hospital admission",
                   "HH": "home health visit", "VR": "virtual visit", "OBSENC": "observation stay"}


@dataclass
class Point:
    date: str
    values: list[float]
    text: str            # '116/98 mmHg', '<6 ng/mL': as recorded, comparator included
    ref: str
    flag: str = ""       # high / low, as the record interprets it or against its reference range
    unit: str = ""       # as a chart writes it ('mmHg', '%')
    note: str = ""       # what qualifies the reading: its specimen's condition, the record's note
    ucum: str = ""       # the unit's UCUM code (else the unit as recorded), to convert by
    loinc: str = ""      # what was measured, for a mass <-> molar factor
    also: str = ""       # the result's other components ('inhaled oxygen flow rate 2 L/min' beside an SpO2)


@dataclass
class Fact:
    ev: Evidence
    kind: str            # medication, measurement, problem, allergy, procedure, immunization, encounter, note, other
    name: str            # the clinical short name ('eGFR', 'clopidogrel 75 mg oral tablet')
    words: str           # the clause a sentence is built from
    date: str = ""
    status: str = ""
    current: bool = True
    negative: bool = False       # the record states the negative: refuted, stopped, not done
    reason: str = ""
    series: str = ""             # measurements: the analyte, so values of one test form a series
    unit: str = ""
    points: list[Point] = field(default_factory=list)
    flag: str = ""
    range: tuple[float | None, float | None] | None = None
    trend: bool = False          # a trend chunk: several values of one test
    coded: str = ""              # the full coded name


def years_before_today(iso: str) -> float:
    try:
        return (date.today() - date.fromisoformat(day(iso))).days / 365.25
    except ValueError:
        return 0.0


def typed_fact(ev: Evidence):
    return typed.fact_from_dict(ev.chunk.fact)


def medication_fact(ev: Evidence, f: typed.MedicationFact) -> Fact:
    status = f.status
    when = day(f.date)
    dose = dosage_words(f.doses, f.medication)
    reason = ", ".join(dict.fromkeys(condition_name({"text": r}) for r in f.reasons or f.visit_reasons))
    since = f"active since {when}" if status in CURRENT_ORDER else f"{status or 'ordered'}, ordered {when}"
    if status in CURRENT_ORDER and years_before_today(when) > 3:
        since = f"marked active but ordered {when}, may be outdated"
    if f.status_reason:          # why it was stopped, held or not given: part of its status
        since += f" ({f.status_reason[:1].lower() + f.status_reason[1:]})"
    words = ", ".join(b for b in (drug_name(f.medication), dose, since) if b)
    return Fact(ev, "medication", drug_name(f.medication), words, when, status, status in CURRENT_ORDER,
                status in STOPPED_ORDER, reason, series=same_drug(f.medication))


def same_drug(name: str) -> str:
    """What the orders of one drug share, so its renewals fold into one clause: each ingredient with
    its strength, as a set ("acetaminophen 325 mg + oxycodone 10 mg"). A drug that shares only an
    ingredient (acetaminophen with hydrocodone) or a class is another drug; the dose form, salt
    words and a brand in brackets do not make one."""
    plain = re.sub(r"\[[^\]]*\]", " ", drug_name(name).lower())
    parts = [part for part in (strength_of(component) for component in plain.split(" / ")) if part]
    if not parts:
        return " + ".join(sorted(ingredients_of(plain))) or " ".join(plain.split())
    return " + ".join(sorted(f"{' + '.join(sorted(ingredients_of(words))) or words} {strength}"
                             for words, strength in parts))


def strength_of(component: str) -> tuple[str, str] | None:
    """("hydrocodone bitartrate", "10 mg") of "12 hr hydrocodone bitartrate 10 mg er oral capsule":
    the words right before the first number that has words before it, and that number's unit (a
    leading "12 hr" or "0.3 ml" is the release time or package, not a strength)."""
    words: list[str] = []
    tokens = component.split()
    i = 0
    while i < len(tokens):
        if NUMBER.match(tokens[i]):
            if words:
                return " ".join(words), " ".join(tokens[i:i + 2])
            i += 2
            continue
        words.append(tokens[i])
        i += 1
    return None


def flag_of(interpretation: str, value: typed.Value | None, ranges: list[typed.ReferenceRange]) -> str:
    """The interpretation the record gives, else high/low against its reference range."""
    if interpretation:
        return interpretation.lower()
    number = value.number if value else None
    for rr in ranges:
        if number is not None:
            if rr.low is not None and rr.low.value is not None and number < rr.low.value:
                return "low"
            if rr.high is not None and rr.high.value is not None and number > rr.high.value:
                return "high"
    return ""


def point_of(ref: str, when: str, value: typed.Value | None, components: list[typed.Component],
             note: str = "", loinc: str = "") -> Point | None:
    """A reading: a blood pressure's two sides, else the value (its comparator kept in the words)."""
    sides = pressure_sides(typed.MeasurementFact(components=components))
    if sides is not None:
        top, bottom = sides
        if top is None or top.value is None or bottom is None or bottom.value is None:
            return None
        shown = unit(top.unit or "mm[Hg]")
        text = f"{value_words({'value': top.value})}/{value_words({'value': bottom.value})} {shown}"
        return Point(when, [float(top.value), float(bottom.value)], text, ref, unit=shown, note=note,
                     ucum=top.code or top.unit or "mm[Hg]")
    q = value.quantity if value else None
    if q is None or q.value is None:
        return None
    text = (q.comparator or "") + value_words({"value": q.value, "unit": q.unit})
    also = "; ".join(f"{c.name} {c.value.text}" for c in components
                     if c.name and c.value is not None and c.value.text)
    return Point(when, [float(q.value)], text, ref, unit=unit(q.unit), note=note, also=also,
                 ucum=q.code or q.unit, loinc=loinc)


def reading_note(specimen: str, notes: str) -> str:
    """What a clinician must know beside a value: the specimen's condition ('hemolyzed'), the
    record's note on the result."""
    return "; ".join(x for x in (f"specimen: {specimen}" if specimen else "", notes) if x)


def series_name(codes: list[typed.Coding], name: str) -> str:
    """The analyte's clinical short name by its codes ('eGFR'), else its recorded name shortened."""
    return observation_name({"coding": [c.__dict__ for c in codes], "text": name}) or name


def measurement_fact(ev: Evidence, f: typed.MeasurementFact, ref: str) -> Fact | None:
    when = day(f.date)
    loinc = next((c.code for c in f.codes if c.system == "http://loinc.org" and c.code), "")
    point = point_of(ref, when, f.value, f.components, reading_note(f.specimen, f.notes), loinc)
    if point is None:
        return None
    ranges = f.ranges
    point.flag = flag_of(f.interpretation, f.value, ranges) if len(point.values) == 1 else ""
    name = series_name(f.codes, f.name)
    first_range = next(((r.low.value if r.low else None, r.high.value if r.high else None) for r in ranges
                        if (r.low and r.low.value is not None) or (r.high and r.high.value is not None)), None)
    with_also = f" with {point.also}" if point.also else ""
    return Fact(ev, "measurement", name, f"{name} {point.text}{with_also} on {point.date}", point.date, f.status,
                series=name, unit=point.unit, points=[point], flag=flag_of(f.interpretation, f.value, ranges),
                range=first_range, coded=f.name)


def problem_fact(ev: Evidence, f: typed.ProblemFact) -> Fact:
    name = condition_name({"text": f.name})
    onset = day(f.onset_date) or day(f.date)
    if f.verification == "refuted":
        return Fact(ev, "problem", name, f"{name} recorded as refuted", onset, "refuted", False, True)
    ended = day(f.abatement) if f.abatement[:4].isdigit() else ""
    if f.status in ("resolved", "inactive", "remission"):
        when = f"{onset or f.onset}, {f.status}" + (f" {ended}" if ended else "")
    elif f.onset_date:
        when = f"since {day(f.onset_date)}"
    elif f.onset:
        # An onset the record gives in words ("childhood", "at age 12") is said as it was given.
        when = f"onset {f.onset}" + (f", recorded {day(f.recorded)}" if f.recorded else "")
    else:
        when = f"since {onset}" if onset else "date not recorded"
    return Fact(ev, "problem", name, f"{name} ({when})", onset, f.status,
                f.status not in ("resolved", "inactive", "remission"))


def allergy_fact(ev: Evidence, f: typed.AllergyFact) -> Fact:
    name = condition_name({"text": f.name})
    recorded = day(f.recorded or f.date)
    if f.verification == "refuted":
        return Fact(ev, "allergy", name, f"an allergy to {name} is recorded as refuted ({recorded})", recorded,
                    "refuted", False, True)
    reactions = [condition_name({"text": m}) + (f" ({reaction.severity})" if reaction.severity else "")
                 for reaction in f.reactions for m in reaction.manifestations]
    detail = [", ".join(dict.fromkeys(reactions)), f"{f.criticality} criticality" if f.criticality else "",
              f"recorded {recorded}" if recorded else ""]
    words = name if "allerg" in name.lower() else f"{name} allergy"
    words += f" — {', '.join(d for d in detail if d)}" if any(detail) else ""
    return Fact(ev, "allergy", name, words, recorded, f.status, f.status != "inactive")


def procedure_fact(ev: Evidence, f: typed.ProcedureFact) -> Fact:
    kind = "immunization" if f.kind == "immunization" else "procedure"
    name = condition_name({"text": f.name})
    when = day(f.date)
    if f.status == "not-done":
        why = f.status_reason
        return Fact(ev, kind, name, f"{name} not done ({when}{', ' + why.lower() if why else ''})", when, f.status,
                    False, True)
    reason = ", ".join(condition_name({"text": r}) for r in f.reasons)
    words = (f"{name} on {when}" if when else name) + (f" for {reason}" if reason else "")
    return Fact(ev, kind, name, words, when, f.status, reason=reason)


def encounter_fact(ev: Evidence, f: typed.EncounterFact) -> Fact:
    kind = condition_name({"text": f.types[0]}) if f.types else ""
    # A stay within another encounter (an ICU stay within an admission) is named as such, never
    # as the admission itself.
    label = f"part of {f.part_of}" if f.part_of else ENCOUNTER_CLASS.get(f.encounter_class, "")
    name = kind or label or "visit"
    if label and label.split()[0] not in name.lower():
        name = f"{name} ({label})"
    start, end = day(f.date), day(f.end)
    reason = ", ".join(dict.fromkeys(condition_name({"text": r}) for r in f.reasons if r))
    words = f"{name} on {start}" + (f" to {end}" if end and end != start else "") + (f" for {reason}" if reason else "")
    return Fact(ev, "encounter", name, words, start, f.status, reason=reason)


def fact_of(ev: Evidence) -> Fact | None:
    """The fact a chunk's source states, in clinical words, or None when it is not one of the
    kinds above (a note, a trend, a panel, a care plan: the caller words those)."""
    chunk = ev.chunk
    if chunk.category == "trend" or chunk.semantic_type == "note":
        return None
    f = typed_fact(ev)
    if isinstance(f, typed.MedicationFact) and f.form == "order":
        return medication_fact(ev, f)
    if isinstance(f, typed.MeasurementFact):
        return measurement_fact(ev, f, chunk.ref)
    if isinstance(f, typed.ProblemFact):
        return problem_fact(ev, f)
    if isinstance(f, typed.AllergyFact):
        return allergy_fact(ev, f)
    if isinstance(f, typed.ProcedureFact) and f.kind in ("procedure", "immunization"):
        return procedure_fact(ev, f)
    if isinstance(f, typed.EncounterFact):
        return encounter_fact(ev, f)
    return None


def series_facts(ev: Evidence) -> list[Fact]:
    """The measurements a trend chunk or a lab panel states, one fact per result."""
    f = typed_fact(ev)
    if not isinstance(f, typed.SeriesFact):
        return []
    out = []
    for p in f.points:
        measured = typed.MeasurementFact(name=p.name, codes=p.codes, date=p.date, status=p.status, value=p.value,
                                         components=p.components, ranges=p.ranges, interpretation=p.interpretation)
        fact = measurement_fact(ev, measured, p.ref)
        if fact is not None:
            fact.trend = ev.chunk.category == "trend"
            out.append(fact)
    return out

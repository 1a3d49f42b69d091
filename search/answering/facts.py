"""What a piece of evidence says, read from the FHIR resource it cites, in clinical words.

A `Fact` is one cited thing: a medication order with its dose and status, a measurement with its
values and dates, a problem, an allergy with its reactions, a procedure, a visit, a vaccine. The
answer's first sentence and its short supporting sentences are written from facts, so every word
of them comes from the record the [n] opens. A resource is read as the FHIR specification
defines it, whoever sent it (Synthea, Epic, Oracle Health).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Callable

from fhir_ingest.record.chunk import blood_pressure, clinical_date, day
from fhir_ingest.record.context import observation_flag
from fhir_ingest.record.normalize import codings, concept_text, ref_id, status_code

from search.answering.clinical import (condition_name, dosage_words, drug_name, observation_name, unit,
                                       value_words)
from search.retrieval.pipeline import Evidence

Reader = Callable[[str], "dict | None"]
CURRENT_ORDER = {"active", "on-hold"}
STOPPED_ORDER = {"stopped", "cancelled", "revoked"}
ENCOUNTER_CLASS = {"EMER": "emergency visit", "IMP": "hospital admission", "ACUTE": "hospital admission",
                   "HH": "home health visit", "VR": "virtual visit", "OBSENC": "observation stay"}


@dataclass
class Point:
    date: str
    values: list[float]
    text: str            # '116/98 mmHg', '4.68 mmol/L': as recorded
    ref: str
    flag: str = ""       # high / low, as the record interprets it or against its reference range
    unit: str = ""       # as a chart writes it ('mmHg', '%')


@dataclass
class Fact:
    ev: Evidence
    kind: str            # medication, measurement, problem, allergy, procedure, immunization, encounter, note, other
    name: str            # the clinical short name ('eGFR', 'clopidogrel 75 mg oral tablet')
    words: str           # the clause a sentence is built from, without the name when `named` is False
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


def medication_fact(ev: Evidence, r: dict, read: Reader) -> Fact:
    name = concept_text(r.get("medicationCodeableConcept"))
    if not name:
        med = read(ref_id(r.get("medicationReference"))) or {}
        name = concept_text(med.get("code")) or (r.get("medicationReference") or {}).get("display", "medication")
    status = r.get("status", "")
    when = day(r.get("authoredOn") or clinical_date(r))
    dose = dosage_words(r.get("dosageInstruction"))
    reason = reason_words(r, read)
    since = f"active since {when}" if status in CURRENT_ORDER else f"{status or 'ordered'}, ordered {when}"
    if status in CURRENT_ORDER and years_before_today(when) > 3:
        since = f"marked active but ordered {when}, may be outdated"
    words = ", ".join(b for b in (drug_name(name), dose, since) if b)
    return Fact(ev, "medication", drug_name(name), words, when, status, status in CURRENT_ORDER,
                status in STOPPED_ORDER, reason, series=ingredient(name))


def ingredient(name: str) -> str:
    """The drug without strength and form, so yearly renewals of one drug count once."""
    words = drug_name(name).lower().split()
    kept = [w for w in words if not any(ch.isdigit() for ch in w) and w not in ("mg", "ml", "mcg", "units", "hr")]
    return " ".join(kept[:2])


def reason_words(r: dict, read: Reader) -> str:
    """Why: the order's own reason, else the reason of the visit it was ordered at."""
    own = reasons_of(r, read)
    if own or not ref_id(r.get("encounter")):
        return own
    return reasons_of(read(ref_id(r["encounter"])) or {}, read)


def observation_points(r: dict, ref: str) -> Point | None:
    bp = blood_pressure(r)
    when = day(clinical_date(r))
    if bp:
        sys_q, dia_q = (c.get("valueQuantity") or {} for c in bp)
        if sys_q.get("value") is None or dia_q.get("value") is None:
            return None
        text = f"{value_words({'value': sys_q['value']})}/{value_words({'value': dia_q['value']})} {unit(sys_q.get('unit', 'mm[Hg]'))}"
        return Point(when, [float(sys_q["value"]), float(dia_q["value"])], text, ref, unit=unit(sys_q.get("unit", "mm[Hg]")))
    q = r.get("valueQuantity") or {}
    if isinstance(q.get("value"), (int, float)):
        return Point(when, [float(q["value"])], value_words(q), ref, unit=unit(q.get("unit") or q.get("code") or ""))
    return None


def flag_words(r: dict) -> str:
    return observation_flag(r).lower()


def reference_range(r: dict) -> tuple[float | None, float | None] | None:
    for rr in r.get("referenceRange") or []:
        low, high = (rr.get("low") or {}).get("value"), (rr.get("high") or {}).get("value")
        if low is not None or high is not None:
            return low, high
    return None


def measurement_fact(ev: Evidence, r: dict, ref: str) -> Fact | None:
    point = observation_points(r, ref)
    if point is None:
        return None
    point.flag = flag_words(r) if len(point.values) == 1 else ""
    name = observation_name(r.get("code"))
    series = next((f"{c.get('system')}|{c.get('code')}" for c in codings(r.get("code")) if c.get("code")), name)
    return Fact(ev, "measurement", name, f"{name} {point.text} on {point.date}", point.date, r.get("status", ""),
                series=name or series, unit=point.unit, points=[point],
                flag=flag_words(r), range=reference_range(r), coded=concept_text(r.get("code")))


def condition_fact(ev: Evidence, r: dict) -> Fact:
    name = condition_name(r.get("code"))
    clinical = status_code(r, "clinicalStatus")
    verification = status_code(r, "verificationStatus")
    onset = day(clinical_date(r))
    if verification == "refuted":
        return Fact(ev, "problem", name, f"{name} recorded as refuted", onset, "refuted", False, True)
    ended = day(r.get("abatementDateTime") or "")
    if clinical in ("resolved", "inactive", "remission"):
        when = f"{onset}, {clinical}" + (f" {ended}" if ended else "")
    else:
        when = f"since {onset}" if onset else "date not recorded"
    return Fact(ev, "problem", name, f"{name} ({when})", onset, clinical, clinical not in ("resolved", "inactive", "remission"))


def allergy_fact(ev: Evidence, r: dict) -> Fact:
    name = condition_name(r.get("code"))
    verification = status_code(r, "verificationStatus")
    recorded = day(r.get("recordedDate") or clinical_date(r))
    if verification == "refuted":
        return Fact(ev, "allergy", name, f"an allergy to {name} is recorded as refuted ({recorded})", recorded,
                    "refuted", False, True)
    reactions = []
    for reaction in r.get("reaction") or []:
        severity = reaction.get("severity", "")
        for m in reaction.get("manifestation") or []:
            reactions.append(condition_name(m) + (f" ({severity})" if severity else ""))
    detail = [", ".join(dict.fromkeys(reactions)), f"{r['criticality']} criticality" if r.get("criticality") else "",
              f"recorded {recorded}" if recorded else ""]
    words = name if "allerg" in name.lower() else f"{name} allergy"
    words += f" — {', '.join(d for d in detail if d)}" if any(detail) else ""
    return Fact(ev, "allergy", name, words, recorded, status_code(r, "clinicalStatus"),
                status_code(r, "clinicalStatus") != "inactive")


def reasons_of(r: dict, read: Reader) -> str:
    """reasonCode and reasonReference by the specification (the referenced Condition's name)."""
    reasons = [condition_name(c) for c in r.get("reasonCode") or []]
    reasons += [condition_name((read(ref_id(x)) or {}).get("code")) or x.get("display", "")
                for x in r.get("reasonReference") or []]
    return ", ".join(dict.fromkeys(x for x in reasons if x))


def procedure_fact(ev: Evidence, r: dict, kind: str, read: Reader) -> Fact:
    code = r.get("vaccineCode") if kind == "immunization" else r.get("code")
    name = condition_name(code)
    when = day(clinical_date(r))
    status = r.get("status", "")
    if status == "not-done":
        why = concept_text(r.get("statusReason")) if isinstance(r.get("statusReason"), dict) else ""
        return Fact(ev, kind, name, f"{name} not done ({when}{', ' + why.lower() if why else ''})", when, status,
                    False, True)
    reason = reasons_of(r, read)
    words = (f"{name} on {when}" if when else name) + (f" for {reason}" if reason else "")
    return Fact(ev, kind, name, words, when, status, reason=reason)


def encounter_fact(ev: Evidence, r: dict, read: Reader) -> Fact:
    kind = condition_name((r.get("type") or [{}])[0]) if r.get("type") else ""
    label = ENCOUNTER_CLASS.get((r.get("class") or {}).get("code", ""), "")
    name = kind or label or "visit"
    if label and label.split()[0] not in name.lower():
        name = f"{name} ({label})"
    period = r.get("period") or {}
    start, end = day(period.get("start") or clinical_date(r)), day(period.get("end") or "")
    reason = reasons_of(r, read)
    words = f"{name} on {start}" + (f" to {end}" if end and end != start else "") + (f" for {reason}" if reason else "")
    return Fact(ev, "encounter", name, words, start, r.get("status", ""), reason=reason)


def fact_of(ev: Evidence, read: Reader) -> Fact | None:
    """The fact a chunk's source resource states, or None when it is not one of the kinds above
    (a note, a trend, a panel, a care plan: the caller words those)."""
    chunk = ev.chunk
    if chunk.category == "trend" or chunk.semantic_type == "note":
        return None
    r = read(chunk.ref)
    if not r:
        return None
    kind = r.get("resourceType")
    if kind == "MedicationRequest":
        return medication_fact(ev, r, read)
    if kind == "Observation":
        return measurement_fact(ev, r, chunk.ref)
    if kind == "Condition":
        return condition_fact(ev, r)
    if kind == "AllergyIntolerance":
        return allergy_fact(ev, r)
    if kind in ("Procedure", "Immunization"):
        return procedure_fact(ev, r, kind.lower(), read)
    if kind == "Encounter":
        return encounter_fact(ev, r, read)
    return None


def prefetch(read: Reader, refs: list[str]) -> None:
    """Read many resources at once when the reader can (a plain lookup reads them one by one)."""
    many = getattr(read, "prefetch", None)
    if many is not None:
        many(refs)


def series_facts(ev: Evidence, read: Reader) -> list[Fact]:
    """The measurements a trend chunk or a lab panel draws on, one fact per result."""
    out = []
    refs = ev.chunk.refs[1:] if ev.chunk.category != "trend" else ev.chunk.refs
    prefetch(read, [ref for ref in refs if ref.startswith("Observation/")])
    for ref in refs:
        r = read(ref) if ref.startswith("Observation/") else None
        fact = measurement_fact(ev, r, ref) if r else None
        if fact is not None:
            fact.trend = ev.chunk.category == "trend"
            out.append(fact)
    return out

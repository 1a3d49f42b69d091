"""The context bundle: the structured facts a clinician scans first, each with the ref it came from.

Active problems, active medications with dose, allergies, the latest value of each lab and vital
sign (with date and flag), and the last encounters. Read through the kinds' typed facts (the same
facts the answer uses), from structured resources only: nothing here is read from a note, so
nothing here can be a templated line contradicting the record.
"""
from __future__ import annotations

import re

from .facts import Dose, MeasurementFact
from .kinds import fact_of
from .kinds.observations import measured_words, pressure_sides
from .normalize import status_code
from .words import _strip_tag, day

INACTIVE_PROBLEM = {"resolved", "inactive", "remission"}
WITHDRAWN = {"entered-in-error"}
CURRENT_ORDER = {"active", "on-hold"}
# Social circumstances and care-process reminders that EHRs (and Synthea) file as Conditions:
# worth a chunk for search, not a line on the problem list a clinician scans.
NOT_A_PROBLEM = re.compile(r"employment|labor force|education|social|isolation|stress\b|housing|homeless|income|"
                           r"violence|criminal|transport|refugee|review due|risk activity|insurance|(\(situation\))",
                           re.I)
LAST_ENCOUNTERS = 5


def _withdrawn(r: dict) -> bool:
    return status_code(r, "status") in WITHDRAWN or status_code(r, "verificationStatus") in WITHDRAWN | {"refuted"}


def measurement_flag(fact: MeasurementFact) -> str:
    """The interpretation the record gives, else high/low against its reference range."""
    if fact.interpretation:
        return fact.interpretation
    number = fact.value.number if fact.value else None
    for rr in fact.ranges:
        if number is not None:
            if rr.low is not None and rr.low.value is not None and number < rr.low.value:
                return "low"
            if rr.high is not None and rr.high.value is not None and number > rr.high.value:
                return "high"
    return ""


def dose_words(doses: list[Dose]) -> str:
    """One line per dosage, its parts once each ("Take as needed.; as needed" says one thing)."""
    lines = []
    for dose in doses:
        parts = [dose.text, dose.amount.text if dose.amount else "", f"rate {dose.rate}" if dose.rate else "",
                 dose.timing, f"route {dose.route}" if dose.route else "", dose.as_needed, dose.maximum]
        kept: list[str] = []
        for part in (p.strip().rstrip(".") for p in parts if p and p.strip()):
            if not any(part.lower() in k.lower() for k in kept):
                kept.append(part)
        if kept:
            lines.append("; ".join(kept))
    return " | ".join(dict.fromkeys(lines))


def context_bundle(resources: list[dict]) -> dict:
    by_ref = {f"{r['resourceType']}/{r['id']}": r for r in resources}
    facts = [(f"{r['resourceType']}/{r['id']}", r["resourceType"], fact_of(r, by_ref.get))
             for r in resources if not _withdrawn(r)]
    return {
        "problems": sorted(problems(facts), key=lambda p: p["since"], reverse=True),
        "medications": sorted(medications(facts), key=lambda m: m["since"], reverse=True),
        "allergies": allergies(facts),
        **measurements(facts),
        "encounters": encounters(facts),
    }


def problems(facts) -> list[dict]:
    return [{"ref": ref, "name": _strip_tag(f.name), "since": day(f.date), "status": f.status}
            for ref, rt, f in facts if rt == "Condition" and f.status not in INACTIVE_PROBLEM
            and not NOT_A_PROBLEM.search(f.name)]


def medications(facts) -> list[dict]:
    return [{"ref": ref, "name": f.medication, "dose": dose_words(f.doses), "since": day(f.date),
             "reason": ", ".join(f.reasons), "status": f.status}
            for ref, rt, f in facts if rt == "MedicationRequest" and f.status in CURRENT_ORDER]


def allergies(facts) -> list[dict]:
    return [{"ref": ref, "name": _strip_tag(f.name),
             "reactions": sorted({m for reaction in f.reactions for m in reaction.manifestations}),
             "criticality": f.criticality, "status": f.status}
            for ref, rt, f in facts if rt == "AllergyIntolerance" and f.status != "inactive"]


def measurements(facts) -> dict:
    """The latest lab and vital-sign result of each test."""
    latest: dict[tuple[str, str], tuple[str, MeasurementFact]] = {}
    for ref, rt, f in facts:
        if rt != "Observation" or f.category not in ("laboratory", "vital-signs"):
            continue
        key = (f.category, f.name)
        if key not in latest or f.date >= latest[key][1].date:
            latest[key] = (ref, f)
    labs, vitals = [], []
    for (category, name), (ref, f) in sorted(latest.items(), key=lambda kv: kv[0][1]):
        item = {"ref": ref, "name": name, "value": measured_words(f), "date": day(f.date),
                "flag": measurement_flag(f) if pressure_sides(f) is None else ""}
        (labs if category == "laboratory" else vitals).append(item)
    return {"labs": labs, "vitals": vitals}


def encounters(facts) -> list[dict]:
    visits = sorted(((ref, f) for ref, rt, f in facts if rt == "Encounter"), key=lambda rf: rf[1].date, reverse=True)
    return [{"ref": ref, "date": day(f.date), "type": ", ".join(f.types), "class": f.encounter_class,
             "reason": ", ".join(f.reasons)} for ref, f in visits[:LAST_ENCOUNTERS]]

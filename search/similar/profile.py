"""A patient's profile: the typed features similar patients and cohorts compare, and its text.

Read through the kinds' fact readers (the same typed facts the chunks, the context bundle and
the side panel carry), from structured resources only. The profile keeps dates, since what
followed a shared medication is measured from them; nothing that leaves `search.similar` does.
"""
from __future__ import annotations

import re
from datetime import date
from functools import lru_cache
from pathlib import Path

from fhir_ingest.record.context import NOT_A_PROBLEM, _withdrawn
from fhir_ingest.record.kinds import fact_of
from fhir_ingest.record.words import _strip_tag

from search.answering.clinical import short_names
from search.nlp.terminology import classes_of, ingredients_in
from search.nlp.units import Measured, factor
from search.similar.version import PROFILE_VERSION

INACTIVE = {"resolved", "inactive", "remission"}
SEMANTIC_TAG = re.compile(r"\((disorder|finding|situation|person|event|morphologic abnormality)\)\s*$")
# Encounter classes that are an admission (inpatient) or an emergency visit.
ADMISSION = {"IMP", "ACUTE", "NONAC", "EMER", "inpatient", "emergency"}
# Blood pressure comes as a panel whose components carry the values.
PRESSURE_PARTS = {"8480-6": "systolic BP", "8462-4": "diastolic BP"}
REFERENCE_INTERVALS = Path(__file__).parent / "data" / "reference_intervals.tsv"
MEASURE_UNITS = Path(__file__).parent / "data" / "measure_units.tsv"
ADULT = 18               # the table's intervals are adults'; a child's reading is flagged only by its own range
HIGH_WORDS = {"high", "above", "h", "hh", "hu", "elevated"}
LOW_WORDS = {"low", "below", "l", "ll", "lu", "decreased"}


def day(text: str) -> str:
    return (text or "")[:10]


def years_between(start: str, end: str) -> float | None:
    try:
        return (date.fromisoformat(day(end)) - date.fromisoformat(day(start))).days / 365.25
    except ValueError:
        return None


def age_band(birth: str, on: str) -> str:
    """The 5-year band ('60-64') of the age on a date; '' when the birth date is unknown."""
    age = years_between(birth, on)
    if age is None or age < 0:
        return ""
    low = int(age) // 5 * 5
    return f"{low}-{low + 4}" if low < 90 else "90+"


def build_profile(patient_id: str, resources: list[dict], chunks=()) -> dict:
    """The profile of one patient's record (resources as the index stores them); `chunks`, the
    record's annotated chunks, give each problem its concepts ("Disorder of kidney due to
    diabetes mellitus" and "Diabetes mellitus type 2" are both diabetes)."""
    by_ref = {f"{r['resourceType']}/{r['id']}": r for r in resources}
    builder = ProfileBuilder(patient_id)
    for resource in by_ref.values():
        builder.add(resource, by_ref.get)
    return builder.profile(problem_concepts(chunks))


# Whose facts the profile keeps to the end (problems, treatment, allergies: a few per visit);
# visits and readings, most of a large record, are reduced as they are added.
KEPT_FACTS = frozenset({"Condition", "MedicationRequest", "MedicationStatement", "AllergyIntolerance"})


class ProfileBuilder:
    """A profile built a resource at a time, keeping what the profile reads of each fact rather
    than the facts: a large record indexed in parts (search/record_parts.py) adds each part's
    resources as they are chunked, so its end need not read the whole record again."""

    def __init__(self, patient_id: str):
        self.patient_id = patient_id
        self.patient: dict | None = None
        self.newest = ""
        self.kept: list[tuple[str, str, object]] = []       # (ref, type, fact) of KEPT_FACTS
        self.visits: list[str] = []
        self.admissions = 0
        self.readings = Readings()

    def add(self, resource: dict, resolve) -> None:
        """One resource of the record (each once, in the record's order); `resolve` reads a
        reference against the whole record."""
        rt = resource["resourceType"]
        if rt == "Patient" and self.patient is None:
            self.patient = resource
        if _withdrawn(resource):
            return
        fact = fact_of(resource, resolve)
        if fact is None:
            return
        if fact.date:
            self.newest = max(self.newest, day(fact.date))
        if rt in KEPT_FACTS:
            self.kept.append((f"{rt}/{resource['id']}", rt, fact))
        elif rt == "Encounter":
            self.visits += [day(fact.date)] if fact.date else []
            self.admissions += fact.encounter_class in ADMISSION
        elif rt == "Observation":
            self.readings.add(fact)

    def profile(self, concepts: dict[str, list[str]]) -> dict:
        """The profile; `concepts`, each Condition's problem concepts (`problem_concepts`)."""
        patient, facts = self.patient or {}, self.kept
        end = day(patient.get("deceasedDateTime", "")) or self.newest
        return {
            "version": PROFILE_VERSION, "patient_id": self.patient_id,
            "sex": patient.get("gender", "") or "unknown",
            "age_band": age_band(patient.get("birthDate", ""), end),
            "birth": day(patient.get("birthDate", "")), "last_date": self.newest,
            "problems": treated(problems(facts, concepts), facts), "medications": medications(facts),
            "allergies": sorted({_strip_tag(f.name) for _, rt, f in facts if rt == "AllergyIntolerance" and f.name}),
            **self.readings.measures(), "lab_states": self.readings.states(day(patient.get("birthDate", ""))),
            "utilisation": utilisation(self.visits, self.admissions),
        }


def problem_concepts(chunks, found: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Condition ref -> the problem concepts its chunk asserts (not negated); `found`, what
    earlier chunks of the record gave (a record indexed in parts adds each part's)."""
    found = dict(found or {})
    for chunk in chunks:
        if chunk.resource_type == "Condition" and chunk.refs:
            keys = {c["key"] for c in chunk.concepts if c.get("semantic_type") == "problem" and not c.get("negated")}
            found[chunk.refs[0]] = sorted(set(found.get(chunk.refs[0], ())) | keys)
    return found


def problems(facts, concepts: dict[str, list[str]]) -> list[dict]:
    """Each problem once (by code, else name): its concepts, first onset, and its end when it has one."""
    found: dict[str, dict] = {}
    for ref, rt, f in facts:
        if rt != "Condition" or not f.name or NOT_A_PROBLEM.search(f.name):
            continue
        code = next((c.code for c in f.codes if c.code), "")
        key = code or _strip_tag(f.name).lower()
        onset = day(f.onset_date or f.date)
        held = found.setdefault(key, {"key": key, "code": code, "name": _strip_tag(f.name), "onset": onset,
                                      "active": False, "ended": "", "concepts": [], "tag": semantic_tag(f.name)})
        held["concepts"] = sorted(set(held["concepts"]) | set(concepts.get(ref, ())))
        held["onset"] = min(filter(None, (held["onset"], onset)), default="")
        if f.status in INACTIVE:
            held["ended"] = max(held["ended"], day(f.abatement) if f.abatement[:4].isdigit() else "")
        else:
            held["active"] = True
    return sorted(found.values(), key=lambda p: p["key"])


def semantic_tag(name: str) -> str:
    """'Prediabetes (finding)' -> 'finding': the SNOMED CT semantic tag a display ends with, '' when
    it has none (another terminology, free text)."""
    match = SEMANTIC_TAG.search(name or "")
    return match.group(1) if match else ""


def treated(found: list[dict], facts) -> list[dict]:
    """Marks each problem a medication order or statement names as its reason: the conditions
    that drive treatment say most about who a patient is."""
    reasons = {_strip_tag(reason).lower() for _, rt, f in facts if rt in ("MedicationRequest", "MedicationStatement")
               for reason in (*f.reasons, *f.visit_reasons)}
    return [dict(problem, treated=problem["name"].lower() in reasons) for problem in found]


def medications(facts) -> list[dict]:
    """Each ingredient once, with its classes, first start and whether an order is current."""
    found: dict[str, dict] = {}
    for _, rt, f in facts:
        if rt not in ("MedicationRequest", "MedicationStatement") or not f.medication:
            continue
        for ingredient in sorted(ingredients_in(f.medication)):
            held = found.setdefault(ingredient, {"ingredient": ingredient, "classes": sorted(classes_of(
                ingredient, epc=False)), "start": day(f.date), "current": False})
            held["start"] = min(filter(None, (held["start"], day(f.date))), default="")
            held["current"] = held["current"] or f.status in ("active", "on-hold")
    return sorted(found.values(), key=lambda m: m["ingredient"])


class Readings:
    """The common labs and vital signs of a record, read one observation at a time: `measures`,
    the series [date, value] of each (those with a short name) in its one unit
    (measure_units.tsv), with the readings whose unit could not be converted counted apart (a
    series never mixes two units); and the newest reading of each, for `states`."""

    def __init__(self):
        self.names = short_names()
        self.series: dict[str, list[list]] = {}
        self.left_out: dict[str, int] = {}
        self.newest: dict[str, tuple] = {}      # name → (day, quantity, fact, own value?, LOINC)

    def add(self, f) -> None:
        if f.category not in ("laboratory", "vital-signs"):
            return
        for name, quantity, own, loinc in readings(f, self.names):
            value = in_measure_unit(name, quantity, loinc)
            if value is None:
                self.left_out[name] = self.left_out.get(name, 0) + 1
            else:
                self.series.setdefault(name, []).append([day(f.date), value])
            if name not in self.newest or day(f.date) >= self.newest[name][0]:
                self.newest[name] = (day(f.date), quantity, f, own, loinc)

    def measures(self) -> dict:
        return {"measures": {name: sorted(points) for name, points in sorted(self.series.items())},
                "measures_left_out": dict(sorted(self.left_out.items()))}

    def states(self, birth: str) -> dict[str, str]:
        """Each common lab and vital sign whose newest reading is out of range: 'high' or 'low'.
        Two patients with the same disease share its labs' state (a raised creatinine, a low
        eGFR) when their problem lists word it differently or not at all."""
        states = {}
        for name, (when, quantity, fact, own, loinc) in self.newest.items():
            age = years_between(birth, when)
            state = reading_state(name, quantity, fact if own else None, age is not None and age >= ADULT, loinc)
            if state:
                states[name] = state
        return dict(sorted(states.items()))


def in_measure_unit(name: str, quantity, loinc: str) -> float | None:
    """The reading's value in its measure's unit; None when its unit cannot be converted (a
    measure the table does not list keeps the value as recorded)."""
    unit = measure_units().get(name)
    recorded = quantity.code or quantity.unit
    if unit is None or recorded == unit:
        return float(quantity.value)
    convert = factor(Measured(recorded, loinc), Measured(unit, loinc))
    return round(convert(float(quantity.value)), 4) if convert is not None else None


@lru_cache(maxsize=1)
def measure_units() -> dict[str, str]:
    """Short name -> the UCUM unit its series are kept in (measure_units.tsv)."""
    rows = [line.split("\t") for line in MEASURE_UNITS.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    return {name: unit.strip() for name, unit in rows[1:]}


def readings(fact, names: dict[str, str]) -> list[tuple[str, object, bool, str]]:
    """(short name, quantity, whether it is the observation's own value, LOINC code) of each common
    lab or vital sign a reading carries: its value, or its components (a blood pressure panel's)."""
    found = []
    quantity = fact.value.quantity if fact.value else None
    for coding in fact.codes:
        if coding.code in names and quantity is not None and quantity.value is not None:
            found.append((names[coding.code], quantity, True, coding.code))
            break
    for component in fact.components:
        for coding in component.codes:
            name = PRESSURE_PARTS.get(coding.code) or names.get(coding.code)
            part = component.value.quantity if component.value else None
            if name and part is not None and part.value is not None:
                found.append((name, part, False, coding.code))
                break
    return found


def reading_state(name: str, quantity, fact, adult: bool, loinc: str = "") -> str:
    """'high', 'low' or '' (normal, or not known). The record's own word first (the reading's
    interpretation, then its reference range: laboratories differ), else the adult reference
    interval of reference_intervals.tsv, the reading converted to the unit it lists (a creatinine
    of 150 umol/L is 1.7 mg/dL: high)."""
    if fact is not None:
        said = interpretation_state(fact.interpretation)
        if said is not None:
            return said
        for bounds in fact.ranges:
            low, high = (b.value if b is not None else None for b in (bounds.low, bounds.high))
            if low is not None or high is not None:
                return beyond(float(quantity.value), low, high)
    units, low, high = reference_intervals().get(name, ((), None, None))
    if not adult or not units:
        return ""
    if quantity.code in units or quantity.unit in units:
        return beyond(float(quantity.value), low, high)
    convert = factor(Measured(quantity.code or quantity.unit, loinc), Measured(units[0], loinc))
    return beyond(convert(float(quantity.value)), low, high) if convert is not None else ""


def interpretation_state(text: str) -> str | None:
    """'High', 'H', 'Critical high', 'Above high normal' -> 'high'; 'Normal' -> ''; None when the
    reading has no interpretation or one without a direction ('Abnormal')."""
    words = set(re.findall(r"[a-z]+", (text or "").lower()))
    if words & HIGH_WORDS:
        return "high"
    if words & LOW_WORDS:
        return "low"
    return "" if words & {"normal", "n"} else None


def beyond(value: float, low: float | None, high: float | None) -> str:
    if high is not None and value > high:
        return "high"
    if low is not None and value < low:
        return "low"
    return ""


@lru_cache(maxsize=1)
def reference_intervals() -> dict[str, tuple[tuple[str, ...], float | None, float | None]]:
    """Short name -> (units, the first the one to convert to; low, high) of reference_intervals.tsv."""
    rows = [(line.split("\t") + ["", ""])[:4] for line in REFERENCE_INTERVALS.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    number = lambda text: float(text) if text.strip() else None
    return {name: (tuple(units.split("|")), number(low), number(high)) for name, units, low, high in rows[1:]}


def utilisation(visits: list[str], admissions: int) -> dict:
    """Visits (their dates) and admissions (inpatient or emergency) per year of the record."""
    visits = sorted(visits)
    span = max(years_between(visits[0], visits[-1]) or 0.0, 1.0) if visits else 1.0
    return {"visits_per_year": round(len(visits) / span, 2), "admissions_per_year": round(admissions / span, 2)}


def latest_trend(points: list[list]) -> str:
    """'rising', 'falling' or 'stable' over the last two readings (5% either way)."""
    if len(points) < 2:
        return "single reading"
    before, last = points[-2][1], points[-1][1]
    if before and abs(last - before) / abs(before) < 0.05:
        return "stable"
    return "rising" if last > before else "falling"


def profile_text(profile: dict) -> str:
    """What is embedded: the comparable features in words, no identifier and no date."""
    problems_now = [p["name"] for p in profile["problems"] if p["active"]]
    past = [p["name"] for p in profile["problems"] if not p["active"]]
    meds = [m["ingredient"] + (f" ({', '.join(m['classes'])})" if m["classes"] else "")
            for m in profile["medications"] if m["current"]]
    labs = [f"{name} {points[-1][1]:g} {latest_trend(points)}" for name, points in profile["measures"].items()]
    return ". ".join(part for part in (
        f"{profile['sex']} aged {profile['age_band'] or 'unknown'}",
        "Problems: " + "; ".join(problems_now) if problems_now else "",
        "Medications: " + "; ".join(meds) if meds else "",
        "Allergies: " + "; ".join(profile["allergies"]) if profile["allergies"] else "",
        "Labs and vitals: " + "; ".join(labs) if labs else "",
        "Past problems: " + "; ".join(past) if past else "") if part)


def profile_keys(profile: dict) -> list[str]:
    """What a cohort selects patients by, and what likeness counts the rarity of: each problem (by
    code, else name), ingredient and class, and each lab out of range."""
    keys = {f"problem:{p['key']}" for p in profile["problems"]}
    keys |= {f"concept:{c}" for p in profile["problems"] for c in p["concepts"]}
    keys |= {f"drug:{m['ingredient']}" for m in profile["medications"]}
    keys |= {f"class:{c}" for m in profile["medications"] for c in m["classes"]}
    keys |= {lab_key(name, state) for name, state in profile.get("lab_states", {}).items()}
    return sorted(keys)


def lab_key(name: str, state: str) -> str:
    return f"lab:{name} {state}"

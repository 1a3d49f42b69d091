"""Cohort comparisons: how an outcome measure moved after two (or more) exposures started, among
the tenant's patients with a condition. Aggregates only: per group the number of patients and
the median change; a group smaller than the minimum is suppressed and said so.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from statistics import median

from search.answering.clinical import short_names
from search.backends.base import Backend
from search.nlp.terminology import clinical_class, ingredient_of, lab_codes
from search.similar.profile import PRESSURE_PARTS, measure_units

MINIMUM_GROUP = 11
NOT_EVIDENCE = ("This describes the records of this workspace, not evidence of effect: the groups were not "
                "randomised and may differ in ways the records do not show.")
BASELINE_DAYS = 365    # a baseline reading at most this long before the exposure started


class CohortError(ValueError):
    """A comparison that cannot be made as asked (an unknown condition, drug or measure)."""


@dataclass(frozen=True)
class Comparison:
    condition: str
    exposures: tuple[str, ...]
    outcome: str
    window_months: int = 12
    minimum: int = MINIMUM_GROUP


def compare(backend: Backend, tenant: str, asked: Comparison) -> dict:
    """Per exposure group: patients, patients with the measure before and after, median change."""
    condition_keys = condition_concepts(asked.condition)
    exposure_keys = [exposure_key(word) for word in asked.exposures]
    measure = measure_name(asked.outcome)
    # The store selects by drug and condition both (its keys hold every problem's concepts), and
    # reads of each profile only the medications and the outcome's series.
    patients = backend.cohort_profiles(tenant, exposure_keys, sorted(condition_keys), measure)
    members = {key: [p for p in patients if holds(p, key)] for key in exposure_keys}
    in_several = {p["patient_id"] for key in exposure_keys for p in members[key]
                  if sum(holds(p, other) for other in exposure_keys) > 1}
    groups = [group_result(word, key, [p for p in members[key] if p["patient_id"] not in in_several],
                           measure, asked) for word, key in zip(asked.exposures, exposure_keys)]
    return {"condition": asked.condition, "outcome": measure, "unit": measure_units().get(measure, ""),
            "window_months": asked.window_months,
            "minimum_group": asked.minimum, "groups": groups,
            "left_out": (f"{len(in_several)} patient{'s' if len(in_several) != 1 else ''} exposed to more than one "
                         "group's drug left out of every group" if in_several else ""),
            "suppressed": [g["exposure"] for g in groups if g["suppressed"]],
            "statement": NOT_EVIDENCE}


def condition_concepts(condition: str) -> set[str]:
    from search.nlp.annotate import default_annotator

    found = {f"concept:{c['key']}" for c in default_annotator().annotate([condition])[0]
             if c.get("semantic_type") == "problem" and not c.get("negated")}
    if not found:
        raise CohortError(f"{condition!r} names no condition chartcite knows; name it as a clinician would "
                          "(hypertension, type 2 diabetes, CKD)")
    return found


def exposure_key(word: str) -> str:
    ingredient = ingredient_of(word)
    if ingredient:
        return f"drug:{ingredient}"
    drug_class = clinical_class(word)
    if drug_class:
        return f"class:{drug_class}"
    raise CohortError(f"{word!r} names no drug or drug class chartcite knows")


def measure_name(word: str) -> str:
    names = {**short_names(), **PRESSURE_PARTS}
    by_name = {name.lower(): name for name in names.values()}
    said = word.strip().lower().replace("blood pressure", "bp")
    if said in by_name:
        return by_name[said]
    found = sorted({names[code] for code in lab_codes(word) if code in names})
    if len(found) == 1:
        return found[0]
    raise CohortError(f"{word!r} names no single lab or vital sign chartcite follows (try HbA1c, systolic BP, "
                      "LDL, eGFR, BMI)")


def holds(profile: dict, key: str) -> bool:
    kind, name = key.split(":", 1)
    return any((m["ingredient"] == name) if kind == "drug" else (name in m["classes"]) for m in profile["medications"])


def exposure_start(profile: dict, key: str) -> str:
    kind, name = key.split(":", 1)
    return min(m["start"] for m in profile["medications"]
               if m["start"] and ((m["ingredient"] == name) if kind == "drug" else (name in m["classes"])))


def change_after(profile: dict, key: str, measure: str, months: int) -> float | None:
    """The newest reading within the window after the exposure started, less the newest reading
    in the year before it; None without both."""
    try:
        start = date.fromisoformat(exposure_start(profile, key))
    except ValueError:
        return None
    points = profile["measures"].get(measure) or []
    earliest, latest = (start - timedelta(days=BASELINE_DAYS)).isoformat(), (start + timedelta(days=round(
        months * 30.44))).isoformat()
    before = [v for d, v in points if earliest <= d <= start.isoformat()]
    after = [v for d, v in points if start.isoformat() < d <= latest]
    return after[-1] - before[-1] if before and after else None


def group_result(word: str, key: str, members: list[dict], measure: str, asked: Comparison) -> dict:
    changes = [c for c in (change_after(p, key, measure, asked.window_months) for p in members) if c is not None]
    if not members:
        return {"exposure": word, "patients": 0, "with_measure": 0, "median_change": None, "suppressed": False,
                "note": f"no patient with the condition has {word} in this workspace's records"}
    if len(members) < asked.minimum:
        return {"exposure": word, "patients": None, "with_measure": None, "median_change": None, "suppressed": True,
                "note": f"fewer than {asked.minimum} patients: suppressed, so that no one can be recognised"}
    if len(changes) < asked.minimum:
        return {"exposure": word, "patients": len(members), "with_measure": None, "median_change": None,
                "suppressed": True, "note": f"fewer than {asked.minimum} of them have {measure} before and after the "
                                            "start: the change is suppressed"}
    return {"exposure": word, "patients": len(members), "with_measure": len(changes),
            "median_change": round(median(changes), 2), "suppressed": False, "note": ""}

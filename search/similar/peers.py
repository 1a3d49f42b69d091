"""Similar patients: the k patients of the same tenant most like this one, de-identified.

Candidates come from the profile vectors (kNN inside the tenant); each is then scored on its
typed features (shared problems, medications, age band, sex), since two records written alike
are not two patients alike. What leaves here names no one: an opaque handle valid for this
response only (never stored, so it opens nothing), a 5-year age band, sex, what the two share
and what followed for the other patient, with offsets instead of dates.
"""
from __future__ import annotations

import math
import secrets
from datetime import date

from search.backends.base import Backend
from search.similar.profile import lab_key, latest_trend

NO_PEERS = "No comparable patients found in this workspace. Manual review recommended."
# A record indexed before profiles existed has none until it is indexed again: not "no peers".
NO_PROFILE = ("This patient's record has not been compared yet: its profile is built when the record is next "
              "indexed (a sync, or `chartcite index`) or by `chartcite check --repair`. Manual review recommended.")
SOURCE_NOTE = ("Other patients of this workspace's own records, de-identified: no names, identifiers or dates; "
               "ages in 5-year bands.")
FLOOR = 0.3          # below this similarity a patient is not called comparable
CANDIDATES = 50      # nearest profile vectors re-scored on their features
# Outcomes a clinician follows after a medication starts.
FOLLOWED_MEASURES = ("HbA1c", "systolic BP", "LDL", "eGFR", "BMI", "creatinine")
MAX_LISTED = 6
# A problem recorded as a finding or situation (SNOMED CT's "(finding)", "(situation)": obesity by
# BMI, an education level, prediabetes) weighs half a disorder: shared findings made patients alike
# who share no disease (measured: hypertension 0.94 -> 0.95 top-5 sharing, diabetes unchanged).
FINDING_WEIGHT = 0.5


def similar_patients(backend: Backend, tenant: str, patient_id: str, k: int = 5) -> dict:
    """{"similar": [...], "message", "confidence", "source"}: the contract's answer when none is comparable."""
    nearest = backend.nearest_profiles(tenant, patient_id, max(CANDIDATES, k))
    profiles = backend.get_profiles(tenant, [patient_id, *(pid for pid, _ in nearest)])
    own = profiles.get(patient_id)
    if own is None:
        return {"similar": [], "message": NO_PROFILE, "confidence": "low", "source": SOURCE_NOTE}
    weights = rarity(backend, tenant, [profiles[pid] for pid, _ in nearest if pid in profiles] + [own])
    scored = sorted(((similarity(own, profiles[pid], cosine, weights), pid) for pid, cosine in nearest
                     if pid in profiles), key=lambda sp: -sp[0])
    chosen = [(score, profiles[pid]) for score, pid in scored if score >= FLOOR][:k]
    if not chosen:
        return {"similar": [], "message": NO_PEERS, "confidence": "low", "source": SOURCE_NOTE}
    return {"similar": [peer_view(own, other, score) for score, other in chosen],
            "message": f"{len(chosen)} comparable patient{'s' if len(chosen) != 1 else ''} in this workspace.",
            "confidence": "medium" if chosen[0][0] >= 0.5 else "low", "source": SOURCE_NOTE}


def rarity(backend: Backend, tenant: str, profiles: list[dict]) -> dict[str, float]:
    """A weight per problem and drug: what nearly every patient of the workspace has (caries, a
    flu shot) says little about likeness; what few have says much. Counted over the whole
    tenant, not the candidates: the nearest are alike by construction, so among them what they
    share looks common. Smoothed (log(1 + N/n)), so a feature every patient shares still counts."""
    wanted = sorted({key for profile in profiles for feature in features(profile) for key in stored_keys(feature)})
    total, counts = backend.key_frequencies(tenant, wanted)
    total = max(total, len(profiles))
    weights = {}
    for feature in {f for profile in profiles for f in features(profile)}:
        holders = max([counts.get(key, 0) for key in stored_keys(feature)] + [1])
        weights[feature] = math.log(1 + total / holders)
    return weights


def stored_keys(feature: str) -> list[str]:
    """The profile keys a feature is counted under: a problem by its concept or its code."""
    if feature.startswith("problem:"):
        name = feature.split(":", 1)[1]
        return [f"concept:{name}", f"problem:{name}"]
    return [feature]


def features(profile: dict) -> set[str]:
    """Active problems (a resolved sprain or bronchitis says little about who a patient is), the
    ingredients of medications ever taken, and the labs whose newest reading is out of range. Not
    the drugs' classes: each drug carries several (aspirin four: antiplatelet, NSAID, pain
    medication...), and counted as features those broad classes outweighed the ingredients two
    patients share."""
    return ({f"problem:{c}" for p in profile["problems"] if p["active"] for c in p["concepts"] or [p["key"]]}
            | {f"drug:{m['ingredient']}" for m in profile["medications"]}
            | {lab_key(name, state) for name, state in profile.get("lab_states", {}).items()})


def problem_keys(problems: list[dict]) -> list[str]:
    """A problem is the same as another by a concept both assert, else by code."""
    return [key for p in problems for key in (p["concepts"] or [p["key"]])]


def overlap(a: set[str], b: set[str], weights: dict[str, float]) -> float:
    union = sum(weights.get(key, 1.0) for key in a | b)
    return sum(weights.get(key, 1.0) for key in a & b) / union if union else 0.0


def problem_units(profile: dict, weights: dict[str, float]) -> list[tuple[set[str], float]]:
    """Each active problem once, as the concepts it asserts, weighed by its broadest one: a
    diabetic kidney disorder is diabetes to a patient with type 2 diabetes, and counting its code,
    its kidney concept and its diabetes apart would let the wording of one problem outweigh two
    patients sharing it. Not weighed up for being treated: three times for a problem a
    medication names as its reason made the commonest treated one (hypertension) outweigh rarer
    chronic ones (diabetes, kidney disease); a shared drug already counts on its own."""
    units = []
    for problem in (p for p in profile["problems"] if p["active"]):
        keys = {f"problem:{key}" for key in problem["concepts"] or [problem["key"]]}
        kind = FINDING_WEIGHT if problem.get("tag", "") not in ("", "disorder") else 1.0
        units.append((keys, kind * min(weights.get(key, 1.0) for key in keys)))
    return units


def problem_overlap(own: dict, other: dict, weights: dict[str, float]) -> float:
    """0-1: the weight of each patient's problems the other shares (by any concept), over the
    weight of both patients' problems."""
    mine, theirs = problem_units(own, weights), problem_units(other, weights)
    my_keys = set().union(*(keys for keys, _ in mine)) if mine else set()
    their_keys = set().union(*(keys for keys, _ in theirs)) if theirs else set()
    total = sum(w for _, w in mine) + sum(w for _, w in theirs)
    shared = sum(w for keys, w in mine if keys & their_keys) + sum(w for keys, w in theirs if keys & my_keys)
    return shared / total if total else 0.0


def band_low(band: str) -> int | None:
    head = band.split("-")[0].rstrip("+")
    return int(head) if head.isdigit() else None


def similarity(own: dict, other: dict, cosine: float, weights: dict[str, float]) -> float:
    """0-1: the profile texts' cosine, the weighted overlap of problems, medications and labs out
    of range, age and sex. Labs out of range say what a problem list may not (a raised
    creatinine); age and sex weigh least, since peers of another age with the same diseases are
    the ones a clinician asks for (docs/similar-patients.md has the figures of each choice)."""
    problems = problem_overlap(own, other, weights)
    mine, theirs = features(own), features(other)
    drugs = overlap({f for f in mine if f.startswith("drug:")}, {f for f in theirs if f.startswith("drug:")}, weights)
    labs = overlap({f for f in mine if f.startswith("lab:")}, {f for f in theirs if f.startswith("lab:")}, weights)
    a, b = band_low(own["age_band"]), band_low(other["age_band"])
    age = max(0.0, 1 - abs(a - b) / 20) if a is not None and b is not None else 0.0
    demographic = 0.5 * (own["sex"] == other["sex"]) + 0.5 * age
    score = 0.1 * max(cosine, 0.0) + 0.55 * problems + 0.15 * drugs + 0.15 * labs + 0.05 * demographic
    return round(min(max(score, 0.0), 1.0), 3)


def peer_view(own: dict, other: dict, score: float) -> dict:
    """One similar patient as shown: nothing that identifies them."""
    return {"handle": secrets.token_urlsafe(9), "similarity": score, "age_band": other["age_band"] or "unknown",
            "sex": other["sex"], "shared": shared(own, other), "followed": followed(own, other)}


def shared(own: dict, other: dict) -> list[str]:
    theirs = set(problem_keys(other["problems"]))
    found = [f"condition: {p['name']}" for p in own["problems"] if theirs & set(problem_keys([p]))]
    drugs = {m["ingredient"] for m in other["medications"]}
    found += [f"medication: {m['ingredient']}" for m in own["medications"] if m["ingredient"] in drugs]
    their_states = other.get("lab_states", {})
    found += [f"lab: {name} {state}" for name, state in own.get("lab_states", {}).items() if their_states.get(name) == state]
    for name, points in own["measures"].items():
        trend, their_points = latest_trend(points), other["measures"].get(name)
        if their_points and trend in ("rising", "falling") and latest_trend(their_points) == trend:
            found.append(f"lab pattern: {name} {trend}")
    return found


def followed(own: dict, other: dict) -> list[str]:
    """What came after for the other patient, measured from what the two share, in offsets."""
    mine = set(problem_keys(own["problems"]))
    anchors = [p for p in other["problems"] if mine & set(problem_keys([p])) and p["onset"]]
    said: list[str] = []
    if anchors:
        first = min(anchors, key=lambda p: p["onset"])
        later = [p for p in other["problems"] if not mine & set(problem_keys([p])) and p["onset"] > first["onset"]]
        said += [f"{p['name']} appeared {offset(first['onset'], p['onset'])} after {first['name']}"
                 for p in sorted(later, key=lambda p: p["onset"])[:3]]
        said += [f"{p['name']} resolved " + (f"{offset(p['onset'], p['ended'])} after onset" if p["ended"] else
                                              "(when is not recorded)")
                 for p in anchors if not p["active"]][:2]
    own_drugs = {m["ingredient"] for m in own["medications"]}
    for medication in (m for m in other["medications"] if m["ingredient"] in own_drugs and m["start"]):
        said += [line for line in (course_after(other, name, medication) for name in FOLLOWED_MEASURES) if line]
    return said[:MAX_LISTED]


def course_after(profile: dict, measure: str, medication: dict) -> str:
    """'HbA1c 7.9 -> 6.8 over 11 months after metformin started', from the last reading on or
    before the start to the newest after it."""
    points = profile["measures"].get(measure) or []
    before = [p for p in points if p[0] <= medication["start"]]
    after = [p for p in points if p[0] > medication["start"]]
    if not before or not after:
        return ""
    return (f"{measure} {before[-1][1]:g} -> {after[-1][1]:g} over {offset(medication['start'], after[-1][0])} "
            f"after {medication['ingredient']} started")


def offset(start: str, end: str) -> str:
    """'3 weeks', '14 months', '6 years': the time between two dates, never the dates."""
    try:
        days = (date.fromisoformat(end[:10]) - date.fromisoformat(start[:10])).days
    except ValueError:
        return "some time"
    if days < 14:
        return f"{days} day{'s' if days != 1 else ''}"
    if days < 60:
        return f"{days // 7} weeks"
    months = round(days / 30.44)
    if months < 24:
        return f"{months} months"
    return f"{round(days / 365.25)} years"

"""The context bundle: the structured facts a clinician scans first, each with the ref it came from.

Active problems, active medications with dose, allergies, the latest value of each lab and vital
sign (with date and flag), and the last encounters. Only structured resources: nothing here is
read from a note, so nothing here can be a templated line contradicting the record.
"""
from __future__ import annotations

import re

from .chunk import WITHDRAWN, PatientChunker, TextBudget, _strip_tag, blood_pressure, clinical_date, day
from .normalize import concept_text, status_code

INACTIVE_PROBLEM = {"resolved", "inactive", "remission"}
# Social circumstances and care-process reminders that EHRs (and Synthea) file as Conditions:
# worth a chunk for search, not a line on the problem list a clinician scans.
NOT_A_PROBLEM = re.compile(r"employment|labor force|education|social|isolation|stress\b|housing|homeless|income|"
                           r"violence|criminal|transport|refugee|review due|risk activity|insurance|(\(situation\))",
                           re.I)
LAST_ENCOUNTERS = 5


def _withdrawn(r: dict) -> bool:
    return status_code(r, "status") in WITHDRAWN or status_code(r, "verificationStatus") in WITHDRAWN | {"refuted"}


def observation_flag(r: dict) -> str:
    """The interpretation the record gives, else high/low against its reference range."""
    given = ", ".join(concept_text(i) for i in r.get("interpretation") or [] if concept_text(i))
    if given:
        return given
    value = (r.get("valueQuantity") or {}).get("value")
    for rr in r.get("referenceRange") or []:
        low, high = (rr.get("low") or {}).get("value"), (rr.get("high") or {}).get("value")
        if isinstance(value, (int, float)):
            if low is not None and value < low:
                return "low"
            if high is not None and value > high:
                return "high"
    return ""


def plain_dose(text: str) -> str:
    """"Take as needed.; as needed" → "Take as needed": the free text and the coded flag say one thing."""
    parts = [p.strip().rstrip(".") for p in text.split(";") if p.strip()]
    kept = [p for i, p in enumerate(parts) if not any(p.lower() in q.lower() for q in parts[:i])]
    return "; ".join(kept)


def context_bundle(resources: list[dict]) -> dict:
    chunker = PatientChunker("", "", resources, TextBudget(10**6, len))
    live = [r for r in resources if not _withdrawn(r)]
    by_type: dict[str, list[dict]] = {}
    for r in live:
        by_type.setdefault(r["resourceType"], []).append(r)

    def ref(r):
        return f"{r['resourceType']}/{r['id']}"

    problems = [{"ref": ref(r), "name": _strip_tag(concept_text(r.get("code"))), "since": day(clinical_date(r)),
                 "status": status_code(r, "clinicalStatus")}
                for r in by_type.get("Condition", []) if status_code(r, "clinicalStatus") not in INACTIVE_PROBLEM
                and not NOT_A_PROBLEM.search(concept_text(r.get("code")))]
    medications = []
    for r in by_type.get("MedicationRequest", []):
        if r.get("status") not in ("active", "on-hold"):
            continue
        drug, _, _ = chunker.medication_concept(r)
        medications.append({"ref": ref(r), "name": drug, "dose": plain_dose(chunker.dosage_text(r.get("dosageInstruction"))),
                            "since": day(clinical_date(r)), "reason": chunker.reason_text(r), "status": r["status"]})
    allergies = [{"ref": ref(r), "name": _strip_tag(concept_text(r.get("code"))),
                  "reactions": sorted({concept_text(m) for x in r.get("reaction") or [] for m in x.get("manifestation") or []}),
                  "criticality": r.get("criticality", ""), "status": status_code(r, "clinicalStatus")}
                 for r in by_type.get("AllergyIntolerance", []) if status_code(r, "clinicalStatus") != "inactive"]
    latest: dict[tuple[str, str], dict] = {}
    for r in by_type.get("Observation", []):
        category = chunker.observation_category(r)
        if category not in ("laboratory", "vital-signs"):
            continue
        key = (category, concept_text(r.get("code")))
        if clinical_date(r) >= clinical_date(latest.get(key, {"resourceType": "Observation"})):
            latest[key] = r
    labs, vitals = [], []
    for (category, name), r in sorted(latest.items(), key=lambda kv: kv[0][1]):
        item = {"ref": ref(r), "name": name, "value": chunker.observation_value(r), "date": day(clinical_date(r)),
                "flag": observation_flag(r) if not blood_pressure(r) else ""}
        (labs if category == "laboratory" else vitals).append(item)
    encounters = sorted(by_type.get("Encounter", []), key=clinical_date, reverse=True)[:LAST_ENCOUNTERS]
    return {
        "problems": sorted(problems, key=lambda p: p["since"], reverse=True),
        "medications": sorted(medications, key=lambda m: m["since"], reverse=True),
        "allergies": allergies,
        "labs": labs,
        "vitals": vitals,
        "encounters": [{"ref": ref(r), "date": day(clinical_date(r)),
                        "type": ", ".join(concept_text(t) for t in r.get("type") or []),
                        "class": (r.get("class") or {}).get("code", ""),
                        "reason": ", ".join(concept_text(c) for c in r.get("reasonCode") or [])} for r in encounters],
    }

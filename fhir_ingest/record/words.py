"""Small words-level helpers shared by the renderers: the clinically relevant date of any
resource, a sentence from optional parts, a de-duplicated list, a SNOMED display without its tag."""
from __future__ import annotations

import re
from datetime import date
from typing import Iterable

# Where each resource type keeps its clinically relevant date, in order of preference (FHIR R4).
DATE_FIELDS = {
    "Observation": ("effectiveDateTime", "effectivePeriod", "effectiveInstant", "issued"),
    "MedicationRequest": ("authoredOn",),
    "MedicationAdministration": ("effectiveDateTime", "effectivePeriod"),
    "MedicationStatement": ("effectiveDateTime", "effectivePeriod", "dateAsserted"),
    "MedicationDispense": ("whenHandedOver", "whenPrepared"),
    "Condition": ("onsetDateTime", "onsetPeriod", "recordedDate"),
    "AllergyIntolerance": ("onsetDateTime", "recordedDate"),
    "Encounter": ("period",),
    "Procedure": ("performedDateTime", "performedPeriod"),
    "Immunization": ("occurrenceDateTime", "recorded"),
    "DocumentReference": ("context", "date"),
    "DiagnosticReport": ("effectiveDateTime", "effectivePeriod", "issued"),
    "CarePlan": ("period", "created"),
    "Device": ("manufactureDate",),
    "ImagingStudy": ("started",),
    "ServiceRequest": ("occurrenceDateTime", "occurrencePeriod", "authoredOn"),
    "Goal": ("startDate", "statusDate"),
    "FamilyMemberHistory": ("date",),
    "QuestionnaireResponse": ("authored",),
    "Composition": ("date",),
    "CareTeam": ("period",),
    "Coverage": ("period",),
    "Media": ("createdDateTime", "createdPeriod", "issued"),
}


def clinical_date(resource: dict) -> str:
    candidates = DATE_FIELDS.get(resource.get("resourceType"), ())
    for field in candidates:
        value = resource.get(field)
        if field == "context" and isinstance(value, dict):
            value = value.get("period")
        if isinstance(value, dict):
            value = value.get("start") or value.get("end")
        if isinstance(value, str) and value:
            return value
    return ""


def day(iso: str) -> str:
    return iso[:10] if iso else ""


def _to_date(iso: str) -> date | None:
    try:
        return date.fromisoformat(iso[:10])
    except (TypeError, ValueError):
        return None


def _sentence(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p and p.strip())


def _join(items: Iterable[str], sep: str = ", ") -> str:
    seen, out = set(), []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return sep.join(out)


def _strip_tag(display: str) -> str:
    """'Prediabetes (finding)' → 'Prediabetes' for labels; the full display stays in the text."""
    return re.sub(r"\s*\((?:disorder|finding|situation|procedure|substance|product|qualifier value|"
                  r"observable entity|physical object|morphologic abnormality|regime/therapy|event)\)\s*$",
                  "", display or "")



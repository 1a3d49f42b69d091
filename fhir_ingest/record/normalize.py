"""FHIR R4 plain record → the words and codes chunkers read.

The plain record is the resource's own JSON (checked by `validate`), which downstream code reads
through the small accessors below, so no field is silently dropped by a model round-trip. This
module imports nothing of the record package: the kinds and the checks both build on it.
"""
from __future__ import annotations

import re


# --- accessors used by the chunkers --------------------------------------------------------

def codings(concept: dict | None) -> list[dict]:
    return [c for c in (concept or {}).get("coding") or [] if isinstance(c, dict)]


def concept_text(concept: dict | None) -> str:
    """Human text of a CodeableConcept: its text, else the first display, else the code."""
    if not concept:
        return ""
    if concept.get("text"):
        return concept["text"]
    for coding in codings(concept):
        if coding.get("display"):
            return coding["display"]
    for coding in codings(concept):
        if coding.get("code"):
            return coding["code"]
    return ""


def code_keys(*concepts: dict | None) -> list[dict]:
    """Every coding of the concepts as {system, code, display} (what a Chunk's `codes` holds)."""
    return [{"system": str(c.get("system") or ""), "code": str(c.get("code") or ""), "display": str(c.get("display") or "")}
            for concept in concepts for c in codings(concept)]


def status_code(resource: dict, field: str) -> str:
    value = resource.get(field)
    if isinstance(value, dict):
        codes = codings(value)
        return codes[0].get("code", "") if codes else ""
    return value or ""


def quantity_text(q: dict | None) -> str:
    if not q or q.get("value") is None:
        return ""
    value = q["value"]
    if isinstance(value, float):
        # As recorded: a clinician checking a cited value against the chart must find the same
        # digits there (37.888, not a rounded 37.89).
        value = repr(value) if "e" not in repr(value) else f"{value:f}".rstrip("0")
        value = value.removesuffix(".0").rstrip(".")
    unit = q.get("unit") or q.get("code") or ""
    return f"{value} {unit}".strip()


def ref_id(reference: dict | None) -> str:
    """`Type/id` of a resolved reference, or '' for conditional / external ones."""
    value = reference.get("reference") if isinstance(reference, dict) else ""
    if not isinstance(value, str) or "?" in value or not value:
        return ""
    parts = value.rstrip("/").split("/")
    return "/".join(parts[-2:]) if len(parts) >= 2 else ""


def patient_of(resource: dict) -> str:
    if resource.get("resourceType") == "Patient":
        return resource.get("id", "")
    for field in ("subject", "patient", "beneficiary"):
        ref = ref_id(resource.get(field))
        if ref.startswith("Patient/"):
            return ref.split("/", 1)[1]
    return ""


def strip_synthea_suffix(name: str) -> str:
    """'Helene803' → 'Helene' (Synthea numbers its generated names)."""
    return re.sub(r"(?<=[A-Za-z])\d+\b", "", name)


def human_name(patient: dict) -> str:
    for name in patient.get("name") or []:
        given = " ".join(name.get("given") or [])
        text = name.get("text") or f"{given} {name.get('family', '')}".strip()
        if text:
            return strip_synthea_suffix(text)
    return ""


def contained(resource: dict, reference) -> dict | None:
    """The resource a local '#id' reference points at among `resource.contained`."""
    value = reference.get("reference") if isinstance(reference, dict) else reference
    if not isinstance(value, str) or not value.startswith("#"):
        return None
    for item in resource.get("contained") or []:
        if isinstance(item, dict) and item.get("id") == value[1:]:
            return item
    return None


def binary_ref(url) -> str:
    """`Binary/id` of an attachment URL (relative, absolute or versioned), or ''."""
    if not isinstance(url, str) or "Binary/" not in url:
        return ""
    tail = url.split("Binary/", 1)[1].split("?")[0].split("#")[0]
    return f"Binary/{tail.split('/')[0]}" if tail else ""

"""FHIR R4 resource → checked plain record.

Resources are parsed with fhir.resources' R4B models (R4B is R4 plus errata; the package's default
models are R5, which reject valid R4 such as `MedicationRequest.medicationCodeableConcept`).
A resource that fails to parse is reported with the reason and never indexed half-read.
The plain record is the resource's own JSON, which downstream code reads through the small
accessors below, so no field is silently dropped by a model round-trip.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

import orjson
from pydantic import ValidationError

# Every type the kinds registry knows (indexed or read to complete others) is checked against the
# FHIR model; every other valid type is read, counted under "not indexed" or "ignored", never dropped
# silently (fhir_ingest/record/kinds).
_URI = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:)\S+$")
_TYPE_NAME = re.compile(r"^[A-Z][A-Za-z]{1,63}$")
_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
# "." and ".." fit the pattern but, in the REST paths an id goes into (`Patient/<id>`), mean "here"
# and "up" (RFC 3986 dot-segments): a client or proxy normalising the URL reads another resource.
_DOT_SEGMENTS = (".", "..")
# In a resource's compact JSON, a "system" whose value is not plainly an absolute URI of printable
# ASCII: everything `_bad_code_system` could object to, and a little more (escapes, non-ASCII).
_SUSPECT_SYSTEM = re.compile(rb'"system":"(?![a-zA-Z][a-zA-Z0-9+.\-]*:[!#-\[\]-~]+")')


class InvalidResource(ValueError):
    pass


@lru_cache(maxsize=None)
def _model_class(resource_type: str):
    from fhir.resources.R4B import get_fhir_model_class

    try:
        return get_fhir_model_class(resource_type)
    except (KeyError, ValueError, AttributeError, ImportError, LookupError) as exc:
        raise InvalidResource(f"unknown resource type {resource_type!r}") from exc


def check_identity(resource: dict) -> None:
    """The resource's type is a FHIR type, and its id and its patient's id (`patient_of`) FHIR ids
    (what grouping it needs), or InvalidResource. Then check_content checks the rest.

    Wrong JSON types anywhere (a list where a string belongs, a number for an id) make the resource
    invalid, never the run: everything that can go wrong in either is an InvalidResource."""
    resource_type = resource.get("resourceType")
    if not isinstance(resource_type, str) or not _TYPE_NAME.match(resource_type):
        raise InvalidResource(f"invalid resourceType {str(resource_type)[:40]!r}")
    _model_class(resource_type)      # an unknown type ("Obsrvation") is invalid, not "not clinical"
    rid = resource.get("id")
    if not rid:
        raise InvalidResource(f"{resource_type} without an id")
    if not is_fhir_id(rid):
        raise InvalidResource(f"{resource_type} id {json.dumps(rid)[:80]} is not a FHIR id {ID_RULE}")
    patient = patient_of(resource)
    if patient and not is_fhir_id(patient):
        raise InvalidResource(f"{resource_type}/{rid}: the patient it names, {json.dumps(patient)[:80]}, "
                              f"is not a FHIR id {ID_RULE}")


ID_RULE = "(1-64 letters, digits, '-', '.'; not '.' or '..')"


def is_fhir_id(value) -> bool:
    """FHIR's id rule, for every id chartcite stores, wherever it came from: a resource's own, and
    the patient's taken from a reference (which nothing else checks: `subject: Patient/<x>` would
    create a patient with any id). fullmatch, as `$` also matches before a final newline."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None and value not in _DOT_SEGMENTS


def check_content(resource: dict, warn=None) -> dict:
    """The resource (a malformed narrative left out, said through `warn`) once its content passes
    the FHIR R4(B) model (types chartcite reads) and names proper code systems; else InvalidResource."""
    resource_type, rid = resource["resourceType"], resource["id"]
    if resource_type not in validated_types():
        return resource  # counted, not indexed: no need to parse it fully
    try:
        _model_class(resource_type).model_validate(resource)
    except ValidationError as exc:
        if narrative_only(exc) and warn is not None:
            # A broken narrative (`text` without its `div`) is a display aid the record can do
            # without; the resource's structured content (a report's results, its conclusion) is not.
            resource = {k: v for k, v in resource.items() if k != "text"}
            warn(f"{resource_type}/{rid}: its narrative `text` is malformed and was left out")
            return check_content(resource)
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
        raise InvalidResource(f"{resource_type}/{rid}: {where or 'resource'}: {first.get('msg')}") from None
    except (RecursionError, TypeError, ValueError) as exc:
        raise InvalidResource(f"{resource_type}/{rid}: cannot be read as FHIR ({type(exc).__name__})") from None
    _check_code_systems(resource, resource_type)
    return resource


def checked_later(resource: dict, patient_id: str) -> bool:
    """Whether a resource whose identity passed (of patient `patient_id`, from patient_of) has its
    content checked when its patient's record is assembled (beside the embedding model, which
    meanwhile embeds earlier patients) rather than when it is read (before any patient can start):
    a patient's own resources, but for the Patient, which decides what its document defines."""
    return bool(patient_id) and resource["resourceType"] in validated_types() and resource["resourceType"] != "Patient"


@lru_cache(maxsize=1)
def validated_types() -> frozenset[str]:
    """The types chartcite reads (the kinds registry, which itself reads these accessors)."""
    from .kinds import KINDS

    return frozenset(KINDS)


def narrative_only(exc: ValidationError) -> bool:
    return all(str((error.get("loc") or ("",))[0]) == "text" for error in exc.errors())


def _check_code_systems(resource: dict, resource_type: str) -> None:
    """A coding whose system is not an absolute URI cannot be matched to any terminology."""
    if not _may_name_a_bad_system(resource):
        return
    found = _bad_code_system(resource)
    if found is not None:
        system, path = found
        raise InvalidResource(f"{resource_type}: unknown code system {system!r} at {path or 'root'}")


def _may_name_a_bad_system(resource: dict) -> bool:
    """A first look at the resource's JSON text, in C: almost every resource names only proper
    systems, and walking it in Python to find that out was a fifth of checking it."""
    try:
        return _SUSPECT_SYSTEM.search(orjson.dumps(resource)) is not None
    except TypeError:          # what orjson cannot write (an integer beyond 64 bits): walk it
        return True


def _bad_code_system(node) -> tuple[str, str] | None:
    """The first system that is not an absolute URI and where it is, or None. The path is spelled
    only on the way back from a find (spelling it at every node was most of this walk's cost)."""
    if isinstance(node, dict):
        system = node.get("system")
        if "code" in node and isinstance(system, str) and not _URI.match(system):
            return system, ""
        children = ((key, value) for key, value in node.items() if key not in ("text", "div", "data", "contained"))
    elif isinstance(node, list):
        children = enumerate(node)
    else:
        return None
    for key, value in children:
        if isinstance(value, (dict, list)) and (found := _bad_code_system(value)) is not None:
            system, below = found
            here = f"[{key}]" if isinstance(key, int) else key
            joint = "." if below and not below.startswith("[") else ""
            return system, f"{here}{joint}{below}"
    return None


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

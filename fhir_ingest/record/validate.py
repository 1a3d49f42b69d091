"""FHIR R4 resource → checked plain record: the reading policy's checks.

Resources are parsed with fhir.resources' R4B models (R4B is R4 plus errata; the package's default
models are R5, which reject valid R4 such as `MedicationRequest.medicationCodeableConcept`).
A resource that fails to parse is reported with the reason and never indexed half-read. The checks
need the kinds registry (which types are read), and the kinds read resources through the accessors
of `normalize`: so the checks live here, above both, and `normalize` imports neither.
"""
from __future__ import annotations

import copy
import json
import re
from functools import lru_cache

import orjson
from pydantic import ValidationError

from .kinds import KINDS
from .normalize import patient_of

# Every type the kinds registry knows (indexed or read to complete others) is checked against the
# FHIR model; every other valid type is read, counted under "not indexed" or "ignored", never dropped
# silently (fhir_ingest/record/kinds).
_URI = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:)\S+$")
_TYPE_NAME = re.compile(r"^[A-Z][A-Za-z]{1,63}$")
_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
# What an id may hold to be read safely, though FHIR's pattern (above) does not allow all of it:
# RFC 3986's unreserved characters, which go into a REST path (`CareTeam/<id>`) unchanged. Oracle
# Health's ids hold `_`; a hospital cannot fix its EHR's output, so such an id is kept and said.
_SAFE_ID = re.compile(r"[A-Za-z0-9\-._~]{1,64}")
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


@lru_cache(maxsize=None)
def _known_type(resource_type: str) -> bool:
    """A name of FHIR R4(B)'s, by the models' type table: building a type's model (a Claim's or an
    ExplanationOfBenefit's, which chartcite counts but does not read) costs a second of CPU at the
    first of each in a process, and only the types chartcite reads need theirs (check_content)."""
    from fhir.resources.R4B import fhirtypes

    return hasattr(fhirtypes, f"{resource_type}Type")


def check_identity(resource: dict, warn=None) -> None:
    """The resource's type is a FHIR type, and its id and its patient's id (`patient_of`) ids that
    can be stored and put in a REST path safely (what grouping it needs), or InvalidResource. An id
    that is safe but outside FHIR's pattern is kept and said through `warn` (the reading policy,
    docs/hostile-input.md). Then check_content checks the rest.

    Wrong JSON types anywhere (a list where a string belongs, a number for an id) make the resource
    invalid, never the run: everything that can go wrong in either is an InvalidResource."""
    resource_type = resource.get("resourceType")
    if not isinstance(resource_type, str) or not _TYPE_NAME.match(resource_type):
        raise InvalidResource(f"invalid resourceType {str(resource_type)[:40]!r}")
    if not _known_type(resource_type):      # an unknown type ("Obsrvation") is invalid, not "not clinical"
        raise InvalidResource(f"unknown resource type {resource_type!r}")
    rid = resource.get("id")
    if not rid:
        raise InvalidResource(f"{resource_type} without an id")
    if not is_safe_id(rid):
        raise InvalidResource(f"{resource_type} id {json.dumps(rid)[:80]} is not a FHIR id {ID_RULE}")
    patient = patient_of(resource)
    if patient and not is_safe_id(patient):
        raise InvalidResource(f"{resource_type}/{rid}: the patient it names, {json.dumps(patient)[:80]}, "
                              f"is not a FHIR id {ID_RULE}")
    for what, value in (("id", rid), ("patient id", patient)):
        if value and not is_fhir_id(value) and warn is not None:
            warn(f"{resource_type}/{rid}: its {what} {value!r} is outside FHIR's id pattern (it holds "
                 f"{_outside_pattern(value)}): kept as recorded")


ID_RULE = "(1-64 letters, digits, '-', '.', '_', '~'; not '.' or '..')"


def is_fhir_id(value) -> bool:
    """FHIR's id rule. fullmatch, as `$` also matches before a final newline."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None and value not in _DOT_SEGMENTS


def is_safe_id(value) -> bool:
    """Whether an id can be kept, wherever it came from: a resource's own, and the patient's taken
    from a reference (which nothing else checks: `subject: Patient/<x>` would create a patient with
    any id). FHIR's rule plus the other characters a URL path carries unchanged (`_`, `~`)."""
    return isinstance(value, str) and _SAFE_ID.fullmatch(value) is not None and value not in _DOT_SEGMENTS


def _outside_pattern(value: str) -> str:
    return ", ".join(repr(c) for c in dict.fromkeys(value) if not _ID.fullmatch(c))


def check_content(resource: dict, warn=None) -> dict:
    """The resource as indexed, once its content passes the FHIR R4(B) model (types chartcite
    reads); else InvalidResource. Defects that change no clinical meaning (the reading policy,
    docs/hostile-input.md) keep the resource and are said through `warn`: a malformed narrative
    (left out), an id outside FHIR's pattern, record-keeping `meta` and extensions that do not
    parse, stray spaces around a value (removed), a code system that is not a URI."""
    resource_type, rid = resource["resourceType"], resource["id"]
    if resource_type not in validated_types():
        return resource  # counted, not indexed: no need to parse it fully
    said = warn if warn is not None else (lambda words: None)
    checked = resource
    for _ in range(3):          # each pass mends what the model named; a mend may uncover more
        try:
            _model_class(resource_type).model_validate(checked)
            break
        except ValidationError as exc:
            mended = mend(checked, exc.errors(), f"{resource_type}/{rid}", said) if warn is not None else None
            if mended is None:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
                raise InvalidResource(f"{resource_type}/{rid}: {where or 'resource'}: {first.get('msg')}") from None
            checked = mended
        except (RecursionError, TypeError, ValueError) as exc:
            raise InvalidResource(f"{resource_type}/{rid}: cannot be read as FHIR ({type(exc).__name__})") from None
    else:
        raise InvalidResource(f"{resource_type}/{rid}: cannot be read as FHIR (defects beyond mending)")
    kept = unmodelled(checked, resource)
    _check_code_systems(kept, resource_type, said)
    return kept


def mend(resource: dict, errors: list[dict], ref: str, tell) -> dict | None:
    """The resource with every error the reading policy tolerates mended (a copy), each said; None
    when one is not tolerated (the resource is then skipped)."""
    mended, said = copy.deepcopy(resource), {}
    warn = lambda words: said.setdefault(words, None)    # one line per defect, however many errors name it
    for error in errors:
        loc = [p for p in error.get("loc", ()) if p != "__root__"]
        where = ".".join(str(p) for p in loc)
        value = error.get("input")
        if loc and loc[0] == "text":
            _drop(mended, loc[:1])
            warn(f"{ref}: its narrative `text` is malformed and was left out")
        elif isinstance(value, str) and value.strip() != value and value.strip():
            _set(mended, loc, value.strip())
            warn(f"{ref}: {where} {value!r} has stray spaces: read without them")
        elif loc and loc[-1] == "id" and error.get("type") == "string_pattern_mismatch" and is_safe_id(value):
            _set(mended, loc, _mended_id(value))
            if loc != ["id"]:     # the resource's own id is said by check_identity
                warn(f"{ref}: {where} {value!r} is outside FHIR's id pattern: kept as recorded")
        elif loc and (loc[0] == "meta" or "extension" in loc):
            _drop(mended, loc[:loc.index("extension") + 2] if "extension" in loc else loc)
            warn(f"{ref}: {where} cannot be read ({error.get('msg')}): left out of the check, kept as recorded")
        else:
            return None
    for words in said:
        tell(words)
    return _pruned(mended)


def _mended_id(value: str) -> str:
    return "".join(c if _ID.fullmatch(c) else "-" for c in value)


def _walk_to(node, loc: list):
    for step in loc:
        node = node[step]
    return node


def _set(node, loc: list, value) -> None:
    try:
        _walk_to(node, loc[:-1])[loc[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass


def _drop(node, loc: list) -> None:
    try:
        parent = _walk_to(node, loc[:-1])
        if isinstance(parent, dict):
            parent.pop(loc[-1], None)
        elif isinstance(parent, list) and isinstance(loc[-1], int) and loc[-1] < len(parent):
            parent[loc[-1]] = _GONE      # removed after every error is mended: the others' positions hold
    except (KeyError, IndexError, TypeError):
        pass


_GONE = object()


def _pruned(node):
    """The node without the list items `_drop` marked gone."""
    if isinstance(node, dict):
        return {key: _pruned(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_pruned(item) for item in node if item is not _GONE]
    return node


def unmodelled(checked: dict, original: dict) -> dict:
    """What is indexed: the original resource, with only the mends that serve reading it kept
    (stray spaces removed, a malformed narrative left out). Ids, `meta` and extensions stay as
    recorded: the mended copy was only what the model could check."""
    if checked is original:
        return original
    kept = copy.deepcopy(original)
    if "text" not in checked:
        kept.pop("text", None)
    _copy_stripped(checked, kept)
    return kept


def _copy_stripped(checked, kept) -> None:
    """Every string the mend stripped of stray spaces, stripped in `kept` too."""
    if isinstance(checked, dict) and isinstance(kept, dict):
        for key, value in kept.items():
            if key in checked:
                if isinstance(value, str) and isinstance(checked[key], str) and value.strip() == checked[key] != value:
                    kept[key] = checked[key]
                else:
                    _copy_stripped(checked[key], value)
    elif isinstance(checked, list) and isinstance(kept, list):
        for a, b in zip(checked, kept):
            _copy_stripped(a, b)


def checked_later(resource: dict, patient_id: str) -> bool:
    """Whether a resource whose identity passed (of patient `patient_id`, from patient_of) has its
    content checked when its patient's record is assembled (beside the embedding model, which
    meanwhile embeds earlier patients) rather than when it is read (before any patient can start):
    a patient's own resources, but for the Patient, which decides what its document defines."""
    return bool(patient_id) and resource["resourceType"] in validated_types() and resource["resourceType"] != "Patient"


@lru_cache(maxsize=1)
def validated_types() -> frozenset[str]:
    """The types chartcite reads (the kinds registry)."""
    return frozenset(KINDS)


def _check_code_systems(resource: dict, resource_type: str, warn) -> None:
    """A coding whose system is not an absolute URI cannot be matched to any terminology: its
    display and code are still read, and the report says so."""
    if not _may_name_a_bad_system(resource):
        return
    found = _bad_code_system(resource)
    if found is not None:
        system, path = found
        warn(f"{resource_type}/{resource['id']}: unknown code system {system!r} at {path or 'root'}: "
             f"kept, matched by its display and code only")


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

"""One patient's record read from an EHR's FHIR API: a search per resource type (paged), notes'
attachments fetched from Binary, conditional references resolved, and, after the first sync, only
what changed since (`_lastUpdated`), merged into what chartcite already holds.
"""
from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .client import FhirClient, FhirError
from .contract import PatientNotFound
from .load import SOURCE, LoadReport, PatientRecord, check_items
from .normalize import human_name
from .reader import RawResource, ReadItem, ReadProblem

log = logging.getLogger(__name__)

# What chartcite reads of a patient, with the search parameter naming the patient.
PATIENT_SEARCHES = {
    "Encounter": "patient", "Condition": "patient", "AllergyIntolerance": "patient",
    "MedicationRequest": "patient", "Observation": "patient", "DiagnosticReport": "patient",
    "DocumentReference": "patient", "Procedure": "patient", "Immunization": "patient",
}
# Read through references, not searched by patient.
REFERENCED_TYPES = ("Patient", "Medication", "Binary")
READ_TYPES = tuple(PATIENT_SEARCHES) + REFERENCED_TYPES
PAGE_SIZE = 100
_CONDITIONAL = re.compile(r"^[A-Z][A-Za-z]+\?[^\s]+$")

Progress = Callable[[str, int, int], None]


@dataclass
class FetchResult:
    resources: list[dict]
    problems: list[ReadProblem] = field(default_factory=list)
    requests: int = 0


def fetch_patient(client: FhirClient, patient_id: str, since: str = "", progress: Progress | None = None) -> FetchResult:
    """Everything of the patient (or, with `since`, what changed from then), attachments inlined."""
    resources: list[dict] = []
    problems: list[ReadProblem] = []
    steps = len(PATIENT_SEARCHES) + 1
    try:
        resources.append(client.get_json(f"Patient/{patient_id}"))
    except FhirError as exc:
        if exc.status == 404:
            raise PatientNotFound("the EHR has no such patient") from exc
        raise
    for i, (rtype, param) in enumerate(PATIENT_SEARCHES.items(), start=1):
        params = {param: patient_id, "_count": str(PAGE_SIZE)}
        if since:
            params["_lastUpdated"] = f"ge{since}"
        found = list(client.search(rtype, params))
        resources += found
        if progress:
            progress("fetching", i, steps)
    medications = sorted({ref.split("/", 1)[1] for r in resources
                          for ref in [(r.get("medicationReference") or {}).get("reference", "")]
                          if ref.startswith("Medication/")})
    if medications:
        resources += list(client.search("Medication", {"_id": ",".join(medications), "_count": str(PAGE_SIZE)}))
    resolver = ConditionalResolver(client)
    for resource in resources:
        problems += inline_attachments(client, resource)
        resolver.rewrite(resource)
    if progress:
        progress("fetching", steps, steps)
    return FetchResult(resources, problems, client.requests_made)


def attachments_of(resource: dict) -> Iterable[dict]:
    if resource.get("resourceType") == "DocumentReference":
        for content in resource.get("content") or []:
            if isinstance(content.get("attachment"), dict):
                yield content["attachment"]
    elif resource.get("resourceType") == "DiagnosticReport":
        yield from (a for a in resource.get("presentedForm") or [] if isinstance(a, dict))


def inline_attachments(client: FhirClient, resource: dict) -> list[ReadProblem]:
    """Attachments that point at a Binary are fetched (Accept = their contentType) and carried as
    base64 `data`, the form the chunker decodes (text, HTML, RTF, PDF)."""
    problems = []
    for attachment in attachments_of(resource):
        if attachment.get("data") or not attachment.get("url"):
            continue
        try:
            raw = client.binary(attachment["url"], attachment.get("contentType", ""))
        except FhirError as exc:
            problems.append(ReadProblem(f"{resource['resourceType']}/{resource.get('id')}",
                                        f"attachment could not be fetched ({exc.status or exc}); the note is indexed without it"))
            continue
        attachment["data"] = base64.b64encode(raw).decode()
    return problems


class ConditionalResolver:
    """`Practitioner?identifier=...` references are resolved to `Type/id` and a display name
    where the EHR finds exactly one match; otherwise the reference keeps a readable display."""

    def __init__(self, client: FhirClient):
        self.client = client
        self.cache: dict[str, dict] = {}

    def rewrite(self, node) -> None:
        if isinstance(node, dict):
            ref = node.get("reference")
            if isinstance(ref, str) and _CONDITIONAL.match(ref):
                node.update(self.resolve(ref))
            for value in node.values():
                if isinstance(value, (dict, list)):
                    self.rewrite(value)
        elif isinstance(node, list):
            for item in node:
                self.rewrite(item)

    def resolve(self, ref: str) -> dict:
        if ref not in self.cache:
            rtype, query = ref.split("?", 1)
            params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            try:
                found = list(self.client.search(rtype, params | {"_count": "2"}))
            except FhirError:
                found = []
            if len(found) == 1:
                match = found[0]
                self.cache[ref] = {"reference": f"{rtype}/{match['id']}", "display": human_name(match) or match.get("name", "")}
            else:
                self.cache[ref] = {"reference": ref, "display": ref.split("|")[-1]}
        return dict(self.cache[ref])


def to_record(patient_id: str, resources: list[dict], problems: list[ReadProblem],
              origin: str) -> tuple[PatientRecord | None, LoadReport]:
    """Check the fetched resources like a file's: malformed ones reported and skipped."""
    items: list[ReadItem] = [RawResource(r, f"{origin}:{r.get('resourceType')}/{r.get('id')}") for r in resources]
    records, report = check_items(items + list(problems))
    record = next((r for r in records if r.patient_id == patient_id), None)
    if record is not None:
        record.authority = SOURCE     # a sync of the patient from its own EHR is the authority on that record
    return record, report

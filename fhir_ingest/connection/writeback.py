"""Writing a saved summary draft back to the EHR as a preliminary note (DocumentReference with
docStatus `preliminary`), only where the EHR granted chartcite a create scope for it."""
from __future__ import annotations

import base64
import hashlib
from datetime import datetime, timezone

from .client import FhirClient, FhirError, FhirUnavailable

# The note's business identifier names the saved draft it was made from, so the EHR itself can
# refuse a second copy (conditional create) and chartcite can look for a copy it may have written.
DRAFT_IDENTIFIER_SYSTEM = "urn:chartcite:saved-draft"

DRAFT_TYPES = {
    "pre-visit": ("34133-9", "Summary of episode note"),
    "medication-review": ("56445-0", "Medication summary Document"),
}


def draft_text(draft: dict) -> str:
    """Plain text of the draft, with each citation spelled out as the record it names."""
    refs = {c["n"]: c["ref"] for c in draft["citations"]}
    lines = [draft.get("title", "Draft"), "(drafted by chartcite from the structured record; preliminary)", ""]
    for section in draft["sections"]:
        lines.append(section["title"])
        for line in section["lines"]:
            lines.append(f"- {line['text']} [{', '.join(refs.get(n, '?') for n in line['citations'])}]")
        lines.append("")
    return "\n".join(lines)


def draft_identifier(tenant: str, patient_id: str, saved_id) -> dict:
    digest = hashlib.sha256(f"{tenant}\x1f{patient_id}\x1f{saved_id}".encode()).hexdigest()[:32]
    return {"system": DRAFT_IDENTIFIER_SYSTEM, "value": digest}


def draft_document(draft: dict, patient_id: str, author: str, identifier: dict) -> dict:
    code, display = DRAFT_TYPES[draft["kind"]]
    resource = {
        "resourceType": "DocumentReference", "identifier": [identifier], "status": "current",
        "docStatus": "preliminary",
        "type": {"coding": [{"system": "http://loinc.org", "code": code, "display": display}]},
        "subject": {"reference": f"Patient/{patient_id}"},
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "description": draft.get("title", display),
        "content": [{"attachment": {"contentType": "text/plain; charset=utf-8", "title": draft.get("title", display),
                                    "data": base64.b64encode(draft_text(draft).encode()).decode()}}],
    }
    if "/" in author:     # fhirUser: Practitioner/123 or its absolute URL
        resource["author"] = [{"reference": "/".join(author.rstrip("/").split("/")[-2:])}]
    return resource


def create_document(client: FhirClient, resource: dict) -> str:
    """POST the note exactly once; the EHR's id for it (from Location or the returned resource).

    The note goes into the patient's legal record, so a retry must never write a second copy: the
    POST is conditional on no note carrying its identifier (If-None-Exist), it is re-sent only when
    it certainly had no effect, and after an answer that leaves it unknown (a 5xx, a read timeout)
    the EHR is searched by that identifier before the one further try."""
    identifier = resource["identifier"][0]
    token = f"{identifier['system']}|{identifier['value']}"
    for _ in range(2):
        try:
            response = client.request("POST", "DocumentReference", json_body=resource, idempotent=False,
                                      retry_statuses={429, 503},
                                      headers={"Content-Type": "application/fhir+json", "Prefer": "return=representation",
                                               "If-None-Exist": f"identifier={token}"})
        except FhirUnavailable:
            response = None
        if response is not None and response.status_code in (200, 201):
            return written_reference(response)
        if response is not None and response.status_code < 500:
            raise FhirError(f"the EHR refused the note ({response.status_code})", response.status_code)
        found = find_written(client, resource["subject"]["reference"], token)
        if found:
            return found
    raise FhirUnavailable("the EHR did not confirm the note and holds none under its identifier; try again later")


def find_written(client: FhirClient, subject: str, token: str) -> str:
    """The note an unconfirmed POST may have written, found by its identifier."""
    bundle = client.get_json("DocumentReference", {"identifier": token, "patient": subject.split("/")[-1]})
    for entry in bundle.get("entry") or []:
        resource = entry.get("resource") or {}
        if resource.get("resourceType") == "DocumentReference" and resource.get("id"):
            return f"DocumentReference/{resource['id']}"
    return ""


def written_reference(response) -> str:
    location = response.headers.get("Location", "")
    if "DocumentReference/" in location:
        return "DocumentReference/" + location.split("DocumentReference/")[1].split("/")[0]
    try:
        return f"DocumentReference/{response.json()['id']}"
    except (ValueError, KeyError):
        return "DocumentReference/?"

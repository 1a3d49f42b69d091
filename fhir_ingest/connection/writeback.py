"""Writing a saved summary draft back to the EHR as a preliminary note (DocumentReference with
docStatus `preliminary`), only where the EHR granted chartcite a create scope for it."""
from __future__ import annotations

import base64
from datetime import datetime, timezone

from .client import FhirClient, FhirError

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


def draft_document(draft: dict, patient_id: str, author: str) -> dict:
    code, display = DRAFT_TYPES[draft["kind"]]
    resource = {
        "resourceType": "DocumentReference", "status": "current", "docStatus": "preliminary",
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
    """POST the note; the EHR's id for it (from Location or the returned resource)."""
    response = client.request("POST", "DocumentReference", json_body=resource,
                              headers={"Content-Type": "application/fhir+json", "Prefer": "return=representation"})
    if response.status_code not in (200, 201):
        raise FhirError(f"the EHR refused the note ({response.status_code})", response.status_code)
    location = response.headers.get("Location", "")
    if "DocumentReference/" in location:
        return "DocumentReference/" + location.split("DocumentReference/")[1].split("/")[0]
    try:
        return f"DocumentReference/{response.json()['id']}"
    except (ValueError, KeyError):
        return "DocumentReference/?"

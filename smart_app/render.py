"""A readable view of one FHIR resource for the side panel: a title, key fields and note text."""
from __future__ import annotations

from fhir_ingest.record.chunk import PatientChunker, clinical_date
from fhir_ingest.record.normalize import concept_text, quantity_text, status_code
from fhir_ingest.record.notes import NoteDecodeError, decode_attachment

TITLE_FIELDS = {
    "Observation": "code", "Condition": "code", "AllergyIntolerance": "code", "Procedure": "code",
    "Immunization": "vaccineCode", "MedicationRequest": "medicationCodeableConcept",
    "MedicationAdministration": "medicationCodeableConcept", "DiagnosticReport": "code",
    "DocumentReference": "type", "Device": "type",
}


def readable(resource: dict, medication: dict | None = None) -> dict:
    rt = resource.get("resourceType", "")
    title_field = TITLE_FIELDS.get(rt)
    title = concept_text(resource.get(title_field)) if title_field else ""
    if not title and medication:
        title = concept_text(medication.get("code"))
    if not title and rt == "Encounter":
        title = ", ".join(concept_text(t) for t in resource.get("type") or [])
    fields: list[list[str]] = [["Date", clinical_date(resource)[:16].replace("T", " ")]]
    for name in ("status", "clinicalStatus", "verificationStatus", "intent", "criticality"):
        value = status_code(resource, name)
        if value:
            fields.append([name, value])
    if rt == "Observation":
        fields.append(["Value", PatientChunker.observation_value(resource)])
        for rr in resource.get("referenceRange") or []:
            fields.append(["Reference range", f"{quantity_text(rr.get('low'))} – {quantity_text(rr.get('high'))}"])
    for name in ("reasonCode", "category", "interpretation"):
        for concept in resource.get(name) or []:
            text = concept_text(concept) if isinstance(concept, dict) else str(concept)
            if text:
                fields.append([name, text])
    for dosage in resource.get("dosageInstruction") or []:
        if dosage.get("text"):
            fields.append(["Dosage", dosage["text"]])
    for reaction in resource.get("reaction") or []:
        manifest = ", ".join(concept_text(m) for m in reaction.get("manifestation") or [])
        fields.append(["Reaction", f"{manifest} ({reaction.get('severity', '')})".replace(" ()", "")])
    note_text = ""
    attachments = [c.get("attachment") or {} for c in resource.get("content") or []] + list(resource.get("presentedForm") or [])
    for attachment in attachments:
        if attachment.get("data"):
            try:
                note_text = decode_attachment(attachment)
            except NoteDecodeError as exc:
                note_text = f"(note text unavailable: {exc})"
            break
    return {"title": title or rt, "resource_type": rt, "fields": [f for f in fields if f[1]], "note_text": note_text}

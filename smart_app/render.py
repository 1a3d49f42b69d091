"""A readable view of one FHIR resource for the side panel: a title, its fields and note text.

The fields are the resource's typed fact (the kind's reader, the same fact the answer words), so
the panel shows what the answer says it shows: a value with its comparator, a dose with its range
and timing, an onset of any type, the drug of a referenced Medication.
"""
from __future__ import annotations

from dataclasses import fields

from fhir_ingest.record.facts import Component, Dose, MedicationFact, Quantity, Reaction, ReferenceRange, Value
from fhir_ingest.record.kinds import clinical_date, fact_of, kind_of
from fhir_ingest.record.kinds.observations import measured_words
from fhir_ingest.record.normalize import concept_text
from fhir_ingest.record.notes import NoteDecodeError, decode_attachment
from fhir_ingest.record.words import _strip_tag
from search.answering.clinical import dosage_words

HIDDEN = {"kind", "name", "codes", "date", "points", "medication", "value", "components", "sections", "onset_date"}
LABELS = {"verification": "verification status", "status_reason": "status reason", "visit_reasons": "reason of the visit",
          "allergy_type": "type", "encounter_class": "class", "body_site": "body site", "ranges": "reference range",
          "doses": "dosage", "notes": "note"}


def words(value) -> str:
    """A fact's field in words, whatever its type."""
    if isinstance(value, (Value, Quantity)):
        return value.text
    if isinstance(value, Dose):
        from fhir_ingest.record.context import dose_words

        return dose_words([value])
    if isinstance(value, ReferenceRange):
        return value.text
    if isinstance(value, Reaction):
        return ", ".join(value.manifestations) + (f" ({value.severity})" if value.severity else "") + (
            f" to {value.substance}" if value.substance else "")
    if isinstance(value, Component):
        return f"{value.name}: {value.value.text}"
    if isinstance(value, list):
        return "; ".join(w for w in (words(v) for v in value) if w)
    return str(value) if value not in (None, "", False) else ""


def fact_fields(fact) -> list[list[str]]:
    rows = []
    if getattr(fact, "kind", "") == "measurement":
        rows.append(["Value", measured_words(fact)])
    for f in fields(fact):
        if f.name in HIDDEN:
            continue
        value = getattr(fact, f.name)
        if f.name == "details":
            rows += [[label, text] for label, text in value]
            continue
        if isinstance(fact, MedicationFact) and f.name in MEDICATION_WORDS:
            rows += MEDICATION_WORDS[f.name](fact)
            continue
        rows.append([LABELS.get(f.name, f.name.replace("_", " ")), words(value)])
    return [row for row in rows if row[1]]


def dose_rows(fact: MedicationFact) -> list[list[str]]:
    """The dose as the answer words it ('1 tablet every six hours'), then what that leaves out."""
    def each(part: str) -> str:
        return ", ".join(dict.fromkeys(getattr(d, part) for d in fact.doses if getattr(d, part)))

    return [["dosage", dosage_words(fact.doses, fact.medication)], ["rate", each("rate")], ["route", each("route")],
            ["maximum", each("maximum")]]


# A medication's fields a clinician reads differently from the record's words: the dose in clinical
# words; whether it is an order, a statement or a dispense is the record's type, not a finding; an
# intent is worth saying only when the record is not an order (a plan, a proposal).
MEDICATION_WORDS = {
    "doses": dose_rows,
    "form": lambda fact: [],
    "reasons": lambda fact: [["reasons", "; ".join(_strip_tag(r) for r in fact.reasons)]],
    "intent": lambda fact: [["intent", fact.intent]] if fact.intent not in ("", "order") else [],
}


def readable(resource: dict, resolve) -> dict:
    """Title, fields and note text of a resource; `resolve` reads the records it points at."""
    rt = resource.get("resourceType", "")
    fact = fact_of(resource, resolve)
    kind = kind_of(rt)
    title = (getattr(fact, "medication", "") or (fact.name if fact else "")
             or (concept_text(resource.get(kind.title)) if kind and kind.title else ""))
    rows = [["Date", clinical_date(resource)[:16].replace("T", " ")]] + (fact_fields(fact) if fact else [])
    note_text = ""
    attachments = [c.get("attachment") or {} for c in resource.get("content") or []] + list(resource.get("presentedForm") or [])
    for attachment in attachments:
        if attachment.get("data"):
            try:
                note_text = decode_attachment(attachment)
            except NoteDecodeError as exc:
                note_text = f"(note text unavailable: {exc})"
            break
    return {"title": title or rt, "resource_type": rt, "fields": [f for f in rows if f[1]], "note_text": note_text}

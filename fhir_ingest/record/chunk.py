"""Checked FHIR resources of one patient → `Chunk`s.

One chunk per structured resource (its facts in a sentence a clinician would write), notes split
on their headings into chunks that fit the embedding model's window, lab panels with their
values, and trend summaries per analyte so "how has her BP been?" hits one chunk.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Callable

from .contract import Chunk, make_label
from .words import _join, _sentence, _strip_tag, _to_date, clinical_date, day  # noqa: F401  (context.py reads some here)
from .normalize import (
    binary_ref, code_keys, codings, concept_text, contained, quantity_text, ref_id, status_code,
)
from .datatypes import choice_text, concept_words, dosage_text, period_text, reference_range_text, value_text
from . import care_records
from .notes import NoteDecodeError, decode_attachment, html_to_text, split_sections

log = logging.getLogger(__name__)

WITHDRAWN = {"entered-in-error"}
SYSTOLIC, DIASTOLIC = "8480-6", "8462-4"


def blood_pressure(resource: dict) -> tuple[dict, dict] | None:
    """(systolic, diastolic) components of a blood-pressure Observation, whatever the component
    order (Synthea lists the diastolic first) and wherever LOINC sits among the codings (Epic puts
    its flowsheet code first); either side may lack a value. None for any other observation."""
    comps = {}
    for component in resource.get("component") or []:
        for coding in codings(component.get("code")):
            if coding.get("code") in (SYSTOLIC, DIASTOLIC):
                comps[coding["code"]] = component
    if SYSTOLIC in comps or DIASTOLIC in comps:
        return comps.get(SYSTOLIC, {}), comps.get(DIASTOLIC, {})
    return None


def blood_pressure_text(systolic: dict, diastolic: dict) -> str:
    """'120/80 mmHg'; a side without a value is said, never left blank ('109/(diastolic not recorded) mmHg')."""
    sys_q, dia_q = systolic.get("valueQuantity") or {}, diastolic.get("valueQuantity") or {}
    unit = sys_q.get("unit") or dia_q.get("unit") or "mm[Hg]"
    top = quantity_text({"value": sys_q.get("value")}) or "(systolic not recorded)"
    bottom = quantity_text({"value": dia_q.get("value")}) or "(diastolic not recorded)"
    return f"{top}/{bottom} {unit}"


def series_key(resource: dict) -> str:
    """What one trend follows: a (system, code), LOINC preferred, so two local code systems that
    happen to share a code never mix (a pulse in a potassium trend)."""
    keys = [c for c in codings(resource.get("code")) if c.get("code")]
    loinc = [c for c in keys if c.get("system") == "http://loinc.org"]
    chosen = (loinc or keys or [{}])[0]
    return f"{chosen.get('system', '')}|{chosen.get('code', '')}" if chosen else ""


TREND_WINDOWS = (30, 90, 365)
# About 60 pages of text, a few hundred chunks: longer "notes" are scanned books or machine output.
MAX_NOTE_CHARS = 200_000


@dataclass
class TextBudget:
    """How much text one chunk may hold, counted the way the embedding model counts it."""
    max_tokens: int
    count_tokens: Callable[[str], int]

    def fits(self, text: str) -> bool:
        # An ASCII text never has more word pieces than characters: a short one fits uncounted
        # (most structured chunks; counting each cost as much as the rest of chunking).
        if len(text) <= self.max_tokens and text.isascii():
            return True
        return self.count_tokens(text) <= self.max_tokens


@dataclass
class ChunkProblem:
    ref: str
    reason: str


def content_narrative(r: dict, structured: bool) -> str:
    """A resource's narrative when it is content: marked `additional` (it says more than the
    structured data, as US Core's CarePlan "Assessment and Plan" does), or the only content there
    is. A `generated` narrative only repeats the structure, and is left out."""
    text = r.get("text") if isinstance(r.get("text"), dict) else {}
    div = text.get("div")
    if not isinstance(div, str) or not div or (structured and text.get("status") != "additional"):
        return ""
    return " ".join(html_to_text(div).split())


# The resource types rendered by the chunker's own methods; care_records.RENDERERS has the rest.
CORE_RENDERERS = {rt: f"chunk_{rt}" for rt in (
    "Encounter", "MedicationRequest", "MedicationAdministration", "Observation", "Condition", "AllergyIntolerance",
    "Procedure", "Immunization", "CarePlan", "Device", "ImagingStudy", "DocumentReference", "DiagnosticReport")}


# --- the chunker ------------------------------------------------------------------------------

class PatientChunker:
    """Chunks for one patient's resources; needs them all at once to resolve cross-references."""

    def __init__(self, tenant: str, patient_id: str, resources: list[dict], budget: TextBudget):
        self.tenant = tenant
        self.patient_id = patient_id
        self.budget = budget
        self.by_ref = {f"{r['resourceType']}/{r['id']}": r for r in resources}
        self.resources = resources
        self.problems: list[ChunkProblem] = []
        self.fitted: set[str] = set()     # chunk ids packed to fit the window already (notes)
        self.conditions_by_encounter = defaultdict(list)
        for r in resources:
            if r["resourceType"] == "Condition":
                enc = ref_id(r.get("encounter"))
                if enc:
                    self.conditions_by_encounter[enc].append(r)
        # DiagnosticReports whose note text is already indexed through a DocumentReference twin.
        self.note_twins = set()
        for r in resources:
            if r["resourceType"] == "DocumentReference":
                for ident in r.get("identifier") or []:
                    value = ident.get("value") or ""
                    if value.startswith("urn:uuid:"):
                        self.note_twins.add("DiagnosticReport/" + value[len("urn:uuid:"):])
                for rel in r.get("relatesTo") or []:
                    target = ref_id(rel.get("target"))
                    if target.startswith("DiagnosticReport/"):
                        self.note_twins.add(target)

    def new_chunk(self, r: dict, part: str, text: str, label: str, semantic_type: str,
                  category: str = "", section: str = "", codes: list[str] | None = None,
                  refs: list[str] | None = None, when: str | None = None, status: str = "") -> Chunk:
        ref = f"{r['resourceType']}/{r['id']}"
        return Chunk(
            tenant=self.tenant, patient_id=self.patient_id, resource_type=r["resourceType"],
            resource_id=r["id"], part=part, text=text, label=label,
            date=when if when is not None else clinical_date(r), semantic_type=semantic_type,
            category=category, section=section,
            version_id=str((r.get("meta") or {}).get("versionId") or ""), status=status,
            codes=codes or [], refs=[ref] + [x for x in (refs or []) if x != ref],
        )

    def chunks(self) -> list[Chunk]:
        out: list[Chunk] = []
        for r in self.resources:
            if status_code(r, "status") in WITHDRAWN or status_code(r, "verificationStatus") in WITHDRAWN:
                continue
            method = self.renderer(r["resourceType"])
            if method is None:
                continue
            try:
                out.extend(method(r))
            except (NoteDecodeError, ValueError) as exc:      # the resource's data: reported, skipped
                self.problems.append(ChunkProblem(f"{r['resourceType']}/{r.get('id')}", f"could not be chunked: {exc}"))
            except (KeyError, TypeError, AttributeError) as exc:
                # A renderer failing on a checked resource is a bug in chartcite: the resource is
                # still reported and the rest of the record indexed, and the traceback is logged
                # (code, not data) so the bug is seen and fixed.
                log.error("the %s renderer failed (%s): a bug", r["resourceType"], type(exc).__name__, exc_info=True)
                self.problems.append(ChunkProblem(f"{r['resourceType']}/{r.get('id')}", f"could not be chunked: {exc}"))
        out.extend(self.trend_chunks())
        return [piece for chunk in out for piece in self.within_window(chunk)]

    def renderer(self, resource_type: str):
        """The renderer of a resource type (CORE_RENDERERS here, the rest in care_records), or None."""
        if resource_type in CORE_RENDERERS:
            return getattr(self, CORE_RENDERERS[resource_type])
        extra = care_records.RENDERERS.get(resource_type)
        return (lambda r: extra(self, r)) if extra else None

    def within_window(self, chunk: Chunk) -> list[Chunk]:
        """A structured chunk too long for the model's window (a 30-question survey, a big panel)
        becomes several, each repeating its lead ("Survey result on 2023-02-01:") so it reads alone."""
        if chunk.chunk_id in self.fitted or self.budget.fits(chunk.text):
            return [chunk]
        lead, sep, body = chunk.text.partition(": ")
        if not sep:
            lead, body = "", chunk.text
        out = []
        for i, (piece, _) in enumerate(self.fit_section(self.room_after(lead), "", body)):
            text = f"{lead}: {piece}" if lead else piece
            out.append(replace(chunk, part=f"{chunk.part}.{i}", text=text))
        return out

    # Encounter -------------------------------------------------------------------------------
    def chunk_Encounter(self, r):
        ref = f"Encounter/{r['id']}"
        when = day(clinical_date(r))
        kind = _join(concept_text(t) for t in r.get("type") or [])
        enc_class = (r.get("class") or {}).get("code", "")
        class_name = {"AMB": "ambulatory", "EMER": "emergency", "IMP": "inpatient", "ACUTE": "inpatient",
                      "VR": "virtual", "HH": "home health", "OBSENC": "observation"}.get(enc_class, enc_class)
        reasons = [concept_text(c) for c in r.get("reasonCode") or []]
        reasons += [concept_text((self.by_ref.get(ref_id(x)) or {}).get("code")) for x in r.get("reasonReference") or []]
        diagnoses = [concept_text(c.get("code")) for c in self.conditions_by_encounter.get(ref, [])]
        locations = [(loc.get("location") or {}).get("display", "") for loc in r.get("location") or []]
        period = r.get("period") or {}
        text = _sentence(
            f"Encounter ({class_name or 'visit'}) on {when}:" if when else f"Encounter ({class_name or 'visit'}):",
            f"{kind}." if kind else "",
            f"Reason: {_join(reasons)}." if any(reasons) else "",
            f"Diagnoses: {_join(diagnoses, '; ')}." if diagnoses else "",
            f"Ended {day(period.get('end', ''))}." if period.get("end") and day(period["end"]) != when else "",
            f"Location: {_join(locations)}." if any(locations) else "",
            f"Status: {r.get('status', '')}.",
        )
        words = _strip_tag(_join(reasons) or kind)
        return [self.new_chunk(r, "0", text, make_label(when, "Visit", words), "encounter",
                               category=class_name, codes=code_keys(*(r.get("type") or []), *(r.get("reasonCode") or [])),
                               status=r.get("status", ""))]

    # Medications ----------------------------------------------------------------------------
    def medication_concept(self, r) -> tuple[str, list[str], list[str]]:
        """(drug name, codes, extra refs) from medicationCodeableConcept or a resolved medicationReference."""
        if r.get("medicationCodeableConcept"):
            mcc = r["medicationCodeableConcept"]
            return concept_text(mcc), code_keys(mcc), []
        med_ref = ref_id(r.get("medicationReference"))
        med = self.by_ref.get(med_ref) or contained(r, r.get("medicationReference"))
        if med:
            return concept_text(med.get("code")), code_keys(med.get("code")), [med_ref] if med_ref else []
        display = (r.get("medicationReference") or {}).get("display", "")
        return display or "unknown medication", [], [med_ref] if med_ref else []

    def reason_text(self, r) -> str:
        reasons = [concept_text(c) for c in r.get("reasonCode") or []]
        for x in r.get("reasonReference") or []:
            target = self.by_ref.get(ref_id(x))
            reasons.append(concept_text((target or {}).get("code")) or x.get("display", ""))
        return _join(reasons)

    def reason_refs(self, r) -> list[str]:
        return [ref_id(x) for x in r.get("reasonReference") or [] if ref_id(x) in self.by_ref]

    @staticmethod
    def dosage_text(dosages: list[dict]) -> str:
        return _join((dosage_text(d) for d in dosages or [] if isinstance(d, dict)), " | ")

    def chunk_MedicationRequest(self, r):
        drug, codes, extra = self.medication_concept(r)
        when = day(clinical_date(r))
        status = r.get("status", "")
        supply = (r.get("dispenseRequest") or {})
        duration = quantity_text(supply.get("expectedSupplyDuration"))
        validity = supply.get("validityPeriod") or {}
        reason = self.reason_text(r)
        visit, visit_ref = ("", "") if reason else self.ordering_visit(r)
        notes = _join((n.get("text", "") for n in r.get("note") or []), " ")
        text = _sentence(
            f"Medication order ({status}) {('on ' + when) if when else ''}:".replace("  ", " "),
            f"{drug}.",
            f"Dosage: {self.dosage_text(r.get('dosageInstruction'))}." if r.get("dosageInstruction") else "",
            f"Reason: {reason}." if reason else visit,
            f"Supply duration {duration}." if duration else "",
            f"Valid {period_text(validity)}." if period_text(validity) else "",
            f"Intent: {r.get('intent', '')}." if r.get("intent") else "",
            f"Note: {notes}" if notes else "",
        )
        label = make_label(when, "Med", f"{drug} ({status})" if status else drug)
        return [self.new_chunk(r, "0", text, label, "medication", category=status, codes=codes,
                               refs=extra + self.reason_refs(r) + ([visit_ref] if visit_ref else []), status=status)]

    def ordering_visit(self, r) -> tuple[str, str]:
        """For an order that states no reason of its own, the reason of the visit it was ordered
        at ("Why is she getting B12 shots?" is answered by that visit), said as what it is."""
        enc_ref = ref_id(r.get("encounter"))
        enc = self.by_ref.get(enc_ref)
        if not enc:
            return "", ""
        reasons = [concept_text(c) for c in enc.get("reasonCode") or []]
        reasons += [concept_text((self.by_ref.get(ref_id(x)) or {}).get("code")) for x in enc.get("reasonReference") or []]
        if not any(reasons):
            return "", ""
        return f"Ordered at the visit of {day(clinical_date(enc))} for {_join(reasons)}.", enc_ref

    def chunk_MedicationAdministration(self, r):
        drug, codes, extra = self.medication_concept(r)
        when = day(clinical_date(r))
        dosage = r.get("dosage") or {}
        bits = [dosage.get("text", ""), quantity_text(dosage.get("dose"))]
        if dosage.get("route"):
            bits.append(f"route {concept_text(dosage['route'])}")
        reason = self.reason_text(r)
        request = ref_id(r.get("request"))
        text = _sentence(
            f"Medication administered ({r.get('status', '')}) on {when}:", f"{drug}.",
            f"Dose: {_join(bits, '; ')}." if any(bits) else "",
            f"Reason: {reason}." if reason else "",
        )
        refs = extra + self.reason_refs(r) + ([request] if request in self.by_ref else [])
        return [self.new_chunk(r, "0", text, make_label(when, "Given", drug), "medication",
                               category="administration", codes=codes, refs=refs, status=r.get("status", ""))]

    # Observations ---------------------------------------------------------------------------
    @staticmethod
    def observation_value(r) -> str:
        bp = blood_pressure(r)
        if bp:
            return blood_pressure_text(*bp)
        parts = [f"{concept_text(c.get('code'))}: {value_text(c) or 'no value'}"
                 for c in r.get("component") or [] if isinstance(c, dict)]
        return "; ".join(filter(None, [value_text(r), *parts]))

    @staticmethod
    def observation_category(r) -> str:
        for cat in r.get("category") or []:
            for c in codings(cat):
                if c.get("code"):
                    return c["code"]
        return ""

    def specimen_text(self, r) -> str:
        """What the result was measured on, when the record says ('Serum sample, hemolyzed')."""
        spec = self.by_ref.get(ref_id(r.get("specimen"))) or contained(r, r.get("specimen"))
        if not spec:
            return (r.get("specimen") or {}).get("display", "") if isinstance(r.get("specimen"), dict) else ""
        collected = (spec.get("collection") or {}).get("collectedDateTime", "") if isinstance(spec.get("collection"), dict) else ""
        return _join([concept_text(spec.get("type")), _join(concept_text(c) for c in spec.get("condition") or []),
                      f"collected {day(collected)}" if collected else ""])

    def chunk_Observation(self, r):
        name = concept_words(r.get("code"))
        when = day(clinical_date(r))
        value = self.observation_value(r)
        if not value and not r.get("hasMember"):
            value = "no value recorded"      # a result without a value must not read as one
        specimen = self.specimen_text(r)
        method, body = concept_text(r.get("method")), concept_text(r.get("bodySite"))
        category = self.observation_category(r)
        ranges = reference_range_text(r.get("referenceRange"))
        flags = _join(concept_text(i) for i in r.get("interpretation") or [])
        semantic = {"vital-signs": "vital", "laboratory": "lab", "social-history": "social",
                    "survey": "survey", "exam": "exam"}.get(category, "observation")
        kind = {"vital": "Vital", "lab": "Lab", "social": "Social", "survey": "Survey", "exam": "Exam"}.get(semantic, "Obs")
        text = _sentence(
            f"{kind} result on {when}:" if when else f"{kind} result:",
            f"{name} = {value}." if value else f"{name}.",
            f"Reference range {ranges}." if ranges else "",
            f"Interpretation: {flags}." if flags else "",
            f"Specimen: {specimen}." if specimen else "", f"Method: {method}." if method else "",
            f"Body site: {body}." if body else "",
            f"Status: {r.get('status', '')}." if r.get("status") not in (None, "final") else "",
            self.notes_text(r),
        )
        label = make_label(when, kind, f"{concept_text(r.get('code'))} {value}{' ' + flags if flags else ''}")
        return [self.new_chunk(r, "0", text, label, semantic, category=category,
                               codes=code_keys(r.get("code")), status=r.get("status", ""))]

    # Problems and allergies ------------------------------------------------------------------
    def chunk_Condition(self, r):
        name = concept_words(r.get("code"))
        clinical = status_code(r, "clinicalStatus")
        verification = status_code(r, "verificationStatus")
        onset = choice_text(r, "onset")
        abated = choice_text(r, "abatement")
        recorded = day(r.get("recordedDate") or "")
        categories = _join(concept_text(c) or (codings(c)[0].get("code", "") if codings(c) else "") for c in r.get("category") or [])
        status = _join([clinical, verification])
        severity = concept_text(r.get("severity"))
        body = _join(concept_text(b) for b in r.get("bodySite") or [])
        text = _sentence(
            f"Problem / diagnosis ({status}):" if status else "Problem / diagnosis:",
            f"{name}.",
            f"Onset {onset}." if onset else "",
            f"Resolved {abated}." if abated and abated != "yes" else "Resolved." if abated else (
                "Still active." if clinical == "active" else ""),
            f"Severity: {severity}." if severity else "", f"Body site: {body}." if body else "",
            f"Category: {categories}." if categories else "",
            f"Recorded {recorded}." if recorded and recorded != onset else "",
            self.notes_text(r),
        )
        when = day(clinical_date(r))
        label = make_label(when, "Problem", f"{_strip_tag(concept_text(r.get('code')))} ({clinical})" if clinical
                           else _strip_tag(concept_text(r.get("code"))))
        enc = ref_id(r.get("encounter"))
        return [self.new_chunk(r, "0", text, label, "problem", category=clinical,
                               codes=code_keys(r.get("code")), refs=[enc] if enc in self.by_ref else [],
                               status=clinical)]

    @staticmethod
    def notes_text(r) -> str:
        notes = _join((n.get("text", "") for n in r.get("note") or [] if isinstance(n, dict)), " ")
        return f"Note: {notes}" if notes else ""

    def chunk_AllergyIntolerance(self, r):
        name = concept_text(r.get("code"))
        clinical = status_code(r, "clinicalStatus")
        verification = status_code(r, "verificationStatus")
        when = day(clinical_date(r))
        reactions = []
        for reaction in r.get("reaction") or []:
            manifest = _join(concept_text(m) for m in reaction.get("manifestation") or [])
            severity = reaction.get("severity", "")
            substance = concept_text(reaction.get("substance"))
            reactions.append(_sentence(manifest, f"({severity})" if severity else "", f"to {substance}" if substance else ""))
        text = _sentence(
            f"Allergy / intolerance ({_join([clinical, verification])}):",
            f"{name}.",
            f"Type {r.get('type')}." if r.get("type") else "",
            f"Category: {_join(r.get('category') or [])}." if r.get("category") else "",
            f"Criticality {r.get('criticality')}." if r.get("criticality") else "",
            f"Reactions: {_join(reactions, '; ')}." if reactions else "",
            f"Recorded {when}." if when else "",
        )
        return [self.new_chunk(r, "0", text, make_label(when, "Allergy", _strip_tag(name)), "allergy",
                               category=_join(r.get("category") or []), codes=code_keys(r.get("code")),
                               status=clinical)]

    # Procedures, immunizations, care plans, devices, imaging ---------------------------------
    def chunk_Procedure(self, r):
        name = concept_text(r.get("code"))
        when = day(clinical_date(r))
        reason = self.reason_text(r)
        location = (r.get("location") or {}).get("display", "")
        body = _join(concept_text(b) for b in r.get("bodySite") or [])
        text = _sentence(
            f"Procedure ({r.get('status', '')}) on {when}:", f"{name}.",
            f"Reason: {reason}." if reason else "", f"Body site: {body}." if body else "",
            f"Location: {location}." if location else "",
        )
        return [self.new_chunk(r, "0", text, make_label(when, "Procedure", _strip_tag(name)), "procedure",
                               codes=code_keys(r.get("code")), refs=self.reason_refs(r), status=r.get("status", ""))]

    def chunk_Immunization(self, r):
        name = concept_text(r.get("vaccineCode"))
        when = day(clinical_date(r))
        text = _sentence(f"Immunization / vaccine ({r.get('status', '')}) on {when}:", f"{name}.")
        return [self.new_chunk(r, "0", text, make_label(when, "Vaccine", name), "immunization",
                               codes=code_keys(r.get("vaccineCode")), status=r.get("status", ""))]

    def chunk_CarePlan(self, r):
        when = day(clinical_date(r))
        categories = _join(concept_text(c) for c in r.get("category") or [] if concept_text(c))
        activities = _join(concept_text((a.get("detail") or {}).get("code")) for a in r.get("activity") or [])
        addresses = _join(concept_text((self.by_ref.get(ref_id(x)) or {}).get("code")) for x in r.get("addresses") or [])
        title = r.get("title") or r.get("description") or ""
        narrative = content_narrative(r, structured=bool(categories or title or activities or addresses))
        text = _sentence(f"Care plan ({r.get('status', '')})" + (f" from {when}:" if when else ":"),
                         f"{_join([categories, title], '. ')}." if categories or title else "",
                         f"Addresses: {addresses}." if addresses else "",
                         f"Activities: {activities}." if activities else "",
                         f"Plan: {narrative}" if narrative and narrative not in (categories, title) else "")
        return [self.new_chunk(r, "0", text, make_label(when, "Care plan", _strip_tag(categories)), "careplan",
                               status=r.get("status", ""))]

    def chunk_Device(self, r):
        name = concept_text(r.get("type")) or _join(n.get("name", "") for n in r.get("deviceName") or [])
        when = day(clinical_date(r))
        text = _sentence(f"Device ({r.get('status', '')}):", f"{name}.", f"Manufactured {when}." if when else "")
        return [self.new_chunk(r, "0", text, make_label(when, "Device", _strip_tag(name)), "device",
                               codes=code_keys(r.get("type")), status=r.get("status", ""))]

    def chunk_ImagingStudy(self, r):
        when = day(clinical_date(r))
        series = r.get("series") or []
        modalities = _join((s.get("modality") or {}).get("display") or (s.get("modality") or {}).get("code", "") for s in series)
        sites = _join((s.get("bodySite") or {}).get("display", "") for s in series)
        procedures = _join(concept_text(p) for p in r.get("procedureCode") or [])
        text = _sentence(f"Imaging study on {when}:", f"{procedures}." if procedures else "",
                         f"Modality: {modalities}." if modalities else "", f"Body site: {sites}." if sites else "")
        return [self.new_chunk(r, "0", text, make_label(when, "Imaging", procedures or modalities), "imaging",
                               status=r.get("status", ""))]

    # Notes and reports -----------------------------------------------------------------------
    def attachment_text(self, r, attachment: dict) -> str:
        """Plain text of an attachment: its inline data, or the Binary it points at when this input
        holds it (relative or absolute URL, a urn:uuid the reader resolved, or contained)."""
        if attachment.get("data"):
            return decode_attachment(attachment)
        url = attachment.get("url")
        binary = contained(r, url) or self.by_ref.get(binary_ref(url))
        if binary and binary.get("data"):
            return decode_attachment({"data": binary["data"],
                                      "contentType": attachment.get("contentType") or binary.get("contentType", "")})
        raise NoteDecodeError("its content is neither inline nor in this input (attachment URL not fetched)")

    def readable_attachments(self, r, attachments: list) -> tuple[list[str], list[str]]:
        """(texts, reasons): every attachment that could be read, and why the others could not."""
        texts, reasons = [], []
        for i, attachment in enumerate(attachments):
            if not isinstance(attachment, dict):
                continue
            try:
                texts.append(self.attachment_text(r, attachment))
            except NoteDecodeError as exc:
                reasons.append(f"attachment {i + 1} ({attachment.get('contentType') or 'no content type'}): {exc}")
        return texts, reasons

    def chunk_DocumentReference(self, r):
        note_type = concept_words(r.get("type")) or "Clinical note"
        when = day(clinical_date(r))
        attachments = [c.get("attachment") for c in r.get("content") or [] if isinstance(c, dict)]
        texts, reasons = self.readable_attachments(r, attachments)
        enc = ref_id((r.get("context") or {}).get("encounter", [{}])[0] if (r.get("context") or {}).get("encounter") else None)
        refs = [enc] if enc in self.by_ref else []
        if texts:    # the same note in several formats: the first readable one is the note
            return self.note_chunks(r, texts[0], note_type, when, "note", refs=refs)
        # The note exists even when its text cannot be read: say so where a clinician will look.
        ref = f"DocumentReference/{r['id']}"
        self.problems.append(ChunkProblem(ref, "note text could not be read: " + "; ".join(reasons or ["no attachment"])))
        description = r.get("description") or ""
        text = _sentence(f"{note_type}" + (f" of {when}" if when else "") + ":", f"{description}." if description else "",
                         "Its text could not be read from the record.")
        return [self.new_chunk(r, "0", text, make_label(when, "Note", note_type), "note", category=note_type,
                               refs=refs, status=r.get("status", ""))]

    def chunk_DiagnosticReport(self, r):
        """The result panel, the conclusion (with its codes) and each presented form, each kept when
        another part cannot be read."""
        ref = f"DiagnosticReport/{r['id']}"
        if ref in self.note_twins:
            return []  # the same note is indexed once, through its DocumentReference
        name = concept_words(r.get("code"))
        when = day(clinical_date(r))
        chunks = []
        results = [self.by_ref.get(ref_id(x)) for x in r.get("result") or []]
        results = [x for x in results if x]
        if results:
            values = [f"{concept_text(o.get('code'))} {self.observation_value(o)}" for o in results]
            text = _sentence(f"Lab panel / report on {when}:" if when else "Lab panel / report:", f"{name}.",
                             "Results: " + "; ".join(values) + ".")
            chunks.append(self.new_chunk(
                r, "0", text, make_label(when, "Panel", concept_text(r.get("code"))), "lab", category="panel",
                codes=code_keys(r.get("code")), refs=[f"Observation/{o['id']}" for o in results],
                status=r.get("status", "")))
        texts, reasons = self.readable_attachments(r, r.get("presentedForm") or [])
        for i, text in enumerate(texts[:1]):
            chunks.extend(self.note_chunks(r, text, name or "Report", when, "note", part_prefix=f"form{i}-"))
        if reasons and not texts:
            self.problems.append(ChunkProblem(ref, "report text could not be read: " + "; ".join(reasons)
                                              + "; its results and conclusion are indexed"))
        coded = _join(concept_words(c) for c in r.get("conclusionCode") or [])
        if r.get("conclusion") or coded:
            text = _sentence(f"Report on {when}:" if when else "Report:", f"{name}.",
                             f"Conclusion: {r['conclusion']}" if r.get("conclusion") else "",
                             f"Coded conclusion: {coded}." if coded else "")
            chunks.append(self.new_chunk(r, "conclusion" if chunks else "0", text,
                                         make_label(when, "Report", concept_text(r.get("code"))), "note",
                                         codes=code_keys(*(r.get("conclusionCode") or [])), status=r.get("status", "")))
        return chunks

    def note_chunks(self, r, text: str, note_type: str, when: str, semantic: str,
                    refs: list[str] | None = None, part_prefix: str = "") -> list[Chunk]:
        """Pack a note's sections into chunks that fit the model's window; never mix two notes."""
        header = f"{note_type} of {when}" if when else note_type
        if len(text) > MAX_NOTE_CHARS:
            # Bounded time and memory whatever arrives; what is left out is reported, never silent.
            self.problems.append(ChunkProblem(f"{r['resourceType']}/{r['id']}", f"a note of {len(text):,} characters: "
                                              f"the first {MAX_NOTE_CHARS:,} are indexed, the rest is not"))
            text = text[:MAX_NOTE_CHARS]
        room = self.room_after(header)
        pieces: list[tuple[str, str, int]] = []  # (heading, text, tokens)
        for section in split_sections(text):
            if re.fullmatch(r"\d{4}-\d{2}-\d{2}", section.text.strip()) and not section.heading:
                continue  # the template's date line; the date is in the header already
            for piece, tokens in self.fit_section(room, section.heading, section.text):
                pieces.append((section.heading, piece, tokens))
        chunks, current, used, headings = [], "", 0, []
        def flush():
            if current:
                n = len(chunks)
                label = make_label(when, "Note", _join(h for h in headings if h) or note_type)
                chunks.append(self.new_chunk(r, f"{part_prefix}sec{n}", f"{header}. {current}", label, semantic,
                                             category=note_type, section=_join(h for h in headings if h),
                                             refs=refs, status=r.get("status", "")))
        for heading, piece, tokens in pieces:
            if current and used + tokens > room:
                flush()
                current, used, headings = piece, tokens, [heading]
            else:
                current, used = f"{current} {piece}".strip(), used + tokens
                headings.append(heading)
        flush()
        self.fitted.update(c.chunk_id for c in chunks)
        return chunks

    def room_after(self, header: str) -> int:
        """Word pieces left in the window for text after "<header>. "."""
        return self.budget.max_tokens - self.budget.count_tokens(f"{header}.")

    def fit_section(self, room: int, heading: str, body: str) -> list[tuple[str, int]]:
        """A section as one or more pieces with their token counts, each of which fits in `room`
        (see room_after). Each sentence is counted once and pieces are sized by adding counts:
        the model's word pieces never cross a space, so text joined by spaces counts as the sum of
        its parts (counting every growing candidate again was most of chunking's time)."""
        lead = f"{heading}:" if heading else ""
        sentences = re.split(r"(?<=[.!?;])\s+|\n", body)
        sizes = [self.budget.count_tokens(sentence) for sentence in sentences]
        lead_size = self.budget.count_tokens(lead)
        if lead_size + sum(sizes) <= room:
            return [(f"{heading}: {body}" if heading else body, lead_size + sum(sizes))]
        continued_size = self.budget.count_tokens(f"{heading} (continued):") if heading else 0
        pieces, current, used = [], lead, lead_size
        for sentence, size in zip(sentences, sizes):
            if current and used + size > room:
                pieces.append((current, used))
                current = f"{heading} (continued): {sentence}" if heading else sentence
                used = continued_size + size
            else:
                current, used = f"{current} {sentence}".strip(), used + size
        if current:
            pieces.append((current, used))
        # A single sentence longer than the window is cut on words rather than silently truncated.
        out = []
        for piece, used in pieces:
            out += [(piece, used)] if used <= room else self.cut_on_words(room, piece)
        return out

    def cut_on_words(self, room: int, text: str) -> list[tuple[str, int]]:
        """Pieces of `text` (with their token counts) that fit in `room`, cut between words in one pass."""
        room = max(1, room)      # a header that fills the window still leaves one word per piece
        pieces, current, used = [], [], 0
        for word in text.split():
            size = self.budget.count_tokens(word)
            if current and used + size > room:
                pieces.append((" ".join(current), used))
                current, used = [], 0
            current.append(word)
            used += size
        if current:
            pieces.append((" ".join(current), used))
        return pieces

    # Trends ----------------------------------------------------------------------------------
    def trend_chunks(self) -> list[Chunk]:
        """Per analyte with two or more values: one summary per window ending at its last value."""
        series = defaultdict(list)
        for r in self.resources:
            if r["resourceType"] != "Observation" or status_code(r, "status") in WITHDRAWN:
                continue
            key = series_key(r)
            if not key or not _to_date(clinical_date(r)):
                continue
            value = self.observation_value(r)
            numeric = r.get("valueQuantity") or any(c.get("valueQuantity") for c in r.get("component") or [])
            if numeric and value:
                series[key].append(r)
        out = []
        for code, observations in series.items():
            if len(observations) < 2:
                continue
            observations.sort(key=lambda o: clinical_date(o))
            last = _to_date(clinical_date(observations[-1]))
            previous_members = None
            for days in TREND_WINDOWS + (None,):
                members = [o for o in observations
                           if days is None or _to_date(clinical_date(o)) >= last - timedelta(days=days)]
                ids = [o["id"] for o in members]
                if len(members) < 2 or ids == previous_members:
                    continue
                previous_members = ids
                out.append(self.trend_chunk(members, days))
        return out

    def trend_chunk(self, members: list[dict], days: int | None) -> Chunk:
        latest = members[-1]
        name = concept_text(latest.get("code"))
        category = self.observation_category(latest)
        semantic = "vital" if category == "vital-signs" else "lab" if category == "laboratory" else "observation"
        shown = members[-12:]
        readings = "; ".join(f"{day(clinical_date(o))} {self.observation_value(o)}" for o in shown)
        window = f"last {days} days" if days else "all recorded values"
        first_day, last_day = day(clinical_date(members[0])), day(clinical_date(latest))
        text = _sentence(
            f"Trend of {name} ({window}, {first_day} to {last_day}, {len(members)} readings):",
            f"{readings}.", f"Latest {self.observation_value(latest)} on {last_day}.",
        )
        label = make_label(last_day, "Trend", f"{name} · {window}")
        refs = [f"Observation/{o['id']}" for o in reversed(members)]
        return self.new_chunk(latest, f"trend-{days or 'all'}", text, label, semantic, category="trend",
                              codes=code_keys(latest.get("code")), refs=refs, when=last_day)


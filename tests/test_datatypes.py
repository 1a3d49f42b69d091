"""FHIR R4 datatypes rendered by the specification: each case is a shape certified EHRs send and
Synthea never does, with the words a clinician must read in the chunk."""
from __future__ import annotations

import pytest

from fhir_ingest.record.chunk import PatientChunker, TextBudget
from fhir_ingest.record.datatypes import range_text, reference_range_text, value_text

PATIENT = {"resourceType": "Patient", "id": "p1"}
BUDGET = TextBudget(254, lambda t: len(t.split()))


def observation(oid="o1", **fields) -> dict:
    base = {"resourceType": "Observation", "id": oid, "status": "final", "subject": {"reference": "Patient/p1"},
            "effectiveDateTime": "2024-03-12T10:00:00Z",
            "code": {"coding": [{"system": "http://loinc.org", "code": "10839-9"}], "text": "Troponin I"}}
    return base | fields


def chunk_text(*resources) -> dict[str, str]:
    chunks = PatientChunker("t", "p1", [PATIENT, *resources], BUDGET).chunks()
    return {c.resource_id: c.text for c in chunks if c.part == "0"}


@pytest.mark.parametrize("element,words", [
    ({"valueQuantity": {"value": 0.01, "comparator": "<", "unit": "ng/mL"}}, "<0.01 ng/mL"),
    ({"valueQuantity": {"value": 60, "comparator": ">", "unit": "mL/min/1.73m2"}}, ">60 mL/min/1.73m2"),
    ({"valueRange": {"low": {"value": 1, "unit": "tablet"}, "high": {"value": 2, "unit": "tablet"}}}, "1-2 tablet"),
    ({"valueRatio": {"numerator": {"value": 1, "unit": "mg"}, "denominator": {"value": 5, "unit": "mL"}}}, "1 mg / 5 mL"),
    ({"valueBoolean": True}, "yes"), ({"valueBoolean": False}, "no"),
    ({"valueInteger": 14}, "14"), ({"valueString": "trace"}, "trace"),
    ({"valuePeriod": {"start": "2024-01-01", "end": "2024-02-01"}}, "2024-01-01 to 2024-02-01"),
    ({"valueTime": "08:30:00"}, "08:30:00"),
    ({"dataAbsentReason": {"coding": [{"code": "not-performed"}]}}, "no value (not performed)"),
    ({"dataAbsentReason": {"text": "Specimen hemolyzed"}}, "no value (Specimen hemolyzed)"),
    ({}, ""),
])
def test_every_value_type_in_words(element, words):
    assert value_text(element) == words


def test_comparators_reach_the_chunk():
    text = chunk_text(observation(valueQuantity={"value": 0.01, "comparator": "<", "unit": "ng/mL"}))["o1"]
    assert "Troponin I = <0.01 ng/mL." in text


def test_a_value_that_is_absent_says_why_instead_of_nothing():
    text = chunk_text(observation(dataAbsentReason={"coding": [{"code": "not-performed"}]}))["o1"]
    assert "Troponin I = no value (not performed)." in text
    assert "Troponin I." not in text


def test_reference_range_keeps_numbers_and_text():
    ranges = [{"low": {"value": 3.5, "unit": "mmol/L"}, "high": {"value": 5.1, "unit": "mmol/L"},
               "text": "Standard reference interval", "appliesTo": [{"text": "adults"}]}]
    assert reference_range_text(ranges) == "3.5-5.1 mmol/L (Standard reference interval) for adults"
    assert reference_range_text([{"high": {"value": 200, "unit": "mg/dL"}}]) == "at most 200 mg/dL"
    assert reference_range_text([{"text": "negative"}]) == "negative"
    assert range_text({"low": {"value": 1, "unit": "mg"}, "high": {"value": 2, "unit": "g"}}) == "1 mg-2 g"


def bp(oid, systolic=None, diastolic=None, loinc_first=True) -> dict:
    def component(code, value):
        codings = [{"system": "http://loinc.org", "code": code}]
        local = {"system": "urn:oid:1.2.840.114350.0.1", "code": f"flowsheet-{code}"}
        comp = {"code": {"coding": codings + [local] if loinc_first else [local] + codings}}
        if value is None:
            comp["dataAbsentReason"] = {"coding": [{"code": "unknown"}]}
        else:
            comp["valueQuantity"] = {"value": value, "unit": "mmHg"}
        return comp
    return observation(oid, code={"coding": [{"system": "http://loinc.org", "code": "85354-9"}], "text": "Blood pressure"},
                       component=[component("8462-4", diastolic), component("8480-6", systolic)])


def test_blood_pressure_whatever_the_coding_order_and_with_a_side_missing():
    text = chunk_text(bp("b1", 128, 82, loinc_first=False), bp("b2", 109, None))
    assert "Blood pressure = 128/82 mmHg." in text["b1"]
    assert "Blood pressure = 109/(diastolic not recorded) mmHg." in text["b2"]


def pulse_like(oid, system, code, value, day):
    return observation(oid, code={"coding": [{"system": system, "code": code}], "text": f"{system} {code}"},
                       valueQuantity={"value": value, "unit": "u"}, effectiveDateTime=f"{day}T09:00:00Z")


def test_trends_never_mix_codes_of_different_systems():
    resources = [pulse_like("k1", "urn:local:lab", "123", 4.1, "2024-01-01"),
                 pulse_like("k2", "urn:local:lab", "123", 4.3, "2024-02-01"),
                 pulse_like("p1", "urn:local:flowsheet", "123", 104, "2024-01-15"),
                 pulse_like("p2", "urn:local:flowsheet", "123", 88, "2024-02-15")]
    trends = [c for c in PatientChunker("t", "p1", [PATIENT, *resources], BUDGET).chunks() if c.category == "trend"]
    members = {frozenset(ref.split("/")[1] for ref in c.refs) for c in trends}
    assert members == {frozenset({"k1", "k2"}), frozenset({"p1", "p2"})}


def test_dosage_by_the_specification():
    from fhir_ingest.record.datatypes import dosage_text

    oxycodone = {"text": "1-2 tablets every 4 hours as needed for pain",
                 "timing": {"repeat": {"frequency": 1, "period": 4, "periodUnit": "h"}, "code": {"text": "Q4H"}},
                 "asNeededCodeableConcept": {"text": "pain"}, "route": {"text": "oral"},
                 "doseAndRate": [{"doseRange": {"low": {"value": 1, "unit": "tablet"}, "high": {"value": 2, "unit": "tablet"}}}],
                 "maxDosePerPeriod": {"numerator": {"value": 6, "unit": "tablet"}, "denominator": {"value": 1, "unit": "d"}}}
    words = dosage_text(oxycodone)
    for part in ("1-2 tablet", "Q4H", "as needed for pain", "max 6 tablet per 1 d", "route oral"):
        assert part in words
    assert dosage_text({"timing": {"code": {"coding": [{"code": "BID", "display": "BID"}]}}, "asNeededBoolean": True}) \
        == "BID; as needed"
    assert dosage_text({"timing": {"repeat": {"frequency": 1, "period": 4, "periodMax": 6, "periodUnit": "h"}}}) \
        == "every 4-6 hours"


def medication_request(**fields) -> dict:
    return {"resourceType": "MedicationRequest", "id": "m1", "status": "active", "intent": "order",
            "subject": {"reference": "Patient/p1"}, "authoredOn": "2024-01-02"} | fields


def test_a_contained_medication_with_only_codings_is_named():
    order = medication_request(contained=[{"resourceType": "Medication", "id": "med1", "code": {"coding": [
        {"system": "http://www.nlm.nih.gov/research/umls/rxnorm", "code": "1364445", "display": "apixaban 5 MG Oral Tablet"}]}}],
        medicationReference={"reference": "#med1"})
    text = chunk_text(order)["m1"]
    assert "apixaban 5 MG Oral Tablet" in text and "unknown medication" not in text


def condition(**fields) -> dict:
    return {"resourceType": "Condition", "id": "c1", "subject": {"reference": "Patient/p1"},
            "clinicalStatus": {"coding": [{"code": "active"}]}, "recordedDate": "2020-05-01",
            "code": {"text": "Knee OA", "coding": [{"system": "http://snomed.info/sct", "code": "239873007",
                                                    "display": "Osteoarthritis of knee"}]}} | fields


@pytest.mark.parametrize("fields,words", [
    ({"onsetString": "childhood"}, "Onset childhood."),
    ({"onsetAge": {"value": 52, "unit": "years"}}, "Onset at age 52 years."),
    ({"onsetPeriod": {"start": "2019-01-01", "end": "2019-03-01"}}, "Onset 2019-01-01 to 2019-03-01."),
    ({"abatementString": "after surgery", "clinicalStatus": {"coding": [{"code": "resolved"}]}}, "Resolved after surgery."),
    ({"abatementAge": {"value": 60, "unit": "years"}}, "Resolved at age 60 years."),
])
def test_onset_and_abatement_of_every_type(fields, words):
    text = chunk_text(condition(**fields))["c1"]
    assert words in text
    assert "Recorded 2020-05-01." in text      # the record date is never passed off as the onset


def test_an_abbreviated_text_keeps_the_coded_name_searchable():
    assert "Knee OA (Osteoarthritis of knee)." in chunk_text(condition())["c1"]


def b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def note(nid="n1", **attachment) -> dict:
    return {"resourceType": "DocumentReference", "id": nid, "status": "current", "type": {"text": "Progress note"},
            "subject": {"reference": "Patient/p1"}, "date": "2024-05-01T09:00:00Z", "content": [{"attachment": attachment}]}


def test_notes_from_a_binary_in_the_same_input_by_any_reference():
    binary = {"resourceType": "Binary", "id": "b1", "contentType": "text/plain", "data": b64("Plan: start apixaban.")}
    relative = note("n1", contentType="text/plain", url="Binary/b1")
    absolute = note("n2", contentType="text/plain", url="https://ehr.example.org/fhir/Binary/b1")
    inner = dict(binary, id="inner")
    held = dict(note("n3", contentType="text/plain", url="#inner"), contained=[inner])
    chunks = PatientChunker("t", "p1", [PATIENT, binary, relative, absolute, held], BUDGET).chunks()
    for nid in ("n1", "n2", "n3"):
        assert any(c.resource_id == nid and "Plan: start apixaban." in c.text for c in chunks), nid


def test_a_transaction_bundles_urn_uuid_binary_is_resolved(tmp_path):
    import json

    from fhir_ingest.record.load import load_resources

    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": "urn:uuid:11111111-1111-4111-8111-111111111111", "resource": {"resourceType": "Patient"},
         "request": {"method": "POST", "url": "Patient"}},
        {"fullUrl": "urn:uuid:22222222-2222-4222-8222-222222222222",
         "resource": {"resourceType": "Binary", "contentType": "text/plain", "data": b64("Assessment: stable angina.")},
         "request": {"method": "POST", "url": "Binary"}},
        {"fullUrl": "urn:uuid:33333333-3333-4333-8333-333333333333", "request": {"method": "POST", "url": "DocumentReference"},
         "resource": {"resourceType": "DocumentReference", "status": "current", "type": {"text": "Progress note"},
                      "subject": {"reference": "urn:uuid:11111111-1111-4111-8111-111111111111"},
                      "content": [{"attachment": {"contentType": "text/plain",
                                                  "url": "urn:uuid:22222222-2222-4222-8222-222222222222"}}]}}]}
    path = tmp_path / "transaction.json"
    path.write_text(json.dumps(bundle), encoding="utf-8")
    records, report = load_resources([path])
    assert not report.skipped and len(report.warnings) == 3          # each id taken from its fullUrl, said
    chunks = PatientChunker("t", records[0].patient_id, records[0].resources, BUDGET).chunks()
    assert any("stable angina" in c.text for c in chunks)


XHTML = '<html xmlns="http://www.w3.org/1999/xhtml"><body><h2>Assessment</h2><p>Community-acquired pneumonia.</p></body></html>'
CDA = """<ClinicalDocument xmlns="urn:hl7-org:v3"><title>Discharge summary</title><component><structuredBody>
<component><section><title>Hospital Course</title><text><paragraph>Treated with ceftriaxone.</paragraph></text></section></component>
<component><section><title>Discharge Medications</title><text><list><item>amoxicillin 500 mg TID</item></list></text></section></component>
</structuredBody></component></ClinicalDocument>"""


@pytest.mark.parametrize("content_type,payload,words", [
    ("application/xhtml+xml", XHTML, "Assessment: Community-acquired pneumonia."),
    ("application/xhtml", XHTML, "Community-acquired pneumonia."),
    ("application/xml", CDA, "Hospital Course: Treated with ceftriaxone."),
    ("application/hl7-v3+xml", CDA, "amoxicillin 500 mg TID"),
])
def test_xhtml_and_cda_notes(content_type, payload, words):
    text = " ".join(c.text for c in PatientChunker("t", "p1", [PATIENT, note(contentType=content_type, data=b64(payload))],
                                                  BUDGET).chunks())
    assert words in text


LAUGHS = """<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>
<ClinicalDocument xmlns="urn:hl7-org:v3"><component><structuredBody><component><section><title>Plan</title>
<text>&lol2; Start lisinopril.</text></section></component></structuredBody></component></ClinicalDocument>"""
EXTERNAL = """<!doctype ClinicalDocument SYSTEM "http://169.254.169.254/latest"><ClinicalDocument/>"""


@pytest.mark.parametrize("payload", [LAUGHS, EXTERNAL])
def test_xml_with_a_doctype_is_refused_and_costs_only_the_note(payload):
    chunker = PatientChunker("t", "p1", [PATIENT, note(contentType="application/xml", data=b64(payload))], BUDGET)
    chunks = chunker.chunks()
    assert not any("lol" in c.text or "lisinopril" in c.text for c in chunks)
    assert any("document type declaration" in p.reason for p in chunker.problems)


def report(**fields) -> dict:
    return {"resourceType": "DiagnosticReport", "id": "r1", "status": "final", "subject": {"reference": "Patient/p1"},
            "code": {"text": "Chest X-ray"}, "effectiveDateTime": "2024-02-02"} | fields


def test_one_unreadable_part_never_costs_a_report_its_results_or_conclusion():
    result = observation("o9", valueQuantity={"value": 1.2, "unit": "ng/mL"})
    broken = report(result=[{"reference": "Observation/o9"}], conclusion="No acute cardiopulmonary process.",
                    conclusionCode=[{"text": "Normal chest X-ray"}],
                    presentedForm=[{"contentType": "image/png", "data": b64("not text")}])
    chunker = PatientChunker("t", "p1", [PATIENT, result, broken], BUDGET)
    texts = " ".join(c.text for c in chunker.chunks() if c.resource_id == "r1")
    assert "Troponin I 1.2 ng/mL" in texts and "No acute cardiopulmonary process." in texts
    assert "Normal chest X-ray" in texts
    assert any("report text could not be read" in p.reason for p in chunker.problems)


def test_a_narrative_without_a_div_costs_only_the_narrative(tmp_path):
    import json

    from fhir_ingest.record.load import load_resources

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": PATIENT}, {"resource": report(text={"status": "generated"}, conclusion="Clear lungs.")}]}), encoding="utf-8")
    records, report_ = load_resources([path])
    assert not report_.skipped and "narrative" in report_.warnings[0].reason
    assert any(r["resourceType"] == "DiagnosticReport" for r in records[0].resources)


@pytest.mark.parametrize("resource,words", [
    ({"resourceType": "MedicationStatement", "id": "x", "status": "active", "subject": {"reference": "Patient/p1"},
      "medicationCodeableConcept": {"text": "apixaban 5 mg tablet"}, "effectiveDateTime": "2024-01-01",
      "dosage": [{"text": "5 mg twice daily"}]}, ["Medication statement (active)", "apixaban 5 mg tablet", "5 mg twice daily"]),
    ({"resourceType": "MedicationDispense", "id": "x", "status": "completed", "subject": {"reference": "Patient/p1"},
      "medicationCodeableConcept": {"text": "Nizatidine 15 MG/ML Oral Solution"}, "whenHandedOver": "2024-02-02",
      "quantity": {"value": 480, "unit": "mL"}, "daysSupply": {"value": 30, "unit": "days"}},
     ["Medication dispensed (completed) on 2024-02-02", "Quantity 480 mL", "Days supply 30 days"]),
    ({"resourceType": "ServiceRequest", "id": "x", "status": "active", "intent": "order", "subject": {"reference": "Patient/p1"},
      "code": {"text": "CBC"}, "authoredOn": "2024-03-03", "reasonCode": [{"text": "fatigue"}]},
     ["Order / referral (active, order) on 2024-03-03", "CBC.", "Reason: fatigue."]),
    ({"resourceType": "Goal", "id": "x", "lifecycleStatus": "active", "subject": {"reference": "Patient/p1"},
      "description": {"text": "HbA1c below 7%"}, "startDate": "2024-01-01",
      "target": [{"measure": {"text": "HbA1c"}, "detailQuantity": {"value": 7, "comparator": "<", "unit": "%"},
                  "dueDate": "2024-12-31"}]}, ["Goal (active) from 2024-01-01", "HbA1c below 7%", "HbA1c: <7 % by 2024-12-31"]),
    ({"resourceType": "FamilyMemberHistory", "id": "x", "status": "completed", "patient": {"reference": "Patient/p1"},
      "relationship": {"text": "father"}, "date": "2011-03-18",
      "condition": [{"code": {"text": "Chronic kidney disease (CKD)"}, "onsetAge": {"value": 50, "unit": "years"}}]},
     ["Family history (completed) recorded 2011-03-18", "father:", "Chronic kidney disease (CKD) (onset at age 50 years)"]),
    ({"resourceType": "QuestionnaireResponse", "id": "x", "status": "completed", "subject": {"reference": "Patient/p1"},
      "questionnaire": "http://example.org/Questionnaire/phq-9", "authored": "2022-11-29",
      "item": [{"linkId": "1", "text": "Little interest or pleasure in doing things?",
                "answer": [{"valueCoding": {"display": "More than half the days"}}]},
               {"linkId": "9", "text": "Total score", "answer": [{"valueInteger": 14}]}]},
     ["Questionnaire response (completed) on 2022-11-29", "phq-9", "Little interest or pleasure in doing things: More than half the days",
      "Total score: 14"]),
    ({"resourceType": "Coverage", "id": "x", "status": "active", "beneficiary": {"reference": "Patient/p1"},
      "payor": [{"display": "Acme Health"}], "type": {"text": "PPO"}}, ["Insurance coverage (active)", "PPO.", "Payer: Acme Health."]),
])
def test_each_clinical_type_is_rendered(resource, words):
    text = " ".join(c.text for c in PatientChunker("t", "p1", [PATIENT, resource], BUDGET).chunks())
    for part in words:
        assert part in text, (part, text)


def test_a_composition_is_a_note_in_its_sections():
    composition = {"resourceType": "Composition", "id": "x", "status": "final", "subject": {"reference": "Patient/p1"},
                   "type": {"text": "Progress note"}, "date": "2024-04-04", "title": "Progress note",
                   "section": [{"title": "Subjective", "text": {"div": "<div>Cough for 3 days.</div>"}},
                               {"title": "Assessment", "text": {"div": "<div>Acute bronchitis.</div>"}},
                               {"title": "Plan", "text": {"div": "<div>Supportive care.</div>"}}]}
    chunks = PatientChunker("t", "p1", [PATIENT, composition], BUDGET).chunks()
    text = " ".join(c.text for c in chunks)
    assert "Subjective: Cough for 3 days." in text and "Assessment: Acute bronchitis." in text
    assert all(c.semantic_type == "note" for c in chunks)


def test_cosmetic_gaps_never_read_as_sentences():
    order = medication_request(medicationCodeableConcept={"text": "lisinopril"},
                               dispenseRequest={"validityPeriod": {"start": "2026-08-22"}})
    plan = {"resourceType": "CarePlan", "id": "cp", "status": "active", "intent": "plan", "subject": {"reference": "Patient/p1"}}
    text = chunk_text(order, plan)
    assert "Valid from 2026-08-22." in text["m1"] and " to ." not in text["m1"]
    assert "from : ." not in text["cp"] and ": ." not in text["cp"]
    undated = {"resourceType": "DocumentReference", "id": "n", "status": "current", "type": {"text": "Discharge Summary"},
               "subject": {"reference": "Patient/p1"}, "content": [{"attachment": {"contentType": "text/plain", "data": b64("Home.")}}]}
    note_text = " ".join(c.text for c in PatientChunker("t", "p1", [PATIENT, undated], BUDGET).chunks())
    assert "Discharge Summary of." not in note_text and note_text.startswith("Discharge Summary. ")

"""One home per kind of FHIR resource: the registry everything is derived from, and the typed fact
each kind reads, checked over every US Core example and shared Synthea records, and through to the
first sentence an answer writes from it. No index and no embedding model."""
from __future__ import annotations

import gzip
import json

import pytest

from fhir_ingest.connection.smart_auth import resource_scopes
from fhir_ingest.record.chunk import PatientChunker, TextBudget
from fhir_ingest.record.kinds import (ESSENTIAL_TYPES, IGNORED_TYPES, INDEXED_TYPES, KINDS, PATIENT_SEARCHES,
                                      SUPPORT_TYPES, clinical_date, fact_of)
from fhir_ingest.record.load import load_resources
from search.answering.facts import fact_of as answer_fact_of
from search.answering.lead import first_sentence
from search.answering.answer import numbered
from search.retrieval.types import Analysis, Evidence

from .conftest import SHARED, require_shared

BUDGET = TextBudget(254, lambda t: len(t.split()))
SYNTHEA_SAMPLE = 8        # patients of the shared set, in file order: every kind Synthea writes


def test_every_indexed_kind_is_searched_rendered_read_and_dated():
    """Adding a resource type is one Kind: it is then searched at the EHR, asked for in the
    scopes, rendered, read into a fact and dated, with nothing else to edit."""
    for rt in INDEXED_TYPES:
        kind = KINDS[rt]
        # The Patient (its demographics) is read as Patient/<id>, not searched.
        assert (kind.search or rt == "Patient") and kind.render and kind.fact and kind.dates, rt
    assert INDEXED_TYPES - {"Patient"} <= set(PATIENT_SEARCHES)
    scopes = set(resource_scopes("patient", "v2"))
    assert {f"patient/{rt}.rs" for rt in INDEXED_TYPES | SUPPORT_TYPES} <= scopes
    assert not (set(KINDS) & set(IGNORED_TYPES))
    assert {"Condition", "AllergyIntolerance", "MedicationRequest"} <= ESSENTIAL_TYPES


@pytest.fixture(scope="module")
def resources() -> list[tuple[dict, dict]]:
    """(resource, the record it belongs to by ref) for every US Core example and a sample of the
    shared Synthea records."""
    require_shared()
    files = sorted((SHARED / "data" / "uscore").glob("*.json")) + \
        sorted((SHARED / "data" / "synthea").glob("*.json.gz"))[:SYNTHEA_SAMPLE]
    records, _ = load_resources(files)
    out = []
    for record in records:
        by_ref = {f"{r['resourceType']}/{r['id']}": r for r in record.resources}
        out += [(r, by_ref) for r in record.resources]
    return out


def quantities_of_dose(dosage: dict) -> list[tuple[str, dict]]:
    out = []
    for dose_rate in dosage.get("doseAndRate") or []:
        if isinstance(dose_rate.get("doseQuantity"), dict):
            out.append(("quantity", dose_rate["doseQuantity"]))
        if isinstance(dose_rate.get("doseRange"), dict):
            out.append(("range", dose_rate["doseRange"]))
    return out


def check_observation(r: dict, fact) -> None:
    q = r.get("valueQuantity")
    if isinstance(q, dict) and q.get("value") is not None:
        assert fact.value.quantity.value == q["value"] and fact.value.quantity.comparator == q.get("comparator", "")
        assert fact.value.quantity.unit == (q.get("unit") or q.get("code") or "")
    if isinstance(r.get("valueRange"), dict):
        low = (r["valueRange"].get("low") or {}).get("value")
        assert fact.value.kind == "range" and (low is None or fact.value.low.value == low)
    if isinstance(r.get("valueCodeableConcept"), dict):
        assert fact.value.kind == "coded" and fact.value.text
    assert len(fact.components) == len([c for c in r.get("component") or [] if isinstance(c, dict)])
    assert len(fact.ranges) == len([x for x in r.get("referenceRange") or [] if isinstance(x, dict)])
    if r.get("interpretation"):
        assert fact.interpretation


def check_medication(r: dict, fact, by_ref: dict) -> None:
    dosages = r.get("dosageInstruction") or r.get("dosage") or []
    dosages = dosages if isinstance(dosages, list) else [dosages]
    assert len(fact.doses) == len([d for d in dosages if isinstance(d, dict)])
    for dosage, dose in zip([d for d in dosages if isinstance(d, dict)], fact.doses):
        for form, q in quantities_of_dose(dosage)[:1]:
            if form == "quantity" and q.get("value") is not None:
                assert dose.amount.quantity.value == q["value"]
            if form == "range":
                assert dose.amount.kind == "range"
        if dosage.get("asNeededBoolean") or dosage.get("asNeededCodeableConcept"):
            assert dose.as_needed.startswith("as needed")
    medication = by_ref.get((r.get("medicationReference") or {}).get("reference", ""))
    if medication and medication.get("code"):
        assert fact.medication and fact.medication != "unknown medication"


def test_every_value_comparator_unit_range_dose_and_onset_is_in_the_typed_fact(resources):
    checked = {}
    for r, by_ref in resources:
        fact = fact_of(r, by_ref.get)
        rt = r["resourceType"]
        if rt not in INDEXED_TYPES:
            continue
        assert fact is not None, rt
        assert fact.date == clinical_date(r)
        if rt == "Observation":
            check_observation(r, fact)
        elif rt.startswith("Medication"):
            check_medication(r, fact, by_ref)
        elif rt == "Condition" and any(k.startswith("onset") for k in r):
            assert fact.onset, r["id"]
            if isinstance(r.get("onsetString"), str):
                assert fact.onset == r["onsetString"]
        elif rt == "AllergyIntolerance":
            assert len(fact.reactions) == len(r.get("reaction") or [])
        checked[rt] = checked.get(rt, 0) + 1
    assert set(checked) >= {"Observation", "MedicationRequest", "Condition", "AllergyIntolerance", "Encounter",
                            "Procedure", "Immunization", "DiagnosticReport", "DocumentReference", "CarePlan"}


def lead_of(question: str, resources: list[dict], kind: str, key: str) -> str:
    """The first sentence an answer writes from the chunks indexing makes of these resources."""
    chunks = [c for c in PatientChunker("t", "p", resources, BUDGET).chunks() if c.category != "trend"]
    for chunk in chunks:
        chunk.concepts = [{"key": key, "display": key, "semantic_type": chunk.semantic_type, "negated": False}]
    relevant = [Evidence(c, 1.0) for c in chunks if c.semantic_type == kind]
    analysis = Analysis(question, [{"key": key, "display": key, "semantic_type": kind, "negated": False, "start": 0}],
                        question.lower().split(), [kind])
    lead = first_sentence(analysis, relevant, lambda ev: "")
    return numbered([lead.draft])[0][0].text


def test_the_first_sentence_says_what_epic_and_oracle_shaped_records_say():
    """The five things the answer's own reader dropped: a comparator, a dose range, an onset in
    words, a drug named only by a referenced Medication, a specimen's condition."""
    patient = {"resourceType": "Patient", "id": "p"}
    ferritin = {"resourceType": "Observation", "id": "fe", "status": "final", "effectiveDateTime": "2025-02-03",
                "category": [{"coding": [{"code": "laboratory"}]}],
                "code": {"coding": [{"system": "http://loinc.org", "code": "2276-4", "display": "Ferritin"}]},
                "valueQuantity": {"value": 6, "comparator": "<", "unit": "ng/mL"},
                "interpretation": [{"text": "low"}], "specimen": {"reference": "Specimen/s1"}}
    specimen = {"resourceType": "Specimen", "id": "s1", "type": {"text": "Serum"},
                "condition": [{"text": "hemolyzed"}]}
    assert lead_of("latest ferritin?", [patient, ferritin, specimen], "lab", "lex:ferritin") == \
        "Ferritin <6 ng/mL (low) on 2025-02-03 [1]."
    med = {"resourceType": "Medication", "id": "m1", "code": {"text": "Oxycodone 5 MG Oral Tablet"}}
    order = {"resourceType": "MedicationRequest", "id": "o1", "status": "active", "intent": "order",
             "authoredOn": f"{__import__('datetime').date.today().year}-01-02",
             "medicationReference": {"reference": "Medication/m1"}, "subject": {"reference": "Patient/p"},
             "dosageInstruction": [{"doseAndRate": [{"doseRange": {"low": {"value": 1, "unit": "tablet"},
                                                                   "high": {"value": 2, "unit": "tablet"}}}],
                                    "asNeededCodeableConcept": {"text": "pain"}}]}
    said = lead_of("is she on oxycodone?", [patient, med, order], "medication", "lex:oxycodone")
    assert said.startswith("Yes — ") or said.startswith("Oxycodone")
    assert "Oxycodone 5 mg oral tablet" in said and "1-2 tablet" in said and "as needed for pain" in said
    problem = {"resourceType": "Condition", "id": "c1", "onsetString": "childhood", "recordedDate": "2019-05-06",
               "clinicalStatus": {"coding": [{"code": "active"}]}, "code": {"text": "Asthma"}}
    said = lead_of("when did the asthma start?", [patient, problem], "problem", "lex:asthma")
    assert "onset childhood" in said and "since 2019-05-06" not in said


def test_the_specimen_condition_stays_beside_the_value(tmp_path):
    from fhir_ingest.record.facts import fact_from_dict

    ferritin = {"resourceType": "Observation", "id": "fe", "status": "final", "effectiveDateTime": "2025-02-03",
                "code": {"text": "Ferritin"}, "valueQuantity": {"value": 6, "comparator": "<", "unit": "ng/mL"},
                "specimen": {"reference": "Specimen/s1"}, "note": [{"text": "sample hemolyzed, repeat advised"}]}
    specimen = {"resourceType": "Specimen", "id": "s1", "type": {"text": "Serum"}, "condition": [{"text": "hemolyzed"}]}
    chunk = PatientChunker("t", "p", [ferritin, specimen], BUDGET).chunks()[0]
    typed = fact_from_dict(chunk.fact)
    assert typed.specimen.startswith("Serum, hemolyzed") and typed.notes == "sample hemolyzed, repeat advised"
    said = answer_fact_of(Evidence(chunk, 1.0))
    assert said.points[0].text == "<6 ng/mL" and "hemolyzed" in said.points[0].note


def test_a_fact_round_trips_through_the_stored_chunk():
    from fhir_ingest.record.contract import Chunk
    from fhir_ingest.record.facts import fact_from_dict

    require_shared()
    bundle = sorted((SHARED / "data" / "synthea").glob("*.json.gz"))[0]
    with gzip.open(bundle, "rt", encoding="utf-8") as fh:
        entries = [e["resource"] for e in json.load(fh)["entry"]]
    chunks = PatientChunker("t", "p", entries, BUDGET).chunks()
    for chunk in chunks:
        stored = Chunk.from_dict(json.loads(json.dumps(chunk.to_dict())))
        assert stored.fact == chunk.fact and stored.codes == chunk.codes and stored.sections == chunk.sections
        if chunk.fact:
            assert fact_from_dict(stored.fact).to_dict() == chunk.fact

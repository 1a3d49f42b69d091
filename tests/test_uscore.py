"""HL7's US Core examples (the shapes certified EHRs send): nothing skipped, nothing clinical lost.

The coverage check walks every example resource of an indexed type and fails when an element that
carries clinical content (a value, a range, a dose, a note, a reason, a status reason, a
conclusion, a coded name) appears nowhere in that resource's chunks."""
from __future__ import annotations

from pathlib import Path

import pytest

from fhir_ingest.record.chunk import PatientChunker, TextBudget
from fhir_ingest.record.load import load_resources
from fhir_ingest.record.kinds import INDEXED_TYPES
from fhir_ingest.record.normalize import quantity_text

from .conftest import SHARED, question_set_report, require_shared

USCORE = SHARED / "data" / "uscore"
BUDGET = TextBudget(254, lambda t: len(t.split()))


@pytest.fixture(scope="module")
def uscore():
    require_shared()
    files = sorted(USCORE.glob("*.json"))
    records, report = load_resources(files)
    chunks = {}
    problems = []
    for record in records:
        chunker = PatientChunker("uscore", record.patient_id, record.resources, BUDGET)
        for chunk in chunker.chunks():
            chunks.setdefault(chunk.ref, []).append(chunk)
        problems += chunker.problems
    resources = [r for record in records for r in record.resources]
    return resources, chunks, report, problems


def test_every_example_is_read_and_nothing_is_skipped(uscore):
    _, _, report, _ = uscore
    assert report.skipped == []
    assert not report.not_indexed, f"types with no renderer: {dict(report.not_indexed)}"
    kinds = {fate.split(":")[0] for *_, fate in report.type_rows()}
    assert kinds <= {"indexed", "read to complete other records", "ignored"}


def test_the_only_problems_are_notes_whose_content_is_outside_the_input(uscore):
    _, _, _, problems = uscore
    assert problems and all("attachment URL not fetched" in p.reason for p in problems), problems


def concept_words_of(concept: dict) -> list[str]:
    """A CodeableConcept is covered when its text, or any of its displays or codes, is in the chunk."""
    if not isinstance(concept, dict):
        return []
    words = [concept["text"]] if isinstance(concept.get("text"), str) else []
    for coding in concept.get("coding") or []:
        words += [coding[k] for k in ("display", "code") if isinstance(coding.get(k), str)]
    return words


def value_words(element: dict) -> list[list[str]]:
    """Alternatives for each value an element carries (any one of each list must be in the text)."""
    out = []
    for key, value in element.items():
        if not key.startswith("value") or key == "valueSet":
            continue
        if isinstance(value, dict) and "value" in value:
            out.append([quantity_text({"value": value["value"]})])
        elif isinstance(value, dict) and ("coding" in value or "text" in value):
            out.append(concept_words_of(value))
        elif isinstance(value, dict) and ("low" in value or "high" in value or "numerator" in value):
            out += [[quantity_text({"value": q["value"]})] for q in value.values() if isinstance(q, dict) and "value" in q]
        elif isinstance(value, str):
            out.append([value[:40]])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append([str(value)])
    return out


def clinical_elements(resource: dict) -> list[tuple[str, list[str]]]:
    """(where, alternatives) for every element that carries clinical content."""
    found = []
    for name in ("code", "vaccineCode", "medicationCodeableConcept", "description", "relationship", "type"):
        words = concept_words_of(resource.get(name))
        if words:
            found.append((name, words))
    for i, words in enumerate(value_words(resource)):
        found.append((f"value[{i}]", words))
    for i, component in enumerate(resource.get("component") or []):
        for j, words in enumerate(value_words(component)):
            found.append((f"component[{i}].value[{j}]", words))
    for i, rr in enumerate(resource.get("referenceRange") or []):
        for side in ("low", "high"):
            if isinstance(rr.get(side), dict) and "value" in rr[side]:
                found.append((f"referenceRange[{i}].{side}", [quantity_text({"value": rr[side]["value"]})]))
        if isinstance(rr.get("text"), str):
            found.append((f"referenceRange[{i}].text", [rr["text"]]))
    for field in ("dosageInstruction", "dosage"):
        dosages = resource.get(field)
        for i, dosage in enumerate(dosages if isinstance(dosages, list) else [dosages] if isinstance(dosages, dict) else []):
            if isinstance(dosage.get("text"), str):
                found.append((f"{field}[{i}].text", [dosage["text"]]))
            for dr in dosage.get("doseAndRate") or []:
                if isinstance(dr.get("doseQuantity"), dict):
                    found.append((f"{field}[{i}].dose", [quantity_text({"value": dr["doseQuantity"]["value"]})]))
    for i, note in enumerate(resource.get("note") or []):
        if isinstance(note.get("text"), str):
            found.append((f"note[{i}]", [note["text"][:40]]))
    for field in ("statusReason", "reasonCode", "conclusionCode"):
        items = resource.get(field)
        for i, concept in enumerate(items if isinstance(items, list) else [items] if isinstance(items, dict) else []):
            found.append((f"{field}[{i}]", concept_words_of(concept)))
    if isinstance(resource.get("conclusion"), str):
        found.append(("conclusion", [resource["conclusion"][:40]]))
    for name in ("onsetString", "abatementString"):
        if isinstance(resource.get(name), str):
            found.append((name, [resource[name]]))
    return [(where, words) for where, words in found if words]


def test_coverage_every_clinical_element_reaches_a_chunk(uscore):
    resources, chunks, _, _ = uscore
    missing = []
    checked = 0
    for resource in resources:
        if resource["resourceType"] not in INDEXED_TYPES:
            continue
        ref = f"{resource['resourceType']}/{resource['id']}"
        text = " ".join(c.text for c in chunks.get(ref, [])).lower()
        if resource["resourceType"] == "Observation" and not text:
            # A result that is a member of a panel may be rendered only inside it.
            text = " ".join(c.text for cs in chunks.values() for c in cs if ref in c.refs).lower()
        for where, words in clinical_elements(resource):
            checked += 1
            if not any(w.lower() in text for w in words):
                missing.append(f"{ref} {where}: none of {words[:3]}")
    assert checked >= 380
    assert not missing, "\n".join(missing)


def chunk_of(uscore, ref: str) -> str:
    return " ".join(c.text for c in uscore[1][ref])


@pytest.mark.parametrize("ref,words", [
    ("MedicationDispense/medicationdispense-example", ["Nizatidine 15 MG/ML Oral Solution", "Quantity 480 mL"]),
    ("FamilyMemberHistory/familymemberhistory-example", ["father", "Chronic kidney disease (CKD)"]),
    ("Goal/goal-1", ["pulse oximetry of 92%", "weight of 195 lbs"]),
    ("ServiceRequest/cbc", ["CBC", "Laboratory Order"]),
    ("QuestionnaireResponse/phq-9-example", ["Little interest or pleasure in doing things: More than half the days"]),
    ("Coverage/coverage-example", ["Insurance coverage (active)", "PPO"]),
    ("DiagnosticReport/cbc", ["Lab panel / report"]),
])
def test_golden_uscore_chunks_state_what_a_clinician_reads(uscore, ref, words):
    text = chunk_of(uscore, ref)
    for part in words:
        assert part in text, (ref, part, text[:400])


def test_a_blood_pressure_with_a_missing_side_says_so(uscore):
    """US Core's bp-data-absent: the diastolic has a dataAbsentReason, not a value."""
    resources, chunks, _, _ = uscore
    absent = [r for r in resources if r["resourceType"] == "Observation"
              and any(c.get("dataAbsentReason") for c in r.get("component") or [])]
    assert absent
    for resource in absent:
        text = chunk_of((None, chunks), f"Observation/{resource['id']}")
        assert "not recorded" in text and "/ " not in text, text


USCORE_QUESTIONS = Path(__file__).parent / "data" / "uscore-questions.jsonl"


@pytest.fixture(scope="module")
def uscore_service(tmp_path_factory, embedder):
    from search.service import SearchService

    require_shared()
    svc = SearchService("embedded", tmp_path_factory.mktemp("uscore-index") / "index.sqlite")
    summary = svc.index_paths("uscore", [USCORE])
    assert not summary.load.skipped
    yield svc
    svc.close()


def test_questions_over_uscore_are_answered_and_cited(uscore_service):
    report = question_set_report(uscore_service, "uscore", USCORE_QUESTIONS, "US Core questions")
    assert report["recall"]["5"] >= 0.85
    assert report["facts"] >= 0.80
    assert report["abstention_accuracy"] >= 0.8
    assert report["false_abstention"] <= 0.1


def test_a_record_read_but_not_indexed_is_not_called_a_new_patient(uscore_service):
    answer = uscore_service.ask("uscore", "deceased-example", "Any allergies?")
    assert answer["abstained"] and answer["answer"].startswith("This is a new patient")

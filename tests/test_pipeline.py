"""Clinical annotation and the staged pipeline on a small hand-written record with known traps."""
from __future__ import annotations

import base64

import pytest

from search.nlp.annotate import default_annotator
from search.answering.answer import NO_EVIDENCE
from search.retrieval.analysis import analyse, time_window

from .conftest import indexed_record

PID = "trap-1"


def resource_lines() -> list[dict]:
    note = ("2025-03-01\n\n# Chief Complaint\n- Fatigue.\n\n# History of Present Illness\nPatient denies chest pain.\n\n"
            "# Allergies\nNo Known Allergies.\n\n# Medications\ninsulin glargine\n\n"
            "# Assessment and Plan\nType 2 diabetes mellitus, follow up in 3 months.\n")
    subject = {"reference": f"Patient/{PID}"}
    snomed, rxnorm, loinc = "http://snomed.info/sct", "http://www.nlm.nih.gov/research/umls/rxnorm", "http://loinc.org"
    return [
        {"resourceType": "Patient", "id": PID, "gender": "female", "birthDate": "1960-02-02"},
        {"resourceType": "Condition", "id": "dm", "subject": subject, "onsetDateTime": "2019-05-01",
         "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical", "code": "active"}]},
         "code": {"coding": [{"system": snomed, "code": "44054006", "display": "Diabetes mellitus type 2 (disorder)"}]}},
        {"resourceType": "MedicationRequest", "id": "ins", "status": "active", "intent": "order", "subject": subject,
         "authoredOn": "2024-01-10", "medicationCodeableConcept": {"coding": [
             {"system": rxnorm, "code": "311041", "display": "insulin glargine 100 UNT/ML Injectable Solution"}]},
         "reasonReference": [{"reference": "Condition/dm"}]},
        {"resourceType": "AllergyIntolerance", "id": "pn", "patient": subject, "recordedDate": "2001-04-04",
         "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical", "code": "active"}]},
         "code": {"coding": [{"system": snomed, "code": "91935009", "display": "Allergy to peanuts"}]},
         "reaction": [{"manifestation": [{"coding": [{"system": snomed, "code": "39579001", "display": "Anaphylaxis"}]}],
                       "severity": "severe"}]},
        *[{"resourceType": "Observation", "id": f"a1c-{y}", "status": "final", "subject": subject,
           "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "laboratory"}]}],
           "code": {"coding": [{"system": loinc, "code": "4548-4", "display": "Hemoglobin A1c/Hemoglobin.total in Blood"}]},
           "effectiveDateTime": f"{y}-06-01", "valueQuantity": {"value": v, "unit": "%"}}
          for y, v in ((2022, 7.9), (2023, 7.4), (2024, 6.8))],
        {"resourceType": "DocumentReference", "id": "note1", "status": "current", "subject": subject,
         "type": {"coding": [{"system": loinc, "code": "34117-2", "display": "History and physical note"}]},
         "date": "2025-03-01T10:00:00Z",
         "content": [{"attachment": {"contentType": "text/plain", "data": base64.b64encode(note.encode()).decode()}}]},
    ]


@pytest.fixture(scope="module")
def svc(tmp_path_factory, embedder):
    service = indexed_record(tmp_path_factory.mktemp("trap"), resource_lines())
    yield service
    service.close()


def test_negation_abbreviations_and_classes_in_annotation():
    annotator = default_annotator()
    [denied, defined, drug] = annotator.annotate(
        ["No Known Allergies. Patient denies chest pain.", "History of chronic kidney disease (CKD) stage 1",
         "Atorvastatin 20 MG Oral Tablet"])
    assert {c["display"]: c["negated"] for c in denied}["allergy"] is True
    assert "chronic kidney disease" in {c["display"] for c in defined}
    assert {"atorvastatin", "statin"} <= {c["display"] for c in drug}
    asked = analyse("Has she ever been on metformin?")
    assert {c["display"]: c["role"] for c in asked.concepts} == {"metformin": "member", "diabetes medication": "class"}
    assert asked.required_keys == {"lex:metformin"}


def test_negation_marks_what_negspacy_marks():
    """chartcite reads a note's entities once per NegEx pass (negspacy re-read them, rebuilt from
    every token, once per sentence): the same entities are negated, sentence by sentence, with
    terminating phrases, following triggers and the "no" prefix."""
    from spacy.util import filter_spans

    from search.nlp.annotate import NAMES_KEY

    annotator = default_annotator()
    texts = ["No Known Allergies. Patient denies chest pain but reports shortness of breath. Asthma noted.",
             "Chest pain ruled out. Diabetes, hypertension. No asthma; has a cough but no fever.",
             "History of chronic kidney disease (CKD) stage 1. Denies CKD symptoms. Insulin started."]
    docs = annotator._docs(texts)
    for doc in docs:
        doc.user_data[NAMES_KEY] = []
        spans = filter_spans(annotator._lexicon_spans(doc, False))
        assert spans
        doc.ents = spans
        annotator.negex(doc)
        theirs = [(e.start, e.end, e._.negex) for e in doc.ents]
        doc.ents = spans
        for e in doc.ents:
            e._.negex = False
        ours = [(e.start, e.end, e._.negex) for e in annotator._negated(doc, annotator._negation_scopes(doc))]
        assert ours == theirs
        assert any(negated for _, _, negated in ours) and not all(negated for _, _, negated in ours)


def test_a_snomed_tag_in_a_structured_text_defines_no_abbreviation():
    """"Depression screening (procedure)" looked like a definition to the abbreviation detector
    ("procedure" the short form of "Depression"), so every screening carried the concept
    depression. A structured text's parenthesis is a tag; in a note it still defines (above)."""
    from fhir_ingest.record.contract import Chunk

    def chunk(text: str, semantic_type: str) -> Chunk:
        return Chunk(tenant="t", patient_id="p", resource_type="Procedure", resource_id="x", part="0", text=text,
                     label="", date="2024-01-01", semantic_type=semantic_type)

    screening = chunk("Procedure (completed) on 2024-01-01: Depression screening (procedure).", "procedure")
    default_annotator().annotate_chunks([screening], [])
    assert "depression" not in {c["display"] for c in screening.concepts}


def test_a_word_inside_a_coded_name_is_not_a_denial():
    """"free" in the vaccine's name "... preservative free" would otherwise deny the whole
    sentence (and a note saying the shot was given would 'conflict' with the immunization)."""
    from search.nlp.annotate import RecordTerm

    vaccine = "Influenza, seasonal, injectable, preservative free"
    names = [RecordTerm(vaccine.lower(), "cvx|140", vaccine, "immunization")]
    [given, refused] = default_annotator().annotate(
        [f"Patient was given the following immunizations: {vaccine.lower()}.", "Patient declined the influenza vaccine."],
        names)
    assert not any(c["negated"] for c in given)
    assert {c["display"]: c["negated"] for c in refused}["influenza vaccine"] is True
    [unnamed] = default_annotator().annotate([f"Patient was given the following immunizations: {vaccine.lower()}."])
    assert any(c["negated"] for c in unnamed), "without the record's names NegEx reads 'free' as a denial"


def test_time_windows():
    assert time_window("BP at the Oct 2022 physical?") == ("2022-10-01", "2022-10-31")
    assert time_window("assessment from his May 30, 2025 visit") == ("2025-05-30", "2025-05-30")
    assert time_window("A1c trend since 2023?") == ("2023-01-01", "")
    assert time_window("What did the Sept 2024 note say?") == ("2024-09-01", "2024-09-30")


def test_a_class_does_not_stand_in_for_the_drug_asked_about(svc):
    metformin = svc.ask("t", PID, "Has she ever been on metformin?")
    # Abstains on metformin, and says what the record does hold of the class: never a bare "no evidence".
    assert metformin["abstained"] and metformin["answer"].startswith(
        f"No metformin is recorded among the patient's medications. {NO_EVIDENCE}"), metformin["answer"]
    # insulin glargine is named as what it is: another drug of the class, not metformin
    assert "also a diabetes medication, like metformin" in metformin["answer"]
    assert all(s.get("context") for s in metformin["statements"])
    on_class = svc.ask("t", PID, "Is she on any diabetes meds?")
    assert not on_class["abstained"] and "insulin glargine" in on_class["answer"]


def test_a_concept_the_record_only_denies_is_not_evidence(svc):
    result = svc.ask("t", PID, "Any chest pain?")
    assert result["abstained"] and result["diagnostics"]["support"]["reason"] == "the record only denies it"


def test_structured_allergy_outranks_the_template_and_the_conflict_is_shown(svc):
    result = svc.ask("t", PID, "Any allergies?")
    assert not result["abstained"]
    assert result["citations"][0]["ref"] == "AllergyIntolerance/pn"
    conflict = [s for s in result["statements"] if s.get("conflict")]
    assert conflict and "No Known Allergies" in conflict[0]["text"]
    cited = result["citations"][conflict[0]["citations"][0] - 1]
    assert cited["ref"] == "DocumentReference/note1"


def test_latest_and_date_filter(svc):
    latest = svc.ask("t", PID, "latest A1c?")
    assert latest["citations"][0]["ref"] == "Observation/a1c-2024" and "6.8%" in latest["answer"]
    dated = svc.ask("t", PID, "A1c in June 2023?")
    assert dated["diagnostics"]["analysis"]["date_from"] == "2023-06-01"
    # This small record has too few chunks in that month, so the recall guard dropped the filter
    # and the rerank's date feature did the work.
    assert [s.get("note") for s in dated["diagnostics"]["stages"] if s["name"] == "filter"] == ["none"]
    assert dated["citations"][0]["ref"] == "Observation/a1c-2023"
    stages = [s["name"] for s in dated["diagnostics"]["stages"]]
    assert stages == ["scope", "analyse", "anchor", "filter", "recall", "fuse", "recovery", "rerank", "select", "series",
                      "histories"]


def test_note_content_questions_are_filtered_to_notes(svc):
    result = svc.ask("t", PID, "What was the chief complaint in the March 2025 note?")
    assert result["diagnostics"]["filter"]["semantic_types"] == ["note"]
    assert not result["abstained"] and "Fatigue" in result["answer"]


def test_ablating_a_stage_removes_it_from_the_trail(svc):
    result = svc.ask("t", PID, "latest A1c?", ablate=("filter", "rerank"))
    names = [s["name"] for s in result["diagnostics"]["stages"]]
    assert "filter" not in names and "rerank" not in names and "recovery" in names
    with pytest.raises(ValueError, match="cannot ablate"):
        svc.ask("t", PID, "latest A1c?", ablate=("magic",))


@pytest.fixture(scope="module")
def cross_encoder_path(tmp_path_factory):
    """A real CrossEncoder saved to a local folder: MiniLM's encoder with a fresh one-logit head
    (seeded). Untrained for relevance, so the test checks the plumbing, not the ranking quality."""
    import torch
    from sentence_transformers import CrossEncoder

    from search.models.embed import default_model_path

    folder = tmp_path_factory.mktemp("cross") / "tiny-cross-encoder"
    torch.manual_seed(7)
    CrossEncoder(default_model_path(), num_labels=1, device="cpu", local_files_only=True).save(str(folder))
    return str(folder)


def test_a_configured_cross_encoder_reads_the_candidates_and_adds_its_score(svc, cross_encoder_path):
    from search.models.crossrank import load_reranker
    from search.retrieval.pipeline import retrieve

    reranker = load_reranker(cross_encoder_path)
    plain = retrieve(svc.backend, svc.embedder, "Any allergies?", "t", PID, k=5)
    crossed = retrieve(svc.backend, svc.embedder, "Any allergies?", "t", PID, k=5, reranker=reranker)
    [stage] = [s for s in crossed.stages if s.name == "rerank"]
    assert stage.note == "cross-encoder tiny-cross-encoder"
    base = {ev.chunk.chunk_id: ev.score for ev in plain.candidates}
    ranked = crossed.candidates
    assert ranked and all(0.0 < ev.features["cross"] < 1.0 for ev in ranked)
    assert len({round(ev.features["cross"], 6) for ev in ranked}) > 1   # it read each pair
    for ev in crossed.evidence:
        assert ev.score == pytest.approx(base[ev.chunk.chunk_id] + ev.features["cross"])
    scores = [ev.score for ev in crossed.evidence]
    assert scores == sorted(scores, reverse=True)


def test_a_missing_cross_encoder_folder_is_a_clear_error(tmp_path):
    from search.models.crossrank import RerankerNotFound, CrossEncoderRanker

    with pytest.raises(RerankerNotFound, match="CHARTCITE_RERANKER"):
        CrossEncoderRanker(str(tmp_path / "nope"))

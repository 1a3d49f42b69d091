"""A "Yes" names the asked thing or is not said; an absent thing is said to be absent; every [n]
opens an item of the answer's evidence list. One hand-written record, a trap per rule: a pregnant
patient with prediabetes, a diabetes care plan, an opioid combination order and a statin."""
from __future__ import annotations

import pytest

from search.answering.answer import NO_EVIDENCE
from search.answering.exists import asked_target
from search.answering.invariants import citations_outside_evidence
from search.evaluate import wrong_yes
from search.retrieval.analysis import analyse

from .conftest import indexed_record

PID = "exists-1"
SNOMED, RXNORM, LOINC = "http://snomed.info/sct", "http://www.nlm.nih.gov/research/umls/rxnorm", "http://loinc.org"
SUBJECT = {"reference": f"Patient/{PID}"}
ACTIVE = {"coding": [{"code": "active"}]}


def coded(system, code, display):
    return {"coding": [{"system": system, "code": code, "display": display}]}


def order(oid, status, day, code, name):
    return {"resourceType": "MedicationRequest", "id": oid, "status": status, "intent": "order", "subject": SUBJECT,
            "authoredOn": day, "medicationCodeableConcept": coded(RXNORM, code, name)}


def record() -> list[dict]:
    return [
        {"resourceType": "Patient", "id": PID, "gender": "female", "birthDate": "1990-01-01"},
        {"resourceType": "Condition", "id": "preg", "subject": SUBJECT, "clinicalStatus": ACTIVE,
         "onsetDateTime": "2025-01-10", "code": coded(SNOMED, "72892002", "Normal pregnancy")},
        {"resourceType": "Condition", "id": "prediab", "subject": SUBJECT, "clinicalStatus": ACTIVE,
         "onsetDateTime": "2020-03-03", "code": coded(SNOMED, "714628002", "Prediabetes (finding)")},
        {"resourceType": "CarePlan", "id": "dmplan", "subject": SUBJECT, "status": "active", "intent": "order",
         "period": {"start": "2020-03-03"}, "category": [coded(SNOMED, "698360004", "Diabetes self management plan")]},
        {"resourceType": "Procedure", "id": "screen", "status": "completed", "subject": SUBJECT,
         "performedDateTime": "2025-02-01", "code": coded(SNOMED, "171183004", "Urine screening test for diabetes")},
        {"resourceType": "Procedure", "id": "exam", "status": "completed", "subject": SUBJECT,
         "performedDateTime": "2025-06-12", "code": coded(SNOMED, "162673000", "General examination of patient (procedure)")},
        order("perc", "completed", "2024-11-02", "1049221", "Acetaminophen 325 MG / oxyCODONE Hydrochloride 5 MG Oral Tablet"),
        *[order(f"simva-{i}", status, day, "312961", "Simvastatin 20 MG Oral Tablet")
          for i, (status, day) in enumerate((("completed", "2019-01-05"), ("completed", "2021-01-05"),
                                             ("active", "2024-01-05")))],
        {"resourceType": "Observation", "id": "glu", "status": "final", "subject": SUBJECT,
         "category": [{"coding": [{"code": "laboratory"}]}], "effectiveDateTime": "2024-05-01",
         "code": coded(LOINC, "2339-0", "Glucose [Mass/volume] in Blood"), "valueQuantity": {"value": 104, "unit": "mg/dL"}},
    ]


@pytest.fixture(scope="module")
def svc(tmp_path_factory, embedder):
    service = indexed_record(tmp_path_factory.mktemp("exists"), record())
    yield service
    service.close()


def lead_refs(result) -> set[str]:
    lead = result["statements"][0]["citations"] if result["statements"] else []
    return {c["ref"] for c in result["citations"] if c["n"] in lead}


def test_the_target_is_the_first_thing_asked_with_what_or_joins_to_it():
    assert {c["display"] for c in asked_target(analyse("any opioids on board? shes pregnant")).concepts} == {"opioid"}
    assert {c["display"] for c in asked_target(analyse("hx of hypertension or diabetes?")).concepts} == \
        {"hypertension", "diabetes"}
    assert asked_target(analyse("what did the last note say")) is None
    # Alternatives are of one kind: "PE" read as a physical exam beside a clot is not the target.
    assert {c["semantic_type"] for c in asked_target(analyse("any DVT or PE postpartum?")).concepts} == {"problem"}


def test_a_class_question_is_answered_by_the_classes_members_not_by_the_context(svc):
    """The pregnancy the question mentions never answers "any opioids?": the oxycodone order does."""
    result = svc.ask("t", PID, "any opioids on board? shes pregnant")
    assert not result["abstained"] and lead_refs(result) == {"MedicationRequest/perc"}, result["answer"]
    assert "oxycodone" in result["statements"][0]["text"].lower()


@pytest.mark.parametrize("question,absent", [
    ("is she diabetic", "No diabetes is recorded"),
    ("any beta blockers?", "No beta blocker is recorded among the patient's medications"),
    ("any DVT postpartum?", "No venous thromboembolism is recorded"),
    ("any DVT or PE postpartum?", "No venous thromboembolism is recorded"),
])
def test_an_absent_target_is_said_to_be_absent_and_never_answered_yes(svc, question, absent):
    """Diabetes is held by a diagnosis, not by prediabetes, a diabetes care plan or a screening test
    for diabetes: those are shown after the absence, as context."""
    result = svc.ask("t", PID, question)
    assert not result["answer"].startswith("Yes"), result["answer"]
    assert result["abstained"] and result["answer"].startswith(absent), result["answer"]
    assert NO_EVIDENCE in result["answer"]


def test_a_question_about_this_admission_without_one_is_not_answered_over_the_whole_record(svc):
    """The record holds no encounter: the opioid order of 2024 is not passed off as this stay's."""
    result = svc.ask("t", PID, "any opioids given this admission?")
    assert result["abstained"] and not result["citations"], result["answer"]
    assert result["answer"].startswith("No hospital admission in progress or recorded for 'this admission'")


def test_a_present_target_is_yes_with_its_entries(svc):
    result = svc.ask("t", PID, "is she on a statin?")
    assert result["answer"].startswith("Yes"), result["answer"]
    assert lead_refs(result) and all(ref.startswith("MedicationRequest/simva") for ref in lead_refs(result))


@pytest.mark.parametrize("question", [
    "is she on a statin?", "simvastatin - first rx on file?", "any opioids on board? shes pregnant", "is she diabetic",
    "any DVT postpartum?", "what meds is she on", "latest glucose", "any beta blockers?",
])
def test_every_citation_opens_an_item_of_the_evidence_list(svc, question):
    """The first of a drug's folded orders is cited from its order history: it joins the list."""
    result = svc.ask("t", PID, question)
    assert citations_outside_evidence(result) == []
    assert result["diagnostics"]["citations_outside_evidence"] == 0


def test_the_invariant_counts_a_mark_that_opens_nothing():
    answer = {"answer": "Simvastatin (the latest of 3 orders, the first on 2019-01-05) [1] [2].",
              "statements": [{"text": "…", "citations": [1, 2]}],
              "citations": [{"n": 1, "ref": "MedicationRequest/simva-2"}, {"n": 2, "ref": "MedicationRequest/simva-0"}],
              "evidence": [{"ref": "MedicationRequest/simva-2", "refs": ["MedicationRequest/simva-2"]}]}
    assert citations_outside_evidence(answer) == [2]
    answer["evidence"].append({"ref": "MedicationRequest/simva-0", "refs": []})
    assert citations_outside_evidence(answer) == []


def test_dev_answers_cite_only_their_evidence_and_say_yes_only_of_what_was_asked(dev_service, dev_questions):
    """Over every dev question: no [n] outside the evidence list, no "Yes" naming something else."""
    outside, wrong = [], []
    for q in dev_questions:
        result = dev_service.ask("default", q["patient_id"], q["question"], k=10)
        outside += [q["id"]] * len(citations_outside_evidence(result))
        wrong += [q["id"]] if wrong_yes(result, q) else []
    assert outside == [] and wrong == []

"""Questions nobody tuned for: shorthand from maintained vocabularies, the target of a question
apart from its context, qualifiers, and the rule that "no evidence" never hides a clinical class
the record holds. One hand-written record, a trap per mechanism."""
from __future__ import annotations

import json
import re

import pytest

from search.answering.answer import NO_EVIDENCE
from search.evaluate import class_present_no_evidence, uncited_clauses
from search.retrieval.analysis import analyse, target_offset
from search.service import SearchService

from .conftest import indexed_record, question_set_report

PID = "shorthand-1"
SNOMED, RXNORM, LOINC = "http://snomed.info/sct", "http://www.nlm.nih.gov/research/umls/rxnorm", "http://loinc.org"
SUBJECT = {"reference": f"Patient/{PID}"}
ACTIVE = {"coding": [{"code": "active"}]}


def coded(system, code, display):
    return {"coding": [{"system": system, "code": code, "display": display}]}


def record() -> list[dict]:
    return [
        {"resourceType": "Patient", "id": PID, "gender": "female", "birthDate": "1950-01-01"},
        {"resourceType": "AllergyIntolerance", "id": "pcn", "patient": SUBJECT, "clinicalStatus": ACTIVE,
         "recordedDate": "2010-01-01", "code": coded(RXNORM, "7980", "Penicillin V"),
         "reaction": [{"manifestation": [coded(SNOMED, "39579001", "Anaphylaxis")], "severity": "severe"}]},
        {"resourceType": "AllergyIntolerance", "id": "smx", "patient": SUBJECT, "clinicalStatus": ACTIVE,
         "recordedDate": "2012-01-01", "code": coded(RXNORM, "10180", "Sulfamethoxazole / Trimethoprim")},
        {"resourceType": "MedicationRequest", "id": "apix", "status": "active", "intent": "order", "subject": SUBJECT,
         "authoredOn": "2024-02-02", "medicationCodeableConcept": coded(RXNORM, "1364430", "apixaban 5 MG Oral Tablet")},
        {"resourceType": "Condition", "id": "aki", "subject": SUBJECT, "clinicalStatus": ACTIVE,
         "onsetDateTime": "2023-03-03", "code": coded(SNOMED, "14669001", "Acute kidney injury (disorder)")},
        {"resourceType": "Condition", "id": "tx", "subject": SUBJECT, "clinicalStatus": ACTIVE,
         "onsetDateTime": "2015-05-05", "code": coded(SNOMED, "161665007", "History of renal transplant (situation)")},
        {"resourceType": "Procedure", "id": "pci", "status": "completed", "subject": SUBJECT,
         "performedDateTime": "2020-06-06", "code": coded(SNOMED, "415070008", "Percutaneous coronary intervention (procedure)")},
        *[{"resourceType": "Observation", "id": oid, "status": "final", "subject": SUBJECT,
           "category": [{"coding": [{"code": "laboratory"}]}], "effectiveDateTime": day,
           "code": coded(LOINC, "2823-3", "Potassium [Moles/volume] in Serum or Plasma"),
           "valueQuantity": {"value": value, "unit": "mmol/L"}}
          for oid, day, value in (("k", "2025-01-01", 3.1), ("k3", "2024-07-01", 4.0), ("k2", "2024-05-20", 5.0),
                                  ("k1", "2024-03-01", 4.9))],
        {"resourceType": "Procedure", "id": "appy", "status": "completed", "subject": SUBJECT,
         "performedDateTime": "2024-06-01", "code": coded(SNOMED, "80146002", "Appendectomy (procedure)")},
        *[{"resourceType": "MedicationRequest", "id": mid, "status": status, "intent": "order", "subject": SUBJECT,
           "authoredOn": day, "medicationCodeableConcept": coded(RXNORM, code, name)}
          for mid, status, day, code, name in (
              ("levo-1", "completed", "2021-01-05", "966247", "Levothyroxine Sodium 0.075 MG Oral Tablet"),
              ("levo-3", "active", "2024-12-05", "966247", "Levothyroxine Sodium 0.075 MG Oral Tablet"),
              ("levo-2", "completed", "2022-01-05", "966247", "Levothyroxine Sodium 0.075 MG Oral Tablet"),
              ("met-1", "completed", "2019-03-03", "861007", "Metformin hydrochloride 500 MG Oral Tablet"),
              ("met-2", "stopped", "2021-03-03", "861007", "Metformin hydrochloride 500 MG Oral Tablet"),
              ("fe", "active", "2024-10-10", "310325", "ferrous sulfate 325 MG Oral Tablet"))],
        {"resourceType": "Observation", "id": "ca", "status": "final", "subject": SUBJECT,
         "category": [{"coding": [{"code": "laboratory"}]}], "effectiveDateTime": "2024-05-01",
         "code": coded(LOINC, "17861-6", "Calcium [Mass/volume] in Serum or Plasma"),
         "valueQuantity": {"value": 9.4, "unit": "mg/dL"}},
        *[{"resourceType": "Condition", "id": cid, "subject": SUBJECT, "clinicalStatus": ACTIVE,
           "onsetDateTime": "2023-09-09", "code": coded(SNOMED, code, display)}
          for cid, code, display in (("ipv", "706893006", "Victim of intimate partner abuse (finding)"),
                                     ("transport", "713458007", "Lack of access to transportation (finding)"))],
        {"resourceType": "Procedure", "id": "crafft", "status": "completed", "subject": SUBJECT,
         "performedDateTime": "2024-07-01", "code": coded(SNOMED, "868187001", "Assessment using Car, Relax, Alone, "
                                                                               "Forget, Friends, Trouble Screening Test")},
    ]


@pytest.fixture(scope="module")
def svc(tmp_path_factory, embedder):
    service = indexed_record(tmp_path_factory.mktemp("shorthand"), record())
    yield service
    service.close()


def cited(result) -> set[str]:
    return {c["ref"] for c in result["citations"]}


@pytest.mark.parametrize("question,ref", [
    ("Any PCN allergy?", "AllergyIntolerance/pcn"),          # the usual abbreviation, a drug of the class
    ("any sulfa allergy?", "AllergyIntolerance/smx"),         # a class word, the drug the record names
    ("Is she on a DOAC?", "MedicationRequest/apix"),          # a class clinicians name by acronym
    ("Any AKI?", "Condition/aki"),                            # an abbreviation only the maintained inventory knows
    ("Has she had PCI?", "Procedure/pci"),                    # the acronym of the record's own procedure name
])
def test_shorthand_reaches_what_the_record_holds(svc, question, ref):
    result = svc.ask("t", PID, question)
    assert not result["abstained"], result["answer"]
    assert ref in cited(result)


def test_capitalised_abbreviations_are_read_through_the_inventory():
    concepts = {c["display"] for c in analyse("hx of CVA or TAVR? on a DOAC?").concepts}
    assert {"stroke", "aortic valve replacement", "direct oral anticoagulant"} <= concepts
    # In lower case many entries are ordinary words ("cold", "arm"): those are never expanded.
    assert analyse("did she have a cold?").expansions == []


@pytest.mark.parametrize("question,klass,listed", [
    ("Any latex allergy?", "allergies", {"AllergyIntolerance/pcn", "AllergyIntolerance/smx"}),
    ("Is she on simvastatin?", "medications", {"MedicationRequest/apix"}),
    ("Any history of asthma?", "problems", {"Condition/aki", "Condition/tx"}),
    ("Has she had a colonoscopy?", "procedures", {"Procedure/pci"}),
])
def test_no_evidence_never_hides_a_class_the_record_holds(svc, question, klass, listed):
    result = svc.ask("t", PID, question)
    # A drug the whole class was read for is said absent first ("No simvastatin is recorded among
    # the patient's medications."), the no-evidence sentence after it.
    opening = re.match(r"(No [^.]+ is recorded among the patient's [^.]+\. )?", result["answer"]).end()
    assert result["abstained"] and result["answer"][opening:].startswith(NO_EVIDENCE), result["answer"]
    assert f"Recorded {klass}" in result["answer"] and "none of which matches" in result["answer"]
    assert listed <= cited(result)
    assert not class_present_no_evidence(result)


@pytest.mark.parametrize("question,why", [
    ("Can I give him amoxicillin?", "an allergy of the same class as amoxicillin (penicillin)"),
    ("Is she allergic to amoxicillin?", "an allergy of the same class as amoxicillin (penicillin)"),
    ("can I give her cefazolin?", "penicillin, which may cross-react with cefazolin: low"),
])
def test_an_allergy_of_the_drugs_class_comes_first_said_as_what_it_is(svc, question, why):
    """Asked before giving a drug (or about an allergy to it), the recorded allergy of its class
    or of a cross-reacting class is shown first, as what it is; never "none of which matches"."""
    result = svc.ask("t", PID, question)
    assert result["abstained"]
    assert result["citations"][0]["ref"] == "AllergyIntolerance/pcn" and "anaphylaxis" in result["statements"][0]["text"]
    assert why in result["answer"] and "none of which matches" not in result["answer"]


def test_a_class_question_answers_only_with_its_members_and_names_the_neighbour_as_what_it_is(svc):
    """No antiplatelet recorded: apixaban is an anticoagulant, named as a neighbouring class and
    never under "Yes"; asked for warfarin, apixaban is another anticoagulant."""
    antiplatelet = svc.ask("t", PID, "Is she on an antiplatelet?")
    assert antiplatelet["abstained"] and not antiplatelet["answer"].startswith("Yes")
    assert "No antiplatelet is recorded among the patient's medications." in antiplatelet["answer"]
    assert "anticoagulant, a class beside antiplatelet, not one [1]" in antiplatelet["answer"]
    warfarin = svc.ask("t", PID, "is she on warfarin?")
    assert warfarin["abstained"] and "also an anticoagulant, like warfarin [1]" in warfarin["answer"]
    assert warfarin["citations"][0]["ref"] == "MedicationRequest/apix"


def test_a_class_list_that_is_cut_claims_nothing_about_what_it_did_not_show(tmp_path, embedder):
    problems = ["Essential hypertension", "Hyperlipidemia", "Osteoarthritis of knee", "Gout", "Anemia",
                "Chronic sinusitis", "Migraine", "Obesity", "Hypothyroidism", "Insomnia", "Glaucoma", "Eczema"]
    resources = [record()[0]] + [
        {"resourceType": "Condition", "id": f"p{i}", "subject": SUBJECT, "clinicalStatus": ACTIVE,
         "onsetDateTime": f"20{10 + i}-01-01", "code": coded(SNOMED, f"{100000 + i}", name)}
        for i, name in enumerate(problems)]
    service = indexed_record(tmp_path, resources)
    try:
        result = service.ask("t", PID, "any history of asthma?")
    finally:
        service.close()
    assert result["abstained"] and "none of which matches" not in result["answer"]
    assert "Recorded problems and diagnoses, closest first (8 of 12):" in result["answer"]


def test_the_target_is_judged_not_the_context(svc):
    question = "Her potassium was low — is she on a diuretic?"
    assert question[target_offset(question):] == "is she on a diuretic?"
    result = svc.ask("t", PID, question)
    assert result["abstained"], "the potassium must not answer a question about a diuretic"
    assert result["statements"][0]["text"].startswith("For context:") and "Observation/k" in cited(result)
    assert "MedicationRequest/apix" in cited(result)         # and what the record does hold of the class


def test_a_qualifier_the_record_lacks_is_not_answered_by_its_head(svc):
    result = svc.ask("t", PID, "Has she had a liver transplant?")
    assert result["abstained"]
    assert "Condition/tx" not in {s["citations"][0] for s in result["statements"] if not s.get("context")}


@pytest.mark.parametrize("question,absent", [
    ("appendectomy in 2024 - any chemo after it?", "chemo"),              # shorthand the inventory expands
    ("AKI on the list - code status, DNR documented?", "dnr"),            # an abbreviation beside a present concept
    ("kidney injury - last monofilament exam?", "monofilament"),         # a word no ordinary English uses
    ("what was the AHI on her sleep study", "ahi"),
])
def test_an_absent_asked_thing_is_not_answered_by_its_present_context(svc, question, absent):
    """The thing asked is judged, not the topic: what the question asks about is in no form in
    the record (neither the word nor an abbreviation's long form), so the present context (the
    appendectomy, the kidney injury) must not be offered as the answer."""
    result = svc.ask("t", PID, question)
    assert result["abstained"], result["answer"]
    assert absent in result["diagnostics"]["support"]["reason"]


@pytest.mark.parametrize("question,ref", [
    ("first potassium on file, way back?", "Observation/k1"),           # phrasing words the record never uses
    ("penicillin allergy - anaphylactic?", "AllergyIntolerance/pcn"),    # another ending of the record's word
    ("CRAFFT done? when", "Procedure/crafft"),                           # an acronym the record spells out
    ("potassium levels charted after the appendectomy?", "Observation/k3"),
    ("any IPV hx documented", "Condition/ipv"),                          # a long form the record says in other words
    ("any transport barriers?", "Condition/transport"),                  # the record's word with another ending
])
def test_phrasing_and_other_forms_never_veto_the_answer(svc, question, ref):
    result = svc.ask("t", PID, question)
    assert not result["abstained"], (result["answer"], result["diagnostics"]["support"])
    assert ref in cited(result)


def test_what_she_takes_is_answered_by_orders_not_by_a_result_of_the_same_name(svc):
    """"Is she on calcium?" asks about a drug: a calcium result does not answer it."""
    on = svc.ask("t", PID, "osteoporosis - is she on calcium?")
    assert on["abstained"] and on["diagnostics"]["support"]["reason"] == "no medication record names what was asked"
    level = svc.ask("t", PID, "calcium level?")
    assert not level["abstained"] and level["citations"][0]["ref"] == "Observation/ca"
    assert not svc.ask("t", PID, "is she on apixaban?")["abstained"]
    iron = svc.ask("t", PID, "Is she on an iron pill?")          # oral iron salts carry no FDA class
    assert iron["answer"].startswith("Yes — ") and iron["citations"][0]["ref"] == "MedicationRequest/fe"


def test_a_drugs_orders_are_folded_and_the_newest_says_if_it_is_current(svc):
    """Yearly renewals of one drug are one drug: "still on" is answered by the newest order, with
    how many there were and when the first was; "first rx" by the oldest."""
    still = svc.ask("t", PID, "still on levothyroxine?")
    assert still["answer"].startswith("Yes — ") and "latest of 3 orders, the first on 2021-01-05" in still["answer"]
    assert still["citations"][0]["ref"] == "MedicationRequest/levo-3"
    assert still["evidence"][0]["ref"] == "MedicationRequest/levo-3"
    first = svc.ask("t", PID, "levothyroxine - first rx on file?")
    assert "first ordered on 2021-01-05" in first["answer"] and first["citations"][0]["ref"] == "MedicationRequest/levo-1"
    # The first order and the newest are two clauses, each citing its own record.
    assert "first ordered on 2021-01-05 [1]; the latest of 3 orders: " in first["answer"], first["answer"]
    assert uncited_clauses(first) == 0
    stopped = svc.ask("t", PID, "is she still taking metformin?")
    assert not stopped["answer"].startswith("Yes") and "stopped" in stopped["answer"]
    assert stopped["citations"][0]["ref"] == "MedicationRequest/met-2"


def test_an_allergy_to_one_drug_is_not_an_allergy_to_another_of_its_class(svc):
    result = svc.ask("t", PID, "Is she allergic to amoxicillin?")
    assert result["abstained"] and "AllergyIntolerance/pcn" in cited(result)   # listed, said not to match


def test_wrong_yes_and_hidden_matches_are_measured():
    from search.evaluate import hidden_match, wrong_yes

    answerable = {"answerable": True, "gold": [["AllergyIntolerance/pcn"]]}
    unanswerable = {"answerable": False, "gold": []}
    yes_other = {"answer": "Yes — aspirin [1].", "abstained": False, "citations": [{"n": 1, "ref": "MedicationRequest/asa"}]}
    yes_gold = {"answer": "Yes — penicillin V [1].", "abstained": False,
                "citations": [{"n": 1, "ref": "AllergyIntolerance/pcn"}]}
    assert wrong_yes(yes_other, answerable) and wrong_yes(yes_gold, unanswerable) and not wrong_yes(yes_gold, answerable)
    listed = {"answer": "I don't have evidence for that. Recorded allergies, none of which matches what was asked: "
                        "penicillin V [1].", "abstained": True, "citations": [{"n": 1, "ref": "AllergyIntolerance/pcn"}]}
    bare = {"answer": "I don't have evidence for that in this patient's record.", "abstained": True, "citations": []}
    assert hidden_match(listed, answerable) and not hidden_match(listed, unanswerable)
    assert not hidden_match(bare, answerable)        # a false abstention, counted as such


def test_class_present_no_evidence_is_measured():
    bare = {"abstained": True, "citations": [], "diagnostics": {"asked_class": {"class": "allergy", "records": 2}}}
    listed = bare | {"citations": [{"ref": "AllergyIntolerance/pcn"}]}
    empty = bare | {"diagnostics": {"asked_class": {"class": "allergy", "records": 0}}}
    assert class_present_no_evidence(bare) and not class_present_no_evidence(listed)
    assert not class_present_no_evidence(empty)


@pytest.mark.parametrize("question,window", [
    ("wt gain from the 2023 to the 2024 physical", ("2023-01-01", "2024-12-31")),   # both years and between
    ("wt at the 2025 physical vs the prior years", ("", "2025-12-31")),
    ("hdl went way up in 2024? values since 2023", ("2023-01-01", "")),              # "since" stays open
])
def test_a_comparison_of_years_spans_them(question, window):
    from search.retrieval.analysis import time_window

    assert time_window(question) == window


def test_time_anchored_to_the_patients_own_events(svc):
    before = svc.ask("t", PID, "K+ before the surgery?")
    assert "before surgery (2024-06-01)" in [st.get("note", "") for st in before["diagnostics"]["stages"]]
    assert before["citations"][0]["ref"] == "Observation/k2"          # the result just before it
    after = svc.ask("t", PID, "potassium since the appendectomy?")
    assert {c["ref"] for c in after["citations"]} & {"Observation/k", "Observation/k3"}
    assert "Observation/k1" not in {c["ref"] for c in after["citations"]}


def test_last_n_results_and_relative_windows(svc):
    last = svc.ask("t", PID, "last 3 potassium values?")
    assert {"Observation/k", "Observation/k3", "Observation/k2"} <= {c["ref"] for c in last["citations"]}
    recent = svc.ask("t", PID, "potassium over the past 6 months?")
    assert recent["diagnostics"]["analysis"]["date_from"] == "2024-07-01"      # 6 months back from 2025-01-01
    assert "Observation/k1" not in {c["ref"] for c in recent["citations"]}


NEW_QUESTIONS = __import__("pathlib").Path(__file__).parent / "data" / "new-questions.jsonl"


@pytest.fixture(scope="module")
def new_set_service(tmp_path_factory, embedder, synthea_dir):
    patients = {json.loads(line)["patient_id"] for line in NEW_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()}
    service = SearchService("embedded", tmp_path_factory.mktemp("new-set") / "index.sqlite")
    summary = service.index_paths("default", [synthea_dir / f"{pid}.json.gz" for pid in sorted(patients)])
    assert not summary.load.skipped
    yield service
    service.close()


def test_the_new_question_set_meets_the_targets(new_set_service):
    """126 questions about the 20 patients kept for new questions (tests/data/README.md): the
    targets the issue sets for questions nobody tuned for."""
    report = question_set_report(new_set_service, "default", NEW_QUESTIONS, "new questions")
    assert report["recall"]["5"] >= 0.90
    assert report["facts"] >= 0.85
    assert report["abstention_accuracy"] >= 0.95
    assert report["false_abstention"] <= 0.05
    assert report["class_present_no_evidence"] == 0


OPS_QUESTIONS = NEW_QUESTIONS.parent / "ops-dev.jsonl"


def test_the_ops_question_set_meets_the_targets(new_set_service):
    """110 count, window, stay, visit, dose-change and compare questions about the same 20 patients
    (tests/data/ops-dev.jsonl, gold from scripts/build_ops_dev.py, a fixed today): issue 36's targets."""
    report = question_set_report(new_set_service, "default", OPS_QUESTIONS, "ops questions")
    print(f"counts stated right {report['counts_right']:.3f}, visit facts {report['visit_facts']:.3f}")
    assert report["counts_asked"] >= 50 and report["counts_right"] >= 0.90
    assert report["visit_questions"] >= 20 and report["visit_facts"] >= 0.85
    assert report["uncited_clauses"] == 0 and report["wrong_yes"] == 0
    compared = {q["id"] for q in map(json.loads, OPS_QUESTIONS.read_text(encoding="utf-8").splitlines()) if q["kind"] == "compare"}
    assert len(compared) >= 10 and not compared & set(report["facts_missed"]), report["facts_missed"]


def test_the_note_of_the_named_visit_among_notes_near_its_date(tmp_path, embedder):
    """Two notes three days apart in January: asked for the ER visit's complaint, the ER note answers."""
    import base64

    def visit(eid, day, code, display, klass):
        return {"resourceType": "Encounter", "id": eid, "status": "finished", "class": {"code": klass},
                "subject": SUBJECT, "period": {"start": f"{day}T09:00:00Z", "end": f"{day}T10:00:00Z"},
                "type": [coded(SNOMED, code, display)]}

    def note(nid, day, eid, complaint):
        text = f"# Chief Complaint\\n- {complaint}\\n\\n# Assessment and Plan\\nFollow up as needed.\\n"
        return {"resourceType": "DocumentReference", "id": nid, "status": "current", "subject": SUBJECT,
                "type": coded(LOINC, "34117-2", "History and physical note"), "date": f"{day}T10:00:00Z",
                "context": {"encounter": [{"reference": f"Encounter/{eid}"}]},
                "content": [{"attachment": {"contentType": "text/plain",
                                            "data": base64.b64encode(text.encode()).decode()}}]}

    resources = [record()[0], visit("er", "2025-01-10", "50849002", "Emergency room admission (procedure)", "EMER"),
                 visit("phys", "2025-01-13", "162673000", "General examination of patient (procedure)", "AMB"),
                 note("n-er", "2025-01-10", "er", "Chest pain"), note("n-phys", "2025-01-13", "phys", "No complaints")]
    service = indexed_record(tmp_path, resources)
    er = service.ask("t", PID, "What was the chief complaint at the Jan 2025 ER visit?")
    physical = service.ask("t", PID, "What was the chief complaint at the Jan 2025 physical?")
    service.close()
    assert er["citations"][0]["ref"] == "DocumentReference/n-er" and "Chest pain" in er["answer"]
    assert physical["citations"][0]["ref"] == "DocumentReference/n-phys"


def two_patients(folder, other_conditions: list[str]):
    """Patient A (hypertension) and patient B, whose problem list the caller chooses. Each is
    indexed on its own: the int8 model quantises a batch's activations together, so vectors
    embedded in one batch depend slightly on each other (a matter of the indexer's batching, not of
    what is asked here)."""
    from search.service import SearchService

    folder.mkdir(exist_ok=True)
    a, b = {"reference": "Patient/pt-a"}, {"reference": "Patient/pt-b"}
    record_a = [{"resourceType": "Patient", "id": "pt-a", "gender": "male", "birthDate": "1950-01-01"},
                {"resourceType": "Condition", "id": "a-htn", "subject": a, "clinicalStatus": ACTIVE,
                 "onsetDateTime": "2020-01-01", "code": coded(SNOMED, "59621000", "Essential hypertension")}]
    record_b = [{"resourceType": "Patient", "id": "pt-b", "gender": "female", "birthDate": "1960-01-01"}]
    record_b += [{"resourceType": "Condition", "id": f"b-{i}", "subject": b, "clinicalStatus": ACTIVE,
                  "onsetDateTime": "2021-01-01", "code": coded(SNOMED, f"1000{i}", display)}
                 for i, display in enumerate(other_conditions)]
    service = SearchService("embedded", folder / "index.sqlite")
    for name, resources in (("a", record_a), ("b", record_b)):
        path = folder / f"{name}.ndjson"
        path.write_text("\n".join(json.dumps(r) for r in resources) + "\n", encoding="utf-8")
        assert not service.index_paths("t", [path]).load.skipped
    return service


def without_timings(value):
    """What a clinician sees of an answer, less the milliseconds each stage took."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "ms"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


@pytest.mark.parametrize("question", ["Does he have african?", "Any breast cancer?", "Is there a pacemaker?",
                                      "Does he have sickle cell trait?"])
def test_what_patient_a_sees_does_not_depend_on_patient_bs_record(tmp_path, embedder, question):
    """The word oracle: a word that occurs only in B's record once showed as `absent: ...` in A's
    diagnostics, and showed nothing when no record had it. A's answer, diagnostics and counts are
    the same whether or not B's record uses the word."""
    with_word = two_patients(tmp_path / "with", ["Sickle cell trait in a person of African descent",
                                                 "Malignant neoplasm of breast", "Cardiac pacemaker in situ"])
    without_word = two_patients(tmp_path / "without", ["Sprain of ankle", "Acute bronchitis", "Otitis media"])
    try:
        seen = [without_timings(service.ask("t", "pt-a", question)) for service in (with_word, without_word)]
    finally:
        with_word.close()
        without_word.close()
    assert seen[0] == seen[1]


def test_a_word_only_another_patient_uses_shows_what_a_word_no_record_uses_shows(tmp_path, embedder):
    service = two_patients(tmp_path, ["Sickle cell trait in a person of African descent"])
    try:
        answers = [without_timings(service.ask("t", "pt-a", f"does he have {word}?")) for word in ("african", "martian")]
    finally:
        service.close()
    notes = [[stage.get("note", "") for stage in a["diagnostics"]["stages"]] for a in answers]
    assert [n.replace("martian", "african") for n in notes[1]] == notes[0]
    assert not any("absent" in note for note in notes[0])
    assert answers[0]["answer"] == answers[1]["answer"].replace("martian", "african")


def test_a_note_section_asked_is_answered_by_the_notes_that_have_it(tmp_path, embedder):
    """"What does the social history say?" names a section, not a clinical thing: the notes holding
    that section answer it, the newest first, also as the second part of a question."""
    import base64

    def note(nid, day, social):
        text = f"# Chief Complaint\n- Checkup\n\n# Social History\n{social}\n\n# Assessment and Plan\nNone.\n"
        return {"resourceType": "DocumentReference", "id": nid, "status": "current", "subject": SUBJECT,
                "type": coded(LOINC, "34117-2", "History and physical note"), "date": f"{day}T10:00:00Z",
                "content": [{"attachment": {"contentType": "text/plain",
                                            "data": base64.b64encode(text.encode()).decode()}}]}

    smoking = {"resourceType": "Observation", "id": "smoke", "status": "final", "subject": SUBJECT,
               "category": [{"coding": [{"code": "social-history"}]}], "effectiveDateTime": "2024-03-03",
               "code": coded(LOINC, "72166-2", "Tobacco smoking status"),
               "valueCodeableConcept": coded(SNOMED, "8517006", "Ex-smoker (finding)")}
    service = indexed_record(tmp_path, [record()[0], smoking, note("old", "2019-02-02", "Patient quit smoking at age 16."),
                                        note("new", "2024-03-03", "Patient lives alone and walks daily.")])
    section = service.ask("t", PID, "what does the social history say?")
    both = service.ask("t", PID, "Does she smoke? what does the social history say?")
    service.close()
    assert not section["abstained"], section["answer"]
    # Answered because the notes have the section, not because a passage happens to resemble it.
    assert section["diagnostics"]["support"]["coverage"] == 1.0
    assert section["citations"][0]["ref"] == "DocumentReference/new"
    assert not both["abstained"] and uncited_clauses(both) == 0, both["answer"]
    assert "Observation/smoke" in cited(both) and {"DocumentReference/new", "DocumentReference/old"} & cited(both)

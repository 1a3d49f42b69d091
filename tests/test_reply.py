"""Reply drafts to a patient's portal message (issue 38): the rules on their own, then the route
through Flask's test client with the real model and index over a Synthea patient."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from search.reply.asked import missing_thing
from search.reply.compose import (CHECK_WITH_CARE_TEAM, Evidence, extractive_sentences, naming_what_is_asked, same_side,
                                  the_specific_kind, with_asked_content, without_unrelated_weak_records)
from search.reply.evaluate import score_message, summary
from search.reply.message import about_whom, asks_to_name_what_happens_now, questions_in
from search.reply.plain import TABLE, clinical_reading, glosses
from search.reply.urgent import urgent_signs
from smart_app.app import create_app
from smart_app.settings import Settings

from .conftest import InlineRunner, demo_launch
from .test_answers import bundle_resources

PID = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"      # an EpiPen, allergies
OTHER = "936988e9-d587-ef42-ebdf-541238540ff3"
URGENT = "Call 911 now if this is happening."


# --- the rules ----------------------------------------------------------------------------------

@pytest.mark.parametrize("message, signs", [
    ("I have chest pain right now and I'm scared. Is it my heart?", ["chest pain"]),
    ("My dad can't breathe and his lips are blue.", ["breathing"]),
    ("She said she wants to die.", ["self-harm"]),
    ("I have no chest pain anymore. When is my next visit?", []),
    ("He is not short of breath, just tired.", []),
    ("They did a CT because I was short of breath last year. What did it show?", []),
    ("My mom had a heart attack in 2009. Why no Lovenox?", []),
    ("My husband had a stroke in 2001. Was he given tPA?", []),
])
def test_emergency_rules_are_negation_and_time_aware(message, signs):
    assert [s.sign for s in urgent_signs(message)] == signs


def test_questions_are_read_with_their_context():
    found = questions_in("My dad had a kidney stone in 2007. We were worried! What size was it? Thanks so much.")
    assert [asked for asked, _ in found] == ["What size was it?"]
    assert "kidney stone in 2007" in found[0][1]
    assert len(questions_in("How long does he need the antibiotics? What was his PSA?")) == 2
    assert questions_in("I am worried about my blood pressure.")[0][0] == "I am worried about my blood pressure."
    assert about_whom("Why did they move my dad?") == "your dad" and about_whom("Why was I moved?") == "you"


def _ev(n, text, score=0.8, kind="note", ref="DocumentReference/a", question=0):
    return Evidence(n, ref, text, score, question, "2020-01-02", "label", kind, [0, len(text)])


def test_a_question_for_a_side_a_number_or_a_time_drops_sentences_without_it():
    transfer = _ev(0, "He requests that she be transferred to Labor and Delivery.", 0.78)
    side = _ev(0, "She presents with left lower quadrant pain.", 0.64)
    kept = with_asked_content([transfer, side], ["side"])
    assert [e.text for e in kept] == [side.text]
    # "When?" is answered by a coded record's own date, which the draft states.
    coded = _ev(0, "Problem / diagnosis (active): Polyp of colon", 0.6, kind="coded")
    assert with_asked_content([_ev(0, "Polyps were seen.", 0.7), coded], ["time"]) == [coded]
    # Nothing that could answer has it: a sentence surely without it is still left out (the weak one
    # then fails the thresholds and the question goes to the care team)...
    weak = _ev(0, "The baby weighed 7 pounds.", 0.2)
    assert with_asked_content([transfer, weak], ["amount"]) == [weak]
    # ...but a note may name a drug in words no pattern knows ("started on Sanctura"): it stays.
    started = _ev(0, "We will start Sanctura XR.", 0.7)
    lab = _ev(0, "Lab result: Cholesterol = 164 mg/dL", 0.6, kind="coded", ref="Observation/o")
    assert with_asked_content([started, lab], ["medication"]) == [started]
    # "Is he on anything for his osteoporosis?": a medication record, not the problem it treats.
    problem = _ev(0, "Problem / diagnosis (active): Osteoporosis (disorder)", 0.67, kind="coded", ref="Condition/c")
    drug = _ev(0, "Medication order (active): Alendronic acid 10 MG Oral Tablet", 0.5, kind="coded",
               ref="MedicationRequest/m")
    assert with_asked_content([problem, drug], ["medication"]) == [drug]
    # A finding only ranks: its words are too many to require.
    assert with_asked_content([transfer, side], ["finding"]) == [transfer, side]


def test_right_is_never_answered_from_a_left_only_sentence():
    scored = [_ev(0, "Mass in the left breast, 2 cm.", 0.9), _ev(0, "Right breast: no abnormality.", 0.7),
              _ev(0, "Both breasts were examined.", 0.6)]
    kept = [e.text for e in same_side(scored, "Is the lump I felt in my right breast cancer?")]
    assert kept == ["Right breast: no abnormality.", "Both breasts were examined."]
    assert len(same_side(scored, "Is the lump cancer?")) == 3


@pytest.mark.parametrize("question, texts, missing", [
    ("What did pathology say about the appendix?", ["A very abnormal appendix was found."], "pathology"),
    ("Is an amputation planned?", ["Wound care will continue."], "amputation"),
    ("What was the stone made of?", ["There is no stone in the left ureter."], "what it is made of"),
    ("What were the results of his swallow study?", ["Trouble swallowing since this morning."], "swallow study"),
    ("What did the pathology show?", ["Pathology showed chronic tonsillitis."], ""),
    ("Did the scan show the cancer in my lungs?", ["The lungs are clear."], ""),
])
def test_a_finding_asked_of_a_named_test_needs_that_test_named(question, texts, missing):
    assert missing_thing(question, texts) == missing


def test_every_draft_sentence_cites_and_stays_within_the_budget():
    evidence = [_ev(1, "He had osteomyelitis of the right fifth toe treated with six weeks of antibiotics.", 0.9),
                _ev(2, "Diabetes mellitus type 2", 0.8, "coded", "Condition/c"),
                _ev(3, " ".join(["word"] * 70), 0.7, ref="DocumentReference/b")]
    sentences = extractive_sentences(evidence, "your dad", 75)
    assert sentences and all(s["citations"] for s in sentences)
    assert sentences[0]["text"].startswith("Your dad's note of 2020-01-02 says: “He had osteomyelitis")
    assert "osteomyelitis: a bone infection" in sentences[0]["text"]
    assert sum(len(s["text"].split()) for s in sentences) <= 75        # the 70-word one did not fit
    assert [n for s in sentences for n in s["citations"]] == [1, 2]


def test_the_plain_language_table_states_its_source_and_licence():
    head = TABLE.read_text(encoding="utf-8").splitlines()[:4]
    assert any("CC0" in line for line in head) and any("Source" in line for line in head)
    already: set[str] = set()
    assert glosses("Carotid stenosis.", already, 2) == ["stenosis: narrowing", "carotid: the main artery in the neck"]
    assert glosses("Carotid stenosis again.", already, 2) == []         # each term glossed once a draft


def test_the_reply_measures_count_what_they_say():
    item = {"id": "x", "answerable": True, "gold": [["The stent is patent."]], "facts": ["patent"], "urgent": False}
    reply = {"draft": "Your note says: “The stent is patent.” [1] Extra words here [2]",
             "sentences": [{"text": "Your note says: “The stent is patent.”", "citations": [1], "kind": "answer"},
                           {"text": "Extra words here", "citations": [], "kind": "answer"}],
             "evidence": [{"n": 1, "text": "The stent is patent."}], "unanswered": [], "urgent": False}
    row = score_message(item, reply)
    assert (row["hits"], row["met"], row["uncited"], row["facts"]) == (1, 1, 1, True)
    unanswerable = score_message({**item, "answerable": False, "gold": [], "facts": []}, reply)
    assert summary([row, unanswerable])["answered_unanswerable"] == 1
    # A model's draft: its kept sentences and those verification removed, with why, are counted.
    written = {**reply, "generator": "gemma3-270m", "sentences": reply["sentences"][:1],
               "removed": [{"statement": "Yes", "reason": "not a sentence"}, {"statement": "1", "reason": "not a sentence"}]}
    fallback = {**reply, "removed": [{"statement": "No", "reason": "not a sentence"}]}
    report = summary([score_message(item, written), score_message(item, fallback)])
    assert (report["model_drafts"], report["model_sentences_kept"], report["model_sentences_removed"]) == (1, 1, 3)
    assert report["model_removed_why"] == {"not a sentence": 3}


# --- the route ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(tmp_path_factory, synthea_dir, embedder):
    source = tmp_path_factory.mktemp("source")
    for pid in (PID, OTHER):
        shutil.copy(synthea_dir / f"{pid}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path_factory.mktemp("data")),
                              "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
                              "CHARTCITE_REPLY_URGENT_TEXT": URGENT})
    app = create_app(settings, runner=InlineRunner(settings))
    return app.test_client()


@pytest.fixture(scope="module")
def handle(client):
    return demo_launch(client, PID)


def post(client, handle, body):
    return client.post("/api/reply", json=body, headers={"X-Chartcite-Session": handle})


def test_a_message_gets_a_cited_draft(client, handle):
    result = post(client, handle, {"message": "My son has bad allergies. Does he carry an EpiPen?"}).get_json()
    assert set(result) >= {"draft", "sentences", "evidence", "unanswered", "urgent"}
    assert result["evidence"] and not result["unanswered"] and not result["urgent"] and result["audit_id"]
    answers = [s for s in result["sentences"] if s["kind"] == "answer"]
    known = {e["n"] for e in result["evidence"]}
    assert answers and all(s["citations"] and set(s["citations"]) <= known for s in answers)
    assert all(e["ref"] and e["text"] and isinstance(e["score"], float) for e in result["evidence"])
    assert len(re.sub(r"\[\d+\]", "", result["draft"]).split()) <= 75


def test_what_the_record_cannot_answer_goes_to_the_care_team(client, handle):
    result = post(client, handle, {"message": "What did the pathology say about his appendix?"}).get_json()
    assert result["unanswered"] == ["What did the pathology say about his appendix?"]
    assert not [s for s in result["sentences"] if s["kind"] == "answer"]
    assert result["draft"] == CHECK_WITH_CARE_TEAM.format(question=result["unanswered"][0])


def test_an_emergency_is_flagged_and_the_draft_opens_with_the_urgent_text(client, handle):
    result = post(client, handle, {"message": "I can't breathe right now. Does he carry an EpiPen?"}).get_json()
    assert result["urgent"] and result["urgent_signs"] == ["breathing"]
    assert result["draft"].startswith(URGENT) and result["sentences"][0]["kind"] == "urgent"


@pytest.mark.parametrize("body", [{}, {"message": ""}, {"message": "   "}, {"message": 7}, {"message": ["a"]},
                                  {"message": "x" * 4001}])
def test_malformed_requests_get_400_with_a_sentence(client, handle, body):
    response = post(client, handle, body)
    assert response.status_code == 400 and response.get_json()["error"]
    bad = client.post("/api/reply", data="[1, 2]", content_type="application/json",
                      headers={"X-Chartcite-Session": handle})
    assert bad.status_code == 400


def test_reply_needs_the_launch_and_its_patient(client, handle):
    assert client.post("/api/reply", json={"message": "any allergies?"}).status_code == 401
    assert post(client, handle, {"message": "any allergies?", "patient_id": OTHER}).status_code == 403


class CapturingModel:
    """A language model endpoint that records what chartcite sends and answers with one
    statement citing evidence 1; its sentences go through verification like any model's."""
    name = "capturing"

    def __init__(self):
        self.sent: list[str] = []

    def complete(self, messages, schema=None):
        self.sent.append(messages[-1]["content"])
        if "Which evidence ids" in messages[-1]["content"]:
            return json.dumps({"ids": [1]})
        return json.dumps({"statements": [{"statement": "You carry an EpiPen for your allergy.", "citations": [1]}]})


def test_no_identifier_of_the_patient_reaches_the_model_from_the_reply_path(client, handle, synthea_dir):
    from smart_app.services import search, sessions

    with client.application.app_context():
        svc, tenant = search(), sessions().resolve(handle).tenant
        model, kept = CapturingModel(), svc.llm
        patient = next(r for r in bundle_resources(synthea_dir / f"{PID}.json.gz") if r["resourceType"] == "Patient")
        names = [n for name in patient["name"] for n in name.get("given", []) + [name.get("family", "")]]
        svc.llm = model
        try:
            message = (f"Hi, this is {names[0]} {names[-1]}, born {patient['birthDate']}, MRN "
                       f"{patient['identifier'][0]['value']}. Does he carry an EpiPen?")
            result = svc.reply(tenant, PID, message)
        finally:
            svc.llm = kept
    assert model.sent, f"nothing was sent to the model: {result}"
    sent = "\n".join(model.sent)
    for secret in (*names, *(re.sub(r"\d+$", "", n) for n in names), patient["birthDate"],
                   *(i["value"] for i in patient.get("identifier", [])),
                   *(line for a in patient.get("address", []) for line in a.get("line", []))):
        assert secret not in sent, f"identifier sent to the model: {secret[:3]}…"
    assert "Evidence:" in sent
    assert all(s["citations"] for s in result["sentences"] if s["kind"] == "answer")


def test_the_launch_message_is_read_only_from_a_communication_of_this_patient():
    from smart_app.reply_routes import communication_ref, message_of

    assert communication_ref({"fhirContext": [{"reference": "Encounter/e1"},
                                              {"reference": "Communication/m-7"}]}) == "Communication/m-7"
    assert communication_ref({"fhirContext": [{"reference": "Communication/../Patient/x"}]}) == ""
    assert communication_ref({}) == "" and communication_ref({"fhirContext": "Communication/1"}) == ""
    message = {"resourceType": "Communication", "subject": {"reference": f"Patient/{PID}"},
               "payload": [{"contentString": "Was my surgery successful? "}, {"contentAttachment": {}}]}
    assert message_of(message, PID) == "Was my surgery successful?"
    assert message_of(message, OTHER) == ""                   # another patient's words are never shown
    assert message_of({**message, "resourceType": "Patient"}, PID) == ""


def test_without_a_message_in_the_launch_the_panel_is_told_to_paste(client, handle):
    response = client.get("/api/reply/launch-message", headers={"X-Chartcite-Session": handle})
    assert response.status_code == 404 and "paste" in response.get_json()["error"]


def test_a_sentence_with_the_kind_of_content_asked_for_ranks_higher():
    from search.reply.answer_types import BONUS, answer_type_bonus, wanted

    assert wanted("Which side was my carotid surgery on?") == ["side"]
    side = wanted("Which side was my carotid surgery on?")
    assert answer_type_bonus(side, "Left carotid endarterectomy with patch angioplasty.") == BONUS
    assert answer_type_bonus(side, "The carotid artery was dissected free.") == 0
    dose = wanted("What is she taking for her RA?")
    assert answer_type_bonus(dose, "She is on 20 mg of methotrexate every week.") == BONUS
    assert answer_type_bonus(dose, "Her history is significant for rheumatoid arthritis.") == 0
    assert answer_type_bonus(wanted("When was my MS diagnosed?"), "In the fall of 2002, she was seen.") == BONUS


@pytest.mark.parametrize("message, whom", [
    ("I had my tubes tied last year and my sister keeps asking about it. What exactly was the surgery?", "you"),
    ("I left my inhaler at my mom's house. What is my rescue inhaler called?", "you"),
    ("My dad's memory keeps getting worse. What medicine is he on for it?", "your dad"),
    ("Grandpa was told he has weak bones. Is he on anything for it?", "your grandpa"),
    ("My mom had a stroke. Is my mom still on the blood thinner?", "your mom"),
    ("My daughter had her baby by C-section. How much did the baby weigh?", "your daughter"),
])
def test_the_draft_speaks_of_whom_the_message_asks_about(message, whom):
    assert about_whom(message) == whom


@pytest.mark.parametrize("question, naming", [
    ("Is this my heart disease again?", True),
    ("Is it my heart?", True),
    ("Could this be a stroke?", True),
    ("Is it normal that my chest hurts after the pacemaker?", False),
    ("Is that written in my chart?", False),
    ("Is my EpiPen still on my list?", False),
])
def test_a_question_naming_what_happens_now_is_left_to_the_care_team(question, naming):
    assert asks_to_name_what_happens_now(question) is naming


def _concept(key, start=0, negated=False, role=""):
    return {"key": key, "start": start, "negated": negated, "role": role}


def test_a_drug_question_naming_its_subject_takes_the_order_that_names_it():
    from types import SimpleNamespace as NS
    asked = NS(concepts=[_concept("lex:dementia")])
    med_list = _ev(0, "simvastatin 10 mg oral tablet", 0.74)
    med_list.chunk = NS(concepts=[_concept("lex:simvastatin", 0), _concept("lex:dementia", 200)])  # outside its span
    order = _ev(0, "Medication order (active): Donepezil 10 MG", 0.34, kind="coded", ref="MedicationRequest/m")
    order.chunk, order.cited = NS(concepts=[_concept("lex:donepezil", 30), _concept("lex:dementia", 90)]), True
    assert naming_what_is_asked([med_list, order], asked, ["medication"]) == [order]
    # A note's list that names the order's drug still answers ("which inhalers?": both named there).
    both = _ev(0, "donepezil 10 mg; simvastatin 10 mg", 0.8)
    both.chunk = NS(concepts=[_concept("lex:donepezil", 0, role="member"), _concept("lex:simvastatin", 18, role="member")])
    order.chunk.concepts[0]["role"] = "member"
    assert naming_what_is_asked([both, med_list, order], asked, ["medication"]) == [both, order]
    # Not a drug question, or no cited order names what is asked: the scores decide as before.
    assert naming_what_is_asked([med_list, order], asked, []) == [med_list, order]
    order.chunk = NS(concepts=[_concept("lex:dementia", 90, negated=True)])
    assert naming_what_is_asked([med_list, order], asked, ["medication"]) == [med_list, order]
    # A concept of the context ("I had my tubes tied...") is not what the question asks about.
    order.chunk = NS(concepts=[_concept("lex:dementia", 90)])
    context = NS(concepts=[_concept("lex:dementia", role="context")])
    assert naming_what_is_asked([med_list, order], context, ["medication"]) == [med_list, order]


def test_a_patients_lay_words_are_read_with_the_clinical_term():
    read = clinical_reading("Which medicine is he taking so his body doesn’t reject it?")
    assert read == "Which medicine is he taking so his body doesn't reject (immunosuppressant) it?"
    # A plain name of two words or more reads as its term; one word ("swelling") is too common to.
    assert clinical_reading("Were my kidney stones big?") == "Were my kidney stones (nephrolithiasis) big?"
    assert clinical_reading("Is the swelling worse?") == "Is the swelling worse?"
    # A question that names the term already is left as written.
    assert clinical_reading("Is my hypertension, my high blood pressure, better?") == \
        "Is my hypertension, my high blood pressure, better?"


def test_what_kind_asks_for_the_disorder_not_the_history_of_it():
    from types import SimpleNamespace as NS
    mi = NS(concepts=[_concept("lex:myocardial infarction")])
    history = _ev(0, "Problem / diagnosis (active): History of myocardial infarction (situation)", 0.71,
                  kind="coded", ref="Condition/h")
    stemi = _ev(0, "Problem / diagnosis (active): Acute ST segment elevation myocardial infarction (disorder)", 0.5,
                kind="coded", ref="Condition/s")
    history.chunk = stemi.chunk = NS(concepts=[_concept("lex:myocardial infarction", 40)])
    assert the_specific_kind([history, stemi], mi, "What kind of heart attack was it?") == [stemi]
    # Asked whether it happened, the history answers as well as the disorder.
    assert the_specific_kind([history, stemi], mi, "Did he have a heart attack?") == [history, stemi]
    # With no other record of the concept, the history stays.
    assert the_specific_kind([history], mi, "What kind of heart attack was it?") == [history]


def test_a_weak_cited_record_about_something_else_does_not_answer():
    from types import SimpleNamespace as NS
    asked = NS(concepts=[_concept("lex:tubal ligation", role="context")])
    assessment = _ev(0, "Procedure (completed): Assessment of health and social care needs", 0.34, kind="coded",
                     ref="Procedure/a")
    assessment.chunk = NS(concepts=[_concept("http://snomed.info/sct|710824005")])
    ligation = _ev(0, "Procedure (completed): Ligation of bilateral fallopian tubes", 0.34, kind="coded",
                   ref="Procedure/l")
    ligation.chunk = NS(concepts=[_concept("lex:tubal ligation", 30)])
    assert without_unrelated_weak_records([assessment, ligation], asked) == [ligation]
    # Scoring well, or a message naming no concept: the thresholds decide as before.
    strong = _ev(0, "Procedure (completed): Assessment of health and social care needs", 0.6, kind="coded")
    strong.chunk = assessment.chunk
    assert without_unrelated_weak_records([strong], asked) == [strong]
    assert without_unrelated_weak_records([assessment], NS(concepts=[])) == [assessment]

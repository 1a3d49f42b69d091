"""Notes as evidence: the clinical sentence splitter, note sections inline and on their own lines,
class answers the notes state, the sentence an answer quotes and cites (by its side, not a
relative's history), and the citation that names the quoted sentence."""
from __future__ import annotations

import base64

import pytest

from fhir_ingest.record.notes import note_sentences, section_kind, sentence_context, split_sections

from .conftest import indexed_record

PID = "p-notes"


# --- the splitter -----------------------------------------------------------------------------------------

def test_sentences_are_not_cut_at_clinical_abbreviations():
    text = ("She was seen by Dr. Smith on admission. Levaquin 250 mg p.o. every other day for the next 5 days. "
            "Metoprolol 25 mg b.i.d. was started. Aspirin 81 mg. daily.\n1.  Prednisone 40 mg daily.\n"
            "2.  Lasix 20 mg daily.")
    sentences = note_sentences(text)
    assert [s.text for s in sentences] == [
        "She was seen by Dr. Smith on admission.",
        "Levaquin 250 mg p.o. every other day for the next 5 days.",
        "Metoprolol 25 mg b.i.d. was started.",
        "Aspirin 81 mg. daily.",
        "1.  Prednisone 40 mg daily.",
        "2.  Lasix 20 mg daily."]
    # Each sentence keeps its place in the note: the side panel finds it there.
    assert all(text[s.start:s.end] == s.text for s in sentences)


def test_a_one_word_list_item_is_a_sentence():
    assert [s.text for s in note_sentences("ALLERGIES:\nNONE.")] == ["ALLERGIES:", "NONE."]


# --- sections ---------------------------------------------------------------------------------------------

NOTE = """HISTORY OF PRESENT ILLNESS: A 64-year-old man seen by Dr. Smith for chest pain.
PAST SURGICAL HISTORY:
Laparoscopic cholecystectomy in 2001.

ALLERGIES:
SULFA AND IVP DYE.

PHYSICAL EXAMINATION:
HEENT: Normal.
LUNGS: Clear.
DISCHARGE MEDICATIONS:
1.  Levaquin 250 mg p.o. every other day for the next 5 days.
2.  Novolin 70/30, 15 units b.i.d.
Plan: Follow up with cardiology in 2 weeks."""


def test_sections_inline_and_on_their_own_lines_are_typed():
    sections = {s.heading: s for s in split_sections(NOTE)}
    assert list(sections) == ["HISTORY OF PRESENT ILLNESS", "PAST SURGICAL HISTORY", "ALLERGIES",
                              "PHYSICAL EXAMINATION", "DISCHARGE MEDICATIONS", "Plan"]
    assert sections["HISTORY OF PRESENT ILLNESS"].text.startswith("A 64-year-old man")      # written inline
    assert sections["Plan"].text == "Follow up with cardiology in 2 weeks."                   # inline, title case
    # An exam's findings stay inside the exam: "HEENT:" is no section of the note.
    assert sections["PHYSICAL EXAMINATION"].text == "HEENT: Normal.\nLUNGS: Clear."
    kinds = {h: s.kind for h, s in sections.items()}
    assert kinds == {"HISTORY OF PRESENT ILLNESS": "hpi", "PAST SURGICAL HISTORY": "procedure", "ALLERGIES": "allergy",
                     "PHYSICAL EXAMINATION": "physical_exam", "DISCHARGE MEDICATIONS": "medication", "Plan": "plan"}


@pytest.mark.parametrize("heading, kind", [("MEDICATIONS ON DISCHARGE", "medication"), ("IMPRESSION/PLAN", "plan"),
                                           ("PROCEDURES PERFORMED", "procedure"), ("A/P", "plan"),
                                           ("DIAGNOSES ON DISCHARGE", "problem"), ("ALLERGIC REACTIONS", "allergy")])
def test_section_titles_are_read_by_their_words_and_by_medspacys_titles(heading, kind):
    assert section_kind(heading) == kind


def test_context_marks_a_relatives_history_and_what_may_happen():
    assert sentence_context("Her mother had breast cancer at 50.") == {"family"}
    assert sentence_context("Return if chest pain recurs.") == {"hypothetical"}
    assert sentence_context("Right breast mass, biopsy pending.") == set()


# --- answers from notes -----------------------------------------------------------------------------------

def note(note_id: str, date: str, text: str) -> dict:
    return {"resourceType": "DocumentReference", "id": note_id, "status": "current", "subject": {"reference": f"Patient/{PID}"},
            "type": {"coding": [{"system": "http://loinc.org", "code": "18842-5", "display": "Discharge summary"}]},
            "date": date, "content": [{"attachment": {"contentType": "text/plain",
                                                      "data": base64.b64encode(text.encode()).decode()}}]}


PATIENT = {"resourceType": "Patient", "id": PID, "gender": "female", "birthDate": "1950-01-01"}
SUMMARY = note("ds-1", "2010-05-02T10:00:00Z", NOTE)
CONSULT = note("bc-1", "2011-03-01T10:00:00Z", """REASON FOR CONSULTATION:
Breast mass.

FAMILY HISTORY:
Her mother had breast cancer at 50.

IMPRESSION:
Left breast: the biopsy showed a benign fibroadenoma.
Right breast: a 2 cm spiculated mass at 10 o'clock, highly suspicious for carcinoma; core biopsy scheduled.""")


@pytest.fixture(scope="module")
def service(tmp_path_factory, embedder):
    svc = indexed_record(tmp_path_factory.mktemp("notes"), [PATIENT, SUMMARY, CONSULT])
    yield svc
    svc.close()


def ask(service, question: str) -> dict:
    return service.ask("t", PID, question)


def answer_over(tmp_path, resources: list[dict], question: str) -> str:
    """The answer to one question over a record of these resources alone."""
    service = indexed_record(tmp_path, resources)
    try:
        return ask(service, question)["answer"]
    finally:
        service.close()


def test_allergies_only_a_note_states_are_never_said_to_be_none(service):
    result = ask(service, "any allergies?")
    assert "No allergies" not in result["answer"] and not result["abstained"], result["answer"]
    assert "SULFA AND IVP DYE." in result["answer"]
    cited = {c["ref"] for c in result["citations"]}
    assert "DocumentReference/ds-1" in cited


def test_medications_only_a_note_lists_are_the_answer_to_a_medication_question(service):
    result = ask(service, "what meds did she go home on?")
    assert "No medications" not in result["answer"], result["answer"]
    assert "Novolin 70/30, 15 units b.i.d." in result["answer"]
    # The plan written inline after the list is its own section, not a medication.
    assert "Follow up with cardiology" not in result["answer"]


def test_an_allergy_the_note_does_not_name_is_no_evidence_with_what_the_notes_do_say(service):
    result = ask(service, "is she allergic to penicillin?")
    assert result["abstained"], result["answer"]
    assert "No allergies or intolerances are recorded" not in result["answer"]
    assert "SULFA AND IVP DYE." in result["answer"]          # what the notes do state, cited


def test_a_quoted_sentence_is_whole_and_its_citation_names_it(service):
    result = ask(service, "how long is the levaquin course?")
    assert "Levaquin 250 mg p.o. every other day for the next 5 days." in result["answer"], result["answer"]
    quotes = [q for c in result["citations"] for q in c.get("quotes", [])]
    assert any("Levaquin 250 mg p.o. every other day for the next 5 days." in q for q in quotes), result["citations"]


def test_the_side_asked_about_answers_not_the_other_one(service):
    result = ask(service, "what did the biopsy of the right breast show?")
    assert "Right breast: a 2 cm spiculated mass" in result["answer"], result["answer"]
    assert "fibroadenoma" not in result["answer"]


def test_a_relatives_history_does_not_answer_for_the_patient(service):
    result = ask(service, "does she have breast cancer?")
    assert "Her mother had breast cancer" not in result["answer"], result["answer"]
    assert "suspicious for carcinoma" in result["answer"]


# --- conflicts only when two cited facts disagree -----------------------------------------------------------

MELANOMA = {"resourceType": "Condition", "id": "mel-1", "subject": {"reference": f"Patient/{PID}"},
            "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                                           "code": "active"}]},
            "code": {"coding": [{"system": "http://snomed.info/sct", "code": "372244006",
                                 "display": "Malignant melanoma"}], "text": "Malignant melanoma"},
            "onsetDateTime": "2004-01-01"}
ORTHO = note("or-1", "2008-11-03T10:00:00Z", """IMPRESSION:
Based on her presentation without any history of obvious fall or trauma and past history of malignant melanoma, this appears to be a pathological fracture of the left proximal hip.""")


CHEST_CT = note("ct-1", "2008-11-04T10:00:00Z", """FINDINGS:
The lungs are clear with no infiltrates, effusions, or masses.""")


def test_a_sentence_that_does_not_deny_the_coded_problem_is_no_conflict(tmp_path, embedder):
    service = indexed_record(tmp_path, [PATIENT, MELANOMA, ORTHO, CHEST_CT])
    try:
        result = service.ask("t", PID, "Did the scan show the cancer in my lungs?")
    finally:
        service.close()
    assert not any(s.get("conflict") for s in result["statements"]), result["answer"]
    assert "conflicts with" not in result["answer"]


# --- the kind of answer the question wants ------------------------------------------------------------------

VASCULAR = note("vs-1", "2009-06-11T10:00:00Z", """PREOPERATIVE DIAGNOSIS:
Critical carotid stenosis.

PROCEDURE PERFORMED:
Left carotid endarterectomy with endovascular patch angioplasty.

ESTIMATED BLOOD LOSS:
150 mL.

COMPLICATIONS:
No blood loss complications and no carotid surgery complications.

OPERATIVE PROCEDURE:
The patient was brought to the operating room and the neck was prepped. The carotid endarterectomy was then performed in the usual fashion. The patient tolerated the procedure well.""")
CLINIC = note("cl-1", "2010-02-01T10:00:00Z", """HISTORY OF PRESENT ILLNESS:
She has a long history of gout and sees rheumatology every year. She is on 300 mg of allopurinol daily as well as colchicine as needed. Her gout has been quiet this winter.

ASSESSMENT AND PLAN:
Stable carotid disease after surgery, doing well. We talked about the plan at length and she is in agreement with the plan. She came off warfarin in the clinic today and the warfarin was taken off her list. Warfarin was stopped because the bleeding risk is too high at her age.""")


@pytest.fixture(scope="module")
def vascular(tmp_path_factory, embedder):
    svc = indexed_record(tmp_path_factory.mktemp("vascular"), [PATIENT, VASCULAR, CLINIC])
    yield svc
    svc.close()


def test_which_side_is_answered_by_the_sentence_that_names_a_side(vascular):
    # "CEA" typed in capitals is read the way this record spells it (carotid endarterectomy), not
    # as the lab the lexicon knows, which the record never holds.
    result = ask(vascular, "which side was the CEA")
    assert not result["abstained"], result["answer"]
    assert "Left carotid endarterectomy with endovascular patch angioplasty." in result["answer"], result["answer"]


def test_an_amount_asked_is_answered_by_the_sentence_that_measures_it(vascular):
    result = ask(vascular, "how much blood loss during the carotid surgery")
    assert "150 mL." in result["answer"], result["answer"]
    assert "No blood loss complications" not in result["answer"]


def test_a_why_question_is_answered_by_the_sentence_that_gives_the_reason(vascular):
    result = ask(vascular, "why did she come off warfarin?")
    assert "because the bleeding risk is too high" in result["answer"], result["answer"]


def test_what_she_takes_for_a_problem_is_answered_by_the_sentence_naming_the_drugs(vascular):
    result = ask(vascular, "what is she taking for her gout")
    assert "allopurinol" in result["answer"], result["answer"]


def test_a_section_asked_by_name_leads_with_its_opening_not_with_its_name_in_a_sentence(vascular):
    result = ask(vascular, "a/p from the clinic visit")
    assert "Stable carotid disease after surgery, doing well." in result["answer"], result["answer"]


def test_the_answer_kinds_read_from_the_question():
    from types import SimpleNamespace

    from search.answering.notes import answer_kind_score, answer_kinds

    def kinds(question, concepts=(), record_kinds=()):
        return answer_kinds(SimpleNamespace(question=question, concepts=list(concepts), kinds=record_kinds))

    assert kinds("which side was the stroke") == {"side"}
    assert kinds("what dose of cefazolin") >= {"amount"}
    assert kinds("bnp?", [{"semantic_type": "lab", "key": "lex:bnp"}]) == {"amount"}
    assert kinds("why was plavix held") == {"reason"}
    assert kinds("what meds did she go home on", record_kinds=("medication",)) == {"drug"}
    assert kinds("what did the chest x-ray show") == set()
    # A time is no amount; a dose is.
    assert answer_kind_score("Complete the 6-week course.", {"amount"}, ()) == 0
    assert answer_kind_score("Start Ancef 2 g q.8 h.", {"amount"}, ()) > 0
    assert answer_kind_score("1. Elevated CEA.", {"amount"}, ()) == 0      # a list number is not a value
    assert answer_kind_score("She is on methotrexate weekly.", {"drug"}, {"methotrexate"}) > 0


TRANSFER = note("tr-1", "2008-10-14T10:00:00Z", """TRANSFER DIAGNOSES:
1. Coronary artery disease.
2. Chest pain.

HOSPITAL COURSE:
He was brought in by a friend with chest pain. His vital signs were stable on admission. He was ruled out for myocardial infarction with troponin x2. Cardiology saw him and recommended a catheterization.""")


def test_a_question_whether_a_diagnosis_was_ruled_out_is_answered_by_the_sentence_that_rules_it_out(tmp_path, embedder):
    # The record only denies the infarction, and the denial is what was asked: no abstention, and
    # the quoted sentence is the one that rules it out ("MI" is written "myocardial infarction").
    service = indexed_record(tmp_path, [PATIENT, TRANSFER])
    try:
        result = ask(service, "was an MI ruled out?")
        assert not result["abstained"], result["answer"]
        assert "He was ruled out for myocardial infarction with troponin x2." in result["answer"], result["answer"]
        # Asked whether he had one, the denial is still no "yes".
        assert ask(service, "did he have an MI?")["abstained"]
    finally:
        service.close()


CARDIAC_TRANSFER = note("tr-2", "2008-10-14T10:00:00Z", """HOSPITAL COURSE:
He was admitted with chest pain and started on aspirin and heparin. He remained stable and was sent over for a catheterization with his usual medicines.

DISCHARGE MEDICATIONS:
1. Aspirin 325 mg p.o. daily.
2. Lovenox 40 mg subcutaneously daily.
3. Metoprolol 25 mg p.o. b.i.d.
4. Protonix 40 mg p.o. daily.""")


def test_a_numbered_medication_list_is_quoted_as_a_list_not_one_line(tmp_path, embedder):
    service = indexed_record(tmp_path, [PATIENT, CARDIAC_TRANSFER])
    try:
        result = ask(service, "meds he was sent over on for the cath")
        for line in ("Aspirin 325 mg p.o. daily.", "Lovenox 40 mg subcutaneously daily.", "Protonix 40 mg p.o. daily."):
            assert line in result["answer"], result["answer"]
    finally:
        service.close()



def test_what_he_went_home_on_is_read_from_the_discharge_section():
    # Scored without the embedder, by the features alone: the discharge section's line wins over
    # a hospital-course sentence that shares more of the question's words.
    from types import SimpleNamespace

    from search.answering.notes import rank_note_sentences

    chunk = SimpleNamespace(
        chunk_id="c1", ref="DocumentReference/ds-3", semantic_type="note", concepts=[],
        sections=["HOSPITAL COURSE", "MEDICATIONS ON DISCHARGE"],
        text="Discharge summary of 2010-01-22. HOSPITAL COURSE: IV steroid taper was started. "
             "MEDICATIONS ON DISCHARGE: 1. Prednisone taper 40 mg daily.")
    analysis = SimpleNamespace(question="steroid taper he went home on", terms=["steroid", "taper", "went", "home"],
                               target=0, residual=["steroid", "taper", "went", "home"],
                               expansions=[], concepts=[], kinds=(), sections_asked=set())
    ranked = rank_note_sentences(analysis, [SimpleNamespace(chunk=chunk)], None)
    assert ranked[0].sentence.text == "1. Prednisone taper 40 mg daily.", [(r.sentence.text, r.score) for r in ranked]


def test_a_bare_test_name_is_answered_by_the_sentence_giving_its_value():
    # "cea?": the long lab line with "CEA elevated at 8.6" answers, not "3. Elevated CEA." that
    # only names it, though an embedder finds the short line closer to the two-word question.
    from types import SimpleNamespace

    from search.answering.notes import rank_note_sentences

    chunk = SimpleNamespace(
        chunk_id="c1", ref="DocumentReference/icu-1", semantic_type="note", concepts=[],
        sections=["LABORATORY DATA", "IMPRESSION"],
        text="Progress note of 2013-03-05. LABORATORY DATA: Sodium is 134, potassium 4.0, TSH 0.74, "
             "CEA elevated at 8.6, ferritin 27.5. IMPRESSION: 3. Elevated CEA.")
    analysis = SimpleNamespace(question="cea?", terms=["cea"], expansions=[], kinds=(), sections_asked=set(),
                               target=0, residual=[],
                               concepts=[{"key": "lex:cea", "display": "carcinoembryonic antigen", "semantic_type": "lab",
                                          "text": "cea"}])
    def closer_to_the_short_line(texts):
        return [0.6 if t.endswith("Elevated CEA.") else 0.3 for t in texts]

    ranked = rank_note_sentences(analysis, [SimpleNamespace(chunk=chunk)], closer_to_the_short_line)
    assert "CEA elevated at 8.6" in ranked[0].sentence.text, [(r.sentence.text, r.score) for r in ranked]


def test_the_section_asked_is_read_in_a_chunk_that_ranked_below_the_chunks_read():
    # A long PLAN cut into chunks: its opening chunk ranked fifth, below four chunks of the note's
    # other sections, and is read all the same; a fifth chunk of another section is not.
    from types import SimpleNamespace

    from search.answering.notes import NOTE_CHUNKS_READ, notes_read

    def note_chunk(n: int, heading: str):
        return SimpleNamespace(chunk=SimpleNamespace(chunk_id=f"c{n}", semantic_type="note", sections=[heading]))

    others = [note_chunk(n, "PHYSICAL EXAMINATION") for n in range(NOTE_CHUNKS_READ)]
    analysis = SimpleNamespace(question="ortho's plan in the ED", terms=["ortho's", "plan", "ed"], expansions=[],
                               sections_asked={"assessment and plan"})
    plan, exam = note_chunk(9, "DISCUSSION AND PLAN"), note_chunk(10, "PHYSICAL EXAMINATION")
    assert [ev.chunk.chunk_id for ev in notes_read(analysis, others + [plan, exam])] == \
        [ev.chunk.chunk_id for ev in others] + ["c9"]


HYPERTENSION_STAY = note("ds-2", "2007-09-08T10:00:00Z", """HOSPITAL COURSE:
The patient was admitted for syncope. Her blood pressure was high and medication was adjusted to benazepril 20 mg a day.

DISCHARGE MEDICATIONS:
1.  Famotidine 20 mg 1 tablet p.o. b.i.d.
2.  Triazolam 0.125 mg p.o. at bedtime.""")


def test_a_drug_class_named_only_in_the_notes_prose_is_not_said_to_be_absent(tmp_path, embedder):
    # The discharge medications state the class without the antihypertensive, which the hospital
    # course names: that sentence answers "bp meds?", never "No antihypertensive is recorded".
    svc = indexed_record(tmp_path, [PATIENT, HYPERTENSION_STAY])
    try:
        result = ask(svc, "what bp meds did she go home on?")
    finally:
        svc.close()
    assert "No antihypertensive" not in result["answer"] and not result["abstained"], result["answer"]
    assert "benazepril 20 mg a day" in result["answer"], result["answer"]


ASPIRIN_ORDER = {"resourceType": "MedicationRequest", "id": "mr-asa", "status": "active", "intent": "order",
                 "subject": {"reference": f"Patient/{PID}"}, "authoredOn": "2003-07-05",
                 "medicationCodeableConcept": {"coding": [{"system": "http://www.nlm.nih.gov/research/umls/rxnorm",
                                                           "code": "243670", "display": "aspirin 81 MG Oral Tablet"}]}}
KNEE_OA = {"resourceType": "Condition", "id": "c-oa", "subject": {"reference": f"Patient/{PID}"},
           "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical", "code": "active"}]},
           "code": {"coding": [{"system": "http://snomed.info/sct", "code": "239873007",
                                "display": "Osteoarthritis of knee (disorder)"}]}, "onsetDateTime": "2004-01-01"}
CARDIAC_VISIT = note("vn-1", "2003-07-05T10:00:00Z", """ASSESSMENT AND PLAN:
Coronary disease, stable. The patient was prescribed aspirin 81 mg oral tablet and simvastatin 20 mg.

MEDICATIONS:
1.  Metoprolol 25 mg daily.""")


def test_a_drug_the_coded_list_holds_is_not_taken_again_from_the_notes_prose(tmp_path, embedder):
    # The coded aspirin was judged no answer to an NSAID for the knee pain; the note's sentence
    # naming the same aspirin does not turn that into a "Yes".
    svc = indexed_record(tmp_path, [PATIENT, KNEE_OA, ASPIRIN_ORDER, CARDIAC_VISIT])
    try:
        result = ask(svc, "anything for the knee OA pain - nsaid? tylenol?")
    finally:
        svc.close()
    assert "prescribed aspirin 81 mg" not in result["answer"].split("For context")[0], result["answer"]


ED_FLANK = note("ed-9", "2011-05-02T10:00:00Z", """HISTORY OF PRESENT ILLNESS:
Pain began in the right flank this morning, with nausea. He has had no fever.

ASSESSMENT AND PLAN:
I spoke with the urologist on call about his flank pain when he came to the emergency room, and he asked that the patient be admitted for further evaluation of this flank pain.""")


def test_which_side_is_never_answered_by_a_closer_sentence_that_names_no_side(tmp_path, embedder):
    answer = answer_over(tmp_path, [PATIENT, ED_FLANK], "which side was his flank pain on when he came to the emergency room")
    assert "Pain began in the right flank" in answer, answer


def test_a_section_asked_by_name_is_quoted_from_its_opening_and_found_by_its_kind():
    from types import SimpleNamespace

    from fhir_ingest.record.contract import Chunk
    from search.answering.notes import sentences_of, with_section_opening
    from search.retrieval.ranking import holds_asked_section

    chunk = Chunk("t", "p", "DocumentReference", "pn-1", "sec4",
                  "Progress note of 2012-02-02. IMPRESSION/PLAN: 1. Pyelonephritis, improving on antibiotics. "
                  "We will keep watching her temperature overnight. She is eating well.",
                  "note", sections=["IMPRESSION/PLAN"], semantic_type="note")
    sentences = sentences_of(chunk)
    later = [s for s in sentences if s.text.startswith("We will keep")]
    asked = SimpleNamespace(question="impression from the progress note", terms=["impression", "progress", "note"],
                            expansions=[], sections_asked={"assessment and plan"})
    quoted = with_section_opening(later, chunk, asked)
    assert [s.text for s in quoted][0].startswith("1. Pyelonephritis"), [s.text for s in quoted]
    assert quoted[1:] == later
    # A question that names no section keeps the sentences chosen for it.
    other = SimpleNamespace(question="is she eating", terms=["eating"], expansions=[], sections_asked=set())
    assert with_section_opening(later, chunk, other) == later
    # "The impression" (read as the assessment and plan) is an IMPRESSION/PLAN section, whatever its title.
    assert holds_asked_section(chunk, asked)
    assert not holds_asked_section(chunk, SimpleNamespace(sections_asked={"social history"}))


def test_what_a_result_is_of_outranks_where_it_is_from():
    # "path results from the tonsils": the follow-up's line on what the pathologist said answers,
    # not the operative note's closer-sounding lines about the tonsils.
    from types import SimpleNamespace

    from search.answering.notes import rank_note_sentences
    from search.retrieval.analysis import analyse

    operative = SimpleNamespace(chunk_id="op", ref="DocumentReference/op-1", semantic_type="note", concepts=[],
                                sections=["TECHNIQUE"],
                                text="Operative note of 2009-02-02. TECHNIQUE: The adenoids were large and boggy.")
    follow_up = SimpleNamespace(chunk_id="fu", ref="DocumentReference/fu-1", semantic_type="note", concepts=[],
                                sections=["PLAN"],
                                text="Clinic note of 2009-02-16. PLAN: The pathology showed benign lymphoid hyperplasia.")

    def closer_to_the_adenoids(texts):
        return [0.7 if "boggy" in t else 0.55 for t in texts]

    ranked = rank_note_sentences(analyse("path results from the adenoids"),
                                 [SimpleNamespace(chunk=operative), SimpleNamespace(chunk=follow_up)], closer_to_the_adenoids)
    assert "pathology showed" in ranked[0].sentence.text, [(r.sentence.text, r.score) for r in ranked]


def test_a_coded_answer_brings_the_note_sentence_that_names_what_was_asked():
    # "what kind of OM": the coded problem answers, and the operative note's "OM, chronic,
    # serous" line is quoted beside it; a best sentence that does not name it adds nothing.
    from types import SimpleNamespace

    from search.answering.answer import names_the_asked, notes_by_their_best_sentence
    from search.answering.notes import NoteSentence, Ranked

    analysis = SimpleNamespace(concepts=[{"key": "lex:otitis media", "display": "otitis media", "semantic_type": "problem",
                                          "text": "OM", "role": ""}])
    assert names_the_asked("OM, chronic, serous, simple or unspecified.", analysis)
    assert names_the_asked("History of otitis media.", analysis)
    assert not names_the_asked("The stomach was evacuated from the room.", analysis)     # "om" of "room", lower case

    def evidence(kind: str, name: str):
        return SimpleNamespace(chunk=SimpleNamespace(semantic_type=kind, chunk_id=name))

    problem, note_ev = evidence("problem", "p1"), evidence("note", "n1")
    said = Ranked(note_ev, NoteSentence("PREOPERATIVE DIAGNOSES", "problem", "OM, chronic, serous."), 0.5)
    unsaid = Ranked(note_ev, NoteSentence("TECHNIQUE", "procedure", "The tube was placed."), 0.5)
    assert notes_by_their_best_sentence([problem], [said], analysis) == [problem, note_ev]
    assert notes_by_their_best_sentence([problem], [unsaid], analysis) == [problem]


OPERATIVE = note("op-7", "2012-03-02T10:00:00Z", """PREOPERATIVE DIAGNOSES:
1. Breech presentation.
2. Prior uterine scar.

OPERATION:
Repeat low transverse cesarean section.

DESCRIPTION OF OPERATION:
The patient was taken to the operating room and spinal anesthesia was given. The cesarean section was performed through the old scar. A healthy infant was delivered and handed to the pediatric team.""")


def test_why_an_operation_was_done_is_answered_by_its_preoperative_diagnoses(tmp_path, embedder):
    answer = answer_over(tmp_path, [PATIENT, OPERATIVE], "Why did my daughter end up needing a C-section?")
    assert "Breech presentation." in answer and "Prior uterine scar." in answer, answer


def titled_note(note_id: str, date: str, title: str, loinc: tuple[str, str], text: str) -> dict:
    resource = note(note_id, date, text)
    resource["description"] = title
    resource["type"] = {"coding": [{"system": "http://loinc.org", "code": loinc[0], "display": loinc[1]}]}
    return resource


CATH = titled_note("cath-3", "2015-06-08T10:00:00Z", "Cardiac Catheterization Report", ("18745-0", "Cardiac catheterization study"),
                   """FINDINGS:
Severe three-vessel coronary disease.

PLAN:
The patient will not be placed on Plavix because bypass surgery is likely this month.""")
LATER_SURGERY = titled_note("op-3", "2015-06-11T10:00:00Z", "Operative Note", ("11504-8", "Surgical operation note"),
                            """HISTORY:
It was felt necessary to perform cardiac catheterization before this surgery.

PROCEDURE:
Right carotid endarterectomy. The wound was irrigated and closed.""")


def test_after_an_event_counts_from_the_event_not_from_a_later_note_recalling_it(tmp_path, embedder):
    # "after the cath": the cath report's day, not the operative note's of three days later that
    # mentions the cath; and "why was Plavix held" is answered by the sentence withholding it.
    from search.retrieval.pipeline import retrieve

    service = indexed_record(tmp_path, [PATIENT, CATH, LATER_SURGERY])
    try:
        result = service.ask("t", PID, "why was plavix held after the cath")
        window = retrieve(service.backend, service.embedder, "why was plavix held after the cath", "t", PID, k=5,
                          pipeline="full").analysis.date_from
    finally:
        service.close()
    assert window == "2015-06-08"
    assert not result["abstained"], result["answer"]
    assert "bypass surgery is likely" in result["answer"], result["answer"]


def test_splitting_a_note_first_leaves_pytorch_unloaded():
    """PyRuSH imports spaCy, whose thinc imports PyTorch when it is installed (450 MB): a record's
    notes are split before the annotation pipeline loads, so the splitter hides PyTorch too (a
    large record's indexing held 400 MB more from its first note on). In a fresh process."""
    import subprocess
    import sys
    from pathlib import Path

    script = """
import sys
from fhir_ingest.record.notes import note_sentences
assert [s.text for s in note_sentences("Seen by Dr. Smith. Denies chest pain.")] == ["Seen by Dr. Smith.", "Denies chest pain."]
assert "spacy" in sys.modules and "torch" not in sys.modules, "torch loaded"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent, encoding="utf-8")
    assert done.stdout.strip() == "ok", done.stderr[-2000:]

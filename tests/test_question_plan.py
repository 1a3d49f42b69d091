"""The question plan (search/answering/plan.py) and its operations (search/answering/operations.py),
with a fixed today: windows relative to it, the operation and target read from the question, and
each operation over typed facts with every stated item cited."""
from __future__ import annotations

import re
from datetime import date

import pytest

from fhir_ingest.record.contract import Chunk
from search.answering import operations as ops
from search.answering.plan import ALL_TIME, PlanPart, Target, Window, plan_question, window_from_today
from search.retrieval.types import Evidence

from .conftest import indexed_record

TODAY = date(2025, 8, 1)
A1C = {"key": "lex:hemoglobin a1c", "display": "hemoglobin a1c", "semantic_type": "lab", "negated": False,
       "text": "a1cs"}
LISINOPRIL = {"key": "rx:29046", "display": "lisinopril", "semantic_type": "medication", "negated": False,
              "text": "lisinopril"}
EMERGENCY = Target("visit", "emergency visits", visit_class="emergency", visit_codes=("EMER",),
                   semantic_types=("encounter",))


# --- windows relative to today ----------------------------------------------------------------------

@pytest.mark.parametrize("question, start, end", [
    ("since last month, any prescriptions?", "2025-07-01", "2025-08-01"),
    ("how many ED visits in the last year", "2024-08-01", "2025-08-01"),
    ("# of a1cs this yr", "2025-01-01", "2025-08-01"),
    ("did they place a 20 gauge until 12 months ago?", "", "2024-08-01"),
    ("bp readings over the past 6 months", "2025-02-01", "2025-08-01"),
    ("labs last month", "2025-07-01", "2025-07-31"),
    ("admissions last year", "2024-01-01", "2024-12-31"),
    ("anything since 3 weeks ago", "2025-07-11", "2025-08-01"),
])
def test_windows_count_from_the_given_today(question, start, end):
    window = window_from_today(question, TODAY)
    assert (window.start, window.end, window.source) == (start, end, "today")


def test_a_question_without_a_relative_phrase_has_no_window_from_today():
    assert window_from_today("how many bmps since dec 2023", TODAY) is None
    assert window_from_today("latest a1c", TODAY) is None


def test_another_today_moves_the_window():
    assert window_from_today("in the last year", date(2020, 3, 31)).start == "2019-03-31"


def test_absolute_and_anchored_windows_come_from_the_retrieval_analysis():
    plan = plan_question("how many a1cs since dec 2023", TODAY, [A1C], date_from="2023-12-01")
    assert plan.parts[0].window == Window("2023-12-01", "", "since 2023-12-01", "absolute")
    anchored = plan_question("a1cs after the acl surgery", TODAY, [A1C], date_from="2021-05-02", anchored=True)
    assert anchored.parts[0].window.source == "event"


# --- operation and target ---------------------------------------------------------------------------

@pytest.mark.parametrize("question, operation", [
    ("how many a1cs this yr", "count"),
    ("# of a1cs", "count"),
    ("first a1c", "first"),
    ("last a1c", "latest"),
    ("any a1c since last month?", "exists"),
    ("a1c values", "list"),
    ("a1c better or worse than 2024?", "compare"),
])
def test_the_operation_is_read_from_the_question(question, operation):
    assert plan_question(question, TODAY, [A1C]).parts[0].operation == operation


def test_a_window_phrase_is_not_read_as_the_latest():
    assert plan_question("since last month, any a1c?", TODAY, [A1C]).parts[0].operation == "exists"


def test_a_trend_over_a_window_from_today_is_left_to_the_trend_answer():
    part = plan_question("How has her A1c changed over the last three years?", TODAY, [A1C]).parts[0]
    assert part.window.source == "today" and part.trend and not part.arithmetic
    assert plan_question("how many a1cs in the last three years", TODAY, [A1C]).parts[0].arithmetic


def test_dose_change_and_duration():
    assert plan_question("dose change on lisinopril?", TODAY, [LISINOPRIL]).parts[0].operation == "change"
    stay = plan_question("how long was she in for the last admission", TODAY, [])
    assert stay.parts[0].operation == "duration" and stay.parts[0].target.visit_codes == ("IMP", "ACUTE", "NONAC")


@pytest.mark.parametrize("question, visit_class", [
    ("how many ED visits in the last year", "emergency"),
    ("# of home health visits in oct 2022", "home health"),
    ("how many admissions has she had", "inpatient"),
    ("office visits since 2024", "ambulatory"),
])
def test_visit_classes_are_targets(question, visit_class):
    part = plan_question(question, TODAY, []).parts[0]
    assert part.target.kind == "visit" and part.target.visit_class == visit_class


def test_a_panel_named_by_its_group_is_counted_by_the_panel_codes():
    bmp = {"key": "lex:basic metabolic panel", "display": "basic metabolic panel", "semantic_type": "lab",
           "negated": False, "text": "bmps", "via": "basic metabolic panel"}
    misread = {"key": "lex:protein", "display": "protein", "semantic_type": "lab", "negated": False, "text": "bmps",
               "via": "bone morphogenetic protein"}
    target = plan_question("how many bmps since dec 2023", TODAY, [bmp, misread]).parts[0].target
    assert "http://loinc.org|24321-2" in target.keys and "lex:protein" not in target.keys
    assert target.words == "basic metabolic panels"


def test_a_drug_class_is_left_to_the_class_listing():
    beta = {"key": "lex:beta blocker", "display": "beta blocker", "semantic_type": "medication", "negated": False,
            "text": "beta blockers"}
    assert plan_question("how many beta blockers is he on", TODAY, [beta]).parts == ()


def test_a_coded_name_is_said_without_its_tag():
    cbt = {"key": "sct:228557008", "display": "Cognitive and behavioral therapy (regime/therapy)",
           "semantic_type": "procedure", "negated": False, "text": "cbt"}
    assert plan_question("how many cbt sessions", TODAY, [cbt]).parts[0].target.words == "Cognitive and behavioral therapy"


def test_nothing_to_operate_on_gives_an_empty_plan():
    assert plan_question("how is she doing", TODAY, []).parts == ()


# --- operations over typed facts ----------------------------------------------------------------------

def item(n: int, day: str, resource_type: str = "Observation", fact: dict | None = None, semantic_type: str = "lab",
         concepts: list | None = None) -> ops.Item:
    chunk = Chunk("t", "p", resource_type, f"r{n}", "0", f"text {n}", f"{day} · Lab · thing {n}", date=day,
                  semantic_type=semantic_type, fact=fact or {}, refs=[f"{resource_type}/r{n}"],
                  concepts=concepts or [])
    return ops.Item(Evidence(chunk, 0.0))


def a1c(n: int, day: str, value: float) -> ops.Item:
    return item(n, day, fact={"kind": "measurement", "name": "HbA1c", "value": {"text": f"{value} %",
                                                                             "quantity": {"value": value}}})


def visit(n: int, day: str, end: str = "", klass: str = "EMER", reasons=("Fracture of clavicle",)) -> ops.Item:
    return item(n, day, "Encounter", {"kind": "encounter", "encounter_class": klass, "types": ["Emergency room admission"],
                                      "reasons": list(reasons), "end": end, "locations": ["General Hospital"]},
                "encounter")


def cited_marks(text: str) -> set[int]:
    marks = set()
    for first, last in re.findall(r"\[(\d+)\](?:–\[(\d+)\])?", text):
        marks |= set(range(int(first), int(last or first) + 1))
    return marks


def part(operation: str, window: Window = ALL_TIME, target: Target | None = None, **kw) -> PlanPart:
    return PlanPart(operation, target or Target("concept", "HbA1c results", keys=("lex:hemoglobin a1c",)), window, **kw)


NEWEST_FIRST = [a1c(3, "2025-06-01", 6.1), a1c(2, "2024-11-01", 6.4), a1c(1, "2023-05-01", 7.0)]


def test_count_states_the_number_first_and_cites_every_item():
    outcome = ops.count(part("count", Window("2024-01-01", "2025-08-01", "since 2024-01-01", "today")),
                        ops.in_window(NEWEST_FIRST, Window("2024-01-01", "2025-08-01")))
    lead = outcome.statements[0].text
    assert lead.startswith("2 HbA1c results since 2024-01-01 [1]–[2]; the latest on 2025-06-01 [1]")
    assert len(outcome.cited) == 2 and cited_marks(lead) == {1, 2}


def test_the_window_is_applied_before_anything_is_stated():
    window = Window("", "2024-08-01", "until 2024-08-01", "today")
    inside = ops.in_window(NEWEST_FIRST, window)
    assert [i.day for i in inside] == ["2023-05-01"]
    text = " ".join(s.text for s in ops.count(part("count", window), inside).statements)
    assert "2025-06-01" not in text and "2024-11-01" not in text


def test_an_empty_window_says_none_is_recorded_in_it():
    outcome = ops.count(part("count", Window("2025-07-01", "2025-08-01", "since 2025-07-01", "today")), [])
    assert outcome.statements[0].text == "No HbA1c results are recorded since 2025-07-01." and not outcome.cited


def test_a_long_list_folds_into_the_evidence_with_its_count_kept():
    many = [visit(n, f"2024-02-{28 - n:02d}", klass="HH") for n in range(20)]
    outcome = ops.count(part("count", target=Target("visit", "home health visits", visit_codes=("HH",))), many)
    assert outcome.statements[0].text.startswith("20 home health visits [1]–[20]")
    assert "and 12 more in the evidence list [9]–[20]." in outcome.statements[1].text
    assert len(outcome.cited) == 20 and outcome.statements[1].citations == list(range(1, 21))


def test_latest_and_first():
    latest = ops.pick(part("latest"), NEWEST_FIRST)
    first = ops.pick(part("first"), NEWEST_FIRST)
    assert "2025-06-01" in latest.statements[0].text and latest.cited == [NEWEST_FIRST[0]]
    assert "2023-05-01" in first.statements[0].text and first.cited == [NEWEST_FIRST[-1]]
    assert "of 3 HbA1c results" in first.statements[0].text


def test_exists_names_the_asked_target_or_says_it_is_absent():
    yes = ops.exists(part("exists"), NEWEST_FIRST)
    assert yes.statements[0].text.startswith("Yes: 3 HbA1c results [1]–[3]")
    no = ops.exists(part("exists", Window("2025-07-01", "2025-08-01", "since 2025-07-01", "today")), [])
    assert no.statements[0].text.startswith("No HbA1c results are recorded since 2025-07-01") and not no.cited


def test_duration_from_the_encounter_period_with_its_place():
    stay = visit(1, "2025-04-16", "2025-05-12", "IMP")
    outcome = ops.duration(part("duration", target=EMERGENCY), [stay], organisation=lambda i: "Ellicott Center")
    text = outcome.statements[0].text
    assert text.startswith("26 days: admitted 2025-04-16, discharged 2025-05-12")
    assert "Ellicott Center" in text and "General Hospital" in text and "[1]" in text


def test_a_same_day_stay():
    outcome = ops.duration(part("duration", target=EMERGENCY), [visit(1, "2025-01-02", "2025-01-02")])
    assert outcome.statements[0].text.startswith("The same day")


def order(n: int, day: str, drug: str, frequency: str = "once daily") -> ops.Item:
    return item(n, day, "MedicationRequest", {"kind": "medication", "medication": drug,
                                              "doses": [{"amount": {"text": "1"}, "frequency": frequency}]},
                "medication")


def test_change_states_each_step_of_the_dose():
    orders = [order(4, "2024-05-01", "lisinopril 10 MG Oral Tablet"), order(3, "2023-05-01", "lisinopril 10 MG Oral Tablet"),
              order(2, "2022-05-01", "lisinopril 20 MG Oral Tablet"), order(1, "2021-05-01", "lisinopril 20 MG Oral Tablet")]
    outcome = ops.change(part("change", target=Target("concept", "lisinopril", keys=("rx:29046",))), orders)
    text = outcome.statements[0].text
    assert "lisinopril 20 MG Oral Tablet, once daily on 2021-05-01 [1] → lisinopril 10 MG Oral Tablet, once daily on 2022-05-01" \
           not in text        # the step is the order that changed, not the first of the old dose
    assert "20 MG Oral Tablet, once daily on 2021-05-01 [1] → lisinopril 10 MG Oral Tablet, once daily on 2023-05-01 [2]" in text
    assert text.startswith("Lisinopril, 1 dose change:")


def test_no_change_is_said_with_the_span():
    orders = [order(2, "2024-05-01", "lisinopril 10 MG Oral Tablet"), order(1, "2021-05-01", "lisinopril 10 MG Oral Tablet")]
    text = ops.change(part("change", target=Target("concept", "lisinopril")), orders).statements[0].text
    assert text == ("No dose change recorded: 2 orders of lisinopril 10 MG Oral Tablet, once daily, "
                    "from 2021-05-01 [1] to 2024-05-01 [2].")


def test_a_value_change_lists_each_value():
    text = ops.change(part("change"), NEWEST_FIRST).statements[0].text
    assert "7.0 % on 2023-05-01 [1] → 6.4 % on 2024-11-01 [2] → 6.1 % on 2025-06-01 [3]" in text


def test_compare_two_periods():
    now = Window("2025-01-01", "2025-08-01", "since 2025-01-01", "absolute")
    then = Window("2024-01-01", "2024-12-31", "in 2024", "absolute")
    outcome = ops.compare(part("compare", now, compare_with=then), NEWEST_FIRST)
    text = outcome.statements[0].text
    assert "6.1 % on 2025-06-01 [1]" in text and "in 2024: 6.4 % on 2024-11-01 [2]" in text and "lower than then" in text
    missing = ops.compare(part("compare", now, compare_with=Window("2019-01-01", "2019-12-31", "in 2019")), NEWEST_FIRST)
    assert missing.statements[0].text.startswith("No HbA1c results are recorded in 2019")


def test_compare_plan_reads_the_named_year():
    plan = plan_question("a1c better or worse than 2024?", TODAY, [A1C]).parts[0]
    assert plan.window.start == "2025-01-01" and plan.compare_with.words == "in 2024"


def test_compare_plan_reads_now_against_last_year():
    plan = plan_question("a1c now vs last year", TODAY, [A1C]).parts[0]
    assert plan.operation == "compare"
    assert (plan.window.start, plan.window.end) == ("2025-01-01", "2025-08-01")
    assert (plan.compare_with.start, plan.compare_with.end, plan.compare_with.words) == ("2024-01-01", "2024-12-31", "in 2024")
    assert plan_question("a1c last year", TODAY, [A1C]).parts[0].operation == "list"


def bmi(n: int, day: str, value: float, percentile: bool = False) -> ops.Item:
    name, code, unit = (("Body mass index (BMI) [Percentile] Per age and sex", "59576-9", "%") if percentile
                        else ("Body mass index (BMI) [Ratio]", "39156-5", "kg/m2"))
    return item(n, day, fact={"kind": "measurement", "name": name, "codes": [{"system": "http://loinc.org", "code": code}],
                              "value": {"text": f"{value} {unit}", "quantity": {"value": value}}}, semantic_type="vital")


def test_a_comparison_compares_one_measurement_not_another_code_of_the_same_concept():
    """A child's BMI and BMI-for-age percentile both assert "body mass index": the BMI of 2024 is
    compared with the BMI of 2023, not with the percentile taken at the same visit."""
    items = [bmi(4, "2024-11-19", 90.8, percentile=True), bmi(3, "2024-11-19", 27.9),
             bmi(2, "2023-11-14", 92.1, percentile=True), bmi(1, "2023-11-14", 27.6)]
    target = Target("concept", "body mass index", keys=("lex:body mass index",))
    outcome = ops.compare(part("compare", Window("2024-01-01", "2025-08-01", "since 2024-01-01"), target,
                               compare_with=Window("2023-01-01", "2023-12-31", "in 2023")), items)
    said = outcome.statements[0].text
    assert "27.9 kg/m2 on 2024-11-19 [1]; in 2023: 27.6 kg/m2 on 2023-11-14 [2] (higher than then)" in said, said
    assert "%" not in said


def test_items_are_the_target_itself():
    denied = item(1, "2024-01-01", concepts=[{"key": "lex:hemoglobin a1c", "negated": True}])
    asserted = item(2, "2024-01-01", concepts=[{"key": "lex:hemoglobin a1c", "negated": False}])
    trend = item(3, "2024-01-01", fact={"kind": "series", "window": "last 90 days"},
                 concepts=[{"key": "lex:hemoglobin a1c", "negated": False}])
    target = Target("concept", "HbA1c results", keys=("lex:hemoglobin a1c",))
    assert [ops.is_item(i.chunk, target) for i in (denied, asserted, trend)] == [False, True, False]
    assert ops.is_item(visit(4, "2024-01-01").chunk, EMERGENCY)
    assert not ops.is_item(visit(5, "2024-01-01", klass="AMB").chunk, EMERGENCY)


# --- end to end: a hand-written record, indexed and asked with a fixed today --------------------------

PID = "ops-1"
SUBJECT = {"reference": f"Patient/{PID}"}
SNOMED, RXNORM = "http://snomed.info/sct", "http://www.nlm.nih.gov/research/umls/rxnorm"
ACT = "http://terminology.hl7.org/CodeSystem/v3-ActCode"


def coded(system, code, display):
    return {"coding": [{"system": system, "code": code, "display": display}], "text": display}


def encounter(eid: str, klass: str, start: str, end: str, kind: str, reason: str = "") -> dict:
    r = {"resourceType": "Encounter", "id": eid, "status": "finished", "subject": SUBJECT,
         "class": {"system": ACT, "code": klass}, "type": [coded(SNOMED, "50849002", kind)],
         "period": {"start": start, "end": end}, "serviceProvider": {"display": "Mercy General Hospital"},
         "location": [{"location": {"display": "Mercy General Hospital, 3rd floor"}}]}
    if reason:
        r["reasonCode"] = [coded(SNOMED, "58150001", reason)]
    return r


def ops_record() -> list[dict]:
    return [
        {"resourceType": "Patient", "id": PID, "gender": "female", "birthDate": "1960-01-01"},
        encounter("ed-1", "EMER", "2023-01-05T10:00:00Z", "2023-01-05T14:00:00Z", "Emergency room admission"),
        encounter("ed-2", "EMER", "2024-09-01T10:00:00Z", "2024-09-01T13:00:00Z", "Emergency room admission"),
        encounter("ed-3", "EMER", "2025-03-01T10:00:00Z", "2025-03-01T12:00:00Z", "Emergency room admission",
                  "Fracture of clavicle"),
        encounter("imp-1", "IMP", "2025-04-16T08:00:00Z", "2025-05-12T11:00:00Z", "Hospital admission",
                  "Fracture of clavicle"),
        encounter("tx-1", "IMP", "2019-04-18T10:00:00Z", "2019-04-25T18:00:00Z",
                  "Admission to surgical transplant department", "Awaiting transplantation of kidney"),
        encounter("hd-1", "AMB", "2019-05-02T10:00:00Z", "2019-05-02T14:00:00Z", "Hemodialysis",
                  "Awaiting transplantation of kidney"),
        *[{"resourceType": "MedicationRequest", "id": mid, "status": status, "intent": "order", "subject": SUBJECT,
           "authoredOn": day, "medicationCodeableConcept": coded(RXNORM, code, name)}
          for mid, status, day, code, name in (
              ("lis-1", "completed", "2021-02-01", "314077", "lisinopril 20 MG Oral Tablet"),
              ("lis-2", "completed", "2022-02-01", "314077", "lisinopril 20 MG Oral Tablet"),
              ("lis-3", "active", "2023-06-01", "314076", "lisinopril 10 MG Oral Tablet"))],
    ]


@pytest.fixture(scope="module")
def ops_service(tmp_path_factory, embedder):
    service = indexed_record(tmp_path_factory.mktemp("ops"), ops_record())
    yield service
    service.close()


def ask(service, question: str) -> dict:
    return service.ask("t", PID, question, today=TODAY)


def every_mark_opens_the_evidence(result: dict) -> bool:
    refs = {c["n"]: c["ref"] for c in result["citations"]}
    listed = {e["ref"] for e in result["evidence"]}
    return all(n in refs and refs[n] in listed for n in cited_marks(result["answer"]))


def test_a_count_of_visits_in_a_window_relative_to_today(ops_service):
    result = ask(ops_service, "how many ED visits in the last year")
    assert result["answer"].startswith("2 emergency visits since 2024-08-01 [1]–[2]; the latest on 2025-03-01 [1]")
    assert "2023-01-05" not in result["answer"]          # outside the window: never stated as inside
    assert every_mark_opens_the_evidence(result)
    assert result["diagnostics"]["question_plan"]["parts"][0]["operation"] == "count"


def test_length_of_stay_and_where(ops_service):
    result = ask(ops_service, "how long was she in for the last admission")
    assert result["answer"].startswith("26 days: admitted 2025-04-16, discharged 2025-05-12")
    assert "Mercy General Hospital" in result["answer"] and every_mark_opens_the_evidence(result)


def test_length_of_stay_for_a_kind_of_record_is_the_stay_whose_type_names_it(ops_service):
    """"How long was she in for the transplant" names procedures, not one: the stay is the visit
    whose type says transplant, not the newer dialysis visit whose reason does."""
    result = ask(ops_service, "how long was she in for the transplant")
    assert result["answer"].startswith("7 days: admitted 2019-04-18, discharged 2019-04-25"), result["answer"]
    assert "Hemodialysis" not in result["answer"] and every_mark_opens_the_evidence(result)
    part = plan_question("how long was she in for the transplant", TODAY, [], ("procedure",)).parts[0]
    assert part.operation == "duration" and part.target.event_word == "transplant"


def test_the_dose_change_is_stated_not_folded(ops_service):
    result = ask(ops_service, "dose change on lisinopril?")
    assert "lisinopril 20 MG Oral Tablet on 2021-02-01 [1] → lisinopril 10 MG Oral Tablet on 2023-06-01 [2]" \
        in result["answer"]
    assert every_mark_opens_the_evidence(result)


def test_an_empty_window_relative_to_today_cites_the_nearest_outside_it(ops_service):
    result = ask(ops_service, "any ED visits since last month?")
    assert result["answer"].startswith("No emergency visits are recorded since 2025-07-01, the nearest outside that "
                                       "window emergency visit (Emergency room admission) on 2025-03-01")
    assert [c["ref"] for c in result["citations"]] == ["Encounter/ed-3"] and every_mark_opens_the_evidence(result)


def test_a_class_with_nothing_recorded_is_said_absent_and_cites_nothing(ops_service):
    result = ask(ops_service, "how many home health visits this yr")
    assert result["answer"] == "No home health visits are recorded since 2025-01-01." and result["abstained"]
    assert not result["citations"]


# --- the evaluation's figures for these questions ------------------------------------------------------

def test_a_count_is_right_only_when_the_first_sentence_states_it():
    from search.evaluate import count_stated

    q = {"count": 11, "kind": "count"}
    assert count_stated({"answer": "11 basic metabolic panels since 2023-12-01 [1]–[11]; the latest on 2025-07-20 [1]."}, q) == 1.0
    assert count_stated({"answer": "Basic metabolic panel on 2025-07-20 [1]. There were 11 in all [1]."}, q) == 0.0
    assert count_stated({"answer": "12 basic metabolic panels [1]–[12]."}, q) == 0.0
    assert count_stated({"answer": "No emergency visits are recorded since 2024-08-01."}, {"count": 0}) == 1.0
    assert count_stated({"answer": "Emergency visit on 2025-03-01 [1]."}, {"count": 0}) == 0.0
    assert count_stated({"answer": "anything"}, {"kind": "lab"}) is None


def test_visit_facts_score_only_visit_questions():
    from search.evaluate import visit_facts

    result = {"answer": "26 days: admitted 2025-04-16, discharged 2025-05-12 [1]."}
    assert visit_facts(result, {"kind": "duration", "facts": ["2025-04-16", "2025-05-12"]}) == 1.0
    assert visit_facts(result, {"kind": "visit", "facts": ["2025-04-16", "mercy general"]}) == 0.5
    assert visit_facts(result, {"kind": "lab", "facts": ["2025-04-16"]}) is None

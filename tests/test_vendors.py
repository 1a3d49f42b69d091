"""Records as Oracle Health, Epic and a hospital data warehouse (MIMIC-IV on FHIR) send them
(issue 35): nothing valid dropped, every clinical type rendered, answers that use what retrieval
found. The fixtures under tests/data/vendors follow the vendors' published shapes (SOURCE.md)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fhir_ingest.record.chunk import PatientChunker, TextBudget
from fhir_ingest.record.contract import Chunk
from fhir_ingest.record.load import load_resources
from search.retrieval.types import Analysis, Evidence
from search.retrieval.ranking import rerank

VENDORS = Path(__file__).parent / "data" / "vendors"
ORACLE = VENDORS / "oracle-millennium.json"
MIMIC = VENDORS / "mimic-shaped.ndjson"
BUDGET = TextBudget(254, lambda t: len(t.split()))


def chunks_of(path: Path, patient: str | None = None) -> list[Chunk]:
    records, _ = load_resources([path])
    record = next(r for r in records if patient is None or r.patient_id == patient)
    return PatientChunker("t", record.patient_id, record.resources, BUDGET).chunks()


def by_resource(chunks: list[Chunk]) -> dict[str, list[Chunk]]:
    out: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        out.setdefault(f"{chunk.resource_type}/{chunk.resource_id}", []).append(chunk)
    return out


# --- reading ------------------------------------------------------------------------------------

def test_defects_that_change_no_clinical_meaning_keep_the_resource_and_are_said():
    """Oracle's `_` in ids and stray spaces in `meta.lastUpdated` cost a warning, not the record."""
    records, report = load_resources([ORACLE])
    assert report.skipped == []
    warnings = " | ".join(w.reason for w in report.warnings)
    assert "CareTeam/4048128_12724066_97953477_1: its id" in warnings and "'_'" in warnings
    assert "Condition/p73077: meta.lastUpdated ' 2020-06-02T12:30:00.000Z  ' has stray spaces" in warnings
    resources = {f"{r['resourceType']}/{r['id']}": r for r in records[0].resources}
    assert resources["Condition/p73077"]["meta"]["lastUpdated"] == "2020-06-02T12:30:00.000Z"
    assert resources["CareTeam/4048128_12724066_97953477_2"]["id"] == "4048128_12724066_97953477_2"
    chunks = by_resource(chunks_of(ORACLE))
    assert "Inpatient team 1" in chunks["CareTeam/4048128_12724066_97953477_1"][0].text
    assert "Asthma" in chunks["Condition/p73077"][0].text


def test_a_code_system_that_is_not_a_uri_is_said_and_kept_and_only_the_unreadable_skipped(tmp_path):
    lab = {"resourceType": "Observation", "id": "k1", "status": "final", "subject": {"reference": "Patient/p"},
           "code": {"coding": [{"system": "LOCAL LAB", "code": "K", "display": "Potassium"}]},
           "effectiveDateTime": "2024-01-02", "valueQuantity": {"value": 3.1, "unit": "mmol/L"},
           "meta": {"lastUpdated": "yesterday"}, "extension": [{"url": "https://ehr.example/x", "valueQuantity": {"value": "n/a"}},
                                                              {"url": "https://ehr.example/y", "valueString": "kept"}]}
    path = tmp_path / "lab.ndjson"
    path.write_text(json.dumps(lab) + "\n", encoding="utf-8")
    records, report = load_resources([path])
    assert report.skipped == [] and [r["id"] for r in records[0].resources] == ["k1"]
    warned = " | ".join(w.reason for w in report.warnings)
    assert "unknown code system 'LOCAL LAB'" in warned and "meta.lastUpdated cannot be read" in warned
    assert "extension.0.valueQuantity.value cannot be read" in warned
    assert records[0].resources[0]["extension"] == lab["extension"]        # kept as recorded
    # The policy's other side: no type, an unsafe id, no patient, a wrong JSON type still skip.
    base = {"resourceType": "Observation", "status": "final", "code": {"text": "K"},
            "subject": {"reference": "Patient/p"}}
    lines = [dict(base, id="ok"), dict(base, id="a/b"), dict(base, id="x" * 65), dict(base, resourceType=7, id="t"),
             dict(base, id="np", subject={"display": "nobody"}), dict(base, id="wrong", status=["final"])]
    path = tmp_path / "mixed.ndjson"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    records, report = load_resources([path])
    assert [r["id"] for r in records[0].resources] == ["ok"]
    assert [s.origin for s in report.skipped] == [f"mixed.ndjson:{n}" for n in (2, 3, 4, 5, 6)]


def test_the_report_counts_per_type_add_up_to_the_resources_read(tmp_path):
    from smart_app.cli import format_index_summary

    base = {"resourceType": "Observation", "status": "final", "code": {"text": "K"},
            "subject": {"reference": "Patient/p"}}
    lines = [dict(base, id="ok"), dict(base, id="a/b"), dict(base, resourceType=["Observation"], id="t"),
             dict(base, id="wrong", status=["final"])]
    path = tmp_path / "mixed.ndjson"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    _, report = load_resources([path, ORACLE])
    assert report.resources_read == 23
    assert sum(read for _, read, *_ in report.type_rows()) == report.resources_read
    summary = SimpleNamespace(load=report, result=SimpleNamespace(patients=2, embedded=0, unchanged=0, removed=0,
                                                                  chunks=0, problems=[]))
    first = format_index_summary(summary, 1.0).splitlines()[0]
    counts = first.split("(", 1)[1].rstrip(")").split(", ")
    assert sum(int(c.rsplit(" ", 1)[1]) for c in counts) == 23, first


def test_an_entered_in_error_goal_never_becomes_a_chunk():
    chunks = by_resource(chunks_of(ORACLE))
    assert "Goal/GL-1" not in chunks and "Goal/GL-2" in chunks


def test_first_or_last_dose_of_a_drug_whose_records_have_no_date_does_not_crash():
    """`KeyError: 'lex:ipratropium'` in rerank's newest/oldest lookup."""
    concept = [{"key": "lex:ipratropium", "display": "ipratropium", "semantic_type": "medication", "negated": False}]
    undated = Chunk("t", "p", "MedicationAdministration", "a1", "0", "Ipratropium given.", "Given", date="",
                    semantic_type="medication", concepts=concept)
    for first in (True, False):
        analysis = Analysis("first dose of ipratropium?", [dict(concept[0], start=0)], ["ipratropium"],
                            ["medication"], wants_first=first, wants_latest=not first)
        assert [ev.chunk.resource_id for ev in rerank([Evidence(undated, 1.0)], analysis)] == ["a1"]


# --- every clinical type rendered, dates and doses through references ------------------------------

# US Core 6.1's clinical profiles (hl7.org/fhir/us/core/STU6.1/profiles-and-extensions.html) by
# resource type, beside NutritionOrder (diet orders); Location, Organization, Practitioner(Role),
# RelatedPerson and Provenance are directory and record-keeping data, ignored with their reason.
US_CORE_CLINICAL = {"AllergyIntolerance", "CarePlan", "CareTeam", "Condition", "Coverage", "Device", "DiagnosticReport",
                    "DocumentReference", "Encounter", "Goal", "Immunization", "MedicationDispense",
                    "MedicationRequest", "Observation", "Patient", "Procedure", "QuestionnaireResponse",
                    "ServiceRequest", "Specimen", "NutritionOrder"}


def test_every_us_core_clinical_type_becomes_a_chunk_with_its_fact():
    from fhir_ingest.record.kinds import INDEXED_TYPES

    assert US_CORE_CLINICAL <= INDEXED_TYPES, US_CORE_CLINICAL - INDEXED_TYPES
    chunks = by_resource(chunks_of(ORACLE))
    diet = chunks["NutritionOrder/310521907"][0]
    assert "Carbohydrate Controlled Diet" in diet.text and "Pureed" in diet.text and "Nectar thick" in diet.text
    assert diet.fact["name"] == "Carbohydrate Controlled Diet"
    specimen = chunks["Specimen/SP-2020-17"][0]
    assert "Venous blood" in specimen.text and "Hemolyzed" in specimen.text and specimen.date.startswith("2020-06-02")
    demographics = chunks["Patient/12724066"][0].text
    assert "Gender: female" in demographics and "Birth date: 1990-09-15" in demographics
    assert "Language: English" in demographics and "Deceased: no" in demographics
    assert "Wren" not in demographics and "Ada" not in demographics     # never names or identifiers


def test_a_patient_alone_is_still_no_whole_record(tmp_path):
    """The demographics chunk does not make a bundle holding only the Patient a record that may
    replace what is held."""
    from fhir_ingest.record.load import MERGE

    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": {"resourceType": "Patient", "id": "p9", "gender": "male"}}]}
    path = tmp_path / "p9.json"
    path.write_text(json.dumps(bundle), encoding="utf-8")
    records, _ = load_resources([path])
    assert records[0].authority == MERGE
    assert [c.resource_type for c in PatientChunker("t", "p9", records[0].resources, BUDGET).chunks()] == ["Patient"]


def test_text_behind_a_url_a_file_cannot_fetch_is_indexed_by_its_coded_parts_and_said():
    chunks = by_resource(chunks_of(ORACLE))
    report = chunks["DiagnosticReport/197198634"][0].text
    assert "XR Chest 2 Views" in report and "2020-06-03" in report and "text was not included" in report
    assert "text was not included" in chunks["DocumentReference/197198700"][0].text


def test_dates_come_through_the_encounter_and_part_of():
    chunks = by_resource(chunks_of(MIMIC))
    diagnosis = chunks["Condition/c8a5e8b2-4f0b-5c6e-9a3d-1e2f3a4b5c6d"][0]
    assert diagnosis.date.startswith("2180-05-06") and diagnosis.fact["date"].startswith("2180-05-06")
    assert "Diagnosed at the encounter of 2180-05-06" in diagnosis.text
    icu = chunks["Encounter/7e3fa4b1-1d2b-5f0c-9d5e-0c6e1f9b2a44"][0]
    assert icu.date.startswith("2180-05-06")
    assert "Part of the inpatient encounter (URGENT) of 2180-05-06" in icu.text


def test_a_dispense_without_a_dose_states_its_orders_dose():
    dispense = by_resource(chunks_of(MIMIC))["MedicationDispense/4d5e6f7a-8b9c-5d0e-9f1a-2b3c4d5e6f7a"][0]
    assert "Dosage (from the order of 2180-05-07): 40 mg" in dispense.text
    assert dispense.fact["doses"][0]["amount"]["text"] == "40 mg"


def test_an_infusion_states_its_rate_and_a_vaccine_not_given_its_reason():
    chunks = by_resource(chunks_of(ORACLE))
    infusion = chunks["MedicationAdministration/MA-heparin"][0]
    assert "rate 18 unit/kg/h" in infusion.text and infusion.fact["doses"][0]["rate"] == "18 unit/kg/h"
    assert "Not given: Patient refused" in chunks["Immunization/IM-flu-refused"][0].text


# --- answering from what was retrieved ------------------------------------------------------------

def oracle_resources() -> list[dict]:
    records, _ = load_resources([ORACLE])
    return records[0].resources


def lead(question: str, kind: str, key: str, keep=lambda r: True) -> str:
    from tests.test_kinds import lead_of

    return lead_of(question, [r for r in oracle_resources() if keep(r)], kind, key)


def test_a_present_tense_question_about_a_resolved_problem_gets_its_status_before_any_yes():
    said = lead("Is she pregnant?", "problem", "lex:pregnancy", lambda r: r["id"] != "p73077")
    assert said.startswith("Not now — pregnant") and "resolved 2020-04-04" in said, said
    assert lead("Was she ever pregnant?", "problem", "lex:pregnancy", lambda r: r["id"] != "p73077").startswith("Yes")


def test_a_reading_is_stated_with_its_other_components():
    said = lead("what was her SpO2?", "vital", "lex:spo2", lambda r: r["id"] != "VS-temp-ax")
    assert "93%" in said and "with oxygen flow rate 2 l/min" in said.lower(), said


def test_the_given_vaccine_comes_before_a_newer_refused_one():
    said = lead("when did she get a flu vaccine?", "immunization", "lex:influenza vaccine")
    assert said.lower().startswith("influenza vaccine on 2019-10-21"), said
    assert "not done (2020-06-03, patient refused)" in said


def test_an_as_needed_order_is_worded_once_from_its_own_text():
    said = lead("albuterol dose?", "medication", "lex:albuterol")
    assert "2 puff(s) inhaled every 4 hours as needed for wheezing" in said and said.count("as needed") == 1, said


def test_a_part_that_says_it_is_about_what_the_part_before_asked():
    from search.answering.parts import question_parts

    assert question_parts("what was her axillary temperature, and was it flagged?")[1] == \
        "was axillary temperature flagged?"
    assert "peanuts" in question_parts("is she allergic to peanuts? how serious is it")[1]


def test_an_icu_stay_part_of_an_admission_is_not_called_the_admission():
    from tests.test_kinds import lead_of

    records, _ = load_resources([MIMIC])
    said = lead_of("when was the ICU stay?", records[0].resources, "encounter", "lex:icu")
    icu = next(clause for clause in said.split("; ") if "intensive care" in clause)
    assert "intensive care unit (part of the inpatient encounter (URGENT) of 2180-05-06) on 2180-05-06" in icu, said
    assert "hospital admission" not in icu


# --- the top evidence item answers: no "no evidence" beside it (issue 35) -------------------------

@pytest.fixture(scope="module")
def oracle_service(tmp_path_factory):
    from search.service import SearchService

    service = SearchService("embedded", tmp_path_factory.mktemp("oracle") / "index.sqlite")
    assert not service.index_paths("t", [ORACLE]).load.skipped
    yield service
    service.close()


def ask(service, question: str) -> dict:
    return service.ask("t", "12724066", question, use_llm=False)


def test_a_point_of_care_value_is_stated_when_the_record_writes_its_initialism(oracle_service):
    """"point-of-care" is in no form in the record, which says "POC": the top item's typed fact
    carries the glucose asked about, so its value is the answer, not "no evidence"."""
    result = ask(oracle_service, "point-of-care glucose value?")
    assert not result["abstained"], result["answer"]
    assert result["answer"].startswith("POC Glucose 212 mg/dL (high) on 2020-06-02 [1]"), result["answer"]


def test_a_word_the_top_item_does_not_carry_still_means_no_evidence(oracle_service):
    """Fail safe: the glucose result does not answer a point-of-care hemoglobin."""
    result = ask(oracle_service, "point-of-care hemoglobin?")
    assert result["abstained"] and not result["citations"], result["answer"]


def test_the_initialism_of_a_question_word_is_found_in_the_item():
    from search.answering.answer import word_in_item

    assert word_in_item("point-of-care", "2020-06-02 · Lab · POC Glucose 212 mg/dL High")
    assert not word_in_item("x-ray", "XR Chest 2 Views")      # two letters: too likely a word by chance
    assert not word_in_item("point-of-care", "Glucose 212 mg/dL (poco loco)")
    assert word_in_item("fasting", "Fasting glucose 98 mg/dL")


def test_asked_why_a_vaccine_was_not_given_the_refusal_and_its_reason_come_first(oracle_service):
    for question in ("why was the flu vaccine not given?", "did she refuse the flu shot?"):
        said = ask(oracle_service, question)["answer"]
        assert said.startswith("Influenza vaccine not done (2020-06-03, patient refused) [1]"), said
    said = ask(oracle_service, "when did she get a flu vaccine?")["answer"]
    assert said.startswith("Influenza vaccine on 2019-10-21 [1]"), said


def test_how_often_of_an_as_needed_order_is_its_frequency_not_a_count_or_no_evidence(oracle_service):
    for question in ("how often is albuterol given?", "how much albuterol and how often?"):
        result = ask(oracle_service, question)
        said = result["answer"]
        assert said.startswith("Albuterol inhaler, 2 puff(s) inhaled every 4 hours as needed for wheezing"), said
        assert "I don't have evidence" not in said and not result["abstained"], said


def test_a_measurement_the_record_never_holds_is_said_to_be_absent_first(oracle_service):
    """"whats the a1c" for a patient with no A1c: that none is recorded is the answer, said before
    anything else, and nothing is cited for it."""
    result = ask(oracle_service, "whats the a1c")
    assert result["abstained"] and not result["citations"], result["answer"]
    assert result["answer"].startswith("No hemoglobin a1c is recorded among the patient's results."), result["answer"]


def test_this_admission_is_the_stay_not_the_whole_record(oracle_service):
    """"This admission" is the inpatient stay of 2020-06-01 to 06-04: the vaccine given in 2019 is
    not a "Yes" for it; the refusal during the stay is the answer."""
    result = ask(oracle_service, "was she vaccinated against influenza this admission?")
    said = result["answer"]
    assert not said.startswith("Yes") and "2019-10-21" not in said, said
    assert said.startswith("No — influenza vaccine not done (2020-06-03, patient refused) [1]"), said


def test_a_yes_rests_only_on_entries_in_the_asked_window(oracle_service):
    """A retrieved entry from outside "in 2015" does not make the answer "Yes"."""
    result = ask(oracle_service, "was she vaccinated against influenza in 2015?")
    assert not result["answer"].startswith("Yes") and result["abstained"], result["answer"]
    assert "recorded among the patient's immunizations between 2015-01-01 and 2015-12-31" in result["answer"]
    assert ask(oracle_service, "any flu vaccine in 2019?")["answer"].startswith("Yes — influenza vaccine on 2019-10-21")


def test_a_question_word_is_found_through_another_name_of_the_same_test(oracle_service):
    """"fingerstick" is in no form in the record, which says "POC Glucose": labs.tsv names both the
    same capillary glucose test, so the POC value answers "fingerstick bg?"."""
    from search.answering.answer import word_in_item
    from search.nlp import terminology

    assert {"poc glucose", "capillary glucose"} <= terminology.lab_synonyms("fingerstick")
    assert "glucose" not in terminology.lab_synonyms("fingerstick")     # shared by other tests: not a synonym
    assert word_in_item("fingerstick", "2020-06-02 · Lab · POC Glucose 212 mg/dL High")
    assert not word_in_item("fingerstick", "Glucose [Mass/volume] in Blood 98 mg/dL")
    result = ask(oracle_service, "fingerstick bg?")
    assert result["answer"].startswith("POC Glucose 212 mg/dL (high) on 2020-06-02 [1]"), result["answer"]
    assert ask(oracle_service, "fingerstick hemoglobin?")["abstained"]

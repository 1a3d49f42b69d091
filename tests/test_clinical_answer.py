"""The answer first, in clinical words (issue 15): the first sentence for each kind of question,
written from hand-made FHIR resources exactly as the specification shapes them, and the metrics
`chartcite eval` prints about how an answer reads. No index and no embedding model."""
from __future__ import annotations

from datetime import date

from fhir_ingest.record.contract import Chunk
from fhir_ingest.record.kinds import fact_of
from fhir_ingest.record.kinds.medications import doses_of
from search.answering.answer import numbered
from search.answering.clinical import dosage_words, drug_name, observation_name, unit, value_words
from search.answering.lead import first_sentence
from search.evaluate import answer_words, first_sentence_facts, sentences, uncited_clauses
from search.retrieval.types import Analysis, Evidence

LOINC = "http://loinc.org"
OLD = f"{date.today().year - 20}-04-03"
RECENT = f"{date.today().year}-01-15"


def observation(oid: str, code: str, display: str, value: float, unit_code: str, when: str, **extra) -> dict:
    return {"resourceType": "Observation", "id": oid, "status": "final", "effectiveDateTime": when,
            "code": {"coding": [{"system": LOINC, "code": code, "display": display}]},
            "valueQuantity": {"value": value, "unit": unit_code, "system": "http://unitsofmeasure.org"}, **extra}


def order(oid: str, drug: str, status: str, when: str, **extra) -> dict:
    return {"resourceType": "MedicationRequest", "id": oid, "status": status, "intent": "order", "authoredOn": when,
            "medicationCodeableConcept": {"text": drug}, **extra}


def evidence(resource: dict, semantic_type: str, keys: list[str], category: str = "", resolve=lambda ref: None) -> Evidence:
    """Evidence as indexing makes it: the chunk carries its resource's typed fact (by its kind)."""
    concepts = [{"key": k, "display": k.split(":")[-1], "semantic_type": semantic_type, "negated": False} for k in keys]
    fact = fact_of(resource, resolve)
    chunk = Chunk("t", "p", resource["resourceType"], resource["id"], "0", "text", "label",
                  date=resource.get("effectiveDateTime") or resource.get("authoredOn") or "", semantic_type=semantic_type,
                  category=category, concepts=concepts, refs=[f"{resource['resourceType']}/{resource['id']}"],
                  fact=fact.to_dict() if fact else {})
    return Evidence(chunk, 1.0)


def answer_to(question: str, resources: list[tuple[dict, str, list[str]]], asked: list[tuple[str, str]], **wants):
    """(lead text, the Lead) for a question whose analysis names `asked` (key, semantic type)."""
    by_ref = {f"{r['resourceType']}/{r['id']}": r for r, _, _ in resources}
    relevant = [evidence(r, kind, keys, "laboratory" if kind == "lab" else "", by_ref.get) for r, kind, keys in resources]
    concepts = [{"key": k, "display": k.split(":")[-1], "semantic_type": t, "negated": False, "role": "", "start": i}
                for i, (k, t) in enumerate(asked)]
    analysis = Analysis(question, concepts, question.lower().split(), [t for _, t in asked], **wants)
    lead = first_sentence(analysis, relevant, lambda ev: "")
    statements, citations = numbered([lead.draft])
    return statements[0].text, lead, citations


A1C = [observation(f"a{i}", "4548-4", "Hemoglobin A1c/Hemoglobin.total in Blood", v, "%", d,
                   referenceRange=[{"high": {"value": 5.7, "unit": "%"}}])
       for i, (v, d) in enumerate([(6.14, "2023-05-15"), (5.96, "2024-05-20"), (5.92, "2025-05-26")])]


def test_a_trend_says_direction_first_and_last_with_dates_and_every_value_cited():
    text, lead, citations = answer_to("How has her A1c trended?", [(r, "lab", ["lex:hemoglobin a1c"]) for r in A1C],
                                      [("lex:hemoglobin a1c", "lab")], wants_trend=True)
    assert text == ("HbA1c fell from 6.14% on 2023-05-15 to 5.92% on 2025-05-26 (3 results: 6.14% → 5.96% → 5.92%) "
                    "[1] [2] [3].")
    assert [c.ref for c in citations] == ["Observation/a0", "Observation/a1", "Observation/a2"]
    chart = __import__("search.answering.charts", fromlist=["series_chart"]).series_chart(lead.series[0])
    assert chart["title"] == "HbA1c" and chart["unit"] == "%" and chart["range"] == {"low": None, "high": 5.7}
    assert chart["full_title"].startswith("Hemoglobin A1c") and [p["date"] for p in chart["points"]][0] == "2023-05-15"


def test_a_latest_value_comes_with_its_flag_and_the_previous_value_for_comparison():
    potassium = [observation("k1", "6298-4", "Potassium [Moles/volume] in Blood", 4.2, "mmol/L", "2024-05-20"),
                 observation("k2", "6298-4", "Potassium [Moles/volume] in Blood", 5.9, "mmol/L", "2025-05-26",
                             interpretation=[{"coding": [{"code": "H", "display": "High"}]}])]
    text, _, _ = answer_to("latest K+?", [(r, "lab", ["lex:potassium"]) for r in reversed(potassium)],
                           [("lex:potassium", "lab")], wants_latest=True)
    assert text == "K+ 5.9 mmol/L (high) on 2025-05-26 [1]; previous 4.2 mmol/L on 2024-05-20 [2]."


def test_blood_pressure_reads_systolic_over_diastolic_whatever_the_component_order():
    bp = {"resourceType": "Observation", "id": "bp", "status": "final", "effectiveDateTime": "2022-10-21",
          "code": {"coding": [{"system": LOINC, "code": "85354-9", "display": "Blood pressure panel"}]},
          "component": [{"code": {"coding": [{"system": LOINC, "code": "8462-4"}]}, "valueQuantity": {"value": 98, "unit": "mm[Hg]"}},
                        {"code": {"coding": [{"system": LOINC, "code": "8480-6"}]}, "valueQuantity": {"value": 116, "unit": "mm[Hg]"}}]}
    text, _, _ = answer_to("BP at the Oct 2022 physical?", [(bp, "vital", ["lex:blood pressure"])],
                           [("lex:blood pressure", "vital")], date_from="2022-10-01", date_to="2022-10-31")
    assert text == "BP 116/98 mmHg on 2022-10-21 [1]."


def test_current_medications_are_active_orders_newest_per_drug_and_old_ones_are_marked():
    orders = [order("m1", "Clopidogrel 75 MG Oral Tablet", "active", OLD),
              order("m2", "aspirin 81 MG Oral Tablet", "completed", RECENT),
              order("m3", "aspirin 81 MG Oral Tablet", "active", RECENT,
                    dosageInstruction=[{"timing": {"repeat": {"frequency": 1, "period": 1, "periodUnit": "d"}}}])]
    keys = ["lex:antiplatelet"]
    text, _, _ = answer_to("Is he on a blood thinner?", [(r, "medication", keys) for r in orders],
                           [("lex:antiplatelet", "medication")])
    assert text == (f"Yes — Clopidogrel 75 mg oral tablet, marked active but ordered {OLD}, may be outdated [1]; "
                    f"aspirin 81 mg oral tablet, once daily, active since {RECENT} [2].")


def test_yes_only_when_the_sentence_lists_what_was_asked():
    # The order found is not what the question names: no "Yes —" in front of it.
    text, _, _ = answer_to("Is she on an IUD?", [(order("m1", "Errin 28 Day Pack", "active", RECENT), "medication",
                                                  ["lex:errin"])], [("lex:intrauterine device", "medication")])
    assert not text.startswith("Yes")


def test_no_only_when_the_record_states_the_negative():
    refuted = {"resourceType": "AllergyIntolerance", "id": "al", "recordedDate": "2020-02-02",
               "verificationStatus": {"coding": [{"code": "refuted"}]}, "code": {"text": "Penicillin"}}
    text, _, _ = answer_to("Is she allergic to penicillin?", [(refuted, "allergy", ["lex:penicillin"])],
                           [("lex:penicillin", "allergy")])
    assert text == "No — an allergy to penicillin is recorded as refuted (2020-02-02) [1]."
    skipped = {"resourceType": "Immunization", "id": "im", "status": "not-done", "occurrenceDateTime": "2024-10-01",
               "vaccineCode": {"text": "Influenza vaccine"}, "statusReason": {"text": "Patient declined"}}
    text, _, _ = answer_to("Did he get a flu shot?", [(skipped, "immunization", ["lex:influenza vaccine"])],
                           [("lex:influenza vaccine", "immunization")])
    assert text == "No — influenza vaccine not done (2024-10-01, patient declined) [1]."


def test_a_reason_is_given_when_asked_why():
    problem = {"resourceType": "Condition", "id": "c1", "code": {"text": "Osteoporosis (disorder)"}}
    fosamax = order("m1", "Alendronic acid 10 MG Oral Tablet", "completed", "2022-05-09",
                    reasonReference=[{"reference": "Condition/c1"}])
    by_ref = {"Condition/c1": problem, "MedicationRequest/m1": fosamax}
    analysis = Analysis("Why is she on Fosamax?", [{"key": "lex:alendronate", "semantic_type": "medication", "display": "x"}],
                        ["fosamax"], ["medication"], wants_why=True)
    lead = first_sentence(analysis, [evidence(fosamax, "medication", ["lex:alendronate"], resolve=by_ref.get)], lambda ev: "")
    assert numbered([lead.draft])[0][0].text == ("Alendronic acid 10 mg oral tablet, completed, ordered 2022-05-09, "
                                                 "for osteoporosis [1].")


def test_clinical_words_for_coded_names_units_and_doses():
    assert observation_name({"coding": [{"system": LOINC, "code": "33914-3", "display": "Glomerular filtration rate…"}]}) == "eGFR"
    assert observation_name({"coding": [{"system": "urn:epic", "code": "1", "display": "Platelets [#/volume] in Blood by Automated count"}]}) == "Platelets"
    assert drug_name("NDA020800 0.3 ML Epinephrine 1 MG/ML Auto-Injector") == "0.3 mL Epinephrine 1 mg/mL auto-injector"
    assert drug_name("24 HR metoprolol succinate 100 MG Extended Release Oral Tablet") == "24 hr metoprolol succinate 100 mg ER oral tablet"
    assert value_words({"value": 37.888, "unit": "Cel"}) == "37.888 °C"
    assert value_words({"value": 6.3, "unit": "%"}) == "6.3%" and value_words({"value": 99, "unit": "/min"}) == "99/min"
    assert unit("{score}") == "" and unit("mm[Hg]") == "mmHg"
    assert dosage_words(doses_of([{"text": "Take as needed.", "asNeededBoolean": True}])) == "as needed"
    assert dosage_words(doses_of([{"timing": {"repeat": {"frequency": 2, "period": 1, "periodUnit": "d"}}}])) == "twice daily"
    assert dosage_words(doses_of([{"timing": {"repeat": {"frequency": 1, "period": 6, "periodUnit": "h"}},
                                   "asNeededBoolean": True}])) == "every 6 hours, as needed"
    assert dosage_words(doses_of([{"text": "Take 1 tablet by mouth daily"}])) == "Take 1 tablet by mouth daily"
    ranged = [{"doseAndRate": [{"doseRange": {"low": {"value": 1, "unit": "tablet"}, "high": {"value": 2, "unit": "tablet"}}}],
               "timing": {"repeat": {"frequency": 1, "period": 6, "periodUnit": "h"}}}]
    assert dosage_words(doses_of(ranged)) == "1-2 tablet every 6 hours"
    # As Synthea writes an order: a coded instruction, a count of no unit, and the timing again.
    coded = [{"text": "Every six hours (qualifier value)", "timing": {"repeat": {"frequency": 4, "period": 1.0, "periodUnit": "d"}},
              "doseAndRate": [{"doseQuantity": {"value": 1.0}}]}]
    assert dosage_words(doses_of(coded), "Acetaminophen 325 MG / Oxycodone Hydrochloride 10 MG Oral Tablet") == \
        "1 tablet every six hours"
    daily = [{"timing": {"repeat": {"frequency": 2, "period": 1.0, "periodUnit": "d"}}, "doseAndRate": [{"doseQuantity": {"value": 2}}]}]
    assert dosage_words(doses_of(daily), "amLODIPine 2.5 MG Oral Capsule") == "2 capsules twice daily"
    assert dosage_words(doses_of(daily), "Insulin Lispro 100 UNT/ML Injectable Solution") == "twice daily"


def test_the_reading_metrics_count_words_first_sentence_facts_and_uncited_clauses():
    answer = {"abstained": False, "answer": 'HbA1c 6.31% on 2023-02-01 [1]. The note of 2004-01-07 says: "Patient is '
                                            'prediabetic. Diet advised." [2]. Prediabetes since 2004; anemia [3].'}
    assert sentences(answer["answer"])[0] == "HbA1c 6.31% on 2023-02-01 [1]."
    assert len(sentences(answer["answer"])) == 3          # the quoted note stays one sentence
    assert uncited_clauses(answer) == 1                    # "Prediabetes since 2004" cites nothing
    assert first_sentence_facts(answer, ["6.31", "prediabetic"]) == 0.5
    assert answer_words("HbA1c 6.31% on 2023-02-01 [1] [2].") == 4
    assert uncited_clauses({"abstained": True, "answer": "I don't have evidence for that."}) == 0
    # One part of a question unanswered says so and claims nothing: not an uncited statement.
    assert uncited_clauses({"abstained": False, "answer": "PHQ-9 25 on 2024-10-29 [1]. I don't have evidence for "
                                                          "that in this patient's record for “any SSRI”."}) == 0


def test_a_resource_the_sentence_writer_cannot_read_falls_back_to_the_records_words(caplog):
    from search.answering.answer import clinical_statements
    from search.retrieval.types import Retrieval

    odd = order("m1", "Clopidogrel 75 MG Oral Tablet", "active", RECENT)
    ev = evidence(odd, "medication", ["lex:clopidogrel"])
    ev.chunk.fact["doses"] = "a stored fact of a shape no writer expects"
    analysis = Analysis("Is he on clopidogrel?", [{"key": "lex:clopidogrel", "semantic_type": "medication",
                                                   "display": "clopidogrel"}], ["clopidogrel"], ["medication"])
    retrieval = Retrieval.__new__(Retrieval)
    retrieval.analysis, retrieval.evidence = analysis, [ev]
    statements, citations, _ = clinical_statements(retrieval, [ev])
    assert statements and statements[0].text.startswith("Text") and citations[0].ref == "MedicationRequest/m1"
    assert "writing the first sentence failed" in caplog.text

"""The ends of a long series answer "latest" and "first" (issue 44, item 3): a patient with 300
monthly weights, most of them the same value, so that the results that rank well for the question
are any of its dates. The answer must rest on the newest (or oldest) result of the whole record."""
from __future__ import annotations

import random
from datetime import date, timedelta

import pytest

from fhir_ingest.record.contract import Chunk
from search.retrieval.types import Evidence
from search.retrieval.ranking import same_test, with_series_ends

from .conftest import indexed_record

PID = "series-1"
WEIGHTS = 300
START = date(2000, 1, 3)


def day(i: int) -> str:
    return (START + timedelta(days=30 * i)).isoformat()


def weights() -> list[dict]:
    """300 weights a month apart: 72.5 kg but every third 80 kg; written in no order of date."""
    subject = {"reference": f"Patient/{PID}"}
    resources = [{"resourceType": "Observation", "id": f"wt-{i:03d}", "status": "final", "subject": subject,
                  "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                            "code": "vital-signs"}]}],
                  "code": {"coding": [{"system": "http://loinc.org", "code": "29463-7", "display": "Body weight"}],
                           "text": "Body weight"},
                  "effectiveDateTime": day(i),
                  "valueQuantity": {"value": 80.0 if i % 3 == 0 and i < WEIGHTS - 1 else 72.5, "unit": "kg",
                                    "system": "http://unitsofmeasure.org", "code": "kg"}}
                 for i in range(WEIGHTS)]
    random.Random(3).shuffle(resources)
    return [{"resourceType": "Patient", "id": PID, "gender": "female", "birthDate": "1950-02-02"}, *resources]


@pytest.fixture(scope="module")
def svc(tmp_path_factory, embedder):
    service = indexed_record(tmp_path_factory.mktemp("series"), weights())
    yield service
    service.close()


@pytest.mark.parametrize("question", ["What is her most recent weight?", "latest weight?",
                                      "What was her last weight?", "current weight"])
def test_latest_is_the_newest_of_the_whole_series(svc, question):
    result = svc.ask("t", PID, question)
    newest, before = f"Observation/wt-{WEIGHTS - 1:03d}", f"Observation/wt-{WEIGHTS - 2:03d}"
    assert result["answer"].startswith(f"Weight 72.5 kg on {day(WEIGHTS - 1)} [1]; previous 72.5 kg on "
                                       f"{day(WEIGHTS - 2)} [2]"), result["answer"]
    assert [c["ref"] for c in result["citations"][:2]] == [newest, before]
    series = next(s for s in result["diagnostics"]["stages"] if s["name"] == "series")
    assert series["note"].startswith(f"{WEIGHTS} results"), series


def test_first_is_the_oldest_of_the_whole_series(svc):
    result = svc.ask("t", PID, "What was her first weight on file?")
    assert f"on {day(0)}" in result["answer"] and result["citations"][0]["ref"] == "Observation/wt-000", result["answer"]


def test_the_series_ends_take_the_places_of_results_that_ranked():
    """Evidence keeps its length: the newest and the one before it come in where the first result of
    the test stood, results of the test that are neither give way from the last."""
    def chunk(cid: str, when: str, rtype: str = "Observation", key: str = "lex:body weight") -> Chunk:
        return Chunk(tenant="t", patient_id=PID, resource_type=rtype, resource_id=cid, part="0", text=cid, label="",
                     date=when, semantic_type="vital", concepts=[{"key": key, "negated": False}])

    ranked = [Evidence(chunk("note", "2020-01-01", "DocumentReference"), 3.0), Evidence(chunk("w1", "2001-01-01"), 2.0),
              Evidence(chunk("w2", "2005-01-01"), 1.5), Evidence(chunk("bp", "2019-01-01", key="lex:bp"), 1.0)]
    ends = [chunk("w9", "2024-07-25"), chunk("w8", "2024-06-25")]
    out = with_series_ends(ranked, "lex:body weight", ends)
    assert [ev.chunk.resource_id for ev in out] == ["note", "w9", "w8", "bp"]
    assert [ev.score for ev in out[1:3]] == [2.0, 2.0]
    assert with_series_ends(out, "lex:body weight", ends) == out


def test_a_window_keeps_the_series_ends_inside_it(svc):
    """"Latest weight in 2010": the newest of that year, not of the record."""
    result = svc.ask("t", PID, "What was her latest weight in 2010?")
    in_2010 = [i for i in range(WEIGHTS) if day(i).startswith("2010")]
    newest = in_2010[-1]
    assert result["citations"][0]["ref"] == f"Observation/wt-{newest:03d}", result["answer"]
    assert f"on {day(newest)}" in result["answer"]


def test_the_newest_goes_first_even_when_the_one_before_it_ranked_above_it():
    """Dev's "most recent BP reading?": the newest reading had ranked second, the one before it not
    at all; it must not be put above the newest."""
    def reading(cid: str, when: str) -> Chunk:
        return Chunk(tenant="t", patient_id=PID, resource_type="Observation", resource_id=cid, part="0", text=cid,
                     label="", date=when, semantic_type="vital", concepts=[{"key": "lex:bp", "negated": False}])

    ranked = [Evidence(reading("older", "2024-01-01"), 2.0), Evidence(reading("newest", "2025-05-08"), 1.5),
              Evidence(reading("other", "2023-01-01"), 1.0)]
    out = with_series_ends(ranked, "lex:bp", [reading("newest", "2025-05-08"), reading("before", "2025-04-10")])
    assert [ev.chunk.resource_id for ev in out] == ["newest", "before", "older"]


def test_the_series_is_the_top_results_own_test_not_every_test_of_a_broader_concept():
    """"Most recent K+": potassium and sodium may both assert a broader concept the question's word
    reads as; the series is potassium's, by its coding."""
    def result(cid: str, code: str) -> Chunk:
        return Chunk(tenant="t", patient_id=PID, resource_type="Observation", resource_id=cid, part="0", text=cid,
                     label="", date="2025-05-26", semantic_type="lab",
                     codes=[{"system": "http://loinc.org", "code": code}])

    potassium = result("k", "6298-4")
    assert same_test(result("k2", "6298-4"), potassium) and not same_test(result("na", "2947-0"), potassium)

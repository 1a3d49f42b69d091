"""Trends in one unit: a series is stated and charted in its newest reading's unit, each reading
still citing its value as recorded; what cannot be reconciled is kept apart and said."""
from __future__ import annotations

import json

import pytest

from search.nlp.units import Measured, factor

PATIENT = "units-patient"


@pytest.mark.parametrize("source, target, value, expected", [
    (Measured("kg"), Measured("[lb_av]"), 80, 176.37),
    (Measured("Cel"), Measured("[degF]"), 37, 98.6),
    (Measured("[degF]"), Measured("Cel"), 101.3, 38.5),
    (Measured("mg/dL", "2345-7"), Measured("mmol/L", "14749-6"), 126, 6.99),      # glucose, by its factor
    (Measured("umol/L", "14682-9"), Measured("mg/dL", "2160-0"), 88.4, 1.0),      # creatinine
    (Measured("mmol/L", "2345-7"), Measured("mg/dL", "2345-7"), 7.0, 126.1),      # molar value sent under the mass code
    (Measured("g/dL"), Measured("g/L"), 13.5, 135),
])
def test_values_convert_by_ucum_and_by_the_analytes_factor(source, target, value, expected):
    convert = factor(source, target)
    assert convert is not None and convert(value) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("source, target", [
    (Measured("[IU]/L", "2345-7"), Measured("mg/dL", "2345-7")),       # an arbitrary unit against a mass
    (Measured("", "29463-7"), Measured("kg", "29463-7")),                # a missing unit
    (Measured("%{HbA1c}"), Measured("%{saturation}")),                    # different annotations
    (Measured("mg/dL", "2160-0"), Measured("mmol/L", "2345-7")),         # two analytes
    (Measured("beats"), Measured("kg")),                                  # not UCUM at all
    (Measured("mmol/mol", "4548-4"), Measured("%", "4548-4")),           # HbA1c's IFCC and NGSP scales
])
def test_what_cannot_be_reconciled_is_not_converted(source, target):
    assert factor(source, target) is None


def observation(oid: str, when: str, loinc: str, name: str, value: float | None, unit: str, code: str) -> dict:
    resource = {"resourceType": "Observation", "id": oid, "status": "final", "subject": {"reference": f"Patient/{PATIENT}"},
                "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                          "code": "vital-signs" if loinc in ("29463-7", "8310-5") else "laboratory"}]}],
                "code": {"coding": [{"system": "http://loinc.org", "code": loinc, "display": name}], "text": name},
                "effectiveDateTime": when}
    quantity = {"value": value, "unit": unit} | ({"system": "http://unitsofmeasure.org", "code": code} if code else {})
    resource["valueQuantity"] = quantity
    return resource


@pytest.fixture(scope="module")
def service(tmp_path_factory, embedder):
    from search.service import SearchService

    folder = tmp_path_factory.mktemp("units")
    resources = [
        {"resourceType": "Patient", "id": PATIENT, "gender": "female", "birthDate": "1970-01-01"},
        observation("w1", "2026-01-01", "29463-7", "Body weight", 80, "kg", "kg"),
        observation("w2", "2026-06-01", "29463-7", "Body weight", 170, "lb", "[lb_av]"),
        observation("t1", "2026-02-01", "8310-5", "Body temperature", 37.0, "C", "Cel"),
        observation("t2", "2026-02-02", "8310-5", "Body temperature", 101.3, "F", "[degF]"),
        observation("g1", "2026-03-01", "2345-7", "Glucose", 126, "mg/dL", "mg/dL"),
        observation("g2", "2026-04-01", "14749-6", "Glucose", 5.0, "mmol/L", "mmol/L")
        | {"referenceRange": [{"low": {"value": 3.9, "unit": "mmol/L", "system": "http://unitsofmeasure.org", "code": "mmol/L"},
                               "high": {"value": 5.6, "unit": "mmol/L", "system": "http://unitsofmeasure.org", "code": "mmol/L"}}]},
        observation("g3", "2026-05-01", "2345-7", "Glucose", 3, "IU", "[IU]"),
    ]
    path = folder / "bundle.json"
    path.write_text(json.dumps({"resourceType": "Bundle", "type": "collection",
                                "entry": [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in resources]}), encoding="utf-8")
    svc = SearchService("embedded", folder / "index.sqlite")
    svc.index_paths("t", [path])
    yield svc
    svc.close()


def test_a_weight_in_kg_then_lb_falls_as_it_really_did(service):
    result = service.ask("t", PATIENT, "weight trend")
    answer = result["answer"]
    assert "fell from 80 kg (176 lb)" in answer and "to 170 lb" in answer, answer
    assert "rose" not in answer.split(".")[0]
    chart = result.get("chart") or next(iter(result.get("charts") or []), None)
    assert chart and chart["unit"] == "lb", result.keys()
    assert [round(p["values"][0]) for p in chart["points"]] == [176, 170]
    assert chart["points"][0]["text"].startswith("80 kg")            # the reading as recorded, still cited


def test_a_fever_in_fahrenheit_after_a_normal_celsius_reading_rises(service):
    answer = service.ask("t", PATIENT, "how has her temperature changed?")["answer"]
    assert "rose from 37 C (98.6 F) on 2026-02-01 to 101.3 F" in answer, answer


def test_glucose_in_mass_and_molar_units_is_one_series_and_iu_is_kept_apart(service):
    answer = service.ask("t", PATIENT, "glucose trend")["answer"]
    first = answer.split(". ")[0]
    assert "126 mg/dL (6.99 mmol/L)" in first and "fell" in first, answer
    assert "cannot be compared" in answer and "3 IU" in answer, answer


def test_a_reference_range_is_drawn_in_the_charts_unit():
    from search.answering.charts import range_in
    from search.answering.facts import Point
    from search.answering.lead import Series

    series = Series("glucose", range=(3.9, 5.6), range_unit=Measured("mmol/L", "14749-6"))
    low, high = range_in(series, Point("2026-05-01", [100.0], "100 mg/dL", "Observation/x", unit="mg/dL",
                                        ucum="mg/dL", loinc="2345-7"))
    assert low == pytest.approx(70.3, rel=0.01) and high == pytest.approx(100.9, rel=0.01)
    assert range_in(series, Point("2026-05-01", [3.0], "3 IU", "Observation/y", unit="IU", ucum="[IU]",
                                  loinc="2345-7")) is None

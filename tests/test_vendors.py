"""Records as Oracle Health, Epic and a hospital data warehouse (MIMIC-IV on FHIR) send them
(issue 35): nothing valid dropped, every clinical type rendered, answers that use what retrieval
found. The fixtures under tests/data/vendors follow the vendors' published shapes (SOURCE.md)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from fhir_ingest.record.chunk import PatientChunker, TextBudget
from fhir_ingest.record.contract import Chunk
from fhir_ingest.record.load import load_resources
from search.retrieval.pipeline import Analysis, Evidence, rerank

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
           "effectiveDateTime": "2024-01-02", "valueQuantity": {"value": 3.1, "unit": "mmol/L"}}
    path = tmp_path / "lab.ndjson"
    path.write_text(json.dumps(lab) + "\n")
    records, report = load_resources([path])
    assert report.skipped == [] and [r["id"] for r in records[0].resources] == ["k1"]
    assert "unknown code system 'LOCAL LAB'" in report.warnings[0].reason
    # The policy's other side: no type, an unsafe id, no patient, a wrong JSON type still skip.
    base = {"resourceType": "Observation", "status": "final", "code": {"text": "K"},
            "subject": {"reference": "Patient/p"}}
    lines = [dict(base, id="ok"), dict(base, id="a/b"), dict(base, id="x" * 65), dict(base, resourceType=7, id="t"),
             dict(base, id="np", subject={"display": "nobody"}), dict(base, id="wrong", status=["final"])]
    path = tmp_path / "mixed.ndjson"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
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
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
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

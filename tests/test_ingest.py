"""Reading FHIR and turning it into chunks, on the real shared records and on broken input."""
from __future__ import annotations

import base64
import gzip
import json
import re

import pytest

from fhir_ingest.record.chunk import PatientChunker, TextBudget
from fhir_ingest.record.load import load_resources
from fhir_ingest.record.reader import read_path


def test_every_shared_bundle_ingests_with_nothing_skipped(patient_files, embedder):
    records, report = load_resources(patient_files)
    assert len(records) == len(patient_files) == 60
    assert report.skipped == []
    manifest = (patient_files[0].parent / "MANIFEST.tsv").read_text(encoding="utf-8").splitlines()
    column = manifest[0].split("\t").index("n_resources")
    assert report.resources_read == sum(int(line.split("\t")[column]) for line in manifest[1:])
    problems, chunks = [], 0
    for record in records:
        chunker = PatientChunker("t", record.patient_id, record.resources, embedder.budget())
        chunks += len(chunker.chunks())
        problems += chunker.problems
    assert problems == []
    assert chunks > 10000


def test_chunk_contract_on_a_real_patient(synthea_dir, embedder):
    records, _ = load_resources([synthea_dir / "a4e05cb8-cdb8-8733-1a63-5a49aa15c251.json.gz"])
    record = records[0]
    chunks = PatientChunker("acme", record.patient_id, record.resources, embedder.budget()).chunks()
    by_type = {}
    for c in chunks:
        by_type.setdefault(c.resource_type, []).append(c)
        assert c.patient_id == record.patient_id and c.tenant == "acme"
        assert re.fullmatch(r"[A-Za-z]+/[\w.-]+", c.ref)
        assert c.refs[0] == c.ref
        assert " · " in c.label and len(c.label) <= 90
        assert re.match(r"\d{4}-\d{2}-\d{2}", c.date) or c.resource_type == "Device"
        assert embedder.count_tokens(c.text) <= embedder.max_tokens, (c.ref, c.part)
    assert {"Encounter", "Observation", "Condition", "AllergyIntolerance", "DocumentReference",
            "MedicationRequest", "Procedure", "Immunization"} <= set(by_type)
    # The A1c with its value and unit, labelled for its chip.
    a1c = [c for c in by_type["Observation"] if "Hemoglobin A1c" in c.text and c.category != "trend"]
    assert any("6.31 %" in c.text and c.label.startswith("2023-02-01 · Lab ·") for c in a1c)
    # Chunk ids are stable and unique.
    ids = [c.chunk_id for c in chunks]
    assert len(ids) == len(set(ids))
    again = PatientChunker("acme", record.patient_id, record.resources, embedder.budget()).chunks()
    assert [c.chunk_id for c in again] == ids


def test_note_twins_are_indexed_once_and_notes_fit_the_window(synthea_dir, embedder):
    records, _ = load_resources([synthea_dir / "3458d2d7-2b13-ee85-cd49-4ab409c1af5d.json.gz"])
    record = records[0]
    chunks = PatientChunker("t", record.patient_id, record.resources, embedder.budget()).chunks()
    notes = [c for c in chunks if c.semantic_type == "note"]
    doc_refs = {r["id"] for r in record.resources if r["resourceType"] == "DocumentReference"}
    assert {c.resource_id for c in notes} == doc_refs           # every note, and only through its DocumentReference
    assert not any(c.resource_type == "DiagnosticReport" and c.semantic_type == "note" for c in chunks)
    for c in notes:
        assert embedder.count_tokens(c.text) <= embedder.max_tokens
    # A long note is split, and no chunk mixes two notes.
    per_note = {}
    for c in notes:
        per_note.setdefault(c.resource_id, []).append(c)
        assert c.text.startswith(c.category)
    assert max(len(v) for v in per_note.values()) >= 2


def test_blood_pressure_reads_systolic_over_diastolic(synthea_dir, embedder):
    records, _ = load_resources([synthea_dir / "8ef99ca1-5615-7aa6-d383-47fe931a1f14.json.gz"])
    record = records[0]
    chunks = PatientChunker("t", record.patient_id, record.resources, embedder.budget()).chunks()
    bp = [c for c in chunks if c.ref == "Observation/5b50845b-9292-4e4f-270e-9d419fb31cd1"]
    assert bp and "116/98" in bp[0].text


def test_trend_summaries_per_window(synthea_dir, embedder):
    records, _ = load_resources([synthea_dir / "df0d0a6e-c262-824e-a4ff-c5b2d6ad334c.json.gz"])
    record = records[0]
    chunks = PatientChunker("t", record.patient_id, record.resources, embedder.budget()).chunks()
    trends = [c for c in chunks if c.category == "trend"]
    assert trends
    parts = {c.part for c in trends}
    assert "trend-365" in parts or "trend-all" in parts
    for c in trends:
        assert len(c.refs) >= 2 and all(r.startswith("Observation/") for r in c.refs)
        assert embedder.count_tokens(c.text) <= embedder.max_tokens


def _bundle(*resources):
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"fullUrl": f"urn:uuid:{r['id']}", "resource": r} for r in resources]}


PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1970-01-01"}


def obs(oid, value, system="http://loinc.org", status="final", subject="Patient/p1"):
    return {"resourceType": "Observation", "id": oid, "status": status,
            "code": {"coding": [{"system": system, "code": "2823-3", "display": "Potassium"}]},
            "subject": {"reference": subject}, "effectiveDateTime": "2024-03-12T10:00:00Z",
            "valueQuantity": {"value": value, "unit": "mmol/L"}}


def test_malformed_resources_are_reported_and_the_rest_is_indexed(tmp_path):
    good = obs("o1", 3.4)
    missing_status = obs("o2", 4.0)
    del missing_status["status"]                                  # required in R4
    bad_system = obs("o3", 4.1, system="not a uri")
    lines = [json.dumps(PATIENT), json.dumps(good), "{not json", json.dumps(missing_status), json.dumps(bad_system)]
    path = tmp_path / "export.ndjson"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records, report = load_resources([path])
    reasons = {s.origin: s.reason for s in report.skipped}
    assert set(reasons) == {"export.ndjson:3", "export.ndjson:4"}
    assert "bad JSON" in reasons["export.ndjson:3"]
    assert "status" in reasons["export.ndjson:4"]
    # A code system that is not a URI changes no clinical meaning: kept, and said (the reading policy).
    assert any("unknown code system" in w.reason for w in report.warnings if w.origin == "export.ndjson:5")
    assert [r["id"] for r in records[0].resources if r["resourceType"] == "Observation"] == ["o1", "o3"]


@pytest.mark.parametrize("system", ["not a uri", "loinc", "", "http://loinc.org", "urn:oid:2.16.840.1.113883.6.1",
                                    "http://x\u00a0y", "http://x\u2003", "http://x\ny", "http://x\n", 'http://a"b',
                                    "http://a\\b", "http://\u00fc.example", "1http://x", "http:", "http://x y", "a+b-c.d:e"])
def test_the_quick_look_for_bad_code_systems_misses_none_the_full_walk_finds(system):
    """The code-system check first looks at the resource's JSON text and walks it only on a
    suspicion: every system the walk rejects, anywhere in the resource, must raise one."""
    from fhir_ingest.record.validate import _bad_code_system, _may_name_a_bad_system

    nested = obs("o1", 3.4)
    nested["valueCodeableConcept"] = {"coding": [{"system": system, "code": "x"}]}
    for resource in (obs("o1", 3.4, system=system), nested):
        assert _may_name_a_bad_system(resource) or _bad_code_system(resource) is None
        if system in ("http://loinc.org", "urn:oid:2.16.840.1.113883.6.1", "a+b-c.d:e"):
            assert not _may_name_a_bad_system(resource)     # plain systems are cleared without a walk


def test_a_resource_invalid_when_its_record_is_assembled_is_skipped_and_counted_so(tmp_path, embedder):
    """A patient's own resources are checked against the FHIR model when the record is assembled.
    One that fails is reported and not counted as read by type; a newer version that fails leaves
    the older one indexed; a patient with nothing valid gets no (empty) entry in the index."""
    from .conftest import make_service

    older, newer = obs("o1", 3.4), obs("o1", 3.9)
    older["meta"], newer["meta"] = {"versionId": "1"}, {"versionId": "2"}
    del newer["status"]                                             # required in R4
    ghost = obs("g1", 1.0, subject="Patient/ghost")
    del ghost["status"]
    path = tmp_path / "export.ndjson"
    path.write_text("".join(json.dumps(r) + "\n" for r in (PATIENT, older, newer, ghost)), encoding="utf-8")
    svc = make_service("embedded", tmp_path)
    try:
        summary = svc.index_paths("t", [path])
        assert {s.origin for s in summary.load.skipped} == {"export.ndjson:3", "export.ndjson:4"}
        assert summary.result.patients == 1
        assert [p["patient_id"] for p in svc.backend.list_patients("t")] == ["p1"]
        assert svc.resource("t", "p1", "Observation/o1")["valueQuantity"]["value"] == 3.4
        observations = next(row for row in summary.load.type_rows() if row[0] == "Observation")
        assert observations[1:3] == (3, 2)                          # read, skipped
    finally:
        svc.close()


def test_a_resource_that_names_no_patient_is_reported_not_dropped(tmp_path):
    orphan = obs("o9", 5.0, subject="urn:uuid:nowhere")
    path = tmp_path / "orphan.ndjson"
    path.write_text(json.dumps(PATIENT) + "\n" + json.dumps(orphan) + "\n", encoding="utf-8")
    _, report = load_resources([path])
    assert [s.origin for s in report.skipped] == ["orphan.ndjson:2"]
    assert "names no patient" in report.skipped[0].reason


def test_bundle_references_resolve_and_gzip_and_directories_read(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    with gzip.open(folder / "b.json.gz", "wt", encoding="utf-8") as fh:
        json.dump(_bundle(PATIENT, obs("o1", 3.4, subject="urn:uuid:p1")), fh)
    items = list(read_path(folder))
    observation = [i.resource for i in items if i.resource["resourceType"] == "Observation"][0]
    assert observation["subject"]["reference"] == "Patient/p1"
    assert items[1].origin == "b.json.gz#entry[1]"


def _note(nid, content_type, payload: str):
    return {"resourceType": "DocumentReference", "id": nid, "status": "current",
            "type": {"coding": [{"system": "http://loinc.org", "code": "11506-3", "display": "Progress note"}]},
            "subject": {"reference": "Patient/p1"}, "date": "2024-05-01T09:00:00Z",
            "content": [{"attachment": {"contentType": content_type,
                                        "data": base64.b64encode(payload.encode()).decode()}}]}


def test_html_and_rtf_notes_are_read_as_text():
    html = "<html><body><h2>Assessment</h2><p>Hypokalemia &amp; fatigue.</p><script>x()</script></body></html>"
    rtf = r"{\rtf1\ansi{\fonttbl\f0\fswiss Helvetica;}\f0\pard PLAN: start potassium chloride 20 mEq daily.\par}"
    resources = [PATIENT, _note("n1", "text/html", html), _note("n2", "text/rtf", rtf)]
    budget = TextBudget(254, lambda t: len(t.split()))
    chunks = PatientChunker("t", "p1", resources, budget).chunks()
    text = {c.resource_id: c.text for c in chunks}
    assert "Assessment: Hypokalemia & fatigue." in text["n1"] and "x()" not in text["n1"]
    assert "potassium chloride 20 mEq daily" in text["n2"]


def test_entered_in_error_never_becomes_a_chunk():
    resources = [PATIENT, obs("o1", 3.4, status="entered-in-error"), obs("o2", 4.2)]
    chunks = PatientChunker("t", "p1", resources, TextBudget(254, lambda t: len(t.split()))).chunks()
    assert {c.resource_id for c in chunks if c.resource_type == "Observation"} == {"o2"}


def test_a_bulk_export_parked_on_disk_regroups_like_the_in_memory_path(patient_files, tmp_path):
    """An export arrives sorted by type, not patient; staging hands each patient back whole, with
    only the Medications that patient's requests point at."""
    from fhir_ingest.record.load import LoadReport, RecordAssembler, check_items
    from fhir_ingest.record.reader import RawResource

    items = [item for path in patient_files[:3] for item in read_path(path)]
    by_type = sorted((i for i in items if isinstance(i, RawResource)), key=lambda i: i.resource["resourceType"])
    medication = {"resourceType": "Medication", "id": "shared-med", "code": {"text": "aspirin"}}
    by_type.append(RawResource(medication, "Medication.ndjson:1"))
    expected, _ = check_items(by_type)
    assembler = RecordAssembler(LoadReport(), tmp_path)
    try:
        assembler.add(by_type)
        assert assembler.patient_ids() == [r.patient_id for r in expected]
        for want in expected:
            got = assembler.record(want.patient_id)
            assert sorted(f"{r['resourceType']}/{r['id']}" for r in got.resources) == \
                sorted(f"{r['resourceType']}/{r['id']}" for r in want.resources)
            assert "Medication/shared-med" not in {f"{r['resourceType']}/{r['id']}" for r in got.resources}
            assert got.complete == want.complete
    finally:
        assembler.close()
    assert not list(tmp_path.iterdir()), "the staged export is removed when the sync ends"


def test_an_order_without_a_reason_says_why_its_visit_happened(embedder):
    """"Why is she getting B12 shots?": the order names no reason, the visit it was ordered at
    does; the chunk says so as what it is and draws on the visit."""
    visit = {"resourceType": "Encounter", "id": "e1", "status": "finished", "class": {"code": "AMB"},
             "subject": {"reference": "Patient/p1"}, "period": {"start": "2017-05-02T09:00:00Z"},
             "reasonCode": [{"coding": [{"system": "http://snomed.info/sct", "code": "271737000",
                                         "display": "Anemia (disorder)"}]}]}
    order = {"resourceType": "MedicationRequest", "id": "m1", "status": "active", "intent": "order",
             "subject": {"reference": "Patient/p1"}, "encounter": {"reference": "Encounter/e1"},
             "authoredOn": "2017-05-02T09:00:00Z",
             "medicationCodeableConcept": {"coding": [{"system": "http://www.nlm.nih.gov/research/umls/rxnorm",
                                                       "code": "1", "display": "Vitamin B12 5 MG/ML Injectable Solution"}]}}
    with_reason = dict(order, id="m2", reasonCode=[{"text": "Pernicious anemia"}])
    chunks = {c.resource_id: c for c in PatientChunker("t", "p1", [PATIENT, visit, order, with_reason],
                                                        embedder.budget()).chunks()}
    assert "Ordered at the visit of 2017-05-02 for Anemia (disorder)." in chunks["m1"].text
    assert chunks["m1"].refs == ["MedicationRequest/m1", "Encounter/e1"]
    assert "Reason: Pernicious anemia." in chunks["m2"].text and "Ordered at" not in chunks["m2"].text


def _everything(*resources, links=("self",)):
    urls = {"self": "https://ehr.example/fhir/Patient/p1/$everything?_count=500",
            "next": "https://ehr.example/fhir/Patient/p1/$everything?page=2"}
    return dict(_bundle(*resources), type="searchset", link=[{"relation": rel, "url": urls[rel]} for rel in links])


@pytest.mark.parametrize("name, document, authority", [
    ("bundle.json", _bundle(PATIENT, obs("o1", 3.4)), "bundle"),
    ("everything.json", _everything(PATIENT, obs("o1", 3.4)), "everything"),
    ("first-page.json", _everything(PATIENT, obs("o1", 3.4), links=("self", "next")), ""),
    ("patient-only.json", _bundle(PATIENT), ""),
    ("patient.json", PATIENT, ""),
    ("two-patients.json", _bundle(PATIENT, dict(PATIENT, id="p2"), obs("o1", 3.4)), ""),
    ("line.ndjson", _bundle(PATIENT, obs("o1", 3.4)), ""),
])
def test_only_a_bundle_file_with_the_patient_and_its_clinical_record_may_be_whole(tmp_path, name, document, authority):
    """What a document shows of itself decides whether it may replace the record held: an NDJSON
    line (even one holding a Bundle), a Patient alone, a bundle of two patients never may; a
    `$everything` page that links to a next one is not the whole answer."""
    path = tmp_path / name
    path.write_text(json.dumps(document) + "\n", encoding="utf-8")
    records, report = load_resources([path])
    assert not report.skipped
    record = next(r for r in records if r.patient_id == "p1")
    assert record.authority == authority
    assert ("p1" in report.added_to) == (authority == "")


@pytest.mark.parametrize("newer, older", [
    ({"versionId": "10"}, {"versionId": "9"}),                                   # numbers, not strings
    ({"versionId": "2", "lastUpdated": "2020-01-01T00:00:00Z"},                  # the version number decides
     {"versionId": "1", "lastUpdated": "2024-01-01T00:00:00Z"}),
    ({"lastUpdated": "2024-05-01T09:00:00Z"}, {"lastUpdated": "2024-05-01T10:00:00+02:00"}),   # instants, not text
    ({"versionId": "b", "lastUpdated": "2024-05-02T00:00:00Z"},                  # versions that are not numbers
     {"versionId": "a", "lastUpdated": "2024-05-01T00:00:00Z"}),
])
def test_a_held_newer_version_is_never_replaced_by_an_older_one(newer, older):
    from fhir_ingest.record.load import merge_resources, version_order

    held, stale = dict(obs("o1", 4.0), meta=newer), dict(obs("o1", 9.9), meta=older)
    assert version_order(held, stale) > 0 > version_order(stale, held)
    assert merge_resources([held], [stale]) == [held]
    assert merge_resources([stale], [held]) == [held]


def test_checking_a_decompression_bomb_costs_no_more_memory_than_its_limit(tmp_path):
    """The expanded bytes are counted as they stream out of gzip: a 64 MB bomb under a 2 MB limit
    is refused having held about 2 MB, not inflated whole first."""
    import tracemalloc
    import zlib

    from fhir_ingest.record.reader import ReadLimits, ReadProblem

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with (tmp_path / "bomb.ndjson.gz").open("wb") as out:
        out.write(packer.compress(b'{"resourceType": "Observation", "note": "'))
        for _ in range(64):
            out.write(packer.compress(b" " * 2**20))
        out.write(packer.flush())
    tracemalloc.start()
    try:
        items = list(read_path(tmp_path / "bomb.ndjson.gz", ReadLimits(2 * 2**20, 10_000)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [type(i) for i in items] == [ReadProblem] and "more than 2 MB" in items[0].reason
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MB"


def test_a_survey_too_long_for_the_window_is_cut_between_its_answers_and_loses_none():
    questions = [f"Within the last year, have you been afraid of question {i}?" for i in range(40)]
    survey = {"resourceType": "Observation", "id": "s1", "status": "final", "subject": {"reference": "Patient/p1"},
              "effectiveDateTime": "2022-11-25",
              "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                        "code": "survey"}]}],
              "code": {"text": "Social needs survey"},
              "component": [{"code": {"text": q}, "valueString": "No"} for q in questions]}
    chunks = [c for c in PatientChunker("t", "p1", [PATIENT, survey], TextBudget(60, lambda t: len(t.split()))).chunks()
              if c.resource_id == "s1"]
    assert len(chunks) > 1
    lead = chunks[0].text.partition(": ")[0]
    for chunk in chunks:
        assert chunk.text.startswith(f"{lead}: ") and len(chunk.text.split()) <= 60
        # Every piece holds whole answers: a question never runs on into the next piece.
        body = chunk.text.partition(": ")[2]
        assert all(re.fullmatch(r"(Social needs survey = )?Within the last year, have you been afraid of question \d+\?: No[;.]?", item)
                   for item in body.split("; ")), body
    said = " ".join(c.text for c in chunks)
    assert all(f"{q}: No" in said for q in questions)


def test_the_shared_resources_a_record_points_at_are_found_from_a_stream():
    """A Bulk round hands its resources as a generator: the Medication, the Specimen and a note's
    Binary are all found in one pass (a second pass over a generator sees nothing)."""
    from fhir_ingest.record.load import shared_refs

    resources = [{"resourceType": "MedicationRequest", "id": "m1", "medicationReference": {"reference": "Medication/d1"}},
                 {"resourceType": "Observation", "id": "o1", "specimen": {"reference": "Specimen/s1"}},
                 {"resourceType": "DocumentReference", "id": "n1",
                  "content": [{"attachment": {"contentType": "text/plain", "url": "Binary/b1"}}]}]
    assert shared_refs(r for r in resources) == {"Medication/d1", "Specimen/s1", "Binary/b1"}


def test_the_annotator_is_built_again_once_its_vocabulary_has_grown(monkeypatch):
    """spaCy's vocabulary keeps every word it meets (each result's value, id and date) and never
    forgets one: indexing a 630 MB population grew the process by 100 MB. Past a number of words
    learnt the next caller gets a new annotator, which annotates as the old one did."""
    from search.nlp import annotate

    monkeypatch.setattr(annotate, "WORDS_LEARNT_AT_MOST", 200)
    monkeypatch.setattr(annotate, "_annotator", None)
    first = annotate.default_annotator()
    texts = ["No known allergies; metformin 500 mg twice daily for type 2 diabetes."]
    before = first.annotate(texts)
    first.annotate([f"Potassium sample id-{n:06x}" for n in range(50)])
    assert 50 <= first.words_learnt() <= 200 and annotate.default_annotator() is first
    first.annotate([f"Sodium sample id-{n:06x}x" for n in range(200)])
    assert first.words_learnt() > 200
    second = annotate.default_annotator()
    assert second is not first and second.words_learnt() == 0
    assert second.annotate(texts) == before

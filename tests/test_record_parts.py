"""A large record is indexed a part at a time so that memory does not grow with it (issue 41):
the parts together write what the record indexed whole writes, and a failure in a part loses
nothing held. Parts are made small here so that an ordinary shared record has several."""
from __future__ import annotations

import copy
import gzip
import json
from dataclasses import replace

import numpy as np
import pytest

from fhir_ingest.record import load
from fhir_ingest.record.compact import CompactResources, is_compact
from fhir_ingest.record.load import LoadReport, assembled, load_resources
from fhir_ingest.record.reader import read_path
from search import record_parts, service
from search.indexer import index_record
from search.record_parts import index_in_parts

from .conftest import make_service

PATIENT = "0c920ac4-2a01-a27d-3d46-1ae563ad206b"       # 240 resources: five parts of 50
TENANT = "parts"
QUESTIONS = ("What are the active problems?", "What was her most recent body weight?",
             "Is she allergic to anything?", "What medications is she on?", "How has her blood pressure been?")


class FailsOnEncode:
    """The real embedder, failing (as a killed worker would) on its `fail_on`-th call."""

    def __init__(self, inner, fail_on: int):
        self.inner, self.calls, self.fail_on = inner, 0, fail_on

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, **kwargs):
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("worker stopped")
        return self.inner.encode(texts, **kwargs)


def record_of(synthea_dir):
    (record,), _ = load_resources([synthea_dir / f"{PATIENT}.json.gz"])
    return record


def held_as(form: str, record):
    """The record as a list of dicts, or held compactly as a large record is (compact.py)."""
    return replace(record, resources=CompactResources(record.resources)) if form == "compact" else record


def held(svc) -> dict:
    """Everything the index holds of the patient, but the time it was indexed."""
    backend = svc.backend
    texts = backend.indexed_texts(TENANT, PATIENT)
    chunks = {c.chunk_id: c.to_dict() for c in backend.get_chunks(TENANT, sorted(texts))}
    summary = dict(backend.get_patient(TENANT, PATIENT) or {})
    summary.pop("indexed_at", None)
    return {"texts": texts, "chunks": chunks, "resources": backend.patient_resources(TENANT, PATIENT),
            "summary": summary, "profile": backend.get_profiles(TENANT, [PATIENT])}


def answers(svc) -> list[tuple]:
    out = []
    for question in QUESTIONS:
        answer = svc.answer(TENANT, PATIENT, question)
        out.append((answer.answer, [s.text for s in answer.statements], [c.ref for c in answer.citations]))
    return out


def vector_scores(svc) -> list[tuple[str, float]]:
    """The whole record ranked by meaning against one question: the chunks' vectors compared."""
    from search.backends.base import Scope

    vector = svc.embedder.encode(["kidney function and blood pressure"])[0]
    hits = svc.backend.search_vector(Scope(TENANT, PATIENT), vector, 1000)
    return sorted((hit.chunk_id, hit.score) for hit in hits)


@pytest.fixture()
def whole_and_parts(tmp_path, synthea_dir):
    whole, parts = make_service("embedded", tmp_path / "whole"), make_service("embedded", tmp_path / "parts")
    yield whole, parts, record_of(synthea_dir)
    whole.close()
    parts.close()


@pytest.mark.parametrize("form", ["list", "compact"])
def test_a_record_indexed_in_parts_equals_the_record_indexed_whole(whole_and_parts, form):
    whole, parts, record = whole_and_parts
    by_whole = index_record(whole.backend, whole.embedder, TENANT, record)
    by_parts = index_in_parts(parts.backend, parts.embedder, TENANT, held_as(form, record), part=50)
    assert (by_parts.chunks, by_parts.embedded, by_parts.resources) == (by_whole.chunks, by_whole.embedded, len(record.resources))
    assert [(p.ref, p.reason) for p in by_parts.problems] == [(p.ref, p.reason) for p in by_whole.problems]
    expected, found = held(whole), held(parts)
    assert found["texts"] == expected["texts"]           # same chunk ids, texts, BM25 texts and concepts
    assert found == expected
    assert answers(parts) == answers(whole)
    ranked_whole, ranked_parts = vector_scores(whole), vector_scores(parts)
    assert [cid for cid, _ in ranked_parts] == [cid for cid, _ in ranked_whole]
    assert np.allclose([s for _, s in ranked_parts], [s for _, s in ranked_whole], atol=1e-4)


def test_reindexing_in_parts_changes_nothing_and_removes_what_the_record_no_longer_makes(whole_and_parts):
    whole, parts, record = whole_and_parts
    index_in_parts(parts.backend, parts.embedder, TENANT, record, part=50)
    again = index_in_parts(parts.backend, parts.embedder, TENANT, record, part=50)
    assert (again.embedded, again.removed, again.unchanged) == (0, 0, again.chunks)
    fewer = copy.deepcopy(record)
    gone = next(r for r in fewer.resources if r["resourceType"] == "Observation")
    fewer.resources.remove(gone)
    index_in_parts(parts.backend, parts.embedder, TENANT, fewer, part=50)
    index_record(whole.backend, whole.embedder, TENANT, fewer)
    assert held(parts) == held(whole)
    assert not any(f"Observation/{gone['id']}" == c["refs"][0] for c in held(parts)["chunks"].values())


@pytest.mark.parametrize("fail_on, form", [(2, "list"), (4, "compact")])     # the first part's vectors: the first call
def test_a_failure_in_a_part_loses_nothing_held(whole_and_parts, fail_on, form):
    whole, parts, record = whole_and_parts
    older = copy.deepcopy(record)
    for resource in older.resources:
        if resource["resourceType"] == "Observation":
            resource.setdefault("meta", {})["versionId"] = "1"
    index_in_parts(parts.backend, parts.embedder, TENANT, held_as(form, older), part=50)
    before = held(parts)
    newer = copy.deepcopy(record)          # every Observation a new version: new chunk ids
    for resource in newer.resources:
        if resource["resourceType"] == "Observation":
            resource.setdefault("meta", {})["versionId"] = "2"
    with pytest.raises(RuntimeError, match="worker stopped"):
        index_in_parts(parts.backend, FailsOnEncode(parts.embedder, fail_on), TENANT, held_as(form, newer), part=50)
    after = held(parts)
    # Every chunk held is still there, unchanged; the record, its summary and profile as before.
    assert {cid: after["chunks"][cid] for cid in before["chunks"]} == before["chunks"]
    assert {k: after[k] for k in ("resources", "summary", "profile")} == \
        {k: before[k] for k in ("resources", "summary", "profile")}
    # The next run finishes the job: the index then holds what indexing the new record whole holds.
    index_in_parts(parts.backend, parts.embedder, TENANT, held_as(form, newer), part=50)
    index_record(whole.backend, whole.embedder, TENANT, newer)
    assert held(parts) == held(whole)


def test_a_large_record_among_others_is_indexed_in_parts_by_index_paths(tmp_path, synthea_dir, monkeypatch):
    """`chartcite index` (index_paths → index_in_turn): a record over the part size ends its group
    and is indexed in parts, the patients around it as before; the index equals a whole one's."""
    files = sorted(set(sorted(synthea_dir.glob("*.json.gz"))[:3] + [synthea_dir / f"{PATIENT}.json.gz"]))
    whole = make_service("embedded", tmp_path / "whole")
    whole.index_paths(TENANT, files)
    called, forms = [], []
    monkeypatch.setattr(record_parts, "PART_RESOURCES", 200)
    monkeypatch.setattr(load, "LARGE_RECORD", 200)        # and assembled compactly
    monkeypatch.setattr(record_parts, "write_part", lambda *a: called.append(1) or real_write_part(*a))
    monkeypatch.setattr(service, "index_in_parts", lambda backend, embedder, tenant, record, *a: forms.append(
        is_compact(record.resources)) or index_in_parts(backend, embedder, tenant, record, *a))
    parts = make_service("embedded", tmp_path / "parts")
    summary = parts.index_paths(TENANT, files)
    assert called, "no record was indexed in parts"
    assert forms and all(forms), "a record over the size was not held compactly"
    assert summary.result.patients == len(files) >= 3
    for pid in [p["patient_id"] for p in whole.backend.list_patients(TENANT)]:
        expected, found = whole.backend.indexed_texts(TENANT, pid), parts.backend.indexed_texts(TENANT, pid)
        assert found == expected and found
        assert parts.backend.patient_resources(TENANT, pid) == whole.backend.patient_resources(TENANT, pid)
    whole.close()
    parts.close()


real_write_part = record_parts.write_part


def test_a_large_record_s_resources_are_stored_without_holding_all_their_json_at_once(tmp_path):
    """The stored resources are written last, in one block: their JSON is made row by row as
    SQLite takes it, not for the whole record first (2,000 resources of 10 kB each: 20 MB of JSON
    beside the parsed record at the end of its indexing). Every resource is stored as it was."""
    import tracemalloc

    from search.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend(tmp_path / "index.db", "test-model", 4)
    resources = [{"resourceType": "Observation", "id": f"o{n}", "status": "final", "code": {"text": f"{n} " + "x" * 10_000}}
                 for n in range(2_000)]
    json_size = sum(len(r["code"]["text"]) for r in resources)
    tracemalloc.start()
    try:
        backend.store_resources(TENANT, "p", resources)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < json_size / 10, f"{peak / 2**20:.1f} MB held while storing {json_size / 2**20:.1f} MB of JSON"
    stored = backend.patient_resources(TENANT, "p")
    assert sorted(stored, key=lambda r: r["id"]) == sorted(resources, key=lambda r: r["id"])
    backend.close()


def one_patient_bundle(path, synthea_dir, copies: int) -> list[dict]:
    """A bundle file of one patient: a shared record's own resources copied under new ids (the
    sizes of real resources), and the resources in it."""
    text = gzip.decompress((synthea_dir / f"{PATIENT}.json.gz").read_bytes()).decode()
    own = [e["resource"] for e in json.loads(text.replace(f"urn:uuid:{PATIENT}", f"Patient/{PATIENT}"))["entry"]]
    patient = next(r for r in own if r["resourceType"] == "Patient")
    resources = [patient] + [dict(r, id=f"{r['id']}-{n}") for n in range(copies) for r in own
                             if r["resourceType"] not in ("Patient", "Practitioner", "Organization", "Location")
                             and (r.get("subject") or r.get("patient") or r.get("beneficiary"))]
    path.write_bytes(gzip.compress(json.dumps({"resourceType": "Bundle", "type": "collection",
                                               "entry": [{"resource": r} for r in resources]}).encode()))
    return resources


def test_a_large_record_is_assembled_as_bytes_and_never_parsed_whole(tmp_path, synthea_dir, monkeypatch):
    """A record over the size is held compactly from its first resource (about a fifth of its
    parsed size): assembling it never holds it parsed; each resource reads back as it was read."""
    import tracemalloc

    monkeypatch.setattr(load, "LARGE_RECORD", 500)
    resources = one_patient_bundle(tmp_path / "big.json.gz", synthea_dir, 6)
    parsed_size = traced_size(lambda: json.loads(json.dumps(resources)))
    with assembled(read_path(tmp_path / "big.json.gz"), LoadReport(), tmp_path) as assembler:
        assembler.record(resources[0]["id"])        # once first: the FHIR models' classes are built
        tracemalloc.start()
        try:
            record = assembler.record(resources[0]["id"])
            held_size, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert is_compact(record.resources) and len(record.resources) == len(resources)
    assert peak < parsed_size / 2, f"{peak / 2**20:.1f} MB at the peak; parsed, the record is {parsed_size / 2**20:.1f} MB"
    assert held_size < parsed_size / 2.5
    assert list(record.resources) == resources
    assert record.resources[10:12] == resources[10:12] and record.patient == resources[0]


def traced_size(make) -> int:
    """Bytes Python holds for what `make` returns."""
    import tracemalloc

    tracemalloc.start()
    try:
        made = make()
        size = tracemalloc.get_traced_memory()[0]
        del made
        return size
    finally:
        tracemalloc.stop()


def test_compact_resources_resolve_references_and_never_change_what_they_hold():
    resources = [{"resourceType": "Encounter", "id": "e1", "status": "finished"},
                 {"resourceType": "Observation", "id": "o1", "encounter": {"reference": "Encounter/e1"}},
                 {"resourceType": "Binary", "id": "b1", "data": "QUJD" * 10_000}]
    held = CompactResources(resources)
    lookup = held.lookup
    assert "Encounter/e1" in lookup and "Encounter/e2" not in lookup and lookup.get("Encounter/e2") is None
    assert lookup["Observation/o1"] == resources[1] and len(lookup["Binary/b1"]["data"]) == 40_000
    lookup["Encounter/e1"]["status"] = "changed by a reader"
    assert held[0]["status"] == "finished"           # the bytes held are the record as read
    held.put({"resourceType": "Encounter", "id": "e1", "status": "cancelled"})
    assert lookup["Encounter/e1"]["status"] == "cancelled" and len(held) == 3
    assert [r["id"] for r in held.of_types(["Binary", "Encounter"])] == ["e1", "b1"]
    assert held.only(["Observation"]).refs == ["Observation/o1"]
    assert list(held + [{"resourceType": "Condition", "id": "c1"}])[3]["id"] == "c1" and len(held) == 3


@pytest.mark.parametrize("authority", ["bundle", ""])      # a bundle that looks whole; an input merged
@pytest.mark.parametrize("held_form", ["list", "compact"])  # the record held, as the index hands it back
def test_the_removal_rule_reads_a_compact_record_as_it_reads_a_list(synthea_dir, authority, held_form):
    from fhir_ingest.record.load import against_held

    record = replace(record_of(synthea_dir), authority=authority)
    observations = [r for r in record.resources if r["resourceType"] == "Observation"]
    kept_newer, replaced, new = observations[:3]
    held = [copy.deepcopy(r) for r in record.resources if r is not new]
    held.append({"resourceType": "Observation", "id": "only-held", "status": "final", "code": {"text": "Potassium"},
                 "subject": {"reference": f"Patient/{PATIENT}"}})
    for resource, mine, theirs in ((kept_newer, "1", "2"), (replaced, "3", "2")):
        resource.setdefault("meta", {})["versionId"] = mine
        next(r for r in held if r["id"] == resource["id"]).setdefault("meta", {})["versionId"] = theirs
    as_list, as_compact = LoadReport(), LoadReport()
    by_list = against_held(record, held, as_list)
    by_compact = against_held(held_as("compact", record), CompactResources(held) if held_form == "compact" else held,
                              as_compact)
    assert is_compact(by_compact.resources)
    assert list(by_compact.resources) == list(by_list.resources)
    assert by_compact.authority == by_list.authority
    assert as_compact.to_dict() == as_list.to_dict()
    assert len(by_list.resources) == len(held) + (1 if authority == "" else 0)   # only-held removed when whole


def test_a_large_record_held_comes_back_from_the_index_compact_and_whole(tmp_path, monkeypatch):
    """What a merge starts from (the record the index holds) is read row by row and held
    compactly past the size: never all of a large record parsed at once."""
    from fhir_ingest.record import compact
    from search.backends.embedded import EmbeddedBackend

    monkeypatch.setattr(compact, "LARGE_RECORD", 20)
    backend = EmbeddedBackend(tmp_path / "index.db", "test-model", 4)
    many = [{"resourceType": "Observation", "id": f"o{n:02d}", "status": "final"} for n in range(50)]
    backend.store_resources(TENANT, "many", many)
    backend.store_resources(TENANT, "few", many[:5])
    held = backend.patient_resources(TENANT, "many")
    assert is_compact(held) and list(held) == many
    assert not is_compact(backend.patient_resources(TENANT, "few"))
    backend.close()


def test_the_trend_summaries_are_written_in_groups_of_bounded_readings(synthea_dir, embedder):
    """Each summary's fact holds every reading of its window: a large record's are written in
    groups drawing on at most a part's worth of readings (a single longer one alone), in order."""
    from fhir_ingest.record.chunk import PatientChunker
    from search.record_parts import trend_parts

    record = record_of(synthea_dir)
    whole = PatientChunker(TENANT, PATIENT, record.resources, embedder.budget()).trend_part()
    groups = list(trend_parts(PatientChunker(TENANT, PATIENT, CompactResources(record.resources),
                                             embedder.budget()), 8))
    assert len(groups) > 2
    assert [c.to_dict() for group in groups for c in group] == [c.to_dict() for c in whole]
    assert all(sum(len(c.refs) for c in group) <= 8 or len(group) == 1 for group in groups)

"""A large record is indexed a part at a time so that memory does not grow with it (issue 41):
the parts together write what the record indexed whole writes, and a failure in a part loses
nothing held. Parts are made small here so that an ordinary shared record has several."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from fhir_ingest.record.load import load_resources
from search import record_parts
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


def test_a_record_indexed_in_parts_equals_the_record_indexed_whole(whole_and_parts):
    whole, parts, record = whole_and_parts
    by_whole = index_record(whole.backend, whole.embedder, TENANT, record)
    by_parts = index_in_parts(parts.backend, parts.embedder, TENANT, record, part=50)
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


@pytest.mark.parametrize("fail_on", [2, 4])     # the first part's vectors are the first call
def test_a_failure_in_a_part_loses_nothing_held(whole_and_parts, fail_on):
    whole, parts, record = whole_and_parts
    older = copy.deepcopy(record)
    for resource in older.resources:
        if resource["resourceType"] == "Observation":
            resource.setdefault("meta", {})["versionId"] = "1"
    index_in_parts(parts.backend, parts.embedder, TENANT, older, part=50)
    before = held(parts)
    newer = copy.deepcopy(record)          # every Observation a new version: new chunk ids
    for resource in newer.resources:
        if resource["resourceType"] == "Observation":
            resource.setdefault("meta", {})["versionId"] = "2"
    with pytest.raises(RuntimeError, match="worker stopped"):
        index_in_parts(parts.backend, FailsOnEncode(parts.embedder, fail_on), TENANT, newer, part=50)
    after = held(parts)
    # Every chunk held is still there, unchanged; the record, its summary and profile as before.
    assert {cid: after["chunks"][cid] for cid in before["chunks"]} == before["chunks"]
    assert {k: after[k] for k in ("resources", "summary", "profile")} == \
        {k: before[k] for k in ("resources", "summary", "profile")}
    # The next run finishes the job: the index then holds what indexing the new record whole holds.
    index_in_parts(parts.backend, parts.embedder, TENANT, newer, part=50)
    index_record(whole.backend, whole.embedder, TENANT, newer)
    assert held(parts) == held(whole)


def test_a_large_record_among_others_is_indexed_in_parts_by_index_paths(tmp_path, synthea_dir, monkeypatch):
    """`chartcite index` (index_paths → index_in_turn): a record over the part size ends its group
    and is indexed in parts, the patients around it as before; the index equals a whole one's."""
    files = sorted(set(sorted(synthea_dir.glob("*.json.gz"))[:3] + [synthea_dir / f"{PATIENT}.json.gz"]))
    whole = make_service("embedded", tmp_path / "whole")
    whole.index_paths(TENANT, files)
    called = []
    monkeypatch.setattr(record_parts, "PART_RESOURCES", 200)
    monkeypatch.setattr(record_parts, "write_part", lambda *a: called.append(1) or real_write_part(*a))
    parts = make_service("embedded", tmp_path / "parts")
    summary = parts.index_paths(TENANT, files)
    assert called, "no record was indexed in parts"
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

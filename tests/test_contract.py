"""The same behaviour on both backends: the embedded SQLite index and a real Elasticsearch node."""
from __future__ import annotations

import re
import uuid

import pytest

from search.answering.answer import NEW_PATIENT, NO_EVIDENCE
from search.backends.base import ModelMismatch

from .conftest import BACKENDS, drop_tenants, make_service

A = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"   # aspirin allergy, EpiPen
B = "a4e05cb8-cdb8-8733-1a63-5a49aa15c251"   # shellfish allergy, prediabetes


@pytest.fixture(scope="module", params=BACKENDS)
def two_tenants(request, tmp_path_factory, embedder, synthea_dir):
    """Patients A and B in tenant north; B also in tenant south (tenant names unique per run)."""
    svc = make_service(request.param, tmp_path_factory.mktemp(request.param))
    run = uuid.uuid4().hex[:8]
    north, south = f"north{run}", f"south{run}"
    svc.index_paths(north, [synthea_dir / f"{A}.json.gz", synthea_dir / f"{B}.json.gz"])
    svc.index_paths(south, [synthea_dir / f"{B}.json.gz"])
    yield svc, north, south
    drop_tenants(svc, [north, south])
    svc.close()


@pytest.mark.parametrize("pipeline", ["dense", "hybrid", "full"])
def test_a_question_about_one_patient_never_returns_another(two_tenants, pipeline):
    svc, north, _ = two_tenants
    result = svc.ask(north, A, "shellfish allergy reaction?", k=10, pipeline=pipeline)
    assert result["evidence"]
    chunks = svc.backend.get_chunks(north, [e["chunk_id"] for e in result["evidence"]])
    assert len(chunks) == len(result["evidence"])
    assert all(c.patient_id == A and c.tenant == north for c in chunks)


def test_tenants_are_isolated_inside_the_query(two_tenants):
    svc, north, south = two_tenants
    assert svc.ask(south, A, "any allergies?")["answer"] == NEW_PATIENT
    south_answer = svc.ask(south, B, "What kind of reaction does he get with shellfish?")
    assert not south_answer["abstained"] and "anaphylaxis" in south_answer["answer"].lower()
    ids = [e["chunk_id"] for e in south_answer["evidence"]]
    assert all(c.tenant == south for c in svc.backend.get_chunks(south, ids))
    assert svc.backend.get_chunks(north, ids) == []    # chunk ids include the tenant


def test_cited_answer_points_at_the_record(two_tenants):
    svc, north, _ = two_tenants
    result = svc.ask(north, B, "What kind of reaction does he get with shellfish?")
    assert "AllergyIntolerance/ed2878e8-2a6a-1670-fe41-7671badcf53f" in {c["ref"] for c in result["citations"]}
    assert not result["abstained"] and "anaphylaxis" in result["answer"].lower()
    for statement in result["statements"]:
        assert statement["citations"] and all(1 <= n <= len(result["citations"]) for n in statement["citations"])
        assert f"[{statement['citations'][0]}]" in result["answer"]
    assert svc.resource(north, B, result["citations"][0]["ref"])["resourceType"] == result["citations"][0]["resource_type"]
    assert svc.resource(north, A, result["citations"][0]["ref"]) is None      # not A's record


@pytest.mark.parametrize("question", ["Is he on a statin?", "Any COPD history?", "Does he have a pacemaker?"])
def test_abstains_when_the_record_does_not_mention_it(two_tenants, question):
    svc, north, _ = two_tenants
    result = svc.ask(north, A, question)
    # What the record lacks may come first ("No statin is recorded among the patient's medications.").
    opening = re.match(r"(No [^.]+ is recorded among the patient's [^.]+\. )?", result["answer"]).end()
    assert result["abstained"] and result["answer"][opening:].startswith(NO_EVIDENCE) and result["confidence"] == "low"
    # Only what the record holds of the asked class may follow, as context: said not to match when
    # the list is whole, said to be the closest when it is cut.
    assert all(s.get("context") for s in result["statements"])
    assert result["statements"] == [] or "none of which matches" in result["answer"] or "closest first" in result["answer"]


@pytest.mark.parametrize("kind", BACKENDS)
def test_reindexing_is_idempotent_and_deletes_remove_chunks(kind, tmp_path, embedder, small_bundle):
    svc = make_service(kind, tmp_path)
    tenant = f"idem{uuid.uuid4().hex[:8]}"
    pid = small_bundle.name.split(".")[0]
    try:
        first = svc.index_paths(tenant, [small_bundle]).result
        ids = set(svc.backend.indexed_texts(tenant, pid))
        second = svc.index_paths(tenant, [small_bundle]).result
        assert first.embedded == first.chunks == len(ids) > 0
        assert second.embedded == 0 and second.removed == 0 and second.unchanged == first.chunks
        assert set(svc.backend.indexed_texts(tenant, pid)) == ids
        ref = svc.ask(tenant, pid, "What conditions does he have?", k=3)["evidence"][0]["ref"]
        assert svc.backend.delete_refs(tenant, pid, [ref]) >= 1
        again = svc.ask(tenant, pid, "What conditions does he have?", k=10)
        assert all(ref not in e["refs"] for e in again["evidence"])
        assert svc.resource(tenant, pid, ref) is None
    finally:
        drop_tenants(svc, [tenant])
        svc.close()


def two_records_sharing_an_id():
    """Patients p1 and p2, each holding an Observation/shared (one put there by another input)."""
    from fhir_ingest.record.load import PatientRecord

    def potassium(oid: str, patient: str, day: str, value: float) -> dict:
        return {"resourceType": "Observation", "id": oid, "status": "final",
                "code": {"coding": [{"system": "http://loinc.org", "code": "2823-3", "display": "Potassium"}]},
                "subject": {"reference": f"Patient/{patient}"}, "effectiveDateTime": f"{day}T09:00:00Z",
                "valueQuantity": {"value": value, "unit": "mmol/L"}}

    return [PatientRecord(pid, [{"resourceType": "Patient", "id": pid, "gender": "female"},
                                potassium("shared", pid, "2024-03-12", value),
                                potassium(f"{pid}-own", pid, "2024-04-01", 4.0)])
            for pid, value in (("p1", 3.1), ("p2", 5.6))]


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_deletion_removes_the_resource_of_that_patient_only_and_the_summary_counts_without_it(kind, tmp_path,
                                                                                                embedder):
    from search.backends.base import Scope

    svc = make_service(kind, tmp_path)
    tenant = f"scoped{uuid.uuid4().hex[:8]}"
    try:
        for record in two_records_sharing_an_id():
            svc.index_record(tenant, record)
        assert svc.holders(tenant, ["Observation/shared", "Observation/p1-own", "Observation/gone"]) == \
            {"Observation/shared": {"p1", "p2"}, "Observation/p1-own": {"p1"}, "Observation/gone": set()}
        before = svc.patient(tenant, "p1")
        assert svc.delete_resources(tenant, "p1", ["Observation/shared"]) >= 1
        assert svc.resource(tenant, "p1", "Observation/shared") is None
        assert svc.resource(tenant, "p2", "Observation/shared")["valueQuantity"]["value"] == 5.6
        assert "5.6" in svc.ask(tenant, "p2", "K+ on March 12, 2024?")["answer"]
        after = svc.patient(tenant, "p1")
        assert sum(after["chunk_counts"].values()) == svc.backend.count(Scope(tenant, "p1")) \
            < sum(before["chunk_counts"].values())
        assert after["resource_counts"]["Observation"] == before["resource_counts"]["Observation"] - 1
        assert svc.backend.check(tenant).problems == []
        assert svc.holders(tenant, ["Observation/shared"]) == {"Observation/shared": {"p2"}}
    finally:
        drop_tenants(svc, [tenant])
        svc.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_deleted_list_updates_the_summary_in_the_same_write_as_the_chunks(kind, tmp_path, embedder, monkeypatch):
    """A Bulk `deleted` entry removes the resource, its chunks and their counts in the patient
    summary together: on the embedded index in one transaction (a failure before the summary is
    written leaves everything as it was), on Elasticsearch in one bulk request."""
    from search.backends.base import Scope

    svc = make_service(kind, tmp_path)
    tenant = f"together{uuid.uuid4().hex[:8]}"
    try:
        for record in two_records_sharing_an_id():
            svc.index_record(tenant, record)
        backend, chunks = svc.backend, svc.backend.count(Scope(tenant, "p1"))
        if kind == "embedded":
            def fail(*args):
                raise RuntimeError("the disk filled up before the summary was written")

            monkeypatch.setattr(backend, "upsert_patient", fail)
            with pytest.raises(RuntimeError):
                svc.delete_resources(tenant, "p1", ["Observation/p1-own"])
            monkeypatch.undo()
            assert backend.count(Scope(tenant, "p1")) == chunks
            assert svc.resource(tenant, "p1", "Observation/p1-own") is not None
        else:
            writes = []
            original = backend._bulk
            monkeypatch.setattr(backend, "_bulk", lambda actions: writes.append(list(actions)) or original(actions))
        removed = svc.delete_resources(tenant, "p1", ["Observation/p1-own"])
        assert removed >= 1 and backend.check(tenant).problems == []
        assert sum(svc.patient(tenant, "p1")["chunk_counts"].values()) == backend.count(Scope(tenant, "p1")) \
            == chunks - removed
        if kind == "elasticsearch":
            [write] = writes
            assert {a["_op_type"] for a in write} == {"delete", "index"}
            assert any(a["_id"] == "patient|p1" for a in write)
    finally:
        drop_tenants(svc, [tenant])
        svc.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_whole_record_without_a_resource_removes_its_stored_copy_too(kind, tmp_path, embedder, small_bundle):
    """Found when an EHR's full export no longer held a resource: its chunks went, its stored copy
    stayed, so its citation still opened and the next merge brought it back."""
    from fhir_ingest.record.load import PatientRecord, load_resources

    svc = make_service(kind, tmp_path)
    tenant = f"whole{uuid.uuid4().hex[:8]}"
    try:
        [record], _ = load_resources([small_bundle])
        svc.index_record(tenant, record)
        dropped = next(r for r in record.resources if r["resourceType"] == "Observation")
        ref = f"Observation/{dropped['id']}"
        assert svc.resource(tenant, record.patient_id, ref) is not None
        rest = [r for r in record.resources if r is not dropped]
        assert svc.index_record(tenant, PatientRecord(record.patient_id, rest)).removed >= 1
        assert svc.resource(tenant, record.patient_id, ref) is None
        held = {f"{r['resourceType']}/{r['id']}" for r in svc.backend.patient_resources(tenant, record.patient_id)}
        assert ref not in held and len(held) > 5
    finally:
        drop_tenants(svc, [tenant])
        svc.close()


def test_model_check_on_both_backends(tmp_path, embedder, small_bundle):
    from search.backends.elastic import ElasticsearchBackend
    from search.backends.embedded import EmbeddedBackend

    from .conftest import es_url

    EmbeddedBackend(tmp_path / "index.sqlite", "model-a@384-aaaa", 384).close()
    with pytest.raises(ModelMismatch, match="model-a@384-aaaa"):
        EmbeddedBackend(tmp_path / "index.sqlite", "model-b@384-bbbb", 384)
    tenant = f"model{uuid.uuid4().hex[:8]}"
    es = ElasticsearchBackend([es_url()], "model-a@384-aaaa", 384)
    try:
        es.count(__import__("search.backends.base", fromlist=["Scope"]).Scope(tenant, "p"))
        with pytest.raises(ModelMismatch, match="chartcite reindex"):
            ElasticsearchBackend([es_url()], "model-b@384-bbbb", 384).count(
                __import__("search.backends.base", fromlist=["Scope"]).Scope(tenant, "p"))
    finally:
        es.es.indices.delete(index=f"chartcite-{tenant}-*", ignore_unavailable=True, allow_no_indices=True)
        es.close()


def test_reindex_swaps_the_alias_and_questions_keep_working(tmp_path, embedder, small_bundle):
    svc = make_service("elasticsearch", tmp_path)
    tenant = f"swap{uuid.uuid4().hex[:8]}"
    pid = small_bundle.name.split(".")[0]
    try:
        svc.index_paths(tenant, [small_bundle])
        before = svc.ask(tenant, pid, "What conditions does he have?")
        old_index = svc.backend.current_index(tenant)
        moved = svc.reindex(tenant)
        after = svc.ask(tenant, pid, "What conditions does he have?")
        assert moved == sum(1 for _ in svc.backend.scan_chunks(tenant))
        assert svc.backend.current_index(tenant) != old_index and svc.backend.current_index(tenant).endswith("-v2")
        assert not svc.backend.es.indices.exists(index=old_index)
        assert svc.embedder.name in svc.backend.built_with()        # what CHARTCITE_INT8=auto keeps
        assert [e["chunk_id"] for e in after["evidence"]] == [e["chunk_id"] for e in before["evidence"]]
    finally:
        drop_tenants(svc, [tenant])
        svc.close()


def test_unreachable_cluster_is_a_clear_error(tmp_path):
    from search.backends.base import BackendError
    from search.backends.elastic import ElasticsearchBackend

    with pytest.raises(BackendError, match="cannot reach Elasticsearch at http://127.0.0.1:9"):
        ElasticsearchBackend(["http://127.0.0.1:9"], "m", 384, request_timeout=2)


def test_an_index_that_cannot_be_placed_says_why(tmp_path):
    """A shard that cannot be allocated makes every later search fail with "all shards failed";
    the backend says at creation which allocation rule refused it."""
    from search.backends.base import BackendUnavailable
    from search.backends.elastic import ElasticsearchBackend

    from .conftest import es_url

    es = ElasticsearchBackend([es_url()], "model-a@384-aaaa", 384)
    es.allocation_wait = "1s"
    name = f"chartcite-unplaced{uuid.uuid4().hex[:8]}-records"
    try:
        with pytest.raises(BackendUnavailable, match=f"cannot place the index {name}: .*no-such-node"):
            es._create_index(name, timeout="1s", settings={
                "number_of_replicas": 0, "index.routing.allocation.require._name": "no-such-node"})
    finally:
        es.es.indices.delete(index=name, ignore_unavailable=True)
        es.close()


def test_dev_recall_is_the_same_on_both_backends(tmp_path_factory, dev_service, dev_questions, synthea_dir, capsys):
    """recall@5 of `full` on each backend, printed, within 0.05 of each other. The embedded side is
    the session's dev index (the same patients); only Elasticsearch is indexed here."""
    from search.evaluate import recall_at

    answerable = [q for q in dev_questions if q["answerable"]]

    def recall(svc, tenant):
        return sum(recall_at(svc.ask(tenant, q["patient_id"], q["question"]), q["gold"], 5)
                   for q in answerable) / len(answerable)

    figures = {"embedded": recall(dev_service, "default")}
    svc = make_service("elasticsearch", tmp_path_factory.mktemp("dev-elasticsearch"))
    tenant = f"dev{uuid.uuid4().hex[:8]}"
    try:
        svc.index_paths(tenant, [synthea_dir / f"{pid}.json.gz" for pid in sorted({q["patient_id"] for q in dev_questions})])
        figures["elasticsearch"] = recall(svc, tenant)
    finally:
        drop_tenants(svc, [tenant])
        svc.close()
    with capsys.disabled():
        print(f"\ndev recall@5 (full): embedded {figures['embedded']:.3f}, elasticsearch {figures['elasticsearch']:.3f}")
    assert abs(figures["embedded"] - figures["elasticsearch"]) <= 0.05


def test_dev_questions_full_pipeline_beats_dense(dev_service, dev_questions, capsys):
    """recall@5 of `full` ≥ `dense` on the development questions, with the figures printed."""
    from search.evaluate import answer_figures, recall_at, summarise

    if not dev_questions:
        pytest.fail("shared/data/questions/dev.jsonl is missing")
    figures = {}
    for pipeline in ("dense", "hybrid", "full"):
        rows = []
        for q in dev_questions:
            result = dev_service.ask("default", q["patient_id"], q["question"], k=5, pipeline=pipeline)
            rows.append({"id": q["id"], "kind": q["kind"], "answerable": q["answerable"],
                         "recall": {5: recall_at(result, q["gold"], 5)}, "rr": 0.0, "abstained": result["abstained"],
                         **answer_figures(result, q["facts"])})
        figures[pipeline] = summarise(rows, [5], [0.0])
    with capsys.disabled():
        print("\nrecall@5 on dev: " + ", ".join(f"{p} {f['recall']['5']:.3f}" for p, f in figures.items())
              + f"; abstention (full) {figures['full']['abstention_accuracy']:.2f}"
              + f"; facts stated (full) {figures['full']['facts']:.3f}, in the first sentence "
              + f"{figures['full']['first_facts']:.3f}; answer words p50 {figures['full']['words_p50']:.0f} "
              + f"p90 {figures['full']['words_p90']:.0f}; uncited clauses {figures['full']['uncited_clauses']}")
    assert figures["full"]["recall"]["5"] >= figures["dense"]["recall"]["5"]
    # Floors set from the measurement in the README (full 0.957 vs dense 0.712, abstention 1.00,
    # no false abstention when this test was written), with room for unseen phrasing.
    assert figures["full"]["recall"]["5"] >= 0.90
    assert figures["full"]["recall"]["5"] >= 1.25 * figures["dense"]["recall"]["5"]
    assert figures["full"]["abstention_accuracy"] >= 0.95
    assert figures["full"]["false_abstention"] <= 0.05
    # The answer text states the expected facts (values as recorded, the note's listed items):
    # 0.979 measured on dev.
    assert figures["full"]["facts"] >= 0.93
    # The answer first and short, every clause cited (measured on dev: 0.948 of the facts in the
    # first sentence, median 31 words, 0 uncited clauses; 0.59 and 71 words before issue 15).
    assert figures["full"]["uncited_clauses"] == 0
    assert figures["full"]["first_facts"] >= 0.80
    assert figures["full"]["words_p50"] <= 45
    # Never a bare "no evidence" while the record holds entries of the asked class.
    assert figures["full"]["class_present_no_evidence"] == 0


def test_a_patient_twice_in_one_run_ends_as_its_later_record(tmp_path, embedder, synthea_dir):
    """The model starts on a group before the previous one is written; a patient in both (a second
    export of the same record) is planned against the index its first copy leaves, so what the
    later copy no longer holds is removed."""
    from dataclasses import replace

    from fhir_ingest.record.load import load_resources
    from search.backends.base import Scope
    from search.indexer import index_in_turn

    svc = make_service("embedded", tmp_path)
    records, _ = load_resources([synthea_dir / f"{pid}.json.gz" for pid in
                                 ("936988e9-d587-ef42-ebdf-541238540ff3", "0b7496cb-ffc9-0874-03f4-f4841c4dfa63")])
    first, other = records
    later = replace(first, resources=[r for r in first.resources if r["resourceType"] != "Observation"])
    try:
        results = list(index_in_turn(svc.backend, svc.embedder, "t", [first, other, later], group=1))
        assert [r.chunks for r in results][2] < results[0].chunks
        assert svc.backend.count(Scope("t", first.patient_id)) == results[2].chunks
    finally:
        svc.close()


def test_a_patient_is_written_whole_or_not_at_all(tmp_path, embedder, synthea_dir, monkeypatch):
    """A stop between a patient's chunks and its summary (the last write) leaves the index as it
    was: no chunks without the record they cite, no record the patient list does not show."""
    from fhir_ingest.record.load import load_resources
    from search.backends.base import Scope

    svc = make_service("embedded", tmp_path)
    records, _ = load_resources([synthea_dir / "936988e9-d587-ef42-ebdf-541238540ff3.json.gz"])
    record = records[0]

    def stop(*args):
        raise RuntimeError("the process stopped here")

    monkeypatch.setattr(svc.backend, "upsert_patient", stop)
    try:
        with pytest.raises(RuntimeError, match="stopped here"):
            svc.index_record("t", record)
        assert svc.backend.count(Scope("t", record.patient_id)) == 0
        assert svc.backend.patient_resources("t", record.patient_id) == []
        monkeypatch.undo()
        assert svc.index_record("t", record).chunks == svc.backend.count(Scope("t", record.patient_id)) > 0
    finally:
        svc.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_writes_in_a_deferred_refresh_block_are_searchable_when_it_ends_even_by_an_error(kind, tmp_path, embedder,
                                                                                       synthea_dir):
    """A Bulk Data round refreshes once per group of patients; what it wrote is searchable when the
    group ends, also when a later patient's failure ends it; another thread's writes meanwhile (a
    clinician's launch) are searchable at once."""
    import threading

    from fhir_ingest.record.load import load_resources
    from search.backends.base import Scope

    svc = make_service(kind, tmp_path)
    tenant = f"defer{uuid.uuid4().hex[:8]}"
    small = ["936988e9-d587-ef42-ebdf-541238540ff3", "0b7496cb-ffc9-0874-03f4-f4841c4dfa63",
             "243a6f9d-3a82-8e87-3adf-5b1a447a6f30"]
    records, _ = load_resources([synthea_dir / f"{pid}.json.gz" for pid in small])
    written = {}
    try:
        with pytest.raises(RuntimeError, match="a later patient failed"):
            with svc.deferred_refresh():
                for record in records[:2]:
                    written[record.patient_id] = svc.index_record(tenant, record).chunks
                launch = threading.Thread(target=lambda: written.update(
                    {records[2].patient_id: svc.index_record(tenant, records[2]).chunks}))
                launch.start()
                launch.join()
                assert svc.backend.count(Scope(tenant, records[2].patient_id)) == written[records[2].patient_id]
                raise RuntimeError("a later patient failed")
        for record in records:
            assert svc.backend.count(Scope(tenant, record.patient_id)) == written[record.patient_id] > 0
            assert svc.patient(tenant, record.patient_id)["patient_id"] == record.patient_id
    finally:
        drop_tenants(svc, [tenant])
        svc.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_what_orjson_refuses_is_stored_as_read(kind, tmp_path, embedder):
    """Both backends write with orjson, which refuses an integer beyond 64 bits and a lone
    surrogate (both read as they were); the write falls back to the standard json module rather
    than losing the patient's record."""
    svc = make_service(kind, tmp_path)
    tenant = f"bigint{uuid.uuid4().hex[:8]}"
    observation = {"resourceType": "Observation", "id": "huge", "status": "final", "subject": {"reference": "Patient/p"},
                   "code": {"text": "count \udcff"}, "valueInteger": 10 ** 30}
    try:
        svc.backend.store_resources(tenant, "p", [observation])
        assert svc.resource(tenant, "p", "Observation/huge") == observation
    finally:
        drop_tenants(svc, [tenant])
        svc.close()


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_search_failed_by_a_lost_shard_is_a_fault_that_passes(status):
    """Inside an `_msearch`, a search over a shard whose node just died answers 502 "Partial
    shards failure": a question then gets "unavailable for a moment" (503), never a 500."""
    from search.backends.base import BackendUnavailable
    from search.backends.elastic import ElasticsearchBackend

    with pytest.raises(BackendUnavailable):
        ElasticsearchBackend._raise_for(status, {"type": "search_phase_execution_exception",
                                                 "reason": "Partial shards failure"})

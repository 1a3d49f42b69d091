"""Index and retrieval behaviour on the embedded backend with the real model."""
from __future__ import annotations

import pytest

from search.answering.answer import NEW_PATIENT, NO_EVIDENCE
from search.backends.base import ModelMismatch
from search.backends.embedded import EmbeddedBackend
from search.service import SearchService

A = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"   # aspirin allergy, EpiPen
B = "a4e05cb8-cdb8-8733-1a63-5a49aa15c251"   # shellfish allergy, prediabetes


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory, embedder, synthea_dir):
    """Patient A and B in tenant 'north'; patient B also in tenant 'south'."""
    svc = SearchService("embedded", tmp_path_factory.mktemp("scope") / "index.sqlite")
    svc.index_paths("north", [synthea_dir / f"{A}.json.gz", synthea_dir / f"{B}.json.gz"])
    svc.index_paths("south", [synthea_dir / f"{B}.json.gz"])
    yield svc
    svc.close()


@pytest.mark.parametrize("pipeline", ["dense", "hybrid", "full"])
def test_a_question_about_one_patient_never_returns_another(two_tenants, pipeline):
    # Shellfish is in B's record only; asked about A it must not surface B's allergy.
    result = two_tenants.ask("north", A, "shellfish allergy reaction?", k=10, pipeline=pipeline)
    north_a = {c.chunk_id for c in two_tenants.backend.get_chunks("north", [e["chunk_id"] for e in result["evidence"]])}
    assert result["evidence"] and all(e["ref"] for e in result["evidence"])
    for ev in result["evidence"]:
        chunk = two_tenants.backend.get_chunks("north", [ev["chunk_id"]])[0]
        assert chunk.patient_id == A and chunk.tenant == "north"
    assert len(north_a) == len(result["evidence"])


def test_tenants_are_isolated_inside_the_query(two_tenants):
    result = two_tenants.ask("south", A, "any allergies?", k=10)
    assert result["evidence"] == [] and result["abstained"] and result["answer"] == NEW_PATIENT
    south = two_tenants.ask("south", B, "What kind of reaction does he get with shellfish?")
    assert not south["abstained"]
    chunks = two_tenants.backend.get_chunks("south", [e["chunk_id"] for e in south["evidence"]])
    assert chunks and all(c.tenant == "south" for c in chunks)
    assert two_tenants.backend.get_chunks("north", [e["chunk_id"] for e in south["evidence"]]) == []


def test_cited_answer_points_at_the_record(two_tenants):
    result = two_tenants.ask("north", B, "What kind of reaction does he get with shellfish?")
    assert not result["abstained"]
    assert "anaphylaxis" in result["answer"].lower()
    refs = {c["ref"] for c in result["citations"]}
    assert "AllergyIntolerance/ed2878e8-2a6a-1670-fe41-7671badcf53f" in refs
    for statement in result["statements"]:
        assert statement["citations"] and all(1 <= n <= len(result["citations"]) for n in statement["citations"])
        assert f"[{statement['citations'][0]}]" in result["answer"]


@pytest.mark.parametrize("question", ["Is he on a statin?", "Any COPD history?", "Does he have a pacemaker?"])
def test_abstains_when_the_record_does_not_mention_it(two_tenants, question):
    result = two_tenants.ask("north", A, question)
    assert result["abstained"] is True
    assert result["answer"].startswith(NO_EVIDENCE)
    # Only what the record holds of the asked class may follow, each entry said not to match.
    assert all(s.get("context") for s in result["statements"])
    assert result["statements"] == [] or "none of which matches" in result["answer"]
    assert result["confidence"] == "low"


def test_reindexing_the_same_record_embeds_nothing_and_keeps_ids(tmp_path, embedder, small_bundle):
    svc = SearchService("embedded", tmp_path / "index.sqlite")
    first = svc.index_paths("t", [small_bundle]).result
    ids = set(svc.backend.indexed_texts("t", small_bundle.name.split(".")[0]))
    second = svc.index_paths("t", [small_bundle]).result
    assert first.embedded == first.chunks > 0
    assert second.embedded == 0 and second.unchanged == first.chunks and second.removed == 0
    assert set(svc.backend.indexed_texts("t", small_bundle.name.split(".")[0])) == ids
    svc.close()


def test_an_index_refuses_a_different_model(tmp_path):
    EmbeddedBackend(tmp_path / "index.sqlite", "model-a@384-aaaa", 384).close()
    with pytest.raises(ModelMismatch, match="model-a@384-aaaa"):
        EmbeddedBackend(tmp_path / "index.sqlite", "model-b@768-bbbb", 768)


def test_deleting_a_resource_removes_its_chunks(tmp_path, embedder, small_bundle):
    svc = SearchService("embedded", tmp_path / "index.sqlite")
    svc.index_paths("t", [small_bundle])
    pid = small_bundle.name.split(".")[0]
    result = svc.ask("t", pid, "What conditions does he have?", k=3)
    ref = result["evidence"][0]["ref"]
    removed = svc.backend.delete_refs("t", [ref])
    assert removed >= 1
    again = svc.ask("t", pid, "What conditions does he have?", k=10)
    assert all(ref not in (e["refs"]) for e in again["evidence"])
    svc.close()


def test_dev_questions_full_pipeline_beats_dense(dev_service, dev_questions, capsys):
    """recall@5 of `full` ≥ `dense` on the development questions, with the figures printed."""
    from search.evaluate import facts_stated, recall_at, summarise

    if not dev_questions:
        pytest.fail("shared/data/questions/dev.jsonl is missing")
    figures = {}
    for pipeline in ("dense", "hybrid", "full"):
        rows = []
        for q in dev_questions:
            result = dev_service.ask("default", q["patient_id"], q["question"], k=5, pipeline=pipeline)
            rows.append({"id": q["id"], "kind": q["kind"], "answerable": q["answerable"],
                         "recall": {5: recall_at(result, q["gold"], 5)}, "rr": 0.0, "abstained": result["abstained"],
                         "facts": facts_stated(result, q["facts"])})
        figures[pipeline] = summarise(rows, [5], [0.0])
    with capsys.disabled():
        print("\nrecall@5 on dev: " + ", ".join(f"{p} {f['recall']['5']:.3f}" for p, f in figures.items())
              + f"; abstention (full) {figures['full']['abstention_accuracy']:.2f}"
              + f"; facts stated (full) {figures['full']['facts']:.3f}")
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
    # Never a bare "no evidence" while the record holds entries of the asked class.
    assert figures["full"]["class_present_no_evidence"] == 0

"""A first sync makes the whole record searchable by its words before any vector exists (issue 16):
questions asked meanwhile are answered from BM25, concepts and structured facts, and say that the
record is still being read; a run that stops before its last vector leaves chunks a later run
embeds, and `check` says so meanwhile. On both backends."""
from __future__ import annotations

import uuid

import pytest

from fhir_ingest.record.load import load_resources
from search.answering.answer import NO_EVIDENCE_YET

from .conftest import BACKENDS, drop_tenants, make_service

PATIENT = "0c920ac4-2a01-a27d-3d46-1ae563ad206b"       # 241 resources: several vector batches


class StopsAfterFirstBatch:
    """The real embedder, which fails (as a killed worker would) once it has embedded one batch."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, texts, **kwargs):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("worker stopped")
        return self.inner.encode(texts, **kwargs)


@pytest.fixture(params=BACKENDS)
def service(request, tmp_path):
    svc = make_service(request.param, tmp_path)
    tenant = f"words{uuid.uuid4().hex[:8]}"
    yield svc, tenant
    drop_tenants(svc, [tenant])
    svc.close()


def test_questions_asked_while_vectors_are_written_are_answered_and_say_so(service, synthea_dir):
    svc, tenant = service
    (record,), _ = load_resources([synthea_dir / f"{PATIENT}.json.gz"])
    asked = {}

    def progress(phase, done, total):
        if phase == "embedding" and 0 < done < total and not asked:
            asked["pending"] = total - done
            for question in ("What are the active problems?", "What was her most recent body weight?",
                             "Has she had a liver transplant?"):
                asked[question] = svc.answer(tenant, PATIENT, question)

    result = svc.index_record(tenant, record, progress, words_first=True)
    assert asked, "the record was embedded in one batch: the test needs a record of several"
    problems = asked["What are the active problems?"]
    assert not problems.abstained and any(c.ref.startswith("Condition/") for c in problems.citations)
    assert (f"Still reading this record: {result.chunks - asked['pending']} of its {result.chunks} passages are "
            "searchable by meaning so far") in problems.reading
    # A body weight is neither a problem, a medication nor an allergy: its vector comes after
    # theirs, yet its words and codes already answer.
    weight = asked["What was her most recent body weight?"]
    assert not weight.abstained and weight.citations[0].ref.startswith("Observation/")
    assert "kg" in weight.statements[0].text and weight.reading
    transplant = asked["Has she had a liver transplant?"]
    assert transplant.abstained and transplant.answer.startswith(NO_EVIDENCE_YET)
    # Finished: every chunk has its vector, and answers no longer carry the notice.
    assert result.embedded == result.chunks
    done = svc.answer(tenant, PATIENT, "What are the active problems?")
    assert done.reading is None and "reading" not in done.to_dict()
    assert svc.backend.check(tenant).problems == []


def test_a_run_that_stops_mid_way_leaves_chunks_the_next_run_embeds(service, synthea_dir, embedder):
    svc, tenant = service
    (record,), _ = load_resources([synthea_dir / f"{PATIENT}.json.gz"])
    from search.indexer import index_record

    with pytest.raises(RuntimeError, match="worker stopped"):
        index_record(svc.backend, StopsAfterFirstBatch(svc.embedder), tenant, record, words_first=True)
    check = svc.backend.check(tenant)
    pending = check.counts["vectors pending"]
    assert 0 < pending < check.counts["chunks"]
    assert any("still wait for their vector" in p for p in check.problems)
    stopped = svc.answer(tenant, PATIENT, "What was her most recent body weight?")
    assert not stopped.abstained and f"{check.counts['chunks'] - pending} of its" in stopped.reading
    # The next sync (of a patient already held: not words first) embeds exactly what was pending.
    again = svc.index_record(tenant, record)
    assert again.embedded == pending
    assert svc.backend.check(tenant).problems == []
    assert svc.answer(tenant, PATIENT, "What was her most recent body weight?").reading is None


def test_a_vector_for_a_chunk_removed_meanwhile_is_skipped(service, synthea_dir, embedder):
    """Between a first sync's words and its vectors, a Bulk round may delete one of the patient's
    resources: the vectors of the rest are written, and the removed chunk stays removed."""
    svc, tenant = service
    (record,), _ = load_resources([synthea_dir / f"{PATIENT}.json.gz"])
    from search.indexer import RecordPlan, plan_record, prepare_record, store_record

    plan: RecordPlan = plan_record(svc.backend, tenant, prepare_record(tenant, record, svc.embedder.budget()))
    chunks = [c for c, _ in plan.changed][:20]
    lexicals = [lx for _, lx in plan.changed][:20]
    store_record(svc.backend, tenant, plan, pending=len(chunks))
    svc.backend.index(chunks, [None] * len(chunks), lexicals)
    assert svc.backend.delete_chunks(tenant, [chunks[0].chunk_id]) == 1
    svc.backend.add_vectors(chunks, svc.embedder.encode([c.text for c in chunks]), lexicals)
    held = svc.backend.indexed_texts(tenant, PATIENT)
    assert chunks[0].chunk_id not in held and len(held) == len(chunks) - 1
    assert svc.backend.check(tenant).counts.get("vectors pending", 0) == 0

"""A real `chartcite worker` process on the Redis broker, indexing into the real Elasticsearch node.

Syncs a patient until searchable; then kills the worker in the middle of a second sync and shows
that a re-run converges to the same index: the same chunk ids, no duplicates, nothing missing.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from search.backends.base import VECTOR_PENDING

from .conftest import clean_env, es_url, redis_url

REPO = Path(__file__).resolve().parent.parent
SMALL = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"
LARGE = "df0d0a6e-c262-824e-a4ff-c5b2d6ad334c"     # 962 resources: long enough to be interrupted


@pytest.fixture()
def env(tmp_path, synthea_dir):
    source = tmp_path / "source"
    source.mkdir()
    for pid in (SMALL, LARGE):
        shutil.copy(synthea_dir / f"{pid}.json.gz", source)
    tenant = f"e2e{uuid.uuid4().hex[:8]}"
    settings_env = clean_env(data_dir=tmp_path / "data", demo_source=source, demo_launch="true", backend="elasticsearch", es_url=es_url(),
                             redis_url=redis_url(), tasks_eager="false", tenant=tenant)
    import redis

    redis.Redis.from_url(redis_url()).flushdb()     # no tasks left over from another run
    yield settings_env, tenant
    from elasticsearch import Elasticsearch

    Elasticsearch([es_url()]).indices.delete(index=f"chartcite-{tenant}-*", ignore_unavailable=True, allow_no_indices=True)


def start_worker(env, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "smart_app.cli", "worker"], cwd=REPO, env=env,
                            stdout=open(log, "a", encoding="utf-8"), stderr=subprocess.STDOUT, start_new_session=True)


def enqueue(env, tenant, pid) -> None:
    code = ("from smart_app.settings import Settings; from workers.runner import TaskRunner; "
            f"print(TaskRunner(Settings.load()).enqueue_sync({tenant!r}, {pid!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, encoding="utf-8")
    assert out.stdout.strip() == "True", out.stderr


# A job that shows no change at all (state, phase, count) for this long is stuck, not slow.
STUCK_SECONDS = 300


def wait_job(jobs, tenant, pid, states, phase=None, watched=()):
    """The job once it is in one of `states` (in `phase` with something done), waited for as long
    as work moves: its own progress, or that of the `watched` jobs it may be queued behind. A busy
    machine makes every step slower; only a job that stops moving fails the wait."""
    last, moved = None, time.time()
    while True:
        job = jobs.get(tenant, pid)
        if job and job.state in states and (phase is None or (job.phase == phase and job.done > 0)):
            return job
        seen = [(j.state, j.phase, j.done) if j else None for j in (job, *(jobs.get(tenant, w) for w in watched))]
        if seen != last:
            last, moved = seen, time.time()
        if time.time() - moved > STUCK_SECONDS:
            raise AssertionError(f"job for {pid} never reached {states}: nothing moved for {STUCK_SECONDS} s "
                                 f"(last: {job})")
        time.sleep(0.5)


def expected_chunk_ids(tenant, synthea_dir, pid, embedder) -> set[str]:
    from fhir_ingest.record.chunk import PatientChunker
    from fhir_ingest.record.load import load_resources

    records, _ = load_resources([synthea_dir / f"{pid}.json.gz"])
    return {c.chunk_id for c in PatientChunker(tenant, pid, records[0].resources, embedder.budget()).chunks()}


def test_worker_syncs_and_a_killed_sync_converges_on_rerun(env, tmp_path, synthea_dir, embedder):
    from search.backends.elastic import ElasticOptions
    from search.service import SearchService
    from workers.progress import RedisJobStore

    settings_env, tenant = env
    jobs = RedisJobStore(redis_url())
    log = tmp_path / "worker.log"
    worker = start_worker(settings_env, log)
    svc = SearchService("elasticsearch", tmp_path / "unused.sqlite", es=ElasticOptions((es_url(),)))
    try:
        enqueue(settings_env, tenant, SMALL)
        wait_job(jobs, tenant, SMALL, {"done"})
        answer = svc.ask(tenant, SMALL, "Does he carry an EpiPen?")
        assert not answer["abstained"] and "Epinephrine" in answer["answer"]

        # Second sync: kill -9 the worker while it is embedding the large record.
        enqueue(settings_env, tenant, LARGE)
        wait_job(jobs, tenant, LARGE, {"running"}, phase="embedding")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        partial = svc.backend.indexed_texts(tenant, LARGE)
        expected = expected_chunk_ids(tenant, synthea_dir, LARGE, embedder)
        # Interrupted part way: a first sync writes every chunk by its words first, so all are
        # there, some still waiting for their vector.
        assert set(partial) == expected and VECTOR_PENDING in partial.values()

        # A re-run (new worker, the sync queued again once the dead job is stale or forced) converges.
        jobs.set(tenant, LARGE, "failed", "done", message="worker killed")
        worker = start_worker(settings_env, log)
        enqueue(settings_env, tenant, LARGE)
        wait_job(jobs, tenant, LARGE, {"done"})
        indexed = svc.backend.indexed_texts(tenant, LARGE)
        assert set(indexed) == expected and VECTOR_PENDING not in indexed.values()
        hits = svc.backend.es.count(index=svc.backend.alias(tenant),
                                    query={"term": {"patient_id": LARGE}})["count"]
        assert hits == len(expected)          # no duplicates
        assert set(svc.backend.indexed_texts(tenant, SMALL)) == expected_chunk_ids(tenant, synthea_dir, SMALL, embedder)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        svc.close()

"""Scale-out, proven: a two-node Elasticsearch cluster (indices with one replica), two real Celery
workers and `chartcite serve`. One node is killed in the middle of a sync and of a stream of
questions: no acknowledged chunk is lost, questions keep being answered (or get a clear 503 during
the failover window, never a 500 and never an answer from part of the record), and the sync
converges to exactly the chunks the records make."""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from .conftest import clean_env, redis_url
from .es_cluster import kill, start_cluster
from .fhir_servers import REPO, free_port, stop, wait_for
from .test_workers_e2e import enqueue, expected_chunk_ids, start_worker, wait_job

ASKED = "936988e9-d587-ef42-ebdf-541238540ff3"           # indexed before the failure; asked about throughout
SYNCED = ["df0d0a6e-c262-824e-a4ff-c5b2d6ad334c",         # 962 resources: still embedding when the node dies
          "baef3b4c-7be0-5b74-d702-108d9fb83d9a", "a8f74921-6700-47ab-2847-fdab282640f0"]
FAILOVER_WINDOW = 60.0      # seconds after the kill within which a 503 is acceptable
QUESTIONS = ["What medications is the patient taking?", "What are the active problems?",
             "When was the last encounter?", "What immunizations has the patient had?"]


def free_block() -> int:
    """A base port with base, base+1, base+100 and base+101 all free (HTTP and transport ports)."""
    for _ in range(200):
        base = random.randrange(20000, 30000)
        try:
            for port in (base, base + 1, base + 100, base + 101):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block")


class QuestionStream(threading.Thread):
    """A clinician asking one question after another, noting when and what came back."""

    def __init__(self, base: str, handle: str):
        super().__init__(daemon=True)
        self.base, self.handle = base, handle
        self.results: list[tuple[float, int, dict]] = []
        self.running = threading.Event()
        self.running.set()

    def run(self) -> None:
        n = 0
        while self.running.is_set():
            try:
                response = requests.post(f"{self.base}/api/ask", json={"question": QUESTIONS[n % len(QUESTIONS)]},
                                         headers={"X-Chartcite-Session": self.handle}, timeout=120)
                body = response.json() if response.headers.get("Content-Type", "").startswith("application/json") else {}
                self.results.append((time.time(), response.status_code, body))
            except requests.RequestException as exc:
                self.results.append((time.time(), 0, {"error": type(exc).__name__}))
            n += 1
            time.sleep(0.2)


@pytest.fixture()
def cluster():
    # Not under pytest's tmp_path: that is private to root, and the nodes run as their own user.
    folder = Path(tempfile.mkdtemp(prefix="chartcite-es-cluster-"))
    folder.chmod(0o711)
    try:
        nodes = start_cluster(folder, free_block(), f"chartcite-failover-{uuid.uuid4().hex[:6]}")
        yield nodes
        for node in nodes:
            kill(node, signal.SIGTERM)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_losing_a_node_mid_sync_loses_nothing_and_questions_carry_on(cluster, tmp_path, synthea_dir, embedder):
    import redis

    from search.backends.elastic import ElasticOptions
    from search.service import SearchService
    from workers.progress import RedisJobStore

    source = tmp_path / "source"
    source.mkdir()
    for pid in [ASKED, *SYNCED]:
        shutil.copy(synthea_dir / f"{pid}.json.gz", source)
    tenant = f"failover{uuid.uuid4().hex[:6]}"
    urls = ",".join(node.url for node in cluster)
    port = free_port()
    env = clean_env(data_dir=tmp_path / "data", demo_source=source, demo_launch="true", backend="elasticsearch",
                    es_url=urls, es_shards=2, es_replicas=1, redis_url=redis_url(), tasks_eager="false",
                    tenant=tenant, web_threads=4, rate_limit_clinician="100000/minute")
    redis.Redis.from_url(redis_url()).flushdb()          # no tasks left over from another run
    indexed = subprocess.run([sys.executable, "-m", "smart_app.cli", "index", str(source / f"{ASKED}.json.gz")],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600, encoding="utf-8")
    assert indexed.returncode == 0, indexed.stderr
    health = requests.get(f"{cluster[0].url}/_cluster/health", params={"wait_for_status": "green", "timeout": "60s"},
                          timeout=90).json()
    assert health["status"] == "green", health            # every shard has its replica on the other node

    processes = []
    log = tmp_path / "workers.log"
    svc = SearchService("elasticsearch", tmp_path / "unused.sqlite", es=ElasticOptions((cluster[0].url,)))
    try:
        processes += [start_worker(env, log), start_worker(env, log)]
        serve_log = tmp_path / "serve.log"
        app = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(port)], cwd=REPO,
                               env=env, stdout=serve_log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
        processes.append(app)
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/healthz", app, serve_log, seconds=120)
        page = requests.post(f"{base}/demo/launch", data={"patient_id": ASKED}, timeout=60)
        handle = re.search(r'name="chartcite-session" content="([^"]+)"', page.text).group(1)
        stream = QuestionStream(base, handle)
        stream.start()

        jobs = RedisJobStore(redis_url())
        for pid in SYNCED:
            enqueue(env, tenant, pid)
        wait_job(jobs, tenant, SYNCED[0], {"running"}, phase="embedding", watched=SYNCED)
        killed_at = time.time()
        kill(cluster[1])                                   # a crash, not a clean stop
        for pid in SYNCED:
            assert wait_job(jobs, tenant, pid, {"done", "failed"}, watched=SYNCED).state == "done"
        time.sleep(3)
        stream.running.clear()
        stream.join(120)

        for pid in [ASKED, *SYNCED]:
            expected = expected_chunk_ids(tenant, synthea_dir, pid, embedder)
            assert set(svc.backend.indexed_texts(tenant, pid)) == expected, pid
            count = svc.backend.es.count(index=svc.backend.alias(tenant), query={"term": {"patient_id": pid}})["count"]
            assert count == len(expected), pid            # converged without duplicates

        statuses = [status for _, status, _ in stream.results]
        print(f"questions: {len(statuses)}, 503s: {statuses.count(503)}, synced chunks: "
              f"{sum(len(svc.backend.indexed_texts(tenant, p)) for p in SYNCED)}; worker retries: "
              f"{log.read_text(encoding='utf-8').count('Retry in')}")
        assert set(statuses) <= {200, 503}, [r for r in stream.results if r[1] not in (200, 503)][:3]
        late = [when - killed_at for when, status, _ in stream.results if status == 503]
        assert all(0 <= t <= FAILOVER_WINDOW for t in late), late
        for _, status, body in stream.results:
            if status == 503:
                assert "unavailable for a moment" in body["error"]
        after = [body for when, status, body in stream.results if status == 200 and when > killed_at]
        assert len(after) >= 5 and all("answer" in body for body in after)
        assert requests.get(f"{cluster[0].url}/_cluster/health", timeout=10).json()["number_of_nodes"] == 1
    finally:
        for process in processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except OSError:
                    stop(process)
        for process in processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        svc.close()

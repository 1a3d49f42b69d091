"""The Elasticsearch side: bulk indexing chunks/s without embedding, ask p50/p95 on both backends in
the same run over the dev questions, and indexing throughput through a Celery worker vs in-process.

Needs the test services: `eval $(scripts/services.sh up)` (or `make bench`, which starts them).
Usage: python bench/elastic.py [--patients N]. The last line is for scripts:
`elastic: bulk_chunks_per_s=… bulk_grouped_chunks_per_s=… ask_p50_ms=… ask_p95_ms=… cpu="…" cores=… isa=…`;
the first names the processor.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402
from fhir_ingest.record.chunk import PatientChunker  # noqa: E402
from fhir_ingest.record.load import load_resources  # noqa: E402
from search.nlp.annotate import default_annotator, record_terms_from_chunks  # noqa: E402
from search.evaluate import percentile  # noqa: E402
from search.indexer import lexical_text  # noqa: E402
from search.backends.elastic import ElasticOptions  # noqa: E402
from search.service import SearchService  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


def es_service(tmp: Path) -> SearchService:
    url = os.environ.get("CHARTCITE_ES_URL")
    if not url:
        sys.exit("CHARTCITE_ES_URL is not set: run `eval $(scripts/services.sh up)` first")
    return SearchService("elasticsearch", tmp / "unused.sqlite", es=ElasticOptions((url,)))


def bulk_rate(svc: SearchService, files: list[Path]) -> tuple[list[str], dict[tuple[bool, bool], float]]:
    """Chunks/s into Elasticsearch with the embeddings computed beforehand (not timed): the chunks
    alone, then with each patient's source records and summary as indexing writes them; each with
    a refresh per patient (a launch's sync: searchable at once) and with one refresh per Bulk Data
    group of patients (`deferred_refresh`, as a bulk round writes)."""
    records, _ = load_resources(files)
    batches = []
    for record in records:
        chunks = PatientChunker("bench", record.patient_id, record.resources, svc.embedder.budget()).chunks()
        default_annotator().annotate_chunks(chunks, record_terms_from_chunks(chunks))
        batches.append((record, chunks, svc.embedder.encode([c.text for c in chunks]), [lexical_text(c) for c in chunks]))
    total = sum(len(b[1]) for b in batches[1:])
    lines, rates = [], {}
    for with_records in (False, True):
        for deferred in (False, True):
            tenant = f"bench{uuid.uuid4().hex[:6]}"
            for chunk in (c for b in batches for c in b[1]):
                chunk.tenant = tenant
            record, chunks, vectors, lexicals = batches[0]
            svc.backend.index(chunks, vectors, lexicals)   # creates the tenant's indices (once per tenant, not per write)
            svc.backend.store_resources(tenant, record.patient_id, record.resources)
            t = time.perf_counter()
            with svc.deferred_refresh() if deferred else nullcontext():
                for record, chunks, vectors, lexicals in batches[1:]:
                    svc.backend.index(chunks, vectors, lexicals)
                    if with_records:
                        svc.backend.store_resources(tenant, record.patient_id, record.resources)
                        svc.backend.upsert_patient(tenant, record.patient_id, {"patient_id": record.patient_id})
            seconds = time.perf_counter() - t
            rates[(with_records, deferred)] = total / seconds
            svc.backend.es.indices.delete(index=f"chartcite-{tenant}-*", allow_no_indices=True)
            what = "chunks, source records and summary" if with_records else "chunks alone"
            how = f"one refresh for the {len(batches) - 1} patients" if deferred else "a refresh per patient"
            lines.append(f"bulk index, {what}, {how}: {total} chunks in {seconds:.1f}s = {total / seconds:.0f} chunks/s")
    lines.append("(no embedding timed; the first patient, which created the indices, untimed)")
    return lines, rates


def ask_latency(questions: list[dict], services: dict[str, SearchService], tenant: str) -> tuple[list[str], dict]:
    lines, figures = [f"{'backend':14} {'p50 ms':>8} {'p95 ms':>8}"], {}
    for name, svc in services.items():
        svc.ask(tenant, questions[0]["patient_id"], "warm-up")
        latencies = []
        for q in questions:
            t = time.perf_counter()
            svc.ask(tenant, q["patient_id"], q["question"])
            latencies.append((time.perf_counter() - t) * 1000)
        figures[name] = (percentile(latencies, .5), percentile(latencies, .95))
        lines.append(f"{name:14} {figures[name][0]:8.1f} {figures[name][1]:8.1f}")
    return lines, figures


def celery_vs_inprocess(files: list[Path], tmp: Path) -> list[str]:
    """The same patients synced by one real worker on Redis, and in-process, both into Elasticsearch."""
    source = tmp / "source"
    source.mkdir()
    for f in files:
        shutil.copy(f, source)
    pids = [f.name.split(".")[0] for f in files]
    out = []
    # In-process.
    tenant = f"inproc{uuid.uuid4().hex[:6]}"
    svc = es_service(tmp)
    t = time.perf_counter()
    result = svc.index_paths(tenant, files).result
    inproc = time.perf_counter() - t
    svc.backend.es.indices.delete(index=f"chartcite-{tenant}-*", allow_no_indices=True)
    out.append(f"in-process:      {result.chunks} chunks in {inproc:.1f}s = {result.chunks / inproc:.1f} chunks/s")
    # Through a Celery worker on Redis (the worker loads its own model: its start-up is not timed).
    tenant = f"celery{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, CHARTCITE_DATA_DIR=str(tmp / "data"), CHARTCITE_DEMO_SOURCE=str(source),
               CHARTCITE_BACKEND="elasticsearch", CHARTCITE_TASKS_EAGER="false", CHARTCITE_TENANT=tenant)
    worker = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "worker"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from smart_app.settings import Settings
    from workers.progress import RedisJobStore
    from workers.runner import TaskRunner

    jobs = RedisJobStore(os.environ["CHARTCITE_REDIS_URL"])
    runner = TaskRunner(Settings.load(env))
    runner.enqueue_sync(tenant, pids[0])                 # warm the worker's model on the first patient
    while (job := jobs.get(tenant, pids[0])) is None or job.state != "done":
        time.sleep(0.2)
    t = time.perf_counter()
    for pid in pids[1:]:
        runner.enqueue_sync(tenant, pid)
    while any((j := jobs.get(tenant, pid)) is None or j.state != "done" for pid in pids[1:]):
        time.sleep(0.2)
    seconds = time.perf_counter() - t
    chunks = sum(jobs.get(tenant, pid).total for pid in pids[1:])
    worker.terminate()
    worker.wait(timeout=60)
    es_service(tmp).backend.es.indices.delete(index=f"chartcite-{tenant}-*", allow_no_indices=True)
    out.append(f"celery (1 worker): {chunks} chunks in {seconds:.1f}s = {chunks / seconds:.1f} chunks/s "
               f"(patients 2..{len(pids)}; the first warmed the worker)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--patients", type=int, default=0, help="only the first N dev patients (default: all 14)")
    args = parser.parse_args()
    print(header(), flush=True)
    questions = [json.loads(line) for line in open(SHARED / "questions" / "dev.jsonl", encoding="utf-8") if line.strip()]
    ids = sorted({q["patient_id"] for q in questions})[: args.patients or None]
    questions = [q for q in questions if q["patient_id"] in ids]
    files = [SHARED / "synthea" / f"{pid}.json.gz" for pid in ids]
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        es = es_service(tmp)
        lines, rates = bulk_rate(es, files)
        print("\n".join(lines))
        tenant = f"ask{uuid.uuid4().hex[:6]}"
        embedded = SearchService("embedded", tmp / "index.sqlite")
        embedded.index_paths(tenant, files)
        es.index_paths(tenant, files)
        lines, latency = ask_latency(questions, {"embedded": embedded, "elasticsearch": es}, tenant)
        print("\n".join(lines))
        es.backend.es.indices.delete(index=f"chartcite-{tenant}-*", allow_no_indices=True)
        print("\n".join(celery_vs_inprocess(files[:6], tmp)))
    print(f"elastic: bulk_chunks_per_s={rates[(False, False)]:.0f} bulk_grouped_chunks_per_s={rates[(False, True)]:.0f} "
          f"ask_p50_ms={latency['elasticsearch'][0]:.1f} ask_p95_ms={latency['elasticsearch'][1]:.1f} {fields()}")


if __name__ == "__main__":
    main()

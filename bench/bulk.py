"""A Bulk Data round end to end, against a local Bulk Data server the test suite also starts:
sekmet-fhir (a FHIR R4 server from PyPI) loaded with N patients made from the shared Synthea
bundles of one Synthea run (copies with every resource id rewritten, so 1,000 patients are 29
copies of 35 records, each with ids of its own), behind tests/ehr_server.py (SMART Backend
Services and Bulk Data). No network; the generated bundles and every data directory stay in a
temporary folder.

Each mode syncs the whole group into a fresh data directory (a first round: full):
- `embedded`: `chartcite sync` in one process, the embedded index (the default);
- `elastic`: the same into Elasticsearch;
- `workers-N`: `chartcite sync --workers` (export and downloads) with N `chartcite worker`
  processes indexing the parts, into Elasticsearch, over Redis.

Printed per mode: resources/s end to end (kick-off to the round's end; by resources indexed, and
by all the resources the EHR serves for the group) and while indexing (first
part claimed to last part done), the CPU seconds (user + system) of chartcite's processes (the
sync and its workers; not the EHR's) per resource, and their bound on 2 cores (2 × resources per
CPU-second: what a machine of its own would reach end to end if chartcite kept both cores busy),
the share of the indexing time the model alone would need
(chunks embedded ÷ the model's own rate on these chunks' texts, measured here), the peak RSS of
each process, and the staging database's size. The processor is the first line; the last is for
scripts: `bulk: patients=… embedded_resources_per_s=… embedded_indexing_resources_per_s=… … cpu="…" cores=… isa=…`.

Usage: python bench/bulk.py --patients 100 [--modes embedded,elastic,workers-1,workers-2]
                             [--split LINES] [--file-delay SECONDS]
(Elasticsearch and Redis from CHARTCITE_ES_URL / CHARTCITE_REDIS_URL, as `make test` sets them.)
`--split` serves each type's file as files of that many lines and `--file-delay` makes each file
answer that many seconds late: a slow EHR's downloads, which the round reads several at once.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
import requests  # noqa: E402
from cryptography.fernet import Fernet  # noqa: E402

from bench.copies import copied_bundle_json  # noqa: E402
from bench.machine import fields, header  # noqa: E402
from tests.conftest import SYNTHEA, clean_env  # noqa: E402
from tests.fhir_servers import (as_put_transaction, load_bundle, published_keys, serve_folder,  # noqa: E402
                                start_ehr_server, start_sekmet, stop, support_bundles)

RUN = "synthea_data_california"
GROUP = "bench-group"
CLIENT_ID = "chartcite-bench"
REDIS_DB = 7            # the bench's own Redis database, flushed before each run with workers


# --- the population -------------------------------------------------------------------------------------

def one_run(synthea: Path) -> list[str]:
    with open(synthea / "MANIFEST.tsv", encoding="utf-8") as fh:
        return [row["patient_id"] for row in csv.DictReader(fh, delimiter="\t") if row["source_path"].startswith(RUN)]


def copied_bundle(source: Path, copy: int) -> tuple[dict, str]:
    """The patient's bundle with every resource id replaced by one of this copy's own (the same old
    id always becomes the same new one), and the new patient id."""
    bundle = as_put_transaction(copied_bundle_json(source, copy))
    patient = next(e["resource"]["id"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient")
    return bundle, patient


def load_population(base: str, synthea: Path, count: int, folder: Path) -> tuple[list[str], int]:
    """`count` patients loaded into sekmet (and their Group): their ids and how many resources."""
    originals = one_run(synthea)
    for support in support_bundles(synthea, originals[:1]):
        load_bundle(base, support)
    patients, resources = [], 0
    for n in range(count):
        bundle, patient = copied_bundle(synthea / f"{originals[n % len(originals)]}.json.gz", n // len(originals))
        response = requests.post(base, json=bundle, headers={"Content-Type": "application/fhir+json"}, timeout=600)
        response.raise_for_status()
        patients.append(patient)
        resources += len(bundle["entry"])
    group = {"resourceType": "Group", "id": GROUP, "type": "person", "actual": True,
             "member": [{"entity": {"reference": f"Patient/{pid}"}} for pid in patients]}
    requests.put(f"{base}/Group/{GROUP}", json=group, headers={"Content-Type": "application/fhir+json"},
                 timeout=60).raise_for_status()
    return patients, resources


# --- measuring processes --------------------------------------------------------------------------------

class PeakMemory:
    """The peak resident memory of each of these processes (and their children), sampled twice a second."""

    def __init__(self, processes: dict[str, subprocess.Popen]):
        self.processes, self.peaks = processes, {name: 0 for name in processes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample(self):
        while not self._stop.wait(0.5):
            for name, process in self.processes.items():
                try:
                    root = psutil.Process(process.pid)
                    rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                except psutil.Error:
                    continue
                self.peaks[name] = max(self.peaks[name], rss)


def round_times(data: Path) -> dict:
    """From the registry: when the round started and ended, and when its first part was claimed and
    its last part done."""
    with sqlite3.connect(data / "registry.sqlite") as db:
        started, ended, summary = db.execute("SELECT started_at, updated_at, summary FROM bulk_round "
                                             "ORDER BY started_at DESC LIMIT 1").fetchone()
        first, last = db.execute("SELECT min(claimed_at), max(done_at) FROM bulk_part").fetchone()
    return {"started": started, "ended": ended, "first_part": first, "last_part": last,
            "summary": json.loads(summary)}


def model_rate(data: Path, env: dict) -> float:
    """Chunks per second the embedding model alone manages on 2,000 chunk texts of this index."""
    code = ("import json, sys, time; from smart_app.settings import Settings; from search.service import SearchService;"
            "svc = SearchService(**Settings.load().search_options()); texts = json.load(sys.stdin);"
            "svc.embedder.encode(texts[:64]); t = time.perf_counter(); svc.embedder.encode(texts);"
            "print(len(texts) / (time.perf_counter() - t))")
    texts = sample_texts(data, env)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, input=json.dumps(texts), capture_output=True,
                         text=True, timeout=1200, encoding="utf-8")
    return float(out.stdout.strip().splitlines()[-1])


def timed_check(data: Path, env: dict) -> float:
    """Seconds `chartcite check` takes on the index this mode built (its own measure, without the
    command's start-up)."""
    code = ("import time; from smart_app.settings import Settings; from search.service import SearchService;"
            "s = Settings.load(); svc = SearchService(**s.search_options()); t = time.perf_counter();"
            "result = svc.catalog.check(s.tenant); print(time.perf_counter() - t, result.counts.get('chunks'),"
            " len(result.problems))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, encoding="utf-8")
    seconds, _, problems = out.stdout.split()
    if int(problems):
        raise RuntimeError(f"check found {problems} problems in the index this round built")
    return float(seconds)


def sample_texts(data: Path, env: dict, count: int = 2000) -> list[str]:
    if env.get("CHARTCITE_BACKEND") == "elasticsearch":
        from elasticsearch import Elasticsearch

        es = Elasticsearch([env["CHARTCITE_ES_URL"]])
        hits = es.search(index=f"chartcite-{env['CHARTCITE_TENANT']}", size=count, _source=["data.text"])["hits"]["hits"]
        return [h["_source"]["data"]["text"] for h in hits]
    with sqlite3.connect(data / "index.sqlite") as db:
        return [json.loads(row[0])["text"] for row in db.execute("SELECT data FROM chunks LIMIT ?", (count,))]


# --- one mode -------------------------------------------------------------------------------------------

def run_mode(mode: str, folder: Path, ehr_root: str) -> dict:
    tenant = f"bench{mode.replace('-', '')}{uuid.uuid4().hex[:4]}"
    data = folder / f"data-{tenant}"
    workers = int(mode.split("-")[1]) if mode.startswith("workers-") else 0
    settings = dict(data_dir=data, tenant=tenant, token_key=Fernet.generate_key().decode())
    if mode != "embedded":
        settings |= dict(backend="elasticsearch", es_url=os.environ["CHARTCITE_ES_URL"])
    if workers:
        own = os.environ["CHARTCITE_REDIS_URL"].rsplit("/", 1)[0] + f"/{REDIS_DB}"
        import redis

        redis.Redis.from_url(own).flushdb()
        settings |= dict(redis_url=own, tasks_eager="false")
    env = clean_env(**settings)
    cli = lambda *args: subprocess.run([sys.executable, "-m", "smart_app.cli", *args], cwd=REPO, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=600, encoding="utf-8")
    assert cli("keys", "generate").returncode == 0
    publish_keys(env, folder / "jwks.json")
    assert cli("ehr", "add", "--name", tenant, "--iss", f"{ehr_root}/fhir", "--client-id", CLIENT_ID,
               "--group-id", GROUP, "--backend-only").returncode == 0
    processes = {f"worker {n + 1}": subprocess.Popen(
        [sys.executable, "-m", "smart_app.cli", "worker"], cwd=REPO, env=env, stdout=(folder / f"{tenant}-w{n}.log").open("w", encoding="utf-8"),
        stderr=subprocess.STDOUT, start_new_session=True) for n in range(workers)}
    started, cpu_before = time.time(), children_cpu()
    sync = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "sync", "--tenant", tenant,
                             *(["--workers"] if workers else [])], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding="utf-8")
    try:
        with PeakMemory({"sync": sync, **processes}) as memory:
            out, err = sync.communicate()
        elapsed = time.time() - started
    finally:
        for process in processes.values():
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(60)
    # Reaped here: the sync and its workers, nothing else (the servers run until the end).
    cpu_seconds = children_cpu() - cpu_before
    if sync.returncode != 0:
        raise RuntimeError(f"{mode}: sync exited {sync.returncode}\n{out}\n{err[-3000:]}")
    times = round_times(data)
    rate = model_rate(data, env)
    check_seconds = timed_check(data, env)
    staging = (data / "bulk-staging.sqlite").stat().st_size / 2**20 if (data / "bulk-staging.sqlite").exists() else 0
    drop_index(env, tenant)
    return {"mode": mode, "elapsed": elapsed, "times": times, "peaks": memory.peaks, "model_rate": rate,
            "staging_mb": staging, "check_seconds": check_seconds, "cpu_seconds": cpu_seconds}


def children_cpu() -> float:
    """User + system CPU seconds of this process's children that have ended and been waited for:
    a machine shared with other work stretches the wall clock, not these."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def publish_keys(env: dict, path: Path) -> None:
    """This mode's keys added to the JWKS file the test server fetches (each mode has its own data dir)."""
    existing = json.loads(path.read_text(encoding="utf-8"))["keys"] if path.exists() else []
    path.write_text(json.dumps({"keys": existing + published_keys(env)}), encoding="utf-8")


def drop_index(env: dict, tenant: str) -> None:
    if env.get("CHARTCITE_BACKEND") == "elasticsearch":
        from elasticsearch import Elasticsearch

        Elasticsearch([env["CHARTCITE_ES_URL"]]).indices.delete(index=f"chartcite-{tenant}-*", ignore_unavailable=True,
                                                              allow_no_indices=True)


def report(result: dict, served: int) -> str:
    """One mode's figures. Resources/s count the resources indexed; `served` (all the EHR holds for
    the group, support resources and types chartcite does not index included, as issue 44 counted
    its 1,000 patients) gives the second end-to-end rate."""
    t, summary = result["times"], result["times"]["summary"]
    resources, chunks, embedded = summary["resources"], summary["chunks"], summary["embedded"]
    indexing = t["last_part"] - t["first_part"]
    model_alone = embedded / result["model_rate"]
    peaks = ", ".join(f"{name} {rss / 2**30:.2f} GB" for name, rss in result["peaks"].items())
    return (f"{result['mode']:>10}: {summary['patients']} patients, {resources} resources, {chunks} chunks "
            f"({embedded} embedded) | end to end {result['elapsed']:.0f} s = {resources / result['elapsed']:.0f} "
            f"resources/s ({served / result['elapsed']:.0f}/s of the {served} served) | export + download {t['first_part'] - t['started']:.0f} s | indexing {indexing:.0f} s = "
            f"{resources / indexing:.0f} resources/s, {chunks / indexing:.0f} chunks/s | the model alone "
            f"({result['model_rate']:.0f} chunks/s) would take {model_alone:.0f} s: {100 * model_alone / indexing:.0f}% "
            f"of indexing, {100 - 100 * model_alone / indexing:.0f}% outside embedding | peak RSS {peaks} | "
            f"staging {result['staging_mb']:.0f} MB | check {result['check_seconds']:.1f} s | "
            f"CPU {result['cpu_seconds']:.0f} s = {1000 * result['cpu_seconds'] / resources:.2f} ms a resource, "
            f"{resources / result['cpu_seconds']:.0f} resources per CPU-second, "
            f"{2 * resources / result['cpu_seconds']:.0f}/s on 2 cores at best")


def machine_figures(result: dict) -> str:
    """One mode's figures for the last line: `workers_1_resources_per_s=… workers_1_indexing_resources_per_s=…`."""
    t, summary = result["times"], result["times"]["summary"]
    key = result["mode"].replace("-", "_")
    return (f"{key}_resources_per_s={summary['resources'] / result['elapsed']:.0f} "
            f"{key}_indexing_resources_per_s={summary['resources'] / (t['last_part'] - t['first_part']):.0f} "
            f"{key}_resources_per_cpu_s={summary['resources'] / result['cpu_seconds']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--patients", type=int, default=100)
    parser.add_argument("--modes", default="embedded,workers-1,workers-2")
    parser.add_argument("--synthea", default=str(SYNTHEA), help="the shared Synthea records (CHARTCITE_SHARED)")
    parser.add_argument("--split", type=int, default=0, help="lines per output file (0: one file per type)")
    parser.add_argument("--file-delay", type=float, default=0.0, help="seconds each output file answers late")
    args = parser.parse_args()
    print(header(), flush=True)
    figures = []
    with tempfile.TemporaryDirectory(prefix="chartcite-bench-bulk-") as tmp:
        folder = Path(tmp)
        sekmet, base = start_sekmet(folder)
        server = serve_folder(folder)
        ehr, ehr_root = start_ehr_server(folder, base, CLIENT_ID, "http://127.0.0.1:1",
                                         f"http://127.0.0.1:{server.server_port}/jwks.json")
        try:
            started = time.perf_counter()
            patients, resources = load_population(base, Path(args.synthea), args.patients, folder)
            print(f"loaded {len(patients)} patients ({resources} resources) into sekmet-fhir in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
            if args.split or args.file_delay:
                requests.post(f"{ehr_root}/_test/bulk", json={"split": args.split, "file_delay": args.file_delay},
                              timeout=30).raise_for_status()
                print(f"output files of {args.split or 'all'} lines, each answering {args.file_delay:g} s late",
                      flush=True)
            for mode in args.modes.split(","):
                result = run_mode(mode, folder, ehr_root)
                print(report(result, resources), flush=True)
                figures.append(machine_figures(result))
        finally:
            stop(ehr)
            stop(sekmet)
            server.shutdown()
    print(f"bulk: patients={len(patients)} {' '.join(figures)} {fields()}")


if __name__ == "__main__":
    main()

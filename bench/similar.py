"""Similar patients and cohort comparisons: the profile build cost per patient, then the latency
of `similar` (k=5) and `cohort` at the shared set's size and at synthetic tenants of the given
sizes (the shared profiles copied with their vectors jittered, so kNN has real work).

Usage: python bench/similar.py [--patients 60] [--sizes 10000] [--backend embedded|elasticsearch]
(Elasticsearch reads CHARTCITE_ES_URL.) Last line, for scripts:
`similar: build_ms=… embed_ms=… fill_s_at_N=… similar_ms_at_N=p50/p95 cohort_ms_at_N=p50/p95 peak_rss_mb_at_N=… …`.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import header  # noqa: E402
from fhir_ingest.record.load import LoadReport, assembled  # noqa: E402
from fhir_ingest.record.reader import read_path  # noqa: E402
from search.indexer import prepare_record  # noqa: E402
from search.models.embedders import load_embedder  # noqa: E402
from search.similar.cohort import Comparison, compare  # noqa: E402
from search.similar.peers import similar_patients  # noqa: E402
from search.similar.profile import build_profile, profile_keys, profile_text  # noqa: E402

SHARED = Path(os.environ.get("CHARTCITE_SHARED", REPO.parent / "shared")) / "data" / "synthea"
COHORT = Comparison("hypertension", ("hydrochlorothiazide", "amlodipine"), "systolic BP", 24, minimum=11)


def shared_profiles(count: int, embedder, folder: Path) -> tuple[list[dict], np.ndarray, float, float]:
    """(profiles, vectors, ms to build one profile, ms to embed one profile text)."""
    files = sorted(SHARED.glob("*.json.gz"))[:count]
    profiles, build = [], 0.0
    with assembled((item for path in files for item in read_path(path)), LoadReport(), folder) as assembler:
        for pid in assembler.patient_ids():
            record = assembler.record(pid)
            chunks = prepare_record("bench", record, embedder.budget()).chunks
            started = time.perf_counter()
            profiles.append(build_profile(pid, record.resources, chunks))
            build += time.perf_counter() - started
    embedder.encode(["warm-up"])          # the first call compiles; a profile is one text of many
    started = time.perf_counter()
    vectors = embedder.encode([profile_text(p) for p in profiles])
    embed = time.perf_counter() - started
    return profiles, np.asarray(vectors), 1000 * build / len(profiles), 1000 * embed / len(profiles)


def fill(backend, tenant: str, profiles: list[dict], vectors: np.ndarray, size: int, rng) -> list[str]:
    with backend.written_together(), backend.deferred_refresh():
        return [put_one(backend, tenant, profiles, vectors, n, rng) for n in range(size)]


def put_one(backend, tenant: str, profiles: list[dict], vectors: np.ndarray, n: int, rng) -> str:
    """The n-th patient: a shared profile as it is, then copies with their vectors jittered."""
    source = profiles[n % len(profiles)]
    pid = source["patient_id"] if n < len(profiles) else f"synthetic-{n}"
    vector = vectors[n % len(profiles)] + (rng.normal(0, 0.02, vectors.shape[1]) if n >= len(profiles) else 0)
    vector = (vector / np.linalg.norm(vector)).astype(np.float32)
    backend.put_profile(tenant, pid, dict(source, patient_id=pid), profile_keys(source), vector)
    return pid


def timed(run, repeat: int) -> tuple[float, float, float]:
    """(p50, p95) in ms of `repeat` runs, and the p50 of this process's CPU time: on a shared
    machine the wall time follows the load, the CPU time what the code does."""
    spent, cpu = [], []
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        run()
        spent.append(1000 * (time.perf_counter() - started))
        cpu.append(1000 * (time.process_time() - cpu_started))
    return float(np.percentile(spent, 50)), float(np.percentile(spent, 95)), float(np.percentile(cpu, 50))


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def open_backend(kind: str, folder: Path, dimension: int):
    if kind == "embedded":
        from search.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(folder / "index.sqlite", "bench-model", dimension)
    from search.backends.elastic import ElasticsearchBackend

    return ElasticsearchBackend([os.environ["CHARTCITE_ES_URL"]], "bench-model", dimension)


def remove_bench_tenants(es) -> None:
    """The bench's tenants out of the shared profiles index (delete-by-query is a module a minimal
    Elasticsearch may lack: the documents are found and deleted one bulk request at a time)."""
    from elasticsearch.helpers import bulk, scan

    found = scan(es, index="chartcite-patient-profiles-d*", query={"query": {"prefix": {"tenant": "bench"}}},
                 source=False)
    bulk(es, ({"_op_type": "delete", "_index": hit["_index"], "_id": hit["_id"]} for hit in found), refresh=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--patients", type=int, default=60)
    parser.add_argument("--sizes", default="10000")
    parser.add_argument("--backend", default="embedded", choices=("embedded", "elasticsearch"))
    parser.add_argument("--queries", type=int, default=20, help="similar queries timed per size (p50, p95)")
    args = parser.parse_args()
    print(header())
    rng = np.random.default_rng(37)
    embedder = load_embedder(None)
    folder = Path(tempfile.mkdtemp(prefix="bench-similar-"))
    profiles, vectors, build_ms, embed_ms = shared_profiles(args.patients, embedder, folder)
    print(f"profile: {build_ms:.1f} ms to build, {embed_ms:.1f} ms to embed, per patient ({len(profiles)} patients)")
    backend = open_backend(args.backend, folder, vectors.shape[1])
    figures = [f"build_ms={build_ms:.1f}", f"embed_ms={embed_ms:.1f}"]
    for size in [len(profiles), *(int(s) for s in args.sizes.split(",") if s)]:
        tenant = f"bench{uuid.uuid4().hex[:8]}"
        started, cpu_started = time.perf_counter(), time.process_time()
        ids = fill(backend, tenant, profiles, vectors, size, rng)
        filled, fill_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        rss_before = peak_rss_mb()
        similar_p50, similar_p95, similar_cpu = timed(
            lambda: similar_patients(backend, tenant, ids[int(rng.integers(len(ids)))], 5), args.queries)
        cohort_p50, cohort_p95, cohort_cpu = timed(lambda: compare(backend, tenant, COHORT), max(3, args.queries // 4))
        # Wall time and this process's CPU time: on a shared machine the two part.
        print(f"{args.backend} {size} patients: filled in {filled:.1f} s ({1000 * filled / size:.1f} ms a profile; "
              f"{fill_cpu:.1f} s of CPU here); "
              f"similar p50 {similar_p50:.0f} ms, p95 {similar_p95:.0f} ms (CPU here {similar_cpu:.0f} ms); "
              f"cohort p50 {cohort_p50:.0f} ms, p95 {cohort_p95:.0f} ms (CPU here {cohort_cpu:.0f} ms); "
              f"peak RSS {peak_rss_mb():.0f} MB (before the queries {rss_before:.0f} MB)")
        figures += [f"fill_s_at_{size}={filled:.0f}", f"similar_ms_at_{size}={similar_p50:.0f}/{similar_p95:.0f}",
                    f"cohort_ms_at_{size}={cohort_p50:.0f}/{cohort_p95:.0f}", f"cohort_cpu_ms_at_{size}={cohort_cpu:.0f}",
                    f"peak_rss_mb_at_{size}={peak_rss_mb():.0f}"]
    if args.backend == "elasticsearch":
        remove_bench_tenants(backend.es)
    backend.close()
    print("similar: " + " ".join(figures))


if __name__ == "__main__":
    main()

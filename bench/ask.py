"""Latency of `ask` over the dev questions with the model warm: p50/p95 per pipeline.

Indexes the dev questions' patients into a temporary embedded index first (not timed). The last
line is for scripts: `ask: p50_ms=… p95_ms=… backend=embedded cpu="…" cores=… isa=…` (the full
pipeline); the first names the processor.
Usage: python bench/ask.py [QUESTIONS.jsonl] [--repeat N] [--patients N] [--es-url http://127.0.0.1:9250]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402
from search.evaluate import percentile  # noqa: E402
from search.backends.elastic import ElasticOptions  # noqa: E402
from search.collector import collect_less_often  # noqa: E402
from search.service import SearchService  # noqa: E402


def main() -> None:
    print(header(), flush=True)
    collect_less_often()          # as the command line and the server do
    shared = REPO.parent / "shared" / "data"
    parser = argparse.ArgumentParser()
    parser.add_argument("questions", nargs="?", default=str(shared / "questions" / "dev.jsonl"))
    parser.add_argument("--synthea", default=str(shared / "synthea"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--patients", type=int, default=0, help="only the questions of the first N patients")
    parser.add_argument("--es-url", default="", help="ask through this Elasticsearch node instead of the embedded backend")
    args = parser.parse_args()
    questions = [json.loads(line) for line in open(args.questions, encoding="utf-8") if line.strip()]
    ids = sorted({q["patient_id"] for q in questions})
    if args.patients:
        ids = ids[: args.patients]
        questions = [q for q in questions if q["patient_id"] in ids]
    with tempfile.TemporaryDirectory() as tmp:
        backend = "elasticsearch" if args.es_url else "embedded"
        svc = SearchService(backend, Path(tmp) / "index.sqlite", es=ElasticOptions((args.es_url,)) if args.es_url else None)
        svc.index_paths("bench", [Path(args.synthea) / f"{pid}.json.gz" for pid in ids])
        svc.ask("bench", ids[0], "warm-up question")
        print(f"{len(questions)} questions x {args.repeat}, {len(ids)} patients, model warm")
        print(f"{'pipeline':8} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'q/s':>7}")
        for pipeline in ("dense", "hybrid", "full"):
            latencies = []
            for _ in range(args.repeat):
                for q in questions:
                    t = time.perf_counter()
                    svc.ask("bench", q["patient_id"], q["question"], pipeline=pipeline)
                    latencies.append((time.perf_counter() - t) * 1000)
            print(f"{pipeline:8} {percentile(latencies, .5):8.1f} {percentile(latencies, .95):8.1f} "
                  f"{max(latencies):8.1f} {1000 * len(latencies) / sum(latencies):7.1f}")
        svc.close()
    print(f"ask: p50_ms={percentile(latencies, .5):.1f} p95_ms={percentile(latencies, .95):.1f} backend={backend} {fields()}")


if __name__ == "__main__":
    main()

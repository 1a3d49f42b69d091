"""Latency of `ask` over the dev questions with the model warm: p50/p95 per pipeline.

Indexes the dev questions' patients into a temporary embedded index first (not timed). Two first
passes of the full pipeline come before the usual rows, each question once: `full, unread` with no
note read yet (each note chunk the answers read is split into sentences and embedded on the
question's path, as for a patient nobody has asked about), then `full, kept` in a new service
with nothing in its memory (another process, or after a restart: the notes' sentences come from
what the index kept of the first pass). The rows after them repeat every question (--repeat).
Wall time and the process's CPU time per question (all its threads) are printed.
The last line is for scripts: `ask: p50_ms=… p95_ms=… backend=embedded cpu="…" cores=… isa=…` (the
full pipeline); the first names the processor.
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
from fhir_ingest.record.notes import forget_splits, note_sentences, sentence_context  # noqa: E402
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

        def new_service() -> SearchService:
            return SearchService(backend, Path(tmp) / "index.sqlite",
                                 es=ElasticOptions((args.es_url,)) if args.es_url else None)

        svc = new_service()
        svc.index_paths("bench", [Path(args.synthea) / f"{pid}.json.gz" for pid in ids])
        # The model and the libraries loaded, no note read: a patient the index does not hold.
        svc.warm_up()
        svc.ask("bench", "no-such-patient", "warm-up question")
        note_sentences("Warm-up. The splitter's rules loaded.")
        sentence_context("Warm-up.")
        print(f"{len(questions)} questions x {args.repeat}, {len(ids)} patients, model warm; "
              f"load average {os.getloadavg()[0]:.2f}")
        print(f"{'pipeline':14} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'q/s':>7} {'cpu p50':>8} {'cpu p95':>8}")
        forget_splits()            # nothing split by indexing or the warm-up question counts
        row("full, unread", timed(svc, questions, "full", 1))
        svc.close()
        forget_splits()
        svc = new_service()
        row("full, kept", timed(svc, questions, "full", 1))
        for pipeline in ("dense", "hybrid", "full"):
            latencies = timed(svc, questions, pipeline, args.repeat)
            row(pipeline, latencies)
        svc.close()
    wall = [w for w, _ in latencies]
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"ask: p50_ms={percentile(wall, .5):.1f} p95_ms={percentile(wall, .95):.1f} backend={backend} {fields()}")


def timed(svc: SearchService, questions: list[dict], pipeline: str, repeat: int) -> list[tuple[float, float]]:
    """(wall ms, CPU ms of the whole process) of each question asked."""
    out = []
    for _ in range(repeat):
        for q in questions:
            wall, cpu = time.perf_counter(), time.process_time()
            svc.ask("bench", q["patient_id"], q["question"], pipeline=pipeline)
            out.append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000))
    return out


def row(label: str, latencies: list[tuple[float, float]]) -> None:
    wall, cpu = [w for w, _ in latencies], [c for _, c in latencies]
    print(f"{label:14} {percentile(wall, .5):8.1f} {percentile(wall, .95):8.1f} {max(wall):8.1f} "
          f"{1000 * len(wall) / sum(wall):7.1f} {percentile(cpu, .5):8.1f} {percentile(cpu, .95):8.1f}", flush=True)

if __name__ == "__main__":
    main()

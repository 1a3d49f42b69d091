"""What reading notes sentence by sentence costs a question: CPU and wall milliseconds.

Sentence selection is: ranking the evidence notes' sentences for the question
(`rank_note_sentences`), what the notes state of a class (`class_in_notes`), the sentences an
answer quotes in the records it cites (`cite_sentences`), and loading and keeping the chunks'
readings (search/sentence_readings.py). Timers around those functions, over the dev questions
(full pipeline, each once) in three passes: `unread` (no chunk read yet: the splitting and the
embedding of each chunk happen here, once), `kept` (a new service with nothing in memory, as
another process or after a restart: the sentences come from what the index kept), `warm` (the
same service again). Indexes the questions' patients into a temporary embedded index first.
Usage: python bench/sentence_selection.py [QUESTIONS.jsonl] [--synthea DIR]
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

import search.answering.answer as answer  # noqa: E402
import search.answering.steps as steps  # noqa: E402
from bench.machine import header  # noqa: E402
from fhir_ingest.record.notes import forget_splits, note_sentences  # noqa: E402
from search.collector import collect_less_often  # noqa: E402
from search.evaluate import percentile  # noqa: E402
from search.sentence_readings import SentenceReadings  # noqa: E402
from search.service import SearchService  # noqa: E402

SPENT = {"wall": 0.0, "cpu": 0.0, "depth": 0}


def timed(function):
    """The function, its time added to SPENT (a call inside another timed one counts once)."""
    def wrapper(*args, **kwargs):
        if SPENT["depth"]:
            return function(*args, **kwargs)
        SPENT["depth"] += 1
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT["wall"] += time.perf_counter() - wall
            SPENT["cpu"] += time.process_time() - cpu
            SPENT["depth"] -= 1
    return wrapper


def time_sentence_selection() -> None:
    answer.rank_note_sentences = timed(answer.rank_note_sentences)
    steps.class_in_notes = timed(steps.class_in_notes)
    # The answer steps are a tuple bound as apply_steps' default: the timed one goes in there.
    steps.apply_steps.__defaults__ = (tuple(timed(s) if s is steps.cite_sentences else s for s in steps.STEPS),)
    SentenceReadings.load = timed(SentenceReadings.load)
    SentenceReadings.keep = timed(SentenceReadings.keep)


def main() -> None:
    print(header(), flush=True)
    collect_less_often()
    shared = REPO.parent / "shared" / "data"
    parser = argparse.ArgumentParser()
    parser.add_argument("questions", nargs="?", default=str(shared / "questions" / "dev.jsonl"))
    parser.add_argument("--synthea", default=str(shared / "synthea"))
    args = parser.parse_args()
    questions = [json.loads(line) for line in open(args.questions, encoding="utf-8") if line.strip()]
    ids = sorted({q["patient_id"] for q in questions})
    time_sentence_selection()
    with tempfile.TemporaryDirectory() as tmp:
        svc = SearchService("embedded", Path(tmp) / "index.sqlite")
        svc.index_paths("bench", [Path(args.synthea) / f"{pid}.json.gz" for pid in ids])
        svc.warm_up()
        svc.ask("bench", "no-such-patient", "warm-up question")
        note_sentences("Warm-up. The splitter's rules loaded.")
        forget_splits()
        print(f"{len(questions)} questions, {len(ids)} patients, full pipeline, model warm; ms per question")
        print(f"{'pass':7} {'question wall p50':>17} {'p95':>6} {'cpu mean':>9} | {'selection wall p50':>18} {'p95':>6} "
              f"{'cpu mean':>9} {'cpu p95':>8} | load")
        for label in ("unread", "kept", "warm"):
            if label == "kept":
                svc.close()
                forget_splits()
                svc = SearchService("embedded", Path(tmp) / "index.sqlite")
            row(label, [asked(svc, q) for q in questions])
        svc.close()


def asked(svc: SearchService, q: dict) -> tuple[float, float, float, float]:
    """(question wall, question cpu, selection wall, selection cpu) in ms."""
    SPENT["wall"] = SPENT["cpu"] = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    svc.ask("bench", q["patient_id"], q["question"])
    return ((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000,
            SPENT["wall"] * 1000, SPENT["cpu"] * 1000)


def row(label: str, times: list[tuple[float, float, float, float]]) -> None:
    wall, cpu, sel_wall, sel_cpu = (list(column) for column in zip(*times))
    mean = lambda values: sum(values) / len(values)
    print(f"{label:7} {percentile(wall, .5):17.1f} {percentile(wall, .95):6.1f} {mean(cpu):9.1f} | "
          f"{percentile(sel_wall, .5):18.1f} {percentile(sel_wall, .95):6.1f} {mean(sel_cpu):9.1f} "
          f"{percentile(sel_cpu, .95):8.1f} | {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()

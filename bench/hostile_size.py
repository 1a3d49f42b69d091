"""Hostile sizes: one bundle with a 10 MB note, and one bundle of 20,000 Observations.

Each case runs `chartcite index` as a real process into a fresh data directory and prints wall
time, the process's peak RSS and its exit code (3 = indexed, with something reported as not
indexed: the note's cap), the processor first and, last, a line for scripts:
`hostile_size: note_s=… note_rss_mb=… observations_s=… observations_rss_mb=… cpu="…" cores=… isa=…`.
Usage: python bench/hostile_size.py [--observations N] [--note-mb M]
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402

PATIENT = {"resourceType": "Patient", "id": "bench-p", "gender": "female", "birthDate": "1960-01-01"}


def observation(i: int) -> dict:
    day = f"{2000 + i % 25}-{1 + i % 12:02d}-{1 + i % 28:02d}"
    return {"resourceType": "Observation", "id": f"obs-{i}", "status": "final",
            "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                      "code": "laboratory"}]}],
            "code": {"coding": [{"system": "http://loinc.org", "code": ("2823-3", "2345-7", "718-7")[i % 3]}],
                     "text": ("Potassium", "Glucose", "Hemoglobin")[i % 3]},
            "subject": {"reference": "Patient/bench-p"}, "effectiveDateTime": f"{day}T08:00:00Z",
            "valueQuantity": {"value": 4 + (i % 50) / 10, "unit": "mmol/L"}}


def big_note(megabytes: int) -> dict:
    sentence = "Patient seen in clinic today, feeling well, no new complaints, medications reviewed and unchanged. "
    text = "ASSESSMENT:\n" + sentence * (megabytes * 1_000_000 // len(sentence))
    return {"resourceType": "DocumentReference", "id": "big-note", "status": "current",
            "type": {"text": "Progress note"}, "subject": {"reference": "Patient/bench-p"}, "date": "2024-05-01T09:00:00Z",
            "content": [{"attachment": {"contentType": "text/plain", "data": base64.b64encode(text.encode()).decode()}}]}


def run_case(name: str, resources: list[dict], folder: Path) -> tuple[str, float, float]:
    bundle = folder / f"{name}.json"
    bundle.write_text(json.dumps({"resourceType": "Bundle", "type": "collection",
                                  "entry": [{"resource": r} for r in [PATIENT, *resources]]}), encoding="utf-8")
    env = dict(os.environ, CHARTCITE_DATA_DIR=str(folder / f"data-{name}"), HF_HUB_OFFLINE="1")
    env.pop("CHARTCITE_BACKEND", None)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "smart_app.cli", "index", str(bundle)], cwd=REPO, env=env,
                         capture_output=True, text=True, encoding="utf-8")
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    chunks = next((line for line in out.stdout.splitlines() if line.startswith("patients:")), out.stderr[-300:])
    return (f"{name:24} {bundle.stat().st_size / 1e6:7.1f} MB input  {seconds:7.1f} s  peak RSS {rss:6.0f} MB  "
            f"exit {out.returncode}  | {chunks}"), seconds, rss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--observations", type=int, default=20_000)
    parser.add_argument("--note-mb", type=int, default=10)
    args = parser.parse_args()
    print(header(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # RUSAGE_CHILDREN is the largest child so far: the smaller case runs first.
        line, note_s, note_rss = run_case(f"{args.note_mb}MB-note", [big_note(args.note_mb)], folder)
        print(line, flush=True)
        line, obs_s, obs_rss = run_case(f"{args.observations}-observations",
                                        [observation(i) for i in range(args.observations)], folder)
        print(line)
    print(f"hostile_size: note_s={note_s:.1f} note_rss_mb={note_rss:.0f} observations_s={obs_s:.1f} "
          f"observations_rss_mb={obs_rss:.0f} {fields()}")


if __name__ == "__main__":
    main()

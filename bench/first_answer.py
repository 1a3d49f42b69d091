"""Time to first answer: from the launch request to the first question that comes back with cited
evidence, for a patient chartcite has never indexed, as a clinician waits for it.

For the median and the largest shared record, each on a fresh data directory and a fresh
`chartcite serve` (gunicorn): cold (the launch arrives as soon as the process answers /healthz,
model still loading) and warm (the launch arrives once /readyz says ready). The clinician asks
"What are the active problems?" and "What was the most recent blood pressure?" (a result: its
vector comes after the essentials') every half second until each answer cites the record, and
notes whether it said the record was still being read. Also reports when the whole record is
indexed. Last line, for scripts: `first_answer: cold_s=… warm_s=… cpu="…" cores=… isa=…` (the
median record, problems); the first names the processor.

Usage: python bench/first_answer.py [--synthea DIR]
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402

QUESTIONS = ("What are the active problems?", "What was the most recent blood pressure?")


def median_and_largest(synthea: Path) -> list[tuple[str, str, int]]:
    with open(synthea / "MANIFEST.tsv", encoding="utf-8") as fh:
        rows = sorted(((int(r["n_resources"]), r["patient_id"]) for r in csv.DictReader(fh, delimiter="\t")))
    (mid_n, mid), (big_n, big) = rows[len(rows) // 2], rows[-1]
    return [("median", mid, mid_n), ("largest", big, big_n)]


def wait(url: str, process: subprocess.Popen, log: Path, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"chartcite serve exited with {process.returncode}:\n{log.read_text(encoding='utf-8')[-2000:]}")
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    sys.exit(f"{url} did not answer 200 in {seconds}s")


def one_run(synthea: Path, patient: str, warm: bool) -> tuple[dict[str, tuple[float, bool]], float]:
    """({question: (seconds to its first cited answer, whether that answer said the record was
    still being read)}, seconds until the record is fully indexed)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        shutil.copy(synthea / f"{patient}.json.gz", source)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHARTCITE_")}
        env |= {"CHARTCITE_DATA_DIR": str(Path(tmp) / "data"), "CHARTCITE_DEMO_SOURCE": str(source),
                "CHARTCITE_DEMO_LAUNCH": "true", "CHARTCITE_LOG_LEVEL": "WARNING"}
        port = 5900 + os.getpid() % 90
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(port)], cwd=REPO,
                                  env=env, stdout=(Path(tmp) / "serve.log").open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
        try:
            wait(f"{base}/{'readyz' if warm else 'healthz'}", server, Path(tmp) / "serve.log")
            started = time.perf_counter()
            page = requests.post(f"{base}/demo/launch", data={"patient_id": patient}, timeout=300)
            headers = {"X-Chartcite-Session": re.search(r'name="chartcite-session" content="([^"]+)"', page.text).group(1)}
            first: dict[str, tuple[float, bool]] = {}      # question -> (seconds, said "still being read")
            while True:
                for question in QUESTIONS:
                    if question in first:
                        continue
                    body = requests.post(f"{base}/api/ask", json={"question": question}, headers=headers, timeout=300)
                    if body.status_code == 200 and body.json().get("citations"):
                        first[question] = (time.perf_counter() - started, "reading" in body.json())
                job = requests.get(f"{base}/api/status", headers=headers, timeout=60).json().get("job") or {}
                if job.get("state") == "done" and len(first) == len(QUESTIONS):
                    return first, time.perf_counter() - started
                if job.get("state") == "failed":
                    sys.exit(f"indexing failed: {job.get('message')}")
                time.sleep(0.5)
        finally:
            server.terminate()
            server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthea", default=str(REPO.parent / "shared" / "data" / "synthea"))
    args = parser.parse_args()
    print(header(), flush=True)
    synthea = Path(args.synthea)
    figures = {}
    for name, patient, resources in median_and_largest(synthea):
        for mode in ("cold", "warm"):
            first, whole = one_run(synthea, patient, warm=mode == "warm")
            figures[(name, mode)] = first[QUESTIONS[0]][0]
            said = "  ".join(f"{q!r} {t:5.1f} s{' (still reading)' if reading else ''}" for q, (t, reading) in first.items())
            print(f"{name:8} record ({resources} resources), {mode}: first cited answer: {said}; "
                  f"whole record indexed {whole:6.1f} s")
    print(f"first_answer: cold_s={figures[('median', 'cold')]:.1f} warm_s={figures[('median', 'warm')]:.1f} {fields()}")


if __name__ == "__main__":
    main()

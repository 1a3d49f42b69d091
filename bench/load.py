"""Load: N concurrent clinician sessions against a real `chartcite serve` (gunicorn) on loopback.

Each session launches a patient (the demo launcher: a real session, as an EHR launch leaves one)
and asks its questions one after another, as a clinician reads each answer before the next;
sessions run at once. The patients are indexed before the clock starts: this measures asking.
The per-clinician question limit is lifted for the run (every demo session is one clinician).

Bounded: at most --questions per session and at most --seconds in all. Prints requests, error
rate, throughput, p50/p95/max latency and the server's peak RSS (all its processes), then one
machine-readable line starting `RESULT ` (JSON, with the processor as "cpu", "cores" and "isa"); the
first line names the processor.

Usage: python bench/load.py [--sessions 8] [--questions 10] [--seconds 120] [--patients 4]
                            [--backend embedded|elasticsearch] [--workers 1] [--threads 8]
(--backend elasticsearch reads CHARTCITE_ES_URL, as `make bench` exports it.)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import header, processor_dict  # noqa: E402
from search.evaluate import percentile  # noqa: E402

QUESTIONS = ["What is the patient allergic to?", "What medications is the patient taking?",
             "What are the active problems?", "What was the last blood pressure?", "Any history of diabetes?",
             "What immunizations has the patient had?", "When was the last encounter?",
             "What was the most recent hemoglobin A1c?", "Is the patient on a statin?", "Any surgeries?"]


def server_env(data: Path, source: Path, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHARTCITE_") or k == "CHARTCITE_ES_URL"}
    env |= {"CHARTCITE_DATA_DIR": str(data), "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
            "CHARTCITE_BACKEND": args.backend, "CHARTCITE_WEB_WORKERS": str(args.workers),
            "CHARTCITE_WEB_THREADS": str(args.threads), "CHARTCITE_RATE_LIMIT_CLINICIAN": "100000/minute",
            "CHARTCITE_RATE_LIMIT_TENANT": "100000/minute", "CHARTCITE_LOG_LEVEL": "WARNING",
            "CHARTCITE_TENANT": f"load{os.getpid()}"}
    if args.backend == "elasticsearch" and not env.get("CHARTCITE_ES_URL"):
        sys.exit("--backend elasticsearch needs CHARTCITE_ES_URL (make bench starts a node and exports it)")
    return env


def tree_rss(pid: int) -> int:
    """Resident memory of a process and its children, in bytes (Linux /proc)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text(encoding="utf-8")
            total += int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
            children = Path(f"/proc/{current}/task/{current}/children").read_text(encoding="utf-8").split()
        except (OSError, AttributeError):
            continue
        pending += [int(c) for c in children]
    return total


def tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace", encoding="utf-8").splitlines()[-lines:])


def wait_ready(base: str, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"chartcite serve exited with {process.returncode}")
        try:
            if requests.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    sys.exit("chartcite serve did not become ready")


def session(base: str, patient: str, questions: int, stop_at: float, samples: list, lock: threading.Lock) -> None:
    page = requests.post(f"{base}/demo/launch", data={"patient_id": patient}, timeout=120)
    handle = re.search(r'name="chartcite-session" content="([^"]+)"', page.text).group(1)
    headers = {"X-Chartcite-Session": handle}
    for i in range(questions):
        if time.time() > stop_at:
            return
        started = time.perf_counter()
        try:
            status = requests.post(f"{base}/api/ask", json={"question": QUESTIONS[i % len(QUESTIONS)]},
                                   headers=headers, timeout=120).status_code
        except requests.RequestException:
            status = 0
        with lock:
            samples.append((time.perf_counter() - started, status, i))


def main() -> None:
    shared = REPO.parent / "shared" / "data" / "synthea"
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--questions", type=int, default=10, help="questions per session")
    parser.add_argument("--seconds", type=float, default=120, help="stop asking after this long")
    parser.add_argument("--patients", type=int, default=4)
    parser.add_argument("--backend", choices=("embedded", "elasticsearch"), default="embedded")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--synthea", default=str(shared))
    parser.add_argument("--log", default="", help="keep the server's log in this file")
    args = parser.parse_args()
    print(header(), flush=True)
    bundles = sorted(Path(args.synthea).glob("*.json.gz"), key=lambda p: p.stat().st_size)[: args.patients]
    patients = [b.name.split(".")[0] for b in bundles]
    with tempfile.TemporaryDirectory() as tmp:
        source, data = Path(tmp) / "source", Path(tmp) / "data"
        source.mkdir()
        for bundle in bundles:
            shutil.copy(bundle, source)
        env = server_env(data, source, args)
        subprocess.run([sys.executable, "-m", "smart_app.cli", "index", str(source), "--tenant", env["CHARTCITE_TENANT"]],
                       cwd=REPO, env=env, check=True, capture_output=True)
        port = 5600 + os.getpid() % 300
        base = f"http://127.0.0.1:{port}"
        log = Path(args.log) if args.log else Path(tmp) / "serve.log"
        server = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(port)], cwd=REPO,
                                  env=env, stdout=log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
        try:
            wait_ready(base, server)
            samples: list[tuple[float, int, int]] = []
            lock, peak = threading.Lock(), [0]
            running = threading.Event()
            running.set()

            def watch_memory():
                while running.is_set():
                    peak[0] = max(peak[0], tree_rss(server.pid))
                    time.sleep(0.25)

            threading.Thread(target=watch_memory, daemon=True).start()
            started = time.perf_counter()
            stop_at = time.time() + args.seconds
            with ThreadPoolExecutor(args.sessions) as pool:
                for n in range(args.sessions):
                    pool.submit(session, base, patients[n % len(patients)], args.questions, stop_at, samples, lock)
            elapsed = time.perf_counter() - started
            running.clear()
        finally:
            server.terminate()
            server.wait(60)
            if args.backend == "elasticsearch":    # the run's own indices, not another tenant's
                requests.delete(f"{env['CHARTCITE_ES_URL'].split(',')[0].rstrip('/')}/chartcite-{env['CHARTCITE_TENANT']}-*",
                                params={"ignore_unavailable": "true", "allow_no_indices": "true"}, timeout=60)
        if any(status != 200 for _, status, _ in samples):
            # The cause of a failed question is in the server's log, which goes with the run's folder.
            print(f"the server's log ends (some questions failed):\n{tail(log, 60)}", file=sys.stderr)
    latencies = [s * 1000 for s, _, _ in samples]
    errors = sum(1 for _, status, _ in samples if status != 200)
    first = [s * 1000 for s, _, i in samples if i == 0]
    statuses = Counter(str(status) for _, status, _ in samples if status != 200)
    result = {"backend": args.backend, "sessions": args.sessions, "workers": args.workers, "threads": args.threads,
              "patients": len(patients), "requests": len(samples), "errors": errors,
              "error_rate": round(errors / len(samples), 4) if samples else None, "error_statuses": dict(statuses),
              "throughput_rps": round(len(samples) / elapsed, 2), "p50_ms": round(percentile(latencies, .5), 1),
              "p95_ms": round(percentile(latencies, .95), 1), "max_ms": round(max(latencies), 1),
              "first_question_p50_ms": round(percentile(first, .5), 1), "peak_rss_mb": round(peak[0] / 2**20),
              **processor_dict()}
    print(f"{args.sessions} sessions x {args.questions} questions on {len(patients)} patients, {args.backend} backend, "
          f"gunicorn {args.workers} worker(s) x {args.threads} threads")
    print(f"requests {result['requests']}  errors {errors} ({100 * (result['error_rate'] or 0):.1f}%)  "
          f"throughput {result['throughput_rps']} questions/s")
    print(f"latency p50 {result['p50_ms']} ms  p95 {result['p95_ms']} ms  max {result['max_ms']} ms  "
          f"server peak RSS {result['peak_rss_mb']} MB")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()

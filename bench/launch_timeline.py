"""Where the first minute goes: a SMART launch of the largest shared record, from the EHR's launch
request to the first cited answer, split into its parts as the clinician meets them.

Real processes on loopback, as tests/test_smart.py runs them: sekmet-fhir loaded with the record,
the SMART authorization test server in front of it (tests/ehr_server.py), and `chartcite serve`
(warm: `/readyz` green before the launch). The launch is driven over HTTP as the EHR's frame
would: GET /launch (the authorize-post page), the authorize request, the callback (token exchange,
id_token check, session, the frame page), the frame's script; then the frame's status poll every
0.1 s (when each phase of the sync began: fetching from the EHR, the words-first write, the
embeddings, done) and the question "What are the active problems?" every 0.5 s until it comes
back cited.

Usage: python bench/launch_timeline.py [--synthea DIR] [--patient ID] [--runs N] [--latency SECONDS]
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import header  # noqa: E402
from tests.fhir_servers import free_port, load_synthea, start_ehr_server, start_sekmet, stop, wait_for  # noqa: E402

CLIENT_ID = "chartcite-bench-client"
QUESTION = "What are the active problems?"


def chosen(synthea: Path, patient: str) -> tuple[str, int, str]:
    """The patient (default: the largest record), its resources by the set's manifest, and which it is."""
    with open(synthea / "MANIFEST.tsv", encoding="utf-8") as fh:
        rows = sorted((int(r["n_resources"]), r["patient_id"]) for r in csv.DictReader(fh, delimiter="\t"))
    if not patient:
        return rows[-1][1], rows[-1][0], "the largest record"
    sizes = {pid: n for n, pid in rows}
    return patient, sizes.get(patient, 0), "the median record" if patient == rows[len(rows) // 2][1] else "a record"


def cli(env: dict, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "smart_app.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, encoding="utf-8")
    if done.returncode:
        sys.exit(f"chartcite {' '.join(args)} failed: {done.stderr[-2000:]}")


def timeline(app: str, ehr: str, patient: str) -> dict[str, float]:
    """Seconds from the launch request at which each part ended (or a phase began)."""
    marks: dict[str, float] = {}
    launch_id = requests.post(f"{ehr}/_test/launch", json={"patient": patient}, timeout=30).json()["launch"]
    browser = requests.Session()
    started = time.perf_counter()
    page = browser.get(f"{app}/launch", params={"iss": f"{ehr}/fhir", "launch": launch_id}, timeout=60)
    marks["launch page (discovery, authorize-post form)"] = time.perf_counter() - started
    action = re.search(r'<form id="authorize-post" method="post" action="([^"]+)"', page.text).group(1)
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    final = browser.post(action.replace("&amp;", "&"), data={k: v.replace("&amp;", "&") for k, v in fields.items()},
                         timeout=120)
    if final.status_code != 200:
        sys.exit(f"the launch failed: {final.status_code} {final.text[:500]}")
    marks["EHR authorize (redirect back)"] = marks["launch page (discovery, authorize-post form)"] + sum(
        r.elapsed.total_seconds() for r in final.history)
    marks["callback: token, id_token, session, frame page"] = time.perf_counter() - started
    browser.get(f"{app}/static/app.js", timeout=30)
    marks["frame script loaded"] = time.perf_counter() - started
    handle = re.search(r'name="chartcite-session" content="([^"]+)"', final.text).group(1)
    headers = {"X-Chartcite-Session": handle}
    seen_phases: set[str] = set()
    next_question = 0.0
    while not any(m.startswith("first cited answer") for m in marks) or "whole record read" not in marks:
        now = time.perf_counter() - started
        status = browser.get(f"{app}/api/status", headers=headers, timeout=60).json()
        job = status.get("job") or {}
        phase = job.get("phase") or job.get("state") or ""
        if phase and phase not in seen_phases:
            seen_phases.add(phase)
            marks[f"sync phase began: {phase}"] = now
        if status.get("indexed") and "record searchable (words first)" not in marks:
            marks["record searchable (words first)"] = now
        if job.get("state") == "done" and "whole record read" not in marks:
            marks["whole record read"] = now
        if job.get("state") == "failed":
            sys.exit(f"the sync failed: {job.get('message')}")
        answered = any(m.startswith("first cited answer") for m in marks)
        if status.get("indexed") and not answered and now >= next_question:
            asked = browser.post(f"{app}/api/ask", json={"question": QUESTION}, headers=headers, timeout=120)
            if asked.status_code == 200 and asked.json().get("citations"):
                marks["first cited answer" + (" (still reading)" if "reading" in asked.json() else "")] = \
                    time.perf_counter() - started
            next_question = now + 0.5
        if now > 600:
            sys.exit(f"no cited answer in 10 minutes: {marks}")
        time.sleep(0.1)
    return marks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthea", default=str(REPO.parent / "shared" / "data" / "synthea"))
    parser.add_argument("--patient", default="", help="default: the largest record of the set")
    parser.add_argument("--runs", type=int, default=1, help="launches, each of a never-indexed record")
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds the EHR takes per FHIR request (a remote EHR; loopback answers at once)")
    args = parser.parse_args()
    synthea = Path(args.synthea)
    patient, resources, which = chosen(synthea, args.patient)
    print(header(), flush=True)
    processes = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        try:
            sekmet, fhir = start_sekmet(folder)
            processes.append(sekmet)
            load_synthea(fhir, synthea, [patient])
            port = free_port()
            app = f"http://localhost:{port}"
            ehr_process, ehr = start_ehr_server(folder, fhir, CLIENT_ID, app, f"{app}/.well-known/jwks.json")
            processes.append(ehr_process)
            requests.post(f"{ehr}/_test/latency", json={"seconds": args.latency}, timeout=30).raise_for_status()
            for run in range(args.runs):
                data = folder / f"data-{run}"
                env = {k: v for k, v in os.environ.items() if not k.startswith("CHARTCITE_")} | {
                    "CHARTCITE_DATA_DIR": str(data), "CHARTCITE_DEMO_LAUNCH": "false", "CHARTCITE_PUBLIC_URL": app,
                    "CHARTCITE_LOG_LEVEL": "WARNING"}
                cli(env, "keys", "generate")
                cli(env, "ehr", "add", "--name", "bench", "--iss", f"{ehr}/fhir", "--client-id", CLIENT_ID,
                    "--frame-origin", ehr)
                log = folder / f"serve-{run}.log"
                server = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(port)],
                                          cwd=REPO, env=env, stdout=log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
                try:
                    wait_for(f"{app}/readyz", server, log, seconds=300)
                    while requests.get(f"{app}/readyz", timeout=10).status_code != 200:
                        time.sleep(0.2)
                    marks = timeline(app, ehr, patient)
                finally:
                    stop(server)
                print(f"run {run + 1}: launch of {which} ({resources or '?'} resources), warm server, "
                      f"EHR latency {args.latency * 1000:.0f} ms per request")
                for name, seconds in sorted(marks.items(), key=lambda kv: kv[1]):
                    print(f"  {seconds:6.2f} s  {name}")
        finally:
            for process in reversed(processes):
                stop(process)


if __name__ == "__main__":
    main()

"""`chartcite serve` as production runs it: gunicorn with threads, an access log without query
strings, a graceful shutdown that lets a question in flight finish, and Prometheus metrics."""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
import requests

from .conftest import SYNTHEA, clean_env, metric
from .fhir_servers import REPO, free_port, stop, wait_for

PID = "936988e9-d587-ef42-ebdf-541238540ff3"


@contextmanager
def serving(folder, **settings):
    """`chartcite serve` with two workers, as a hospital scales one host, on the demo patient."""
    source = folder / "source"
    source.mkdir()
    shutil.copy(SYNTHEA / f"{PID}.json.gz", source)
    port = free_port()
    log = folder / "serve.log"
    env = clean_env(data_dir=folder / "data", demo_source=source, demo_launch="true", web_workers=2, web_threads=4,
                    **settings)
    process = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(port)], cwd=REPO,
                               env=env, stdout=log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{base}/healthz", process, log, seconds=120)
        yield {"url": base, "process": process, "log": log, "data": folder / "data"}
    finally:
        stop(process)


@pytest.fixture(scope="module")
def server(tmp_path_factory, synthea_dir):
    # Two workers: metrics must sum them.
    with serving(tmp_path_factory.mktemp("serve")) as running:
        yield running


def demo_session(base: str) -> str:
    page = requests.post(f"{base}/demo/launch", data={"patient_id": PID}, timeout=60)
    assert page.status_code == 200, page.text
    return re.search(r'name="chartcite-session" content="([^"]+)"', page.text).group(1)


def wait_indexed(base: str, handle: str, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        job = requests.get(f"{base}/api/status", headers={"X-Chartcite-Session": handle}, timeout=30).json().get("job")
        if job and job["state"] in ("done", "failed"):
            assert job["state"] == "done", job
            return
        time.sleep(0.5)
    raise AssertionError("the patient was not indexed in time")


def ask(base: str, handle: str, question: str) -> requests.Response:
    return requests.post(f"{base}/api/ask", json={"question": question}, timeout=120,
                         headers={"X-Chartcite-Session": handle})


def wait_ready(base: str, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while requests.get(f"{base}/readyz", timeout=10).status_code != 200:
        assert time.time() < deadline, "the workers did not get ready"
        time.sleep(0.2)


def test_ready_means_every_worker_is_warm(server):
    """First in this module, while the workers are still loading: /readyz, whichever worker
    answers, says ready only once both have the model and the pipeline, so an orchestrator never
    sends a clinician's question to a worker still loading them."""
    deadline = time.time() + 120
    while (first := requests.get(f"{server['url']}/readyz", timeout=10)).status_code != 200:
        assert first.status_code == 503 and time.time() < deadline, first.text
        time.sleep(0.05)
    answers = [requests.get(f"{server['url']}/readyz", timeout=10) for _ in range(20)]
    assert [a.status_code for a in answers] == [200] * 20, [a.json() for a in answers if a.status_code != 200]
    assert all(a.json()["checks"]["workers"] == "ok" for a in answers)
    marked = sorted(p.name for p in (server["data"] / "workers-ready").iterdir())
    assert len(marked) == 3 and "expected" in marked     # one file per warm worker, named by its pid


def test_gunicorn_serves_and_the_access_log_holds_no_query_strings(server):
    response = requests.get(f"{server['url']}/healthz", timeout=10)
    assert response.status_code == 200 and response.headers["Server"].startswith("gunicorn")
    requests.get(f"{server['url']}/callback", params={"code": "one-time-code-xyz", "state": "s"}, timeout=10)
    deadline = time.time() + 10
    while '"GET /callback"' not in server["log"].read_text(encoding="utf-8") and time.time() < deadline:
        time.sleep(0.2)
    text = server["log"].read_text(encoding="utf-8")
    assert '"GET /callback" 400' in text and "one-time-code-xyz" not in text
    assert "Booting worker" in text


# Everything that ends or reorders a line for a reader or a log shipper.
LINE_BREAKERS = ["\n", "\r", "\r\n", "\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1b[2K\r"]


def test_no_request_parameter_can_start_a_log_line(server):
    """Unauthenticated requests put text into the log (an EHR's error_description, a path): a
    newline in it must not start a line of the sender's choosing, in the app's log or gunicorn's."""
    marker = f"forged-{time.time_ns()}"
    # The error is logged cut to 60 characters; the description and the path hold the marker.
    for breaker in LINE_BREAKERS:
        forged = f"{breaker}2099-01-01 00:00:00,000 INFO smart_app.launch: {marker}"
        requests.get(f"{server['url']}/callback", params={"error": f"x{forged}", "error_description": f"ok{forged}"},
                     timeout=10)
        requests.get(f"{server['url']}/nowhere{requests.utils.quote(forged)}", timeout=10)
    requests.get(f"{server['url']}/callback", params={"error": "x", "error_description": f"\u202e{marker}"},
                 timeout=10)
    deadline = time.time() + 10
    while server["log"].read_text(encoding="utf-8").count(marker) < 2 * len(LINE_BREAKERS) + 1 and time.time() < deadline:
        time.sleep(0.2)
    text = server["log"].read_text(encoding="utf-8")
    assert text.count(marker) >= 2 * len(LINE_BREAKERS) + 1, text[-3000:]
    forged_lines = [line for line in text.splitlines() if marker in line
                    and "the EHR refused authorization: x" not in line and '"GET /nowhere' not in line]
    assert not forged_lines, forged_lines
    assert "\u202e" not in text and "\\u202e" + marker in text


def test_metrics_sum_every_worker(server):
    handle = demo_session(server["url"])
    wait_indexed(server["url"], handle)
    before = requests.get(f"{server['url']}/metrics", timeout=30).text
    asked = 6
    for _ in range(asked):
        assert ask(server["url"], handle, "What is the patient allergic to?").status_code == 200
    for _ in range(6):       # whichever worker answers the scrape, it reports both workers' questions
        scraped = requests.get(f"{server['url']}/metrics", timeout=30).text
        total = sum(metric(scraped, "chartcite_questions_total", outcome=o) - metric(before, "chartcite_questions_total",
                                                                                    outcome=o)
                    for o in ("answered", "refused", "failed"))
        assert total == asked
    assert "Booting worker" in server["log"].read_text(encoding="utf-8")


def test_a_question_in_flight_finishes_when_the_server_is_stopped(server):
    handle = demo_session(server["url"])
    wait_indexed(server["url"], handle)
    assert ask(server["url"], handle, "What is the patient allergic to?").status_code == 200
    result = {}

    def in_flight():
        result["response"] = ask(server["url"], handle, "What medications is the patient taking?")

    asking = threading.Thread(target=in_flight)
    asking.start()
    time.sleep(0.15)
    server["process"].send_signal(signal.SIGTERM)
    asking.join(60)
    assert result["response"].status_code == 200 and result["response"].json()["citations"]
    assert server["process"].wait(60) == 0
    assert "Shutting down: Master" in server["log"].read_text(encoding="utf-8")


def test_a_clinicians_question_limit_holds_across_workers(tmp_path_factory, synthea_dir):
    """CHARTCITE_RATE_LIMIT_CLINICIAN is the clinician's allowance, not each worker's: without
    Redis the counts live in a file every worker on the host shares."""
    with serving(tmp_path_factory.mktemp("limited"), rate_limit_clinician="4/hour") as limited:
        wait_ready(limited["url"])           # both workers take questions
        handle = demo_session(limited["url"])
        answers = [ask(limited["url"], handle, "What is the patient allergic to?") for _ in range(10)]
        assert [a.status_code for a in answers] == [200] * 4 + [429] * 6
        assert "Too many questions" in answers[-1].json()["error"]

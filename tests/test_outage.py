"""A short EHR outage, in real processes: sekmet-fhir behind the SMART test server, `chartcite
serve` running its syncs in-process (the embedded default) or on a real `chartcite worker` over
Redis. The FHIR server is stopped while the clinician launches and started again:

- within seconds the frame says the EHR could not be reached and when it retries;
- what was indexed before stays askable, and says how old it is;
- Refresh and a relaunch start a sync at once (they were refused for ten minutes), and the
  scheduled retries run in both modes (in-process, they never ran).
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest
from cryptography.fernet import Fernet

from .conftest import clean_env, redis_url
from .fhir_servers import REPO, free_port, load_synthea, start_ehr_server, start_sekmet, stop, wait_for
from .test_smart import CLIENT_ID, GROUP, OTHER, PID, Stack, api, handle_of, launch


class OutageStack(Stack):
    sekmet: subprocess.Popen
    folder: object

    def stop_fhir(self) -> None:
        stop(self.sekmet)

    def start_fhir(self) -> None:
        port = int(self.upstream.rsplit(":", 1)[1].split("/")[0])
        self.sekmet, _ = start_sekmet(self.folder, port=port)


@pytest.fixture(scope="module", params=["in-process", "worker"])
def outage_stack(request, tmp_path_factory, synthea_dir):
    mode = request.param
    folder = tmp_path_factory.mktemp(f"outage-{mode}")
    processes = []
    try:
        sekmet, fhir_base = start_sekmet(folder)
        load_synthea(fhir_base, synthea_dir, [PID, OTHER], GROUP)
        app_port = free_port()
        app_url = f"http://localhost:{app_port}"
        tenant = f"outage{uuid.uuid4().hex[:6]}"
        settings = dict(data_dir=folder / "data", demo_launch="false", public_url=app_url,
                        token_key=Fernet.generate_key().decode())
        if mode == "worker":
            # A Redis database of its own: no task another test left queued (or scheduled to retry)
            # reaches this worker, and flushing it touches nothing else.
            import redis

            own = redis_url().rsplit("/", 1)[0] + "/3"
            redis.Redis.from_url(own).flushdb()
            settings |= dict(tasks_eager="false", redis_url=own)
        env = clean_env(**settings)
        ehr, ehr_root = start_ehr_server(folder, fhir_base, CLIENT_ID, app_url, f"{app_url}/.well-known/jwks.json")
        processes.append(ehr)
        stack = OutageStack(app_url, ehr_root, f"{ehr_root}/fhir", env, folder / "chartcite.log", fhir_base)
        stack.sekmet, stack.folder = sekmet, folder
        assert stack.cli("keys", "generate").returncode == 0
        added = stack.cli("ehr", "add", "--name", tenant, "--iss", stack.fhir, "--client-id", CLIENT_ID,
                          "--frame-origin", ehr_root)
        assert added.returncode == 0, added.stderr
        app = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(app_port)], cwd=REPO,
                               env=env, stdout=stack.app_log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
        processes.append(app)
        if mode == "worker":
            worker = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "worker"], cwd=REPO, env=env,
                                      stdout=(folder / "worker.log").open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
            processes.append(worker)
        wait_for(f"{app_url}/.well-known/jwks.json", app, stack.app_log, seconds=120)
        yield stack
    finally:
        for process in reversed(processes):
            stop(process)
        stop(stack.sekmet if "stack" in locals() else sekmet)


def status_of(stack, handle: str) -> dict:
    return api(stack, handle, "GET", "/api/status").json()


def wait_state(stack, handle: str, states: set[str], seconds: float) -> tuple[dict, float]:
    """The status once the job is in one of `states`, and how long that took."""
    started = time.time()
    while time.time() - started < seconds:
        status = status_of(stack, handle)
        if (status.get("job") or {}).get("state") in states:
            return status, time.time() - started
        time.sleep(0.25)
    raise AssertionError(f"the sync never reached {states} in {seconds} s: {status}")


def launch_in_chromium(stack, patient: str) -> tuple[str, str, float]:
    """The EHR's chart page in Chromium, chartcite in its frame: the frame's session handle, the
    sentence its sync line shows once the Retry button appears, and how long that took."""
    from playwright.sync_api import sync_playwright

    from .test_browser import CHROMIUM
    from .test_frames import CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            started = time.time()
            page.goto(f"{stack.ehr}/ehr?patient={patient}")
            frame = page.frame_locator("#app")
            frame.locator("#retry-sync:not([hidden])").wait_for(timeout=30_000)
            took = time.time() - started
            sentence = frame.locator("#sync-text").inner_text()
            handle = frame.locator('meta[name="chartcite-session"]').get_attribute("content")
            return handle, sentence, took
        finally:
            browser.close()


def launched(stack, patient: str) -> str:
    final, _ = launch(stack, stack.test_api("launch", {"patient": patient})["launch"])
    assert final.status_code == 200, final.text[:300]
    return handle_of(final.text)


def test_an_ehr_outage_is_said_within_seconds_and_over_as_soon_as_the_ehr_is_back(outage_stack):
    stack = outage_stack
    held = launched(stack, PID)
    status, _ = wait_state(stack, held, {"done"}, 180)
    assert status["indexed"]

    stack.stop_fhir()
    try:
        # A patient never synced, launched during the outage: the frame says so within seconds,
        # with a Retry button.
        fresh, sentence, took = launch_in_chromium(stack, OTHER)
        assert took < 15 and re.fullmatch(r"The EHR could not be reached; retrying in \d+ s\.", sentence), sentence
        status = status_of(stack, fresh)
        assert status["job"]["state"] == "waiting" and not status["indexed"]
        assert 0 < status["job"]["retry_at"] - time.time() <= 15
        # The scheduled retry runs (and, the EHR still down, waits longer the next time).
        again, _ = wait_state_with(stack, fresh, lambda j: j["attempts"] >= 2, 60)
        assert again["job"]["state"] == "waiting" and again["job"]["retry_at"] - time.time() > 5

        # The patient indexed before stays askable, with the age of what it answers from.
        assert api(stack, held, "POST", "/api/sync").json()["queued"] is True
        status, _ = wait_state(stack, held, {"waiting"}, 30)
        assert status["indexed"] and status["synced_at"] and time.time() - status["synced_at"] < 600
        answer = api(stack, held, "POST", "/api/ask", json={"question": "What conditions does he have?"}).json()
        assert not answer["abstained"] and answer["citations"]
        # Refresh is not refused while the sync waits: it tries again at once.
        assert api(stack, held, "POST", "/api/sync").json()["queued"] is True
    finally:
        stack.start_fhir()

    relaunched = launched(stack, OTHER)
    status, took = wait_state(stack, relaunched, {"done"}, 120)
    assert status["indexed"] and took < 12, f"the relaunch waited {took:.0f} s for a scheduled retry"
    assert api(stack, held, "POST", "/api/sync").json()["queued"] is True
    status, _ = wait_state(stack, held, {"done"}, 120)
    assert status["indexed"]


def wait_state_with(stack, handle: str, condition, seconds: float) -> tuple[dict, float]:
    started = time.time()
    while time.time() - started < seconds:
        status = status_of(stack, handle)
        if status.get("job") and condition(status["job"]):
            return status, time.time() - started
        time.sleep(0.25)
    raise AssertionError(f"the job never got there in {seconds} s: {status}")

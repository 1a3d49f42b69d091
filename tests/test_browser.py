"""The frame inside another origin's iframe, driven in Debian's headless Chromium as a user would.

Starts the real `chartcite serve` process and a second web server (the "EHR") on another origin
whose page embeds chartcite in an iframe.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .conftest import clean_env
from .fhir_servers import free_port, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PID = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def servers(tmp_path_factory, synthea_dir):
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run `make install-test` (apt-get install chromium)")
    app_port, ehr_port = free_port(), free_port()
    source = tmp_path_factory.mktemp("source")
    shutil.copy(synthea_dir / f"{PID}.json.gz", source)
    env = clean_env(data_dir=tmp_path_factory.mktemp("data"), demo_source=source, demo_launch="true",
                    frame_ancestors=f"http://localhost:{ehr_port}")
    log_path = tmp_path_factory.mktemp("logs") / "serve.log"
    log = open(log_path, "w")
    app = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(app_port)],
                           cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    ehr_root = tmp_path_factory.mktemp("ehr")
    (ehr_root / "index.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>Demo EHR</title><h3 style='font-family:sans-serif'>Demo EHR · patient chart</h3>"
        f"<iframe id='app' src='http://127.0.0.1:{app_port}/' width='1180' height='640' "
        "style='border:1px solid #999'></iframe>")
    ehr = ThreadingHTTPServer(("127.0.0.1", ehr_port), partial(SimpleHTTPRequestHandler, directory=str(ehr_root)))
    threading.Thread(target=ehr.serve_forever, daemon=True).start()
    try:
        wait_for(f"http://127.0.0.1:{app_port}/", app, log_path, seconds=90)
        yield {"app": app_port, "ehr": ehr_port}
    finally:
        app.terminate()
        app.wait(timeout=20)
        ehr.shutdown()
        log.close()


@pytest.mark.browser
def test_clinician_asks_inside_the_ehr_iframe_and_opens_a_citation(servers, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1220, "height": 720})
        page.goto(f"http://localhost:{servers['ehr']}/index.html")
        frame = page.frame_locator("#app")
        frame.locator(f"button[data-patient='{PID}']").click()
        # Indexing runs in the background; the question box unlocks when the record is searchable.
        frame.locator("#ask-form[data-ready='yes']").wait_for(timeout=120_000)
        frame.locator("#question").fill("Does he carry an EpiPen?")
        frame.locator("#ask-button").click()
        statement = frame.locator("#answer .statement").first
        statement.wait_for(timeout=60_000)
        assert "epinephrine" in statement.inner_text().lower()
        assert frame.locator("#answer .cite").count() >= 1
        chip = frame.locator("#chips .chip").first
        chip_ref = chip.get_attribute("data-ref")
        chip.click()
        frame.locator("#panel:not([hidden]) #panel-title").wait_for(timeout=10_000)
        assert frame.locator("#panel-ref").inner_text() == chip_ref
        assert "pinephrine" in frame.locator("#panel-title").inner_text()
        frame.locator("#raw-toggle").click()
        assert f'"id": "{chip_ref.split("/")[1]}"' in frame.locator("#panel-raw").inner_text()
        shot = REPO / "docs" / "frame.png" if os.environ.get("CHARTCITE_UPDATE_SCREENSHOT") else tmp_path / "frame.png"
        page.screenshot(path=str(shot))
        browser.close()

"""The frame inside another origin's iframe, driven in Debian's headless Chromium as a user would.

Starts the real `chartcite serve` process and a second web server (the "EHR") on another origin
whose page embeds chartcite in an iframe.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .conftest import clean_env
from .fhir_servers import free_port, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PID = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"
CARDIAC = "5c028667-bfa9-f625-b66f-b3473ffc597e"      # an older man with an MI history, on antiplatelets
RANGED = "range-k"                                      # hand-made below: potassium with a reference range
REPO = Path(__file__).resolve().parent.parent


def ranged_bundle() -> dict:
    """A patient whose potassium results carry a reference range (Synthea's never do), as US Core
    shapes a laboratory Observation."""
    def potassium(i: int, value: float, day: str) -> dict:
        return {"resourceType": "Observation", "id": f"k{i}", "status": "final",
                "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                          "code": "laboratory"}]}],
                "code": {"coding": [{"system": "http://loinc.org", "code": "2823-3",
                                     "display": "Potassium [Moles/volume] in Serum or Plasma"}]},
                "subject": {"reference": f"Patient/{RANGED}"}, "effectiveDateTime": day,
                "valueQuantity": {"value": value, "unit": "mmol/L", "system": "http://unitsofmeasure.org", "code": "mmol/L"},
                "referenceRange": [{"low": {"value": 3.5, "unit": "mmol/L"}, "high": {"value": 5.1, "unit": "mmol/L"}}]}
    resources = [{"resourceType": "Patient", "id": RANGED, "gender": "female", "birthDate": "1950-02-03",
                  "name": [{"family": "Range", "given": ["Kay"]}]}]
    resources += [potassium(i, v, d) for i, (v, d) in enumerate([(4.1, "2023-03-01"), (4.9, "2024-03-05"), (5.6, "2025-03-02")])]
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


@contextmanager
def served_in_an_ehr_page(tmp_path_factory, prefix: str, env: dict, app_port: int, ehr_port: int, heading: str,
                          height: int):
    """`chartcite serve` on app_port, framed by a static demo EHR page on ehr_port."""
    log_path = tmp_path_factory.mktemp(f"{prefix}logs") / "serve.log"
    log = open(log_path, "w", encoding="utf-8")
    app = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(app_port)],
                           cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    ehr_root = tmp_path_factory.mktemp(f"{prefix}ehr")
    (ehr_root / "index.html").write_text(
        f"<!doctype html><meta charset='utf-8'><title>Demo EHR</title>{heading}"
        f"<iframe id='app' src='http://127.0.0.1:{app_port}/' width='1180' height='{height}' "
        "style='border:1px solid #999'></iframe>", encoding="utf-8")
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


@pytest.fixture(scope="module")
def servers(tmp_path_factory, synthea_dir):
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run `make install-test` (apt-get install chromium)")
    app_port, ehr_port = free_port(), free_port()
    source = tmp_path_factory.mktemp("source")
    for pid in (PID, CARDIAC):
        shutil.copy(synthea_dir / f"{pid}.json.gz", source)
    (source / f"{RANGED}.json").write_text(json.dumps(ranged_bundle()), encoding="utf-8")
    env = clean_env(data_dir=tmp_path_factory.mktemp("data"), demo_source=source, demo_launch="true",
                    frame_ancestors=f"http://localhost:{ehr_port}")
    with served_in_an_ehr_page(tmp_path_factory, "", env, app_port, ehr_port,
                               "<h3 style='font-family:sans-serif'>Demo EHR · patient chart</h3>", 640) as ports:
        yield ports


# Indexing that shows no change on the frame's progress line for this long is stuck, not slow.
STUCK_SECONDS = 180


def wait_until_ready(frame) -> None:
    """The question box unlocks when the record is searchable: waited for as long as the frame's
    progress line keeps changing, since a busy machine only makes indexing slower. Fails when the
    line stands still for STUCK_SECONDS, saying what it showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    last, moved = None, time.time()
    while True:
        try:
            frame.locator("#ask-form[data-ready='yes']").wait_for(timeout=5_000)
            return
        except PlaywrightTimeout:
            pass
        shown = (frame.locator("#ask-form").get_attribute("data-sync"), frame.locator("#sync-text").text_content())
        if shown != last:
            last, moved = shown, time.time()
        assert time.time() - moved < STUCK_SECONDS, f"indexing showed no progress for {STUCK_SECONDS} s: {shown}"


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
        wait_until_ready(frame)
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


def launch(page, servers, pid):
    page.goto(f"http://localhost:{servers['ehr']}/index.html")
    frame = page.frame_locator("#app")
    frame.locator(f"button[data-patient='{pid}']").click()
    wait_until_ready(frame)
    return frame


def ask(frame, question):
    frame.locator("#question").fill(question)
    frame.locator("#ask-button").click()
    lead = frame.locator("#answer .statement.lead").first
    lead.wait_for(timeout=60_000)
    return lead


@pytest.mark.browser
def test_the_answer_comes_first_in_clinical_words_with_a_readable_chart(servers, tmp_path):
    """Issue 15: the answer sentence first, each clause citing, dates as a clinician writes them;
    a trend chart with axes, dates, values and the reference range; a copy button for the note."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1220, "height": 760})
        frame = launch(page, servers, CARDIAC)

        lead = ask(frame, "Is he on an antiplatelet?")      # clopidogrel is one; a blood thinner it is not
        text = lead.inner_text()
        assert text.startswith("Yes — ") and "clopidogrel 75 mg" in text.lower(), text
        assert lead.locator(".cite").count() >= 2                 # each clause carries its own mark
        assert "Apr 2005" in text and "2005-04-03" not in text    # clinical dates in the frame
        assert "Intent: order" not in frame.locator("#answer").inner_text()

        lead = ask(frame, "How has his kidney function changed?")
        text = lead.inner_text()
        assert text.startswith("eGFR rose from") and "results:" in text, text
        chart = frame.locator("#chart svg")
        chart.wait_for(timeout=10_000)
        ticks = [t for t in frame.locator("#chart svg text.tick").all_text_contents()]
        assert any(re.fullmatch(r"\d{1,2} [A-Z][a-z]{2} \d{4}", t) for t in ticks), ticks       # dates on x
        assert any(re.fullmatch(r"-?\d+(\.\d+)?", t) for t in ticks), ticks                    # values on y
        assert frame.locator("#chart svg text.axis-title").text_content().startswith("mL/min")    # the unit
        assert frame.locator("#chart svg circle title").count() >= 3                          # hoverable points
        assert frame.locator("#chart svg text.point-label").count() >= 3                      # labelled points
        caption = frame.locator("#chart figcaption").inner_text()
        assert caption.startswith("eGFR") and "…" not in caption and "Glomerular filtration rate" in caption
        assert "mL/min" in frame.locator("#chart-desc").inner_text()                           # a text alternative
        shot = REPO / "docs" / "answer-first.png" if os.environ.get("CHARTCITE_UPDATE_SCREENSHOT") else tmp_path / "a.png"
        page.screenshot(path=str(shot))
        frame.locator("#copy-answer").click()
        copied = frame.locator("#copy-text").input_value()
        assert copied.startswith("eGFR rose from") and "[1]" in copied and "Sources" in copied and "Observation/" in copied

        frame = launch(page, servers, RANGED)
        lead = ask(frame, "potassium trend?")
        assert lead.inner_text().startswith("K+ rose from 4.1 mmol/L"), lead.inner_text()
        assert frame.locator("#chart svg rect.range-band").count() == 1
        assert "reference range 3.5–5.1" in frame.locator("#chart-desc").inner_text()
        browser.close()


@pytest.mark.browser
def test_the_side_panel_reads_as_the_answer_does_and_follows_the_answer(servers):
    """The record a chip opens says its dose as the answer does ("1 tablet once daily", not the
    record's "1; 1 time(s) per 1.0 d" nor "form: order") with dates as the answer writes them; a
    new answer closes it rather than leave the previous answer's record beside it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1220, "height": 760})
        frame = launch(page, servers, CARDIAC)
        ask(frame, "Is he on a statin?")
        chip = frame.locator("#chips .chip", has_text="imvastatin").first
        chip.click()
        frame.locator("#panel:not([hidden]) #panel-title").wait_for(timeout=10_000)
        fields = dict(zip(frame.locator("#panel-fields dt").all_text_contents(),
                          frame.locator("#panel-fields dd").all_text_contents()))
        assert fields.get("dosage") == "1 tablet once daily", fields
        assert "form" not in fields and not any("time(s)" in v for v in fields.values()), fields
        assert re.fullmatch(r"\d{1,2} [A-Z][a-z]{2} \d{4}( \d\d:\d\d)?", fields["Date"]), fields
        ask(frame, "What are his active problems?")
        assert frame.locator("#panel").is_hidden() and frame.locator("#panel-title").inner_text() == ""
        browser.close()


# --- similar patients (issue 37) -----------------------------------------------------------------------

def hypertensive_bundle(n: int) -> dict:
    """A hand-made hypertensive on lisinopril with three blood pressures: small enough to index in
    seconds, alike enough that each is the others' similar patient."""
    pid = f"htn-{n}"
    subject = {"reference": f"Patient/{pid}"}

    def pressure(i: int, systolic: int, day: str) -> dict:
        return {"resourceType": "Observation", "id": f"{pid}-bp{i}", "status": "final", "subject": subject,
                "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                          "code": "vital-signs"}]}],
                "code": {"coding": [{"system": "http://loinc.org", "code": "85354-9", "display": "Blood pressure panel"}]},
                "effectiveDateTime": day, "component": [
                    {"code": {"coding": [{"system": "http://loinc.org", "code": code, "display": name}]},
                     "valueQuantity": {"value": value, "unit": "mm[Hg]", "system": "http://unitsofmeasure.org",
                                       "code": "mm[Hg]"}}
                    for code, name, value in (("8480-6", "Systolic blood pressure", systolic),
                                              ("8462-4", "Diastolic blood pressure", 85))]}
    resources = [
        {"resourceType": "Patient", "id": pid, "gender": "male", "birthDate": f"196{n}-05-0{n + 1}",
         "name": [{"family": f"Peerson{n}", "given": ["Hugh"]}], "address": [{"city": f"Town{n}"}]},
        {"resourceType": "Condition", "id": f"{pid}-htn", "subject": subject, "onsetDateTime": f"201{n}-02-01",
         "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                                        "code": "active"}]},
         "code": {"coding": [{"system": "http://snomed.info/sct", "code": "59621000",
                              "display": "Essential hypertension (disorder)"}], "text": "Essential hypertension"}},
        {"resourceType": "MedicationRequest", "id": f"{pid}-acei", "status": "active", "intent": "order",
         "subject": subject, "authoredOn": f"201{n}-03-01",
         "medicationCodeableConcept": {"coding": [{"system": "http://www.nlm.nih.gov/research/umls/rxnorm",
                                                   "code": "314076", "display": "lisinopril 10 MG Oral Tablet"}]},
         "reasonReference": [{"reference": f"Condition/{pid}-htn", "display": "Essential hypertension"}]},
    ]
    resources += [pressure(i, value, f"201{n + i}-0{i + 1}-15") for i, value in enumerate((158, 146, 134))]
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources]}


@pytest.fixture(scope="module")
def similar_servers(tmp_path_factory):
    """chartcite with similar patients turned on, four hypertensives indexed beforehand."""
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run `make install-test` (apt-get install chromium)")
    app_port, ehr_port = free_port(), free_port()
    source = tmp_path_factory.mktemp("similar-source")
    for n in range(4):
        (source / f"htn-{n}.json").write_text(json.dumps(hypertensive_bundle(n)), encoding="utf-8")
    env = clean_env(data_dir=tmp_path_factory.mktemp("similar-data"), demo_source=source, demo_launch="true",
                    frame_ancestors=f"http://localhost:{ehr_port}", similar_patients="on")
    indexed = subprocess.run([sys.executable, "-m", "smart_app.cli", "index", str(source)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=600, encoding="utf-8")
    assert indexed.returncode == 0, indexed.stdout + indexed.stderr
    with served_in_an_ehr_page(tmp_path_factory, "similar-", env, app_port, ehr_port, "", 700) as ports:
        yield ports


@pytest.mark.browser
def test_the_similar_patients_panel_says_why_and_names_no_one(similar_servers):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1220, "height": 760})
        frame = launch(page, similar_servers, "htn-0")
        frame.locator("#similar > summary").click()
        frame.locator("#similar-list .similar-item").first.wait_for(timeout=60_000)
        peers = frame.locator("#similar-list .similar-item").all_inner_texts()
        assert len(peers) == 3, peers
        for text in peers:
            assert re.search(r"similarity [01]\.\d\d · male · aged \d{2}-\d{2}", text), text
            assert "condition: Essential hypertension" in text and "medication: lisinopril" in text, text
            assert "What followed for them" in text and "after lisinopril started" in text, text
            # No name, id, birth date, address or exact date of another patient.
            assert not re.search(r"htn-\d|Peerson|Town\d|\d{4}-\d{2}", text), text
        assert "de-identified" in frame.locator("#similar-source").inner_text()
        frame.locator("#cohort-condition").fill("hypertension")
        frame.locator("#cohort-exposures").fill("lisinopril, losartan")
        frame.locator("#cohort-outcome").fill("systolic BP")
        frame.locator("#cohort-button").click()
        statement = frame.locator("#cohort-result .cohort-statement")
        statement.wait_for(timeout=30_000)
        groups = frame.locator("#cohort-result .cohort-groups li").all_inner_texts()
        assert groups[0].startswith("lisinopril: ") and "suppressed" in groups[0], groups
        assert "not evidence of effect" in statement.inner_text()
        browser.close()

"""SMART on FHIR end to end, in real processes on loopback: sekmet-fhir loaded with Synthea, the
SMART authorization test server in front of it, and `chartcite serve` (registered with `chartcite
ehr add`, keys from `chartcite keys generate`). Launches are driven over HTTP as a browser would
(the authorize-post form is posted like the page's script does); tests/test_smart_browser.py does
the same in Chromium."""
from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from cryptography.fernet import Fernet

from fhir_ingest.connection.smart_auth import resource_scopes

from .conftest import SHARED, clean_env, metric
from .fhir_servers import REPO, free_port, load_synthea, load_uscore, start_ehr_server, start_sekmet, stop, wait_for

PID = "936988e9-d587-ef42-ebdf-541238540ff3"            # 46 resources
USCORE = SHARED / "data" / "uscore"                     # HL7's US Core examples, of Patient/example
OTHER = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"          # 88 resources, two medications
GROUP = "chartcite-test-group"
OUTSIDER = "outside-the-group"                          # indexed from a file into the EHR's tenant
CLIENT_ID = "chartcite-test-client"
ADMIN_TOKEN = "admin-token-for-the-suite"
FRAME_ORIGINS_CACHE = 3            # seconds the app keeps the registered frame origins (30 by default)
FRAME_ORIGINS_WAIT = FRAME_ORIGINS_CACHE + 1
TENANT = "testehr"


@dataclass
class Stack:
    app: str
    ehr: str
    fhir: str
    env: dict
    app_log: Path
    upstream: str

    def cli(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "smart_app.cli", *args], cwd=REPO, env=self.env | (env or {}),
                              capture_output=True, text=True, timeout=600, encoding="utf-8")

    def test_api(self, path: str, body: dict | None = None):
        response = requests.post(f"{self.ehr}/_test/{path}", json=body or {}, timeout=30)
        response.raise_for_status()
        return response.json()

    def ehr_log(self) -> list[dict]:
        return requests.get(f"{self.ehr}/_test/log", timeout=10).json()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, synthea_dir):
    folder = tmp_path_factory.mktemp("smart")
    processes = []
    try:
        sekmet, fhir_base = start_sekmet(folder)
        processes.append(sekmet)
        load_synthea(fhir_base, synthea_dir, [PID, OTHER], GROUP)
        load_uscore(fhir_base, USCORE)
        app_port = free_port()
        app_url = f"http://localhost:{app_port}"
        env = clean_env(data_dir=folder / "data", demo_launch="false", public_url=app_url,
                        token_key=Fernet.generate_key().decode(), fhir_max_concurrency=2, admin_token=ADMIN_TOKEN,
                        frame_origins_cache_seconds=FRAME_ORIGINS_CACHE)
        ehr, ehr_root = start_ehr_server(folder, fhir_base, CLIENT_ID, app_url, f"{app_url}/.well-known/jwks.json",
                                         standalone_patient=OTHER)
        processes.append(ehr)
        stack = Stack(app_url, ehr_root, f"{ehr_root}/fhir", env, folder / "chartcite.log", fhir_base)
        generated = stack.cli("keys", "generate")
        assert generated.returncode == 0, generated.stderr
        # The EHR's pages are framed from its own origin and, same-site with chartcite, as localhost.
        added = stack.cli("ehr", "add", "--name", TENANT, "--iss", stack.fhir, "--client-id", CLIENT_ID,
                          "--frame-origin", ehr_root, "--frame-origin", same_site(ehr_root), "--group-id", GROUP,
                          "--write-back")
        assert added.returncode == 0, added.stderr
        app = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(app_port)], cwd=REPO,
                               env=env, stdout=stack.app_log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
        processes.append(app)
        wait_for(f"{app_url}/.well-known/jwks.json", app, stack.app_log, seconds=120)
        yield stack
    finally:
        for process in reversed(processes):
            stop(process)


def same_site(origin: str) -> str:
    """The EHR's origin (127.0.0.1) by the name chartcite is served at (localhost): same-site."""
    return origin.replace("127.0.0.1", "localhost")


# --- helpers: a browser's part of the launch ---------------------------------------------------------

def authorize_form(html: str) -> tuple[str, dict]:
    action = re.search(r'<form id="authorize-post" method="post" action="([^"]+)"', html).group(1)
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html))
    return action.replace("&amp;", "&"), {k: v.replace("&amp;", "&") for k, v in fields.items()}


def launch(stack: Stack, launch_id: str | None, browser: requests.Session | None = None):
    """GET /launch like the EHR's iframe, post the authorize form like autopost.js, follow the
    redirect back to /callback. Returns the final response and the authorize parameters sent."""
    browser = browser or requests.Session()
    params = {"iss": stack.fhir} | ({"launch": launch_id} if launch_id else {})
    page = browser.get(f"{stack.app}/launch", params=params, timeout=30)
    assert page.status_code == 200, page.text
    action, fields = authorize_form(page.text)
    final = browser.post(action, data=fields, timeout=60)
    return final, fields


def handle_of(page: str) -> str:
    return re.search(r'<meta name="chartcite-session" content="([^"]+)"', page).group(1)


def api(stack: Stack, handle: str, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, f"{stack.app}{path}", headers={"X-Chartcite-Session": handle}, timeout=120, **kwargs)


def wait_synced(stack: Stack, handle: str, seconds: float = 300) -> dict:
    deadline = time.time() + seconds
    while time.time() < deadline:
        status = api(stack, handle, "GET", "/api/status").json()
        job = status.get("job") or {}
        if job.get("state") == "failed":
            return status
        if status["indexed"] and job.get("state") == "done":
            return status
        time.sleep(0.5)
    raise AssertionError(f"the patient did not sync in {seconds}s: {status}")


@pytest.fixture(scope="module")
def launched(stack):
    """One EHR launch of PID, synced: (handle, page, authorize fields)."""
    stack.test_api("clear-log")
    launch_id = stack.test_api("launch", {"patient": PID, "need_patient_banner": False, "style": True})["launch"]
    final, fields = launch(stack, launch_id)
    assert final.status_code == 200 and urlsplit(final.url).path == "/callback", final.text[:500]
    handle = handle_of(final.text)
    status = wait_synced(stack, handle)
    assert status["indexed"], status
    return handle, final, fields


# --- launch -----------------------------------------------------------------------------------------

def test_ehr_launch_syncs_the_patient_and_answers_with_citations(stack, launched):
    handle, page, fields = launched
    assert fields["aud"] == stack.fhir and fields["code_challenge_method"] == "S256"
    assert fields["launch"] and "launch" in fields["scope"].split()
    assert "patient/Observation.rs" in fields["scope"] and "openid" in fields["scope"]
    answer = api(stack, handle, "POST", "/api/ask", json={"question": "What conditions does he have?"}).json()
    assert not answer["abstained"] and answer["citations"]
    assert all(c["ref"].count("/") == 1 for c in answer["citations"])
    record = api(stack, handle, "GET", "/api/record", params={"ref": answer["citations"][0]["ref"]})
    assert record.status_code == 200
    # Read from the EHR over FHIR: one search per type with the patient and a page size.
    searched = [e for e in stack.ehr_log() if e["path"].startswith("/fhir/Observation")]
    assert searched and searched[0]["args"]["patient"] == [PID] and searched[0]["args"]["_count"] == ["100"]
    assert all(e["auth"] for e in stack.ehr_log() if not e["path"].endswith("metadata"))


@pytest.mark.browser
def test_ehr_launch_in_chromium_inside_the_ehrs_iframe(stack, tmp_path):
    """The EHR's chart page (127.0.0.1) embeds chartcite (localhost, another origin) and launches
    it; chartcite posts the authorization, syncs the patient, and the clinician asks and opens a chip."""
    from playwright.sync_api import sync_playwright

    from .test_browser import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run `make install-test` (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1220, "height": 900})
        page.goto(f"{stack.ehr}/ehr?patient={OTHER}")
        frame = page.frame_locator("#app")
        frame.locator("#ask-form[data-ready='yes']").wait_for(timeout=180_000)
        assert frame.locator("#banner").is_hidden()           # the EHR shows its own banner
        inner = next(f for f in page.frames if f.url.startswith(stack.app))
        assert re.fullmatch(re.escape(stack.app) + r"/app/[\w-]{16,}", inner.url)   # the code left the address bar
        frame.locator("#question").fill("Does she carry an EpiPen?")
        frame.locator("#ask-button").click()
        statement = frame.locator("#answer .statement").first
        statement.wait_for(timeout=60_000)
        assert "epinephrine" in statement.inner_text().lower()
        chip = frame.locator("#chips .chip").first
        chip_ref = chip.get_attribute("data-ref")
        chip.click()
        frame.locator("#panel:not([hidden]) #panel-title").wait_for(timeout=10_000)
        assert frame.locator("#panel-ref").inner_text() == chip_ref
        page.screenshot(path=str(tmp_path / "smart-frame.png"))
        browser.close()


def test_launch_context_is_honoured_banner_and_style(stack, launched):
    _, page, _ = launched
    assert 'id="banner" hidden' in page.text            # need_patient_banner: false
    assert 'data-name="color_highlight" content="#69b5ce"' in page.text


def test_the_id_token_names_the_clinician_and_tokens_never_reach_the_page_or_log(stack, launched):
    handle, page, _ = launched
    code = parse_qs(urlsplit(page.url).query)["code"][0]
    log_text = stack.app_log.read_text(encoding="utf-8")
    assert code not in page.text and code not in log_text
    assert "access_token" not in page.text and "Bearer" not in page.text
    assert PID not in log_text                                   # no patient ids in the app log either
    # Cookies: the frame's cookie is Secure, HttpOnly, SameSite=None, Partitioned, and kept for its
    # own frame's address only.
    cookie = page.headers.get("Set-Cookie", "")
    frame = re.search(r'<meta name="chartcite-frame" content="([^"]+)"', page.text).group(1)
    assert "chartcite_frame=" in cookie and f"Path={frame};" in cookie and "Partitioned" in cookie
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=None" in cookie
    # Tokens are encrypted at rest: the registry holds no access token in the clear.
    db = (Path(stack.env["CHARTCITE_DATA_DIR"]) / "registry.sqlite").read_bytes()
    assert b"access_token" not in db and b"refresh_token" not in db


def test_standalone_launch_asks_for_a_patient_at_the_ehr(stack):
    final, fields = launch(stack, None)
    assert "launch/patient" in fields["scope"].split() and "launch" not in fields
    handle = handle_of(final.text)
    status = api(stack, handle, "GET", "/api/status").json()
    assert status["patient_id"] == OTHER


def frame_ancestors(response: requests.Response) -> list[str]:
    return re.search(r"frame-ancestors ([^;]+)", response.headers["Content-Security-Policy"]).group(1).split()


def test_csp_lets_only_the_launching_ehr_frame_its_pages(stack):
    """A launch's pages may be framed by the EHR it came from, not by every registered EHR's
    origins; pages of no launch by chartcite alone; error pages by any registered EHR."""
    other = "https://other-ehr.example.org"
    added = stack.cli("ehr", "add", "--name", "other", "--iss", "https://other-ehr.example.org/fhir",
                      "--client-id", "x", "--frame-origin", other)
    assert added.returncode == 0, added.stderr
    try:
        time.sleep(FRAME_ORIGINS_WAIT)       # every process picks a registration up within its cache time
        final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert frame_ancestors(final) == ["'self'", stack.ehr, same_site(stack.ehr)]
        start = requests.get(f"{stack.app}/launch", params={"iss": stack.fhir}, timeout=30)
        assert frame_ancestors(start) == ["'self'", stack.ehr, same_site(stack.ehr)]
        plain = requests.get(f"{stack.app}/.well-known/jwks.json", timeout=10)
        assert frame_ancestors(plain) == ["'self'"] and "X-Frame-Options" not in plain.headers
        refused = requests.get(f"{stack.app}/launch", params={"iss": "https://nobody.example.org"}, timeout=10)
        assert refused.status_code == 400
        assert set(frame_ancestors(refused)) == {"'self'", stack.ehr, same_site(stack.ehr), other}
    finally:
        stack.cli("ehr", "remove", "other")


def test_a_new_launch_honours_a_frame_origin_changed_a_moment_ago(stack):
    """The frame origins are kept 30 s for every response's CSP, but a launch reads them afresh: an
    origin hospital IT has just added frames the very next launch (it was refused for half a minute)."""
    first, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    assert first.status_code == 200 and "https://new-frame.example.org" not in frame_ancestors(first)
    origins = ["--frame-origin", stack.ehr, "--frame-origin", same_site(stack.ehr)]
    assert stack.cli("ehr", "update", TENANT, *origins, "--frame-origin", "https://new-frame.example.org").returncode == 0
    try:
        start = requests.get(f"{stack.app}/launch", params={"iss": stack.fhir}, timeout=30)
        assert "https://new-frame.example.org" in frame_ancestors(start)
        final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert final.status_code == 200 and "https://new-frame.example.org" in frame_ancestors(final)
    finally:
        assert stack.cli("ehr", "update", TENANT, *origins).returncode == 0


def test_jwks_publishes_both_algorithms_and_no_private_parts(stack):
    keys = requests.get(f"{stack.app}/.well-known/jwks.json", timeout=10).json()["keys"]
    assert {k["alg"] for k in keys} == {"RS384", "ES384"}
    assert not any("d" in k for k in keys)


# --- security ------------------------------------------------------------------------------------------

def test_unregistered_iss_gets_a_clear_page_and_no_redirect(stack):
    response = requests.get(f"{stack.app}/launch", params={"iss": "https://evil.example.org/fhir", "launch": "x"},
                            allow_redirects=False, timeout=10)
    assert response.status_code == 400 and "Location" not in response.headers
    assert "not registered" in response.text


def authorized_callback(stack: Stack, browser: requests.Session) -> tuple[str, dict]:
    """Launch and authorize, stopping before the EHR's redirect back: (callback URL, fields sent)."""
    launch_id = stack.test_api("launch", {"patient": PID})["launch"]
    page = browser.get(f"{stack.app}/launch", params={"iss": stack.fhir, "launch": launch_id}, timeout=30)
    action, fields = authorize_form(page.text)
    back = browser.post(action, data=fields, allow_redirects=False, timeout=30)
    return back.headers["Location"], fields


def test_state_mismatch_is_refused(stack):
    browser = requests.Session()
    location, fields = authorized_callback(stack, browser)
    callback = location.replace(fields["state"], "forged-state")
    response = browser.get(callback, timeout=30)
    assert response.status_code == 400 and "state mismatch" in response.text
    assert 'name="chartcite-session"' not in response.text


def test_state_from_another_browser_is_refused(stack):
    location, _ = authorized_callback(stack, requests.Session())
    response = requests.get(location, cookies={"chartcite_launch": "someone-else"}, timeout=30)
    assert response.status_code == 400 and "another browser" in response.text


def test_pkce_is_s256_and_the_server_rejects_plain_and_wrong_verifiers(stack):
    launch_id = stack.test_api("launch", {"patient": PID})["launch"]
    page = requests.get(f"{stack.app}/launch", params={"iss": stack.fhir, "launch": launch_id}, timeout=30)
    action, fields = authorize_form(page.text)
    assert fields["code_challenge_method"] == "S256" and len(fields["code_challenge"]) == 43
    plain = dict(fields, code_challenge_method="plain")
    refused = requests.post(action, data=plain, allow_redirects=False, timeout=30)
    assert "error=invalid_request" in refused.headers["Location"]
    # A code obtained with the right challenge cannot be redeemed with a wrong verifier.
    fields["launch"] = stack.test_api("launch", {"patient": PID})["launch"]
    code = parse_qs(urlsplit(requests.post(action, data=fields, allow_redirects=False, timeout=30)
                             .headers["Location"]).query)["code"][0]
    token = requests.post(f"{stack.ehr}/auth/token", timeout=30, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": fields["redirect_uri"],
        "client_id": CLIENT_ID, "code_verifier": "not-the-verifier"})
    assert token.status_code in (400, 401) and token.json()["error"] in ("invalid_grant", "invalid_client")


@pytest.mark.parametrize("mode, reason", [({"aud": "someone-else"}, "aud"), ({"nonce": "replayed"}, "nonce"),
                                          ({"lifetime": -120}, "exp")])
def test_a_bad_id_token_ends_the_launch(stack, mode, reason):
    stack.test_api("id-token", mode)
    try:
        final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    finally:
        stack.test_api("id-token", {})
    assert final.status_code == 400 and "id_token did not validate" in final.text and reason in final.text
    assert 'name="chartcite-session"' not in final.text


@pytest.mark.parametrize("patient", ["../../etc", "a b", "x" * 65, ".."])
def test_a_launch_naming_a_patient_id_that_is_not_a_fhir_id_gets_no_session(stack, patient):
    final, _ = launch(stack, stack.test_api("launch", {"patient": patient})["launch"])
    assert final.status_code == 400 and "not a FHIR id" in final.text
    assert 'name="chartcite-session"' not in final.text

def test_metrics_count_ehr_requests_by_status_and_hold_no_patient_data(stack, launched):
    assert requests.get(f"{stack.app}/metrics", timeout=30).status_code == 403
    text = requests.get(f"{stack.app}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30).text
    assert metric(text, "chartcite_ehr_requests_total", status="200") > 10
    assert metric(text, "chartcite_syncs_total", kind="patient", outcome="done") >= 1
    assert PID not in text and OTHER not in text and "ehr-clinician" not in text


def test_another_patients_id_is_refused_and_audited(stack, launched):
    handle, _, _ = launched
    response = api(stack, handle, "POST", "/api/ask", json={"question": "any allergies?", "patient_id": OTHER})
    assert response.status_code == 403
    record = api(stack, handle, "GET", "/api/record", params={"ref": f"Patient/{OTHER}"})
    assert record.status_code == 403          # a ref naming another patient is refused like a patient_id
    from smart_app.audit import AuditTrail

    trail = AuditTrail(f"sqlite:///{Path(stack.env['CHARTCITE_DATA_DIR']) / 'audit.sqlite'}")
    [event] = trail.entries(kind="refused", limit=1)
    assert event["patient_id"] == PID and event["asked_patient"] == OTHER and "ehr-clinician" in event["clinician"]


# --- sync ----------------------------------------------------------------------------------------------

def test_incremental_sync_fetches_changes_and_entered_in_error_disappears(stack, launched):
    handle, _, _ = launched
    before = api(stack, handle, "POST", "/api/ask", json={"question": "What conditions does he have?"}).json()
    cited = next(c["ref"] for c in before["citations"] if c["ref"].startswith("Condition/"))
    condition = requests.get(f"{stack.upstream}/{cited}", timeout=10).json()
    condition["verificationStatus"] = {"coding": [{
        "system": "http://terminology.hl7.org/CodeSystem/condition-ver-status", "code": "entered-in-error"}]}
    requests.put(f"{stack.upstream}/{cited}", json=condition, timeout=10,
                 headers={"Content-Type": "application/fhir+json"}).raise_for_status()
    stack.test_api("clear-log")
    relaunch_id = stack.test_api("launch", {"patient": PID})["launch"]
    final, _ = launch(stack, relaunch_id)
    handle2 = handle_of(final.text)
    # A launch of a recently synced patient does not refetch; ask the app to sync now.
    synced = api(stack, handle2, "POST", "/api/sync")
    assert synced.status_code == 202
    wait_synced(stack, handle2)
    searches = [e for e in stack.ehr_log() if e["path"] == "/fhir/Condition"]
    assert searches and all(a.startswith("ge") for e in searches for a in e["args"]["_lastUpdated"])
    after = api(stack, handle2, "POST", "/api/ask", json={"question": "What conditions does he have?"}).json()
    assert cited not in {c["ref"] for c in after["citations"]}


def test_sync_survives_429_500_and_truncated_pages(stack):
    stack.test_api("faults", {"kind": "429", "path": "/fhir/Encounter", "retry_after": 1})
    stack.test_api("faults", {"kind": "500", "path": "/fhir/Observation"})
    stack.test_api("faults", {"kind": "truncate", "path": "/fhir/Condition"})
    final, _ = launch(stack, stack.test_api("launch", {"patient": OTHER})["launch"])
    handle = handle_of(final.text)
    api(stack, handle, "POST", "/api/sync")
    status = wait_synced(stack, handle)
    assert status["job"]["state"] == "done" and status["chunks"] > 50, status
    answer = api(stack, handle, "POST", "/api/ask", json={"question": "What medications is she on?"}).json()
    assert answer["citations"]


def test_an_expired_token_is_refreshed_and_a_failed_refresh_asks_for_relaunch(stack):
    final, _ = launch(stack, stack.test_api("launch", {"patient": OTHER})["launch"])
    handle = handle_of(final.text)
    wait_synced(stack, handle)
    stack.test_api("expire-tokens")
    stack.test_api("clear-log")
    api(stack, handle, "POST", "/api/sync")
    status = wait_synced(stack, handle)
    assert status["job"]["state"] == "done", status
    stack.test_api("expire-tokens")
    stack.test_api("revoke-refresh")
    api(stack, handle, "POST", "/api/sync")
    status = wait_synced(stack, handle)
    assert status["job"]["state"] == "failed" and "open chartcite from the EHR again" in status["job"]["message"]


def test_a_symmetric_client_signs_in_with_its_secret_and_asks_only_for_its_registered_scopes(stack):
    """Finding 4: Epic and Oracle Health register confidential symmetric clients, and a registration
    that may not be granted openid and fhirUser fails with invalid_scope and a description."""
    secret = "s3cret/with:odd&chars+"
    grantable = ["launch", "launch/patient", "offline_access", *resource_scopes("patient", "v2"),
                 "patient/DocumentReference.c"]
    stack.test_api("client", {"auth": "client_secret_basic", "secret": secret, "grantable": grantable})
    try:
        updated = stack.cli("ehr", "update", TENANT, "--client-auth", "client_secret_basic",
                            "--client-secret-env", "TEST_EHR_SECRET", env={"TEST_EHR_SECRET": secret})
        assert updated.returncode == 0, updated.stderr
        refused, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert refused.status_code == 400
        assert "invalid_scope" in refused.text and "Scopes openid and fhirUser could not be granted" in refused.text
        assert "Scopes openid and fhirUser could not be granted" in stack.app_log.read_text(encoding="utf-8")

        assert stack.cli("ehr", "update", TENANT, "--request-scopes", "offline_access").returncode == 0
        stack.test_api("clear-log")
        final, fields = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert final.status_code == 200, final.text
        assert "openid" not in fields["scope"].split() and "offline_access" in fields["scope"].split()
        handle = handle_of(final.text)
        stack.test_api("expire-tokens")
        api(stack, handle, "POST", "/api/sync")
        assert wait_synced(stack, handle)["job"]["state"] == "done"
        assert stack.cli("sync", "--tenant", TENANT).returncode == 0      # Backend Services on the secret too
        token_requests = [e for e in stack.ehr_log() if e["path"] == "/auth/token"]
        assert {e["grant"] for e in token_requests} == {"authorization_code", "refresh_token", "client_credentials"}
        assert {e["client_auth"] for e in token_requests} == {"basic"}

        wrong = stack.cli("ehr", "update", TENANT, "--client-secret-env", "TEST_EHR_SECRET",
                          env={"TEST_EHR_SECRET": "not-the-secret"})
        assert wrong.returncode == 0
        denied, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert denied.status_code == 400 and "invalid_client" in denied.text and "do not match" in denied.text
        listed = json.loads(stack.cli("ehr", "list", "--json").stdout)[0]
        assert listed["client_auth"] == "client_secret_basic" and secret not in json.dumps(listed)
    finally:
        stack.test_api("client", {})
        restored = stack.cli("ehr", "update", TENANT, "--client-auth", "private_key_jwt",
                             "--request-scopes", "openid fhirUser offline_access")
        assert restored.returncode == 0, restored.stderr


def test_a_registration_needs_the_secret_of_its_client_type(tmp_path):
    from fhir_ingest.connection.registry import Registry, RegistryError

    registry = Registry(f"sqlite:///{tmp_path / 'r.sqlite'}", Fernet.generate_key().decode())
    with pytest.raises(RegistryError, match="client secret"):
        registry.add_ehr("epic", "https://fhir.example.org/R4", "cid", client_auth="client_secret_basic")
    with pytest.raises(RegistryError, match="request-scopes"):
        registry.add_ehr("epic", "https://fhir.example.org/R4", "cid", request_scopes="openid patient/*.read")
    ehr = registry.add_ehr("epic", "https://fhir.example.org/R4", "cid", client_auth="client_secret_basic",
                           client_secret="the-secret")
    assert registry.client_secret(ehr) == "the-secret" and b"the-secret" not in (tmp_path / "r.sqlite").read_bytes()
    public = registry.update_ehr("epic", client_auth="none")
    assert public.client_secret == "" and public.auth_method == "none"


def ehr_status_count(stack: Stack, status: str) -> float:
    text = requests.get(f"{stack.app}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30).text
    return metric(text, "chartcite_ehr_requests_total", status=status)


def test_short_lived_tokens_are_renewed_before_expiry_through_a_long_sync(stack):
    """Oracle Health's access tokens last about ten minutes; scaled down, 2-second tokens and a slow
    EHR make one sync outlive several of them: each is renewed before the EHR would refuse it."""
    stack.test_api("token-lifetime", {"seconds": 2})
    stack.test_api("latency", {"seconds": 0.4})
    try:
        final, _ = launch(stack, stack.test_api("launch", {"patient": OTHER})["launch"])
        handle = handle_of(final.text)
        wait_synced(stack, handle)
        refused_before = ehr_status_count(stack, "401")
        stack.test_api("clear-log")
        started = time.time()
        api(stack, handle, "POST", "/api/sync")
        assert wait_synced(stack, handle)["job"]["state"] == "done"
        took = time.time() - started
    finally:
        stack.test_api("latency", {"seconds": 0})
        stack.test_api("token-lifetime", {"seconds": 3600})
    renewals = [e for e in stack.ehr_log() if e.get("grant") == "refresh_token"]
    assert took > 4 and len(renewals) >= 2, (took, len(renewals))
    assert ehr_status_count(stack, "401") == refused_before          # renewed before, never after, a refusal


def test_a_patient_sync_searches_the_kinds_of_record_side_by_side_within_the_budget(stack):
    """A record's searches go to the EHR side by side, never more at once than the budget allows
    (`fhir_max_concurrency`, 2 here): one after another, a launch waited on each round trip in turn."""
    first, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    handle = handle_of(first.text)
    wait_synced(stack, handle)
    stack.test_api("latency", {"seconds": 0.3})
    try:
        stack.test_api("clear-log")
        assert api(stack, handle, "POST", "/api/sync").status_code in (200, 202)
        assert wait_synced(stack, handle)["job"]["state"] == "done"
    finally:
        stack.test_api("latency", {"seconds": 0})
    searches = [e for e in stack.ehr_log() if e["method"] == "GET" and e["path"].count("/") == 2
                and e["path"] != "/fhir/metadata"]
    assert len(searches) > 10
    assert max(e["in_flight"] for e in searches) == 2, [e["in_flight"] for e in searches]


def test_a_public_client_without_a_refresh_token_ends_a_long_sync_cleanly(stack):
    """Epic gives public clients no refresh token: when the sign-in ends mid-sync, the sync stops
    with a sentence saying what to do, the index keeps what it had, and the log gets one line."""
    first, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    assert wait_synced(stack, handle_of(first.text))["job"]["state"] == "done"
    stack.test_api("client", {"auth": "none"})
    assert stack.cli("ehr", "update", TENANT, "--client-auth", "none", "--request-scopes", "openid fhirUser").returncode == 0
    stack.test_api("token-lifetime", {"seconds": 2})
    stack.test_api("latency", {"seconds": 0.4})
    try:
        stack.test_api("clear-log")
        final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert final.status_code == 200, final.text
        handle = handle_of(final.text)
        held = api(stack, handle, "GET", "/api/status").json()["chunks"]
        tracebacks = stack.app_log.read_text(encoding="utf-8").count("Traceback")
        api(stack, handle, "POST", "/api/sync")
        status = wait_synced(stack, handle)
    finally:
        stack.test_api("latency", {"seconds": 0})
        stack.test_api("token-lifetime", {"seconds": 3600})
        stack.test_api("client", {})
        stack.cli("ehr", "update", TENANT, "--client-auth", "private_key_jwt",
                  "--request-scopes", "openid fhirUser offline_access")
    assert status["job"]["state"] == "failed" and "no way to renew it" in status["job"]["message"]
    assert status["job"]["phase"] == "sign_in_expired"        # the frame offers no Retry that cannot help
    assert status["chunks"] == held > 0
    token_requests = [e for e in stack.ehr_log() if e["path"] == "/auth/token"]
    assert [(e["grant"], e["client_auth"]) for e in token_requests] == [("authorization_code", "none")]
    assert stack.app_log.read_text(encoding="utf-8").count("Traceback") == tracebacks


# --- Backend Services + Bulk Data ----------------------------------------------------------------------

def test_client_assertions_expire_within_five_minutes_with_a_fresh_jti():
    from joserfc import jwt as jose_jwt
    from joserfc.jwk import KeySet

    from fhir_ingest.connection.keys import client_assertion, generate_pair

    for alg in ("RS384", "ES384"):
        pair = generate_pair(alg)
        keys = KeySet.import_key_set({"keys": [pair.public]})
        first, second = (jose_jwt.decode(client_assertion(pair, "cid", "https://ehr/token"), keys, algorithms=[alg])
                         for _ in range(2))
        assert first.header["alg"] == alg and first.header["kid"] == pair.kid
        assert first.claims["jti"] != second.claims["jti"]
        assert 0 < first.claims["exp"] - first.claims["iat"] <= 300
        assert first.claims["iss"] == first.claims["sub"] == "cid" and first.claims["aud"] == "https://ehr/token"


def test_bulk_sync_exports_the_group_indexes_it_and_applies_deletions(stack, tmp_path):
    stack.test_api("faults", {"kind": "429", "path": "bulk-status", "retry_after": 1, "times": 2})
    first = stack.cli("sync", "--tenant", TENANT, "--full")
    assert first.returncode == 0, first.stderr
    assert "synced 2 patients" in first.stdout
    log = stack.ehr_log()
    kickoff = [e for e in log if "$export" in e["path"]]
    assert kickoff and kickoff[-1]["path"] == f"/fhir/Group/{GROUP}/$export"
    listed = stack.cli("ehr", "list", "--json")
    assert '"last_sync_status": "ok: 2 patients' in listed.stdout
    status = json.loads(stack.cli("status", "--json").stdout)
    assert status["ehrs"][TENANT]["status"].startswith("ok: 2 patients") and status["ehrs"][TENANT]["last_bulk_sync"]
    # A deletion at the EHR reaches the index through the next export's `deleted` output.
    observation = next(e for e in requests.get(f"{stack.upstream}/Observation", timeout=30,
                                               params={"patient": OTHER, "_count": "1"}).json()["entry"])
    ref = f"Observation/{observation['resource']['id']}"
    # Another input put the same Type/id under a patient outside the Group: the deletion is not theirs.
    outsider = tmp_path / "outsider.ndjson"
    copy = {k: v for k, v in observation["resource"].items() if k != "encounter"} | {
        "subject": {"reference": f"Patient/{OUTSIDER}"}}
    outsider.write_text(json.dumps({"resourceType": "Patient", "id": OUTSIDER}) + "\n" + json.dumps(copy) + "\n", encoding="utf-8")
    assert stack.cli("index", "--tenant", TENANT, str(outsider)).returncode == 0
    stack.test_api("delete", {"ref": ref})
    second = stack.cli("sync", "--tenant", TENANT)
    assert second.returncode == 0, second.stderr
    assert "1 deleted" in second.stdout
    kickoffs = [e for e in stack.ehr_log() if "$export" in e["path"]]
    assert "_since" in kickoffs[-1]["args"]
    from search.backends.base import Scope
    from search.service import SearchService

    data = Path(stack.env["CHARTCITE_DATA_DIR"])
    svc = SearchService("embedded", data / "index.sqlite")
    try:
        assert svc.resource(TENANT, OTHER, ref) is None
        assert svc.resource(TENANT, OUTSIDER, ref) is not None
        # The summaries count what is left: `check` agrees, and the patient list counts it.
        checked = stack.cli("check", "--tenant", TENANT)
        assert checked.returncode == 0 and "consistent" in checked.stdout, checked.stdout
        listed = {row["patient_id"]: row for row in map(json.loads, stack.cli("patients", "--tenant", TENANT,
                                                                             "--json").stdout.splitlines())}
        assert sum(listed[OTHER]["chunk_counts"].values()) == svc.backend.count(Scope(TENANT, OTHER))
    finally:
        svc.close()
    assert (f"note: {ref}, deleted at the EHR, is held for 2 patient(s) of this tenant: removed for {OTHER}; "
            f"kept for {OUTSIDER} (not patients of this export)") in second.stdout


def test_a_deletion_applies_to_the_rounds_patients_holding_it_and_never_guesses():
    from workers.bulk_round import scoped_deletions

    holders = {"Observation/one": {"a"}, "Observation/outside": {"z"}, "Observation/two": {"a", "z"},
               "Observation/both": {"a", "b"}, "Observation/none": set()}
    refs = list(holders)
    group = scoped_deletions(refs, holders, {"a", "b"})
    assert group.by_patient == {"a": ["Observation/one", "Observation/two", "Observation/both"],
                                "b": ["Observation/both"]}
    assert [note.split(",")[0] for note in group.notes] == ["Observation/outside", "Observation/two", "Observation/both"]
    assert "removed for a; kept for z (not patients of this export)" in group.notes[1]
    unknown = scoped_deletions(refs, holders, None)
    assert unknown.by_patient == {"a": ["Observation/one"], "z": ["Observation/outside"]}
    assert [note.split(",")[0] for note in unknown.notes] == ["Observation/two", "Observation/both"]
    assert "removed for none of them" in unknown.notes[0]


def test_an_export_that_ignores_since_is_merged_and_only_a_full_round_replaces_a_record(stack):
    """Epic's export is not incremental: it answers a `_since` export with everything and names no
    deletions. chartcite notices and says so, re-embeds nothing unchanged, and removes nothing on
    that guess: a resource the EHR deleted stays until a full round, asked for, replaces the record
    (before, the guess alone replaced each record, which emptied a record on a backdated change)."""
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0          # a cursor to send as _since
    observations = requests.get(f"{stack.upstream}/Observation", params={"patient": OTHER, "_count": "5"},
                                timeout=30).json()["entry"]
    ref = f"Observation/{observations[-1]['resource']['id']}"
    stack.test_api("ignore-since", {"on": True})
    try:
        stack.test_api("delete", {"ref": ref})
        stack.test_api("clear-log")
        second = stack.cli("sync", "--tenant", TENANT)
    finally:
        stack.test_api("ignore-since", {"on": False})
    assert second.returncode == 0, second.stderr
    assert "_since" in [e for e in stack.ehr_log() if "$export" in e["path"]][-1]["args"]
    assert held_resource(stack, OTHER, ref) is not None, second.stdout
    assert "the EHR ignored _since" in second.stdout and "0 deleted" in second.stdout
    assert "nothing was removed" in second.stdout and "sync --full" in second.stdout
    embedded, chunks = map(int, re.search(r"(\d+) chunks embedded of (\d+)", second.stdout).groups())
    assert chunks > 50 and embedded <= 2, second.stdout         # at most a summary changes
    stack.test_api("clear-log")
    full = stack.cli("sync", "--tenant", TENANT, "--full")
    assert full.returncode == 0, full.stderr
    assert "_since" not in [e for e in stack.ehr_log() if "$export" in e["path"]][-1]["args"]
    assert held_resource(stack, OTHER, ref) is None, full.stdout
    assert "ignored _since" not in json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["last_sync_status"]


def held_resource(stack: Stack, patient: str, ref: str) -> dict | None:
    """The resource as the index holds it for the patient (None when it does not)."""
    from search.service import SearchService

    svc = SearchService("embedded", Path(stack.env["CHARTCITE_DATA_DIR"]) / "index.sqlite")
    try:
        return svc.resource(TENANT, patient, ref)
    finally:
        svc.close()


def test_ehr_check_passes_a_ready_registration_and_names_the_fix_otherwise(stack):
    good = stack.cli("ehr", "check", TENANT, "--json")
    assert good.returncode == 0, good.stdout + good.stderr
    checks = {c["name"]: c for c in json.loads(good.stdout)}
    assert {n: checks[n]["status"] for n in ("discovery", "capabilities", "jwks", "backend", "group")} == \
        dict.fromkeys(("discovery", "capabilities", "jwks", "backend", "group"), "ok")
    assert checks["fhir"]["status"] in ("ok", "warn")
    added = stack.cli("ehr", "add", "--name", "nowhere", "--iss", f"http://127.0.0.1:{free_port()}/fhir",
                      "--client-id", "x", "--group-id", "g")
    assert added.returncode == 0
    try:
        bad = stack.cli("ehr", "check", "nowhere")
        assert bad.returncode == 1 and "[FAIL] discovery" in bad.stdout and "fix: check --iss" in bad.stdout
    finally:
        stack.cli("ehr", "remove", "nowhere")
    assert stack.cli("ehr", "update", TENANT, "--group-id", "no-such-group").returncode == 0
    try:
        wrong = stack.cli("ehr", "check", TENANT)
        assert wrong.returncode == 1 and "[FAIL] group" in wrong.stdout and "--group-id" in wrong.stdout
    finally:
        stack.cli("ehr", "update", TENANT, "--group-id", GROUP)


def check_of(stack: Stack, name: str = "client") -> tuple[int, dict, list[dict]]:
    """`ehr check --json`: the exit code, the named check, and the checks that did not pass."""
    result = stack.cli("ehr", "check", TENANT, "--json")
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    return result.returncode, checks[name], [c for c in checks.values() if c["status"] == "fail"]


def test_ehr_check_proves_the_client_credentials_at_the_token_endpoint(stack):
    """A wrong client id, a key the EHR cannot verify, a wrong secret: each fails with its fix and
    exit 1 (they passed before, found only at a clinician's first launch). A secret the EHR
    compares raw is found and the registration switched."""
    code, client, _ = check_of(stack)
    assert code == 0 and client["status"] == "ok" and "invalid_grant" in client["detail"]
    assert stack.cli("ehr", "update", TENANT, "--client-id", "not-our-client").returncode == 0
    try:
        code, client, _ = check_of(stack)
        assert code == 1 and client["status"] == "fail" and "invalid_client" in client["detail"]
        assert "client id" in client["fix"] and "[FAIL] client" in stack.cli("ehr", "check", TENANT).stdout
    finally:
        assert stack.cli("ehr", "update", TENANT, "--client-id", CLIENT_ID).returncode == 0
    stack.test_api("client", {"auth": "private_key_jwt", "jwks_url": f"{stack.ehr}/jwks"})    # another key set
    try:
        code, client, _ = check_of(stack)
        assert code == 1 and "does not verify" in client["detail"] and "JWKS URL" in client["fix"]
    finally:
        stack.test_api("client", {})
    secret = "p+ss%word/with=odd:chars"
    stack.test_api("client", {"auth": "client_secret_basic", "secret": secret, "secret_encoding": "raw"})
    try:
        wrong = stack.cli("ehr", "update", TENANT, "--client-auth", "client_secret_basic", "--client-secret-env", "S",
                          env={"S": "not-the-secret"})
        assert wrong.returncode == 0
        code, client, _ = check_of(stack)
        assert code == 1 and "do not match" in client["detail"] and "--secret-encoding" in client["fix"]
        denied, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert denied.status_code == 400 and "--secret-encoding" in denied.text and "ehr check" in denied.text
        assert "registration's scopes" not in denied.text
        assert stack.cli("ehr", "update", TENANT, "--client-secret-env", "S", env={"S": secret}).returncode == 0
        code, client, failed = check_of(stack)
        assert code == 0 and "--secret-encoding raw" in client["detail"], failed
        assert json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["secret_encoding"] == "raw"
        final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert final.status_code == 200, final.text[:500]
    finally:
        stack.test_api("client", {})
        restored = stack.cli("ehr", "update", TENANT, "--client-auth", "private_key_jwt", "--secret-encoding", "form")
        assert restored.returncode == 0, restored.stderr


def registration_row(stack: Stack) -> dict:
    return next(e for e in json.loads(stack.cli("ehr", "list", "--json").stdout) if e["name"] == TENANT)


def test_ehr_check_warns_where_the_ehr_cannot_tell_right_from_wrong_and_the_launch_settles_it(stack):
    """The SMART reference launcher keeps no client registry: a right and a wrong client id, key or
    secret all earn the same invalid_client for a made-up code, and it lists no "none" among its
    client authentication methods, while launches work. `ehr check` says the credentials could not
    be verified here (a warning, exit 0) for all three client types instead of failing them; the
    secret's encoding it could not choose is chosen by the first launch and recorded."""
    unverifiable = "could not be verified here; the first launch will tell"
    stack.test_api("smart-config", {"set": {"token_endpoint_auth_methods_supported":
                                            ["private_key_jwt", "client_secret_basic"]}})
    stack.test_api("client", {"registry": False})
    secret = "p+ss%word/with=odd:chars"
    try:
        code, client, failed = check_of(stack)
        assert code == 0 and client["status"] == "warn" and unverifiable in client["detail"], failed
        launched, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert launched.status_code == 200, launched.text[:500]

        stack.test_api("client", {"registry": False, "auth": "none"})
        assert stack.cli("ehr", "update", TENANT, "--client-auth", "none").returncode == 0
        code, client, failed = check_of(stack)
        # (this test server gives a public client's id no Backend Services sign-in: that check fails apart)
        assert client["status"] == "warn" and unverifiable in client["detail"], client
        assert {c["name"] for c in failed} <= {"backend"}, failed
        capabilities = check_of(stack, "capabilities")[1]
        assert capabilities["status"] == "warn" and '"none"' in capabilities["detail"]
        launched, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert launched.status_code == 200, launched.text[:500]

        stack.test_api("client", {"registry": False, "auth": "client_secret_basic", "secret": secret,
                                  "secret_encoding": "raw"})
        assert stack.cli("ehr", "update", TENANT, "--client-auth", "client_secret_basic", "--client-secret-env", "S",
                         "--secret-encoding", "form", env={"S": secret}).returncode == 0
        # The made-up code cannot tell; the secret's own Backend Services sign-in can, and chooses.
        result = stack.cli("ehr", "check", TENANT, "--json")
        checks = {c["name"]: c for c in json.loads(result.stdout)}
        assert result.returncode == 0 and checks["client"]["status"] == "warn", checks
        assert unverifiable in checks["client"]["detail"]
        assert checks["backend"]["status"] == "ok" and "--secret-encoding raw" in checks["backend"]["detail"], checks
        assert registration_row(stack)["secret_encoding"] == "raw"
        launched, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert launched.status_code == 200, launched.text[:500]
        # Without Backend Services, the first launch chooses it.
        assert stack.cli("ehr", "update", TENANT, "--secret-encoding", "form").returncode == 0
        launched, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert launched.status_code == 200, launched.text[:500]
        assert registration_row(stack)["secret_encoding"] == "raw"
        again, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
        assert again.status_code == 200
        basic = [e for e in stack.ehr_log() if e["path"] == "/auth/token" and e["client_auth"] == "basic"]
        assert basic  # the secret went in HTTP Basic
    finally:
        stack.test_api("client", {})
        stack.test_api("smart-config", {})
        restored = stack.cli("ehr", "update", TENANT, "--client-auth", "private_key_jwt", "--secret-encoding", "form")
        assert restored.returncode == 0, restored.stderr


def test_registration_info_prints_what_the_consoles_ask_for(stack):
    info = stack.cli("registration-info")
    assert info.returncode == 0
    for expected in (f"{stack.app}/launch", f"{stack.app}/callback", f"{stack.app}/.well-known/jwks.json",
                     "patient/Observation.read", "patient/Observation.rs", "system/Observation.rs", "launch-ehr"):
        assert expected in info.stdout
    # Outside the demo, loopback is no credential (a TLS proxy on the same host is loopback too).
    assert requests.get(f"{stack.app}/admin", timeout=10).status_code == 403
    assert requests.get(f"{stack.app}/admin/audit", timeout=10).status_code == 403
    admin = requests.get(f"{stack.app}/admin", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert admin.status_code == 200 and TENANT in admin.text and stack.fhir in admin.text


def test_an_interrupted_export_is_cancelled_at_the_ehr(stack):
    from fhir_ingest.connection.bulk import BulkExport
    from smart_app.settings import Settings
    from workers.sync import ehr_client, open_registry

    settings = Settings.load(stack.env)
    registry = open_registry(settings)
    export = BulkExport(ehr_client(settings, registry, registry.ehr(TENANT)))
    stack.test_api("clear-log")
    with pytest.raises(KeyboardInterrupt):
        with export.job(GROUP, ("Patient",)):
            raise KeyboardInterrupt      # a worker shutting down mid-export
    methods = [(e["method"], e["path"].split("/")[2]) for e in stack.ehr_log()]
    assert ("GET", "Group") in methods and ("DELETE", "bulk-status") in methods


def test_binary_attachments_use_their_content_type_and_conditional_references_resolve(stack, launched):
    practitioner = requests.get(f"{stack.upstream}/Practitioner", params={"_count": "1"}, timeout=10).json()["entry"][0]["resource"]
    npi = next(i["value"] for i in practitioner["identifier"] if "npi" in i["system"])
    note = "<html><body><h2>Assessment</h2><p>Reports tinnitus in the left ear since the spring.</p></body></html>"
    binary = {"resourceType": "Binary", "id": "cc-note-1", "contentType": "text/html",
              "data": base64.b64encode(note.encode()).decode()}
    document = {"resourceType": "DocumentReference", "id": "cc-doc-1", "status": "current",
                "subject": {"reference": f"Patient/{PID}"}, "date": "2024-10-01T09:00:00Z",
                "type": {"coding": [{"system": "http://loinc.org", "code": "11506-3", "display": "Progress note"}]},
                "author": [{"reference": f"Practitioner?identifier=http://hl7.org/fhir/sid/us-npi|{npi}"}],
                "content": [{"attachment": {"contentType": "text/html", "url": f"{stack.fhir}/Binary/cc-note-1"}}]}
    for resource in (binary, document):
        requests.put(f"{stack.upstream}/{resource['resourceType']}/{resource['id']}", json=resource, timeout=10,
                     headers={"Content-Type": "application/fhir+json"}).raise_for_status()
    # The log is cleared before the launch: the launch's own sync may read the note before the
    # explicit one starts (which then has nothing new to fetch), and either fetch is the one to check.
    stack.test_api("clear-log")
    handle = handle_of(launch(stack, stack.test_api("launch", {"patient": PID})["launch"])[0].text)
    api(stack, handle, "POST", "/api/sync")
    wait_synced(stack, handle)
    fetches = [e for e in stack.ehr_log() if e["path"] == "/fhir/Binary/cc-note-1"]
    # Its own type first, FHIR JSON accepted instead: the strict server answers with the resource.
    assert fetches[0]["accept"].startswith("text/html") and "application/fhir+json" in fetches[0]["accept"]
    assert all(f["auth"] for f in fetches)
    answer = api(stack, handle, "POST", "/api/ask", json={"question": "Any tinnitus?"}).json()
    assert "DocumentReference/cc-doc-1" in {c["ref"] for c in answer["citations"]}
    stored = api(stack, handle, "GET", "/api/record", params={"ref": "DocumentReference/cc-doc-1"}).json()["resource"]
    assert stored["author"][0]["reference"] == f"Practitioner/{practitioner['id']}"


def test_binary_negotiation_with_strict_servers_and_unreadable_notes_are_said(stack):
    """A server that answers 406 unless Accept is exactly application/fhir+json is asked again and
    the note is read; a note whose Binary the EHR does not have is indexed as unreadable and the
    frame's status says how many notes could not be read."""
    note = "<html><body><h2>Plan</h2><p>Start vestibular rehabilitation exercises.</p></body></html>"
    binary = {"resourceType": "Binary", "id": "strict-note", "contentType": "text/html",
              "data": base64.b64encode(note.encode()).decode()}
    def document(did, binary_id):
        return {"resourceType": "DocumentReference", "id": did, "status": "current",
                "subject": {"reference": f"Patient/{PID}"}, "date": "2024-11-01T09:00:00Z",
                "type": {"coding": [{"system": "http://loinc.org", "code": "11506-3", "display": "Progress note"}]},
                "content": [{"attachment": {"contentType": "text/html", "url": f"{stack.fhir}/Binary/{binary_id}"}}]}
    for resource in (binary, document("strict-doc", "strict-note"), document("lost-doc", "never-stored")):
        requests.put(f"{stack.upstream}/{resource['resourceType']}/{resource['id']}", json=resource, timeout=10,
                     headers={"Content-Type": "application/fhir+json"}).raise_for_status()
    stack.test_api("binary-exact", {"on": True})
    try:
        handle = handle_of(launch(stack, stack.test_api("launch", {"patient": PID})["launch"])[0].text)
        stack.test_api("clear-log")
        api(stack, handle, "POST", "/api/sync")
        wait_synced(stack, handle)
    finally:
        stack.test_api("binary-exact", {"on": False})
    accepts = [e["accept"] for e in stack.ehr_log() if e["path"] == "/fhir/Binary/strict-note"]
    assert accepts[0].startswith("text/html") and accepts[-1] == "application/fhir+json"
    answer = api(stack, handle, "POST", "/api/ask", json={"question": "Any vestibular rehabilitation planned?"}).json()
    assert "DocumentReference/strict-doc" in {c["ref"] for c in answer["citations"]}
    status = api(stack, handle, "GET", "/api/status").json()
    assert status["job"]["message"].split(". ")[0] == "1 note could not be read from the EHR"


def test_a_saved_draft_is_written_back_as_a_preliminary_note_when_the_ehr_allows(stack):
    final, fields = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    handle = handle_of(final.text)
    assert "patient/DocumentReference.c" in fields["scope"].split()       # asked for, because of --write-back
    draft = api(stack, handle, "POST", "/api/draft", json={"kind": "pre-visit"}).json()
    assert draft["can_write_back"]
    early = api(stack, handle, "POST", "/api/draft/writeback", json={"saved": "never-saved"})
    assert early.status_code == 404                                        # nothing is written unsaved
    saved = api(stack, handle, "POST", "/api/draft/save", json={"draft": draft}).json()["saved"]
    written = api(stack, handle, "POST", "/api/draft/writeback", json={"saved": saved})
    assert written.status_code == 201, written.text
    ref = written.json()["document"]
    note = requests.get(f"{stack.upstream}/{ref}", timeout=10).json()
    assert note["docStatus"] == "preliminary" and note["subject"]["reference"] == f"Patient/{PID}"
    assert note["author"][0]["reference"] == "Practitioner/ehr-clinician"
    text = base64.b64decode(note["content"][0]["attachment"]["data"]).decode()
    assert "FINDINGS" in text and "ITEMS TO REVIEW" in text


def notes_written_from(stack, identifier_value: str) -> list[str]:
    found = requests.get(f"{stack.upstream}/DocumentReference", params={"identifier": f"urn:chartcite:saved-draft|{identifier_value}"},
                         timeout=10).json()
    return [e["resource"]["id"] for e in found.get("entry") or []]


def saved_pre_visit_draft(stack, handle) -> int:
    draft = api(stack, handle, "POST", "/api/draft", json={"kind": "pre-visit"}).json()
    return api(stack, handle, "POST", "/api/draft/save", json={"draft": draft}).json()["saved"]


@pytest.mark.parametrize("fault", [{"kind": "after-store", "status": 504}, {"kind": "after-store", "status": 502},
                                   {"kind": "after-store", "delay": 22}], ids=["504", "502", "read-timeout"])
def test_a_note_whose_answer_is_lost_is_written_once(stack, fault):
    """The EHR stored the note and then the answer was lost: chartcite finds the note it wrote
    instead of writing a second copy into the legal record."""
    from fhir_ingest.connection.writeback import draft_identifier

    final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    handle = handle_of(final.text)
    saved = saved_pre_visit_draft(stack, handle)
    stack.test_api("faults", fault | {"path": "/fhir/DocumentReference", "times": 1})
    try:
        written = api(stack, handle, "POST", "/api/draft/writeback", json={"saved": saved})
    finally:
        stack.test_api("clear-faults")
    assert written.status_code == 201, written.text
    ids = notes_written_from(stack, draft_identifier(TENANT, PID, saved)["value"])
    assert ids == [written.json()["document"].split("/")[1]]


def test_a_saved_draft_goes_into_the_chart_once_and_only_by_its_author(stack):
    from concurrent.futures import ThreadPoolExecutor

    from fhir_ingest.connection.writeback import draft_identifier

    final, _ = launch(stack, stack.test_api("launch", {"patient": PID})["launch"])
    handle = handle_of(final.text)
    saved = saved_pre_visit_draft(stack, handle)
    with ThreadPoolExecutor(2) as pool:              # a double click, or two frames at once
        answers = list(pool.map(lambda _: api(stack, handle, "POST", "/api/draft/writeback", json={"saved": saved}),
                                range(2)))
    assert sorted(a.status_code for a in answers) == [201, 409]
    first = next(a for a in answers if a.status_code == 201).json()["document"]
    assert next(a for a in answers if a.status_code == 409).json()["document"] == first
    assert notes_written_from(stack, draft_identifier(TENANT, PID, saved)["value"]) == [first.split("/")[1]]
    again = api(stack, handle, "POST", "/api/draft/writeback", json={"saved": saved})
    assert again.status_code == 409 and again.json()["document"] == first

    other = saved_pre_visit_draft(stack, handle)
    final, _ = launch(stack, stack.test_api("launch", {"patient": PID, "clinician": "Practitioner/colleague"})["launch"])
    colleague = handle_of(final.text)
    refused = api(stack, colleague, "POST", "/api/draft/writeback", json={"saved": other})
    assert refused.status_code == 403 and "only the clinician who saved" in refused.json()["error"]
    assert notes_written_from(stack, draft_identifier(TENANT, PID, other)["value"]) == []


def test_write_scopes_are_read_in_both_syntaxes():
    from fhir_ingest.connection.smart_auth import can_write_documents

    assert can_write_documents("launch patient/DocumentReference.c patient/Observation.rs")
    assert can_write_documents("patient/DocumentReference.write")
    assert can_write_documents("user/*.cruds")
    assert not can_write_documents("patient/DocumentReference.rs patient/*.read")


def test_ehr_list_counts_the_patients_launches_synced(stack, launched):
    """A tenant whose patients were synced by launches, not by a bulk round, is not "never synced"."""
    row = json.loads(stack.cli("ehr", "list", "--json").stdout)[0]
    assert row["patient_syncs"]["patients"] >= 1 and row["patient_syncs"]["last"] > time.time() - 3600
    listed = stack.cli("ehr", "list").stdout
    assert re.search(r"patients synced by launches: [1-9]\d*, last \d{4}-", listed), listed


def test_a_launch_reads_every_clinical_kind_the_ehr_offers_and_says_which_it_does_not(stack):
    """A launch on the US Core example patient, served by sekmet: every clinical type the input
    holds for that patient is fetched and indexed (CarePlan, CareTeam, Goal, Device, Coverage,
    ServiceRequest, MedicationDispense, QuestionnaireResponse... were never read at a launch), and
    a type the server does not have is skipped with one line in the sync status."""
    from fhir_ingest.record.kinds import INDEXED_TYPES
    from fhir_ingest.record.normalize import patient_of
    from search.service import SearchService

    held = {}
    for path in USCORE.glob("*.json"):
        resource = json.loads(path.read_text(encoding="utf-8"))
        if resource.get("resourceType") in INDEXED_TYPES and patient_of(resource) == "example":
            held.setdefault(resource["resourceType"], set()).add(resource["id"])
    stack.test_api("unsupported", {"types": ["Media"]})
    try:
        final, _ = launch(stack, stack.test_api("launch", {"patient": "example"})["launch"])
        status = wait_synced(stack, handle_of(final.text))
    finally:
        stack.test_api("unsupported", {"types": []})
    assert status["job"]["state"] == "done", status
    assert "Media: not offered by this EHR" in status["job"]["message"]
    svc = SearchService("embedded", Path(stack.env["CHARTCITE_DATA_DIR"]) / "index.sqlite")
    try:
        indexed = {}
        for resource in svc.catalog.patient_resources(TENANT, "example"):
            indexed.setdefault(resource["resourceType"], set()).add(resource["id"])
    finally:
        svc.close()
    missing = {rt: ids - indexed.get(rt, set()) for rt, ids in held.items() if rt != "Media"}
    assert not any(missing.values()), missing
    assert {"CarePlan", "CareTeam", "Goal", "Device", "ServiceRequest", "QuestionnaireResponse"} <= set(indexed)
    assert "Media" not in indexed

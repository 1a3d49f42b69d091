"""What hospital IT and on-call engineers rely on: liveness and readiness, a failed sync that the
next launch retries, an expired sign-in logged as one line, and no code left in the address bar."""
from __future__ import annotations

import logging
import shutil
import time

import pytest

from smart_app.app import create_app
from smart_app.settings import Settings

from .conftest import InlineRunner, demo_launch, metric

PID = "936988e9-d587-ef42-ebdf-541238540ff3"


@pytest.fixture()
def app(tmp_path, synthea_dir, embedder):
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(synthea_dir / f"{PID}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true"})
    return create_app(settings, runner=InlineRunner(settings))


def ready(client, seconds: float = 60) -> dict:
    deadline = time.time() + seconds
    while True:
        body = client.get("/readyz").get_json()
        if body["ready"] or time.time() > deadline:
            return body
        time.sleep(0.2)


def test_liveness_and_readiness(app):
    client = app.test_client()
    assert client.get("/healthz").get_json() == {"status": "ok"}
    body = ready(client)
    assert body == {"ready": True, "checks": {"index": "ok", "registry": "ok", "broker": "ok", "model": "ok",
                                                 "workers": "ok"}}


def test_readiness_names_what_is_down(tmp_path, embedder):
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_BACKEND": "elasticsearch",
                              "CHARTCITE_ES_URL": "http://127.0.0.1:1"})
    client = create_app(settings, runner=InlineRunner(settings)).test_client()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["checks"]["index"].startswith("failed")
    assert client.get("/healthz").status_code == 200          # alive, not ready


def test_a_failed_sync_is_retried_by_the_next_launch(app):
    client = app.test_client()
    handle = demo_launch(client, PID)
    headers = {"X-Chartcite-Session": handle}
    runner = app.extensions["chartcite.runner"]
    runner.jobs.set("default", PID, "failed", "done", message="the EHR sign-in expired")
    assert client.get("/api/status", headers=headers).get_json()["job"]["state"] == "failed"
    again = {"X-Chartcite-Session": demo_launch(client, PID)}
    assert client.get("/api/status", headers=again).get_json()["job"]["state"] == "done"


def test_an_expired_sign_in_is_one_warning_line(caplog):
    from fhir_ingest.connection.client import AuthExpired
    from workers.runner import TaskRunner

    class ExpiringTask:
        """A task whose run ends in an expired sign-in, as the real one does when tokens lapse."""
        def apply(self, args, throw):
            raise AuthExpired("the EHR sign-in expired")

    with caplog.at_level(logging.INFO):
        TaskRunner._run_eagerly(object.__new__(TaskRunner), ExpiringTask(), "t", "p", "s")
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]


def test_a_log_record_is_one_line_and_a_traceback_only_continues_it():
    """chartcite's formatter (command line, gunicorn, Celery): text from outside cannot start a
    record of its own, in the message or in an exception's message."""
    from smart_app.logs import LOG_FORMAT, OneLineFormatter

    formatter = OneLineFormatter(LOG_FORMAT)
    hostile = "ok\n2099-01-01 INFO forged\r\u2028\u2029\x85\x1b[31m\u202etxt\u2066\x00"
    line = formatter.format(logging.makeLogRecord({"msg": "refused: %s", "args": (hostile,), "levelname": "WARNING",
                                                   "name": "smart_app.launch"}))
    assert len(line.splitlines()) == 1 and "\\n2099-01-01 INFO forged" in line
    assert "\\u202etxt" in line and "\\x1b[31m" in line and "\\x85" in line
    try:
        raise ValueError(hostile)
    except ValueError:
        import sys

        record = logging.makeLogRecord({"msg": "failed", "levelname": "ERROR", "name": "x", "exc_info": sys.exc_info()})
    first, *rest = formatter.format(record).splitlines()
    assert first.endswith("x: failed") and rest and all(line.startswith("  | ") for line in rest)
    assert any("forged" in line for line in rest)


def test_a_log_record_never_shows_a_urls_credentials():
    from smart_app.logs import LOG_FORMAT, OneLineFormatter

    message = ("Connected to redis://:s3cret-pw@redis.example:6379/0 and "
               "https://llm.example/v1?client_secret=cs-999&x=1, then 'postgresql://a:p#ss@db/audit'")
    line = OneLineFormatter(LOG_FORMAT).format(logging.makeLogRecord({"msg": message, "levelname": "INFO", "name": "c"}))
    for secret in ("s3cret-pw", "cs-999", "p#ss"):
        assert secret not in line
    assert "redis://:****@redis.example:6379/0" in line and "client_secret=****&x=1" in line


def test_a_failed_callback_leaves_no_code_in_the_address(app):
    client = app.test_client()
    page = client.get("/callback?code=secret-one-time-code&state=forged").get_data(as_text=True)
    assert "error.js" in page and "secret-one-time-code" not in page
    assert client.get("/launch/error").status_code == 400


def test_the_status_carries_the_banner_a_first_launch_could_not_show(app):
    client = app.test_client()
    headers = {"X-Chartcite-Session": demo_launch(client, PID)}
    banner = client.get("/api/status", headers=headers).get_json()["banner"]
    assert banner["gender"] == "male" and banner["birth_date"] and banner["age"] is not None and banner["name"]


def test_the_ehrs_refusal_is_shown_and_logged_for_it(app, caplog):
    client = app.test_client()
    with caplog.at_level(logging.WARNING):
        page = client.get("/callback", query_string={
            "error": "invalid_scope", "error_description": "Scopes openid and fhirUser could not be granted <b>x</b>"})
    text = page.get_data(as_text=True)
    assert page.status_code == 400 and "invalid_scope" in text
    assert "Scopes openid and fhirUser could not be granted &lt;b&gt;" in text        # escaped, never markup
    assert any("invalid_scope" in r.getMessage() and "could not be granted" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("error, advice, not_advice", [
    ("invalid_scope", "scopes", "client id"),
    ("invalid_client", "ehr check", "scopes"),
    ("invalid_request", "redirect URI", "scopes"),
    ("access_denied", "declined", "scopes"),
])
def test_the_refusal_page_says_what_to_do_about_that_refusal(app, error, advice, not_advice):
    """Each error an authorization endpoint sends gets its own advice: a wrong client id or a bad
    redirect URI is not a scope problem."""
    text = app.test_client().get("/callback", query_string={"error": error}).get_data(as_text=True)
    assert advice in text and not_advice not in text


def test_a_first_launch_banner_waits_for_the_record_instead_of_saying_patient_y(app):
    """Before the record's Patient is read, the banner says so: no "Patient" placeholder, no " y"
    for an age that is not known yet."""
    from flask import render_template

    with app.test_request_context("/"):
        html = render_template("patient.html", handle="h", patient={}, patient_id="p", frame_path="/app/f",
                               pipelines=(), show_banner=True, style={})
    banner = html[html.index('id="banner"'):html.index("</header>")]
    assert "Reading the patient" in banner and ">Patient<" not in banner
    assert '<span id="banner-age"></span>' in banner


def test_metrics_count_questions_stages_and_syncs_without_patient_data(app):
    client = app.test_client()
    headers = {"X-Chartcite-Session": demo_launch(client, PID)}
    question = "What is the patient allergic to?"
    answered = client.post("/api/ask", json={"question": question}, headers=headers).get_json()
    client.post("/api/ask", json={"question": "Has the patient had a liver transplant?"}, headers=headers)
    text = client.get("/metrics").get_data(as_text=True)
    assert metric(text, "chartcite_questions_total", outcome="answered") + \
        metric(text, "chartcite_questions_total", outcome="refused") == 2
    assert metric(text, "chartcite_question_seconds_count", stage="total") == 2
    assert metric(text, "chartcite_question_seconds_count", stage="recall") == 2
    assert metric(text, "chartcite_syncs_total", kind="patient", outcome="done") >= 1
    assert metric(text, "chartcite_queue_depth") == 0
    banner = client.get("/api/status", headers=headers).get_json()["banner"]
    for private in (PID, question, banner["name"], banner["birth_date"], answered["answer"][:40]):
        assert private not in text


def test_metrics_need_the_admin_token_outside_the_demo(tmp_path, embedder):
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_ADMIN_TOKEN": "t0ken"})
    client = create_app(settings, runner=InlineRunner(settings)).test_client()
    assert client.get("/metrics").status_code == 403
    scraped = client.get("/metrics", headers={"Authorization": "Bearer t0ken"})
    assert scraped.status_code == 200 and scraped.content_type.startswith("text/plain")


def test_shared_rate_counts_are_one_count_and_start_again_with_their_window(tmp_path):
    """Two stores on one file (two workers): one count; a window that has passed starts at zero."""
    from smart_app.rate_store import SqliteRateStorage, rate_store_uri

    uri = rate_store_uri(tmp_path / "rate limits #1.sqlite")
    first, second = SqliteRateStorage(uri), SqliteRateStorage(uri)
    assert [first.incr("clinician:t:c", 1), second.incr("clinician:t:c", 1), first.incr("clinician:t:c", 1)] == [1, 2, 3]
    assert second.get("clinician:t:c") == 3 and second.get_expiry("clinician:t:c") > time.time()
    time.sleep(1.1)
    assert second.get("clinician:t:c") == 0 and first.incr("clinician:t:c", 1) == 1


ROTATING = "ops-2026:new-secret-2026-aaaa,ops-old:old-secret-2025-bbbb"


def test_named_admin_tokens_rotate_and_the_audit_says_which_was_used(tmp_path, embedder):
    """Hospital IT adds a new token beside the old, moves Prometheus and people over, then drops
    the old one: each access is audited under its token's name, never its secret."""
    data = str(tmp_path / "data")
    settings = Settings.load({"CHARTCITE_DATA_DIR": data, "CHARTCITE_ADMIN_TOKEN": "t0ken-default",
                              "CHARTCITE_ADMIN_TOKENS": ROTATING})
    app = create_app(settings, runner=InlineRunner(settings))
    client = app.test_client()
    for path in ("/admin", "/metrics", "/admin/audit"):
        for secret in ("new-secret-2026-aaaa", "old-secret-2025-bbbb", "t0ken-default"):
            assert client.get(path, headers={"Authorization": f"Bearer {secret}"}).status_code == 200, (path, secret)
        for wrong in ("Bearer new-secret-2026-aaa", "Bearer ops-2026", "new-secret-2026-aaaa", ""):
            assert client.get(path, headers={"Authorization": wrong}).status_code == 403, (path, wrong)
    with app.app_context():
        from smart_app.services import audit

        entries = audit().entries(kind="admin", limit=100)
    assert sorted({(e["token"], e["request"]) for e in entries}) == sorted(
        (token, f"GET {path}") for token in ("default", "ops-2026", "ops-old") for path in ("/admin", "/metrics",
                                                                                          "/admin/audit"))
    assert all(e["clinician"] == f"admin token {e['token']}" for e in entries)
    stored = (tmp_path / "data" / "audit.sqlite").read_bytes()
    assert b"secret-2026" not in stored and b"secret-2025" not in stored and b"t0ken-default" not in stored
    rotated = Settings.load({"CHARTCITE_DATA_DIR": data, "CHARTCITE_ADMIN_TOKENS": "ops-2026:new-secret-2026-aaaa"})
    after = create_app(rotated, runner=InlineRunner(rotated)).test_client()
    assert after.get("/metrics", headers={"Authorization": "Bearer old-secret-2025-bbbb"}).status_code == 403
    assert after.get("/metrics", headers={"Authorization": "Bearer t0ken-default"}).status_code == 403
    assert after.get("/metrics", headers={"Authorization": "Bearer new-secret-2026-aaaa"}).status_code == 200


def test_admin_tokens_are_masked_by_name_and_checked_when_settings_load(tmp_path):
    from smart_app.settings import SettingsError

    settings = Settings.load({"CHARTCITE_ADMIN_TOKENS": ROTATING, "CHARTCITE_ADMIN_TOKEN": "t0ken-default"})
    assert settings.masked()["admin_tokens"] == "ops-2026:****,ops-old:****"
    assert settings.masked()["admin_token"] == "****"
    for value, says in [("bare-secret-no-name", "name:secret"), ("ops:", "name:secret"), ("o p:x", "name:secret"),
                        ("a:x1,a:x2", "names a twice"), ("a:same,b:same", "same secret"),
                        ("default:x", "'default'")]:
        with pytest.raises(SettingsError, match=says) as refused:
            Settings.load({"CHARTCITE_ADMIN_TOKENS": value, "CHARTCITE_ADMIN_TOKEN": "t0ken-default"})
        assert "bare-secret" not in str(refused.value)        # a secret is never repeated in the message

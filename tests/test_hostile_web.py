"""The frame's JSON API against malformed and hostile requests: a 400 with a sentence, never a 500;
another patient refused however the request spells it."""
from __future__ import annotations

import logging
import shutil

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from smart_app.app import create_app
from smart_app.settings import Settings

from .conftest import InlineRunner, demo_launch

PID = "936988e9-d587-ef42-ebdf-541238540ff3"
OTHER = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"
POST_ROUTES = ("/api/ask", "/api/draft", "/api/draft/save", "/api/draft/writeback", "/api/sync")
GET_ROUTES = ("/api/status", "/api/context", "/api/drafts", "/api/record")


@pytest.fixture(scope="module")
def app(tmp_path_factory, synthea_dir, embedder):
    source = tmp_path_factory.mktemp("source")
    for pid in (PID, OTHER):
        shutil.copy(synthea_dir / f"{pid}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path_factory.mktemp("data")),
                              "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true", "CHARTCITE_RATE_LIMIT_CLINICIAN": "100000/minute",
                              "CHARTCITE_RATE_LIMIT_TENANT": "100000/minute"})
    return create_app(settings, runner=InlineRunner(settings))


@pytest.fixture(scope="module")
def session(app):
    client = app.test_client()
    return client, {"X-Chartcite-Session": demo_launch(client, PID)}


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
                    max_leaves=12)
# Bodies shaped like the real ones, with every value replaced by anything JSON can hold.
SHAPED = st.fixed_dictionaries({}, optional={"question": JSON, "k": JSON, "pipeline": JSON, "kind": JSON,
                                             "draft": JSON, "saved": JSON, "title": JSON})


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(POST_ROUTES), body=JSON | SHAPED)
def test_no_json_body_makes_a_route_fail(session, route, body):
    client, headers = session
    response = client.post(route, json=body, headers=headers)
    assert response.status_code < 500, (route, body, response.get_data(as_text=True))
    assert response.is_json and (response.status_code < 400 or response.get_json()["error"])


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(question=st.text(min_size=1, max_size=200))
def test_no_question_text_makes_asking_fail(session, question):
    client, headers = session
    response = client.post("/api/ask", json={"question": question}, headers=headers)
    assert response.status_code in (200, 400), (question, response.get_data(as_text=True))


@pytest.mark.parametrize("question,says", [
    ("labs on 2023-02-30", "2023-02-30 is not a date: February 2023 has 28 days."),
    ("since 2024-00-10 any visits?", "2024-00-10 is not a date: there is no month 0."),
    ("meds on 2024-13-45", "2024-13-45 is not a date: there is no month 13."),
    ("since 0000-01-01", "0000-01-01 is not a date: there is no year 0."),
    ("A1c on Feb 30, 2024?", "Feb 30, 2024 is not a date: February 2024 has 29 days."),
    ("any labs since 31/04/2024?", "31/04/2024 is not a date: read day first or month first, no such day exists."),
    ("BP on 31 April 2024?", "31 April 2024 is not a date: April 2024 has 30 days."),
])
def test_an_impossible_date_is_said_not_answered_around(session, question, says):
    """Labs "on 2023-02-30" are not other days' labs: the answer says the date does not exist."""
    client, headers = session
    response = client.post("/api/ask", json={"question": question}, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    result = response.get_json()
    assert result["answer"].startswith(says) and "ask again with the date you mean" in result["answer"]
    assert result["abstained"] and not result["citations"] and not result["statements"]


def test_a_real_date_and_a_lone_surrogate_are_answered_as_usual(session):
    client, headers = session
    for question in ("labs on 2024-02-29", "BP \ud800 lately?"):
        result = client.post("/api/ask", json={"question": question}, headers=headers).get_json()
        assert "is not a date" not in result["answer"], question


@pytest.mark.parametrize("body,says", [
    ([], "JSON object"), ("a string", "JSON object"), ({"question": "K+?", "k": 1e400}, "k"),
    ({"question": "K+?", "k": "many"}, "k"), ({"question": 7}, "question"), ({}, "question"),
])
def test_a_malformed_ask_gets_a_sentence(session, body, says):
    client, headers = session
    response = client.post("/api/ask", json=body, headers=headers)
    assert response.status_code == 400 and says in response.get_json()["error"]


def test_a_draft_without_a_title_is_refused_not_crashed(session):
    client, headers = session
    draft = client.post("/api/draft", json={"kind": "medication-review"}, headers=headers).get_json()
    draft.pop("title")
    response = client.post("/api/draft/save", json={"draft": draft}, headers=headers)
    assert response.status_code == 400 and "title" in response.get_json()["error"]


def test_a_body_that_is_not_json_is_refused(session):
    client, headers = session
    response = client.post("/api/ask", data=b"\xff\xfe not json", headers=headers, content_type="application/json")
    assert response.status_code == 400 and response.is_json


SPELLINGS = ["patient", "patient_id", "patientId", "PATIENT", "subject", "patient_ids", "subjectId", "subject_id",
             "beneficiary", "Beneficiary", "person", "member_id", "individual", "patients", "patientReference",
             "patient.reference", "patientid", "the-patient", "_patient", "people"]


@pytest.mark.parametrize("route", GET_ROUTES)
@pytest.mark.parametrize("key", SPELLINGS)
def test_another_patient_is_refused_however_it_is_spelled(session, route, key):
    client, headers = session
    for value in (OTHER, f"Patient/{OTHER}"):
        response = client.get(route, query_string={key: value, "ref": "Patient/x"}, headers=headers)
        assert response.status_code == 403, (route, key, value)


@pytest.mark.parametrize("key", SPELLINGS)
def test_another_patient_in_a_body_is_refused(session, key):
    client, headers = session
    response = client.post("/api/ask", json={"question": "K+?", key: OTHER}, headers=headers)
    assert response.status_code == 403


@pytest.mark.parametrize("body", [
    {"question": "K+?", "context": {"subject": {"reference": f"Patient/{OTHER}"}}},
    {"question": "K+?", "filters": [{"ref": f"Patient/{OTHER}"}]},
    {"question": "K+?", "focus": f"https://ehr.example.org/fhir/Patient/{OTHER}/_history/3"},
    {"question": "K+?", "patients": [PID, OTHER]},
    {"question": "K+?", "Beneficiary": {"identifier": {"value": OTHER}}},
    {"question": "K+?", "k": 5, "options": [[{"subjectIds": [OTHER]}]]},
])
def test_another_patient_nested_anywhere_is_refused_and_audited(app, session, body):
    client, headers = session
    with app.app_context():
        from smart_app.services import audit

        before = len(audit().entries(kind="refused", limit=10_000))
        response = client.post("/api/ask", json=body, headers=headers)
        refused = audit().entries(kind="refused", limit=10_000)
    assert response.status_code == 403 and "not launched for that patient" in response.get_json()["error"]
    assert len(refused) == before + 1 and refused[0]["asked_patient"] == OTHER


# Keys a frame might send that are about something else, and patient words inside values.
@pytest.mark.parametrize("body", [
    {"question": "Which patient notes mention a subject of concern, for this person or any member?"},
    {"question": "Patient/ history?"},
    {"question": "K+?", "subject": PID, "patient": {"reference": f"Patient/{PID}"}, "patient_ids": [PID]},
    {"question": "K+?", "pipeline": "full", "k": 3, "client": "frame-2", "personalised": True},
])
def test_legitimate_fields_and_the_launched_patient_still_work(session, body):
    client, headers = session
    response = client.post("/api/ask", json=body, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(word=st.sampled_from(["patient", "subject", "beneficiary", "person", "member", "individual"]),
       style=st.sampled_from(["{w}", "{W}", "{w}_id", "{w}Id", "{w}-ids", "{w}s", "the_{w}", "{w}.reference"]),
       depth=st.integers(0, 4), in_list=st.booleans(), as_reference=st.booleans())
def test_any_patient_key_at_any_depth_is_refused(session, word, style, depth, in_list, as_reference):
    client, headers = session
    value = {"reference": f"Patient/{OTHER}"} if as_reference else OTHER
    node = {style.format(w=word, W=word.capitalize()): [value] if in_list else value}
    for level in range(depth):
        node = {f"level{level}": [node] if level % 2 else node}
    response = client.post("/api/ask", json={"question": "K+?", **node}, headers=headers)
    assert response.status_code == 403, node


def test_the_launched_patient_named_explicitly_is_fine(session):
    client, headers = session
    assert client.get("/api/status", query_string={"patient_id": PID}, headers=headers).status_code == 200


def test_admin_needs_a_token_outside_the_demo(tmp_path):
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_LAUNCH": "false",
                              "CHARTCITE_ADMIN_TOKEN": "t0ken"})
    client = create_app(settings, runner=InlineRunner(settings)).test_client()
    assert client.get("/admin").status_code == 403                   # loopback is no credential
    assert client.get("/admin", headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert client.get("/admin", headers={"Authorization": "Bearer t0ken"}).status_code == 200
    no_token = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data2"), "CHARTCITE_DEMO_LAUNCH": "false"})
    assert create_app(no_token, runner=InlineRunner(no_token)).test_client().get("/admin").status_code == 403


def test_a_token_key_beside_the_data_is_warned_about(tmp_path, caplog):
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_LAUNCH": "false"})
    settings.ensure_token_key()
    with caplog.at_level(logging.WARNING):
        create_app(settings, runner=InlineRunner(settings))
    assert any("CHARTCITE_TOKEN_KEY" in r.getMessage() for r in caplog.records)

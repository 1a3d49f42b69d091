"""The frame's HTTP surface through Flask's test client, with the real model and index."""
from __future__ import annotations

import shutil

import pytest

from smart_app.app import create_app
from smart_app.settings import Settings

from .conftest import InlineRunner, demo_launch

PID = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"
OTHER = "936988e9-d587-ef42-ebdf-541238540ff3"
TRENDS = "25e20083-13a8-d554-d92f-e69cf81e6923"   # several blood pressures over the years


@pytest.fixture(scope="module")
def client(tmp_path_factory, synthea_dir, embedder):
    source = tmp_path_factory.mktemp("source")
    for pid in (PID, OTHER, TRENDS):
        shutil.copy(synthea_dir / f"{pid}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path_factory.mktemp("data")),
                              "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
                              "CHARTCITE_FRAME_ANCESTORS": "https://ehr.example.org"})
    app = create_app(settings, runner=InlineRunner(settings))
    return app.test_client()


def test_launcher_lists_demo_patients(client):
    page = client.get("/").get_data(as_text=True)
    assert PID in page and OTHER in page


def test_launch_indexes_then_answers_with_citations(client):
    handle = demo_launch(client, PID)
    status = client.get("/api/status", headers={"X-Chartcite-Session": handle}).get_json()
    assert status["indexed"] and status["job"]["state"] == "done"
    result = client.post("/api/ask", json={"question": "Does he carry an EpiPen?"},
                         headers={"X-Chartcite-Session": handle}).get_json()
    assert not result["abstained"] and result["citations"]
    assert set(result) >= {"answer", "statements", "citations", "evidence", "confidence", "abstained", "diagnostics"}
    record = client.get("/api/record", query_string={"ref": result["citations"][0]["ref"]},
                        headers={"X-Chartcite-Session": handle}).get_json()
    assert record["resource"]["id"] == result["citations"][0]["ref"].split("/")[1]
    assert record["readable"]["title"]


def test_the_patient_comes_from_the_launch_not_the_request(client):
    handle = demo_launch(client, PID)
    refused = client.post("/api/ask", json={"question": "any allergies?", "patient_id": OTHER},
                          headers={"X-Chartcite-Session": handle})
    assert refused.status_code == 403
    # Another patient's record is not readable through this launch either: a ref naming another
    # Patient is refused like any other parameter that names one; their other records are not found.
    demo_launch(client, OTHER)
    assert client.get("/api/record", query_string={"ref": "Patient/" + OTHER},
                      headers={"X-Chartcite-Session": handle}).status_code == 403


def test_no_launch_no_answers(client):
    assert client.post("/api/ask", json={"question": "any allergies?"}).status_code == 401
    assert client.post("/api/ask", json={"question": "x"}, headers={"X-Chartcite-Session": "forged"}).status_code == 401


def test_frame_headers_allow_only_registered_ancestors(client):
    response = client.get("/")
    csp = response.headers["Content-Security-Policy"]
    assert "frame-ancestors 'self' https://ehr.example.org" in csp
    assert "X-Frame-Options" not in response.headers


def test_bad_requests_get_clear_errors(client):
    handle = demo_launch(client, PID)
    headers = {"X-Chartcite-Session": handle}
    assert client.post("/api/ask", json={"question": "  "}, headers=headers).status_code == 400
    assert client.post("/api/ask", json={"question": "bp?", "pipeline": "magic"}, headers=headers).status_code == 400
    assert client.get("/api/record", query_string={"ref": "nonsense"}, headers=headers).status_code == 400


def test_trend_answers_carry_a_chart(client):
    handle = demo_launch(client, TRENDS)
    result = client.post("/api/ask", json={"question": "How has his blood pressure trended?"},
                         headers={"X-Chartcite-Session": handle}).get_json()
    assert result["chart"] and len(result["chart"]["points"]) >= 2
    assert all(len(p["values"]) == 2 for p in result["chart"]["points"])   # systolic and diastolic

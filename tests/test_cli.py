"""The `chartcite` command line as other tools use it: real processes, real model, JSON out."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import clean_env

REPO = Path(__file__).resolve().parent.parent
PID = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"


def run(args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "smart_app.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, encoding="utf-8")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return clean_env(data_dir=tmp_path_factory.mktemp("cli-data"), secret_key="very-secret")


@pytest.fixture(scope="module")
def indexed(env, synthea_dir, tmp_path_factory):
    bad = tmp_path_factory.mktemp("bad") / "broken.ndjson"
    bad.write_text('{"resourceType": "Observation", "id": "x"\n', encoding="utf-8")
    out = run(["index", str(synthea_dir / f"{PID}.json.gz"), str(bad)], env)
    assert out.returncode == 3, out.stderr      # indexed, but something was skipped
    return out


def test_index_prints_a_summary_with_skips(indexed):
    assert "resources read: 88" in indexed.stdout          # the bundle; the broken line is reported below
    assert "patients: 1" in indexed.stdout
    assert "skipped: 1" in indexed.stdout and "broken.ndjson:1: bad JSON" in indexed.stdout


def test_patients_hides_names_unless_asked(indexed, env):
    plain = run(["patients"], env)
    assert PID in plain.stdout and "Parker" not in plain.stdout
    named = run(["patients", "--show-names"], env)
    assert "Carey Jerald Parker" in named.stdout


def test_ask_json_schema_and_explain(indexed, env):
    out = run(["ask", "--patient", PID, "--json", "Does he carry an EpiPen?"], env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) >= {"id", "patient_id", "question", "answer", "statements", "citations", "evidence",
                           "confidence", "abstained", "diagnostics"}
    assert result["confidence"] in ("high", "medium", "low") and result["abstained"] is False
    citation = result["citations"][0]
    assert set(citation) >= {"n", "ref", "resource_type", "date", "label", "snippet"}
    evidence = result["evidence"][0]
    assert set(evidence) >= {"rank", "ref", "chunk_id", "score", "label", "text"}
    assert evidence["ref"].count("/") == 1
    assert {s["name"] for s in result["diagnostics"]["stages"]} >= {"scope", "recall", "select"}
    assert all({"name", "in", "out", "ms"} <= set(s) for s in result["diagnostics"]["stages"])
    explained = run(["ask", "--patient", PID, "--explain", "--pipeline", "dense", "latest BP?"], env)
    assert "stage" in explained.stdout and "recall" in explained.stdout


def test_ask_batch_loads_the_model_once_and_passes_ids(indexed, env, tmp_path):
    batch = tmp_path / "q.jsonl"
    batch.write_text("\n".join(json.dumps({"id": f"q{i}", "patient_id": PID, "question": q}) for i, q in
                               enumerate(["ok to give him aspirin?", "Is he on a statin?", "BP at the Oct 2022 physical?"])), encoding="utf-8")
    out = run(["ask", "--batch", str(batch), "--k", "3"], env)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["q0", "q1", "q2"]
    assert rows[1]["abstained"] and not rows[0]["abstained"]
    # At most k passages retrieved; what an answer lists from the class or the notes comes on top,
    # and then only what it cites (every [n] opens an item of the list).
    for r in rows:
        cited = {c["ref"] for c in r["citations"]}
        assert len([e for e in r["evidence"] if e["ref"] not in cited]) <= 3
        assert cited <= {e["ref"] for e in r["evidence"]}
    assert "116/98" in rows[2]["answer"]


def test_config_masks_secrets(env):
    out = run(["config"], env)
    settings = json.loads(out.stdout)
    assert settings["secret_key"] == "****" and "very-secret" not in out.stdout
    assert settings["backend"] == "embedded"


@pytest.mark.parametrize("origin", ["https://x.example *", "https://x; script-src 'unsafe-inline'"])
def test_a_frame_origin_that_is_not_an_origin_is_refused_with_a_sentence(env, origin):
    """Registered or configured, an origin lands in the CSP header: a `*` would let any site frame
    the app, and a `;` would start a directive of the attacker's choosing."""
    out = run(["ehr", "add", "--name", "evil", "--iss", "https://evil.example/fhir", "--client-id", "c",
               "--frame-origin", origin], env)
    assert out.returncode == 2 and f"{origin!r} is not an origin" in out.stderr, out.stderr
    assert "evil" not in run(["ehr", "list"], env).stdout
    configured = run(["config"], {**env, "CHARTCITE_FRAME_ANCESTORS": f"https://ok.example.org {origin}"})
    assert configured.returncode == 2 and "CHARTCITE_FRAME_ANCESTORS" in configured.stderr, configured.stderr
    assert "is not an origin" in configured.stderr and "Traceback" not in configured.stderr


def test_commands_that_need_redis_say_it_is_down_in_a_sentence(env, tmp_path):
    from .fhir_servers import free_port

    down = {**env, "CHARTCITE_DATA_DIR": str(tmp_path / "data"),
            "CHARTCITE_REDIS_URL": f"redis://:redis-pw@127.0.0.1:{free_port()}/0"}
    assert run(["ehr", "add", "--name", "gone", "--iss", f"http://127.0.0.1:{free_port()}/fhir", "--client-id", "c",
                "--client-auth", "none", "--group-id", "g"], down).returncode == 0
    for command in (["status"], ["status", "--json"], ["sync", "--tenant", "gone"]):
        out = run(command, down)
        assert out.returncode == 1 and "Traceback" not in out.stderr, (command, out.stderr)
        assert "Redis at redis://:****@127.0.0.1" in out.stderr and "cannot be reached" in out.stderr, out.stderr
        assert "redis-pw" not in out.stderr
    # Without Redis, an EHR that cannot be read is a sentence too.
    no_redis = {k: v for k, v in down.items() if k != "CHARTCITE_REDIS_URL"}
    out = run(["sync", "--tenant", "gone"], no_redis)
    assert out.returncode == 1 and "sync failed" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_closed_pipe_ends_a_command_quietly(indexed, env):
    """`chartcite patients --json | head`: the reader goes away before chartcite writes; chartcite
    stops with the exit code a shell gives a process a closed pipe stopped, and no traceback."""
    process = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "patients", "--json"], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()              # the reader is gone before the first line is written
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 141, stderr
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr, stderr


def test_third_party_loggers_keep_quiet_unless_asked(env, tmp_path):
    """Elasticsearch's client wrote a line for every request at INFO; it now writes warnings only,
    and everything at CHARTCITE_LOG_LEVEL=DEBUG."""
    from .conftest import es_url

    elastic = {**env, "CHARTCITE_BACKEND": "elasticsearch", "CHARTCITE_ES_URL": es_url(),
               "CHARTCITE_DATA_DIR": str(tmp_path / "data")}
    quiet = run(["check", "--tenant", "quiet-loggers"], elastic)
    assert quiet.returncode == 0, quiet.stderr
    assert "elastic_transport" not in quiet.stderr and "INFO" not in quiet.stderr, quiet.stderr
    loud = run(["check", "--tenant", "quiet-loggers"], elastic | {"CHARTCITE_LOG_LEVEL": "DEBUG"})
    assert "elastic_transport" in loud.stderr
    # The first command on a fresh data folder migrates chartcite's databases: Alembic's INFO lines
    # (a dozen per command) are not the operator's business.
    fresh = run(["ehr", "add", "--name", "quiet", "--iss", "https://ehr.example/fhir", "--client-id", "c",
                 "--client-auth", "none", "--group-id", "g"], elastic | {"CHARTCITE_DATA_DIR": str(tmp_path / "fresh")})
    assert fresh.returncode == 0 and "alembic" not in fresh.stderr, fresh.stderr


def test_unknown_patient_and_missing_paths_are_clear_errors(env):
    out = run(["index", "/nonexistent/file.json"], env)
    assert out.returncode == 2 and "no such file" in out.stderr


def test_a_real_celery_worker_indexes_a_patient(env, synthea_dir, tmp_path):
    """`chartcite worker` on the SQLite broker picks up sync_patient and reports progress."""
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(synthea_dir / "936988e9-d587-ef42-ebdf-541238540ff3.json.gz", source)
    worker_env = dict(env, CHARTCITE_DATA_DIR=str(tmp_path / "data"), CHARTCITE_DEMO_SOURCE=str(source),
                      CHARTCITE_TASKS_EAGER="false")
    worker = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "worker"], cwd=REPO, env=worker_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, encoding="utf-8")
    try:
        # As deployed: the worker is up (its SQLite broker tables created) before anything is queued;
        # enqueuing during its start-up raced table creation and kombu's retry met a closed channel.
        wait_until_ready(worker)
        code = ("from smart_app.settings import Settings; from workers.runner import TaskRunner; "
                "r = TaskRunner(Settings.load()); print(r.enqueue_sync('default', "
                "'936988e9-d587-ef42-ebdf-541238540ff3'))")
        queued = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=worker_env, capture_output=True, text=True,
                                timeout=120, encoding="utf-8")
        assert queued.stdout.strip() == "True", queued.stderr
        from workers.progress import JobStore

        from .test_workers_e2e import wait_job

        jobs = JobStore(tmp_path / "data" / "state.sqlite")
        job = wait_job(jobs, "default", "936988e9-d587-ef42-ebdf-541238540ff3", {"done", "failed"})
        assert job.state == "done", job
        assert job.total > 0
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def wait_until_ready(worker: subprocess.Popen, seconds: float = 120) -> None:
    import threading

    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(worker.stdout), daemon=True).start()
    deadline = time.time() + seconds
    while not any(" ready." in line for line in lines):
        assert worker.poll() is None and time.time() < deadline, "".join(lines)
        time.sleep(0.3)


def self_signed(folder: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_serve_over_tls_for_a_local_https_test(env, tmp_path):
    import requests

    from .fhir_servers import free_port, stop

    cert, key = self_signed(tmp_path)
    port = free_port()
    log = tmp_path / "serve.log"
    process = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "serve", "--port", str(port), "--cert", str(cert),
                                "--key", str(key)], env=env, stdout=log.open("w", encoding="utf-8"), stderr=subprocess.STDOUT,
                               cwd=Path(__file__).resolve().parent.parent)
    try:
        url = f"https://localhost:{port}/.well-known/jwks.json"
        deadline = time.time() + 180
        while True:
            try:
                response = requests.get(url, verify=str(cert), timeout=30)
                break
            except (requests.ConnectionError, requests.Timeout):     # not listening yet, or its worker still booting
                assert process.poll() is None and time.time() < deadline, log.read_text(encoding="utf-8")
                time.sleep(0.3)
        assert response.status_code == 200 and "keys" in response.json()
        assert "frame-ancestors" in response.headers["Content-Security-Policy"]
    finally:
        stop(process)
    half = subprocess.run([sys.executable, "-m", "smart_app.cli", "serve", "--cert", str(cert)], env=env,
                          capture_output=True, text=True, timeout=60, encoding="utf-8")
    assert half.returncode == 2 and "--cert and --key go together" in half.stderr


def test_every_command_is_documented_in_the_readme():
    """The README is the truth: each `chartcite` command (and each subcommand) appears there."""
    from smart_app.cli import COMMANDS, build_parser

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert not [name for name in COMMANDS if f"chartcite {name}" not in readme]
    parser = build_parser()
    groups = next(a for a in parser._actions if a.dest == "command").choices
    for group in ("keys", "ehr"):
        names = next(a for a in groups[group]._actions if a.dest.endswith("_command")).choices
        line = next(l for l in readme.splitlines() if l.startswith(f"chartcite {group} ") and "|" in l)
        assert set(names) <= {part.strip().split()[-1] for part in line.split("#")[0].split("|")}, line


def test_every_entry_point_collects_garbage_less_often(tmp_path, monkeypatch):
    """Reading and preparing patients allocate millions of acyclic objects: the command line and
    the app factory collect young ones every 50,000 allocations, not every 700 (a fifth of the
    CPU indexing spends beside the model); the older generations keep their settings."""
    import gc

    from search.collector import YOUNG_OBJECTS_PER_COLLECTION
    from smart_app.app import create_app
    from smart_app.cli import main
    from smart_app.settings import Settings

    for name in [n for n in os.environ if n.startswith("CHARTCITE_")]:
        monkeypatch.delenv(name)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path), "CHARTCITE_SECRET_KEY": "very-secret"})
    before = gc.get_threshold()
    try:
        for start in (lambda: main(["config"]), lambda: create_app(settings)):
            gc.set_threshold(700, 10, 10)
            start()
            assert gc.get_threshold() == (YOUNG_OBJECTS_PER_COLLECTION, 10, 10)
    finally:
        gc.set_threshold(*before)


def ascii_locale_env(data_dir) -> dict:
    """A server's bare environment: the C locale with Python's UTF-8 mode off, so the locale's
    encoding is ASCII (what a minimal container or a cron job gives)."""
    env = {k: v for k, v in clean_env(data_dir=data_dir).items() if not k.startswith("LC_")}
    env.update(LANG="C", LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    return env


def test_an_ascii_locale_reads_and_writes_accented_records(tmp_path):
    note = "Assessment: Ménière’s disease, right ear. Temperature 38.2 °C. Plan: betahistine 16 mg."
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": {"resourceType": "Patient", "id": "p-accent", "name": [{"family": "Peña", "given": ["José"]}],
                      "gender": "male", "birthDate": "1961-04-02"}},
        {"resource": {"resourceType": "Condition", "id": "c-accent", "subject": {"reference": "Patient/p-accent"},
                      "code": {"text": "Ménière’s disease"}, "recordedDate": "2025-03-01"}},
        {"resource": {"resourceType": "DocumentReference", "id": "d-accent", "status": "current",
                      "subject": {"reference": "Patient/p-accent"}, "date": "2025-03-01T10:00:00Z",
                      "type": {"text": "Progress note"},
                      "content": [{"attachment": {"contentType": "text/plain; charset=utf-8",
                                                  "data": base64.b64encode(note.encode("utf-8")).decode()}}]}}]}
    path = tmp_path / "accented.json"
    path.write_text(json.dumps(bundle, ensure_ascii=False), encoding="utf-8")
    env = ascii_locale_env(tmp_path / "data")
    indexed = run(["index", str(path)], env)
    assert indexed.returncode == 0, indexed.stderr
    named = run(["patients", "--show-names"], env)
    assert "José Peña" in named.stdout, named.stderr
    answer = run(["ask", "--patient", "p-accent", "--json", "what is the plan for the meniere's disease?"], env)
    assert answer.returncode == 0, answer.stderr
    assert "Ménière" in json.loads(answer.stdout)["answer"]
    plain = run(["ask", "--patient", "p-accent", "temperature?"], env)
    assert plain.returncode == 0 and "38.2" in plain.stdout and "°C" in plain.stdout, plain.stderr
    message = "Docteur, ma fièvre à 38.2 °C, est-ce la maladie de Ménière ?"
    piped = subprocess.run([sys.executable, "-m", "smart_app.cli", "reply", "--patient", "p-accent", "--message-file", "-",
                            "--json"], cwd=REPO, env=env, input=message.encode("utf-8"), capture_output=True, timeout=300)
    assert piped.returncode == 0, piped.stderr.decode("utf-8", "replace")
    assert json.loads(piped.stdout.decode("utf-8"))["draft"]

"""The edges of issue 42: misspellings, lexical work that does not depend on other patients, the
audit trail under concurrent writers, limits on every frame route, files in shared folders,
terminal output, and the smaller ones."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from smart_app.app import create_app
from smart_app.settings import Settings

from .conftest import SHARED, InlineRunner, demo_launch, metric, require_shared
from .synthetic import vm_steps

QUESTION_SETS = [SHARED / "data" / "questions" / name for name in ("clinician-dev.jsonl", "dev.jsonl")]
SMALL = "936988e9-d587-ef42-ebdf-541238540ff3"          # the smallest shared record (46 resources)


# --- misspellings ------------------------------------------------------------------------------

def misspellings(word: str) -> list[str]:
    """One letter dropped, doubled, or swapped with its neighbour, in the middle of the word (the
    first letter stays: a clinician rarely gets it wrong, and the corrector keeps it)."""
    i = len(word) // 2
    return [word[:i] + word[i + 1:], word[:i] + word[i] + word[i:], word[:i - 1] + word[i] + word[i - 1] + word[i + 1:]]


def clinical_words(question: str) -> list[str]:
    """The words of a question the clinical vocabulary knows and ordinary English does not."""
    from search.nlp import spelling as S
    from search.nlp import terminology as T

    words = re.findall(r"[A-Za-z]{5,}", question)
    return [w for w in words if S.is_known(w.lower()) and not T.is_common_word(w)]


def misspelt_questions() -> list[tuple[str, str, str]]:
    """(question, the misspelt question, the word as meant) for every clinical word of every
    question of the clinician and dev sets, each misspelt three ways; misspellings that happen to
    be words themselves are left out (nothing can tell them from what was meant)."""
    from search.nlp import spelling as S

    require_shared()
    found = []
    for path in QUESTION_SETS:
        for line in path.read_text(encoding="utf-8").splitlines():
            question = json.loads(line)["question"]
            for word in clinical_words(question):
                for typo in misspellings(word):
                    if not S.is_known(typo.lower()):
                        found.append((question, question.replace(word, typo, 1), word.lower()))
    return found


def test_a_misspelling_between_two_equally_close_words_is_read_not_crashed():
    """"diabetis" is one edit from "diabetes" and from "diabetic": the tie used to raise inside
    the corrector (a comprehension's name shadowed the terminology module)."""
    from search.nlp.spelling import spelled

    for question in ("any diabetis?", "does he have diabetis"):
        corrected, corrections = spelled(question)
        assert corrections == [("diabetis", "diabetes")] and "diabetes" in corrected


def test_every_question_misspelt_still_reads_and_most_read_as_meant():
    """The whole clinician and dev question sets, every clinical word misspelt three ways: none
    raises, and most misspellings are read as the word meant (docs/quality.md reports the share)."""
    from search.nlp.spelling import spelled

    cases = misspelt_questions()
    assert len(cases) > 100
    meant = 0
    for _question, typed, word in cases:
        corrected, corrections = spelled(typed)
        meant += any(fixed == word for _, fixed in corrections)
    share = meant / len(cases)
    print(f"\nmisspelt clinical words read as meant: {meant} of {len(cases)} ({share:.1%})")
    assert share >= 0.6


@pytest.fixture(scope="module")
def small_app(tmp_path_factory, synthea_dir, embedder):
    source = tmp_path_factory.mktemp("source")
    shutil.copy(synthea_dir / f"{SMALL}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path_factory.mktemp("data")),
                              "CHARTCITE_DEMO_SOURCE": str(source), "CHARTCITE_DEMO_LAUNCH": "true",
                              "CHARTCITE_RATE_LIMIT_CLINICIAN": "1000/minute"})
    return create_app(settings, runner=InlineRunner(settings))


def test_misspelt_questions_answer_over_http_as_the_right_spelling_does(small_app):
    """A deterministic sample of the misspelt questions (every 8th) asked through /api/ask: each
    answers 200, and most answer exactly as the correctly spelt question does."""
    client = small_app.test_client()
    handle = demo_launch(client, SMALL)
    ask = lambda q: client.post("/api/ask", json={"question": q}, headers={"X-Chartcite-Session": handle})  # noqa: E731
    sample = misspelt_questions()[::8] + [("any diabetes?", "any diabetis?", "diabetes"),
                                            ("does he have diabetes", "does he have diabetis", "diabetes")]
    same = 0
    for question, typed, _ in sample:
        typo = ask(typed)
        assert typo.status_code == 200, (typed, typo.get_data(as_text=True)[:300])
        right = ask(question).get_json()
        same += (typo.get_json()["answer"], typo.get_json()["citations"]) == (right["answer"], right["citations"])
    print(f"\nmisspelt questions answered as the right spelling: {same} of {len(sample)}")
    assert same >= 0.6 * len(sample)


# --- lexical work does not depend on other patients --------------------------------------------

def note_chunks(tenant: str, patient_id: str, texts: list[str]):
    from fhir_ingest.record.contract import Chunk

    return [Chunk(tenant=tenant, patient_id=patient_id, resource_type="DocumentReference", resource_id=f"n{i}",
                  part="0", text=text, label="note", date="2024-03-01", semantic_type="note")
            for i, text in enumerate(texts)]


def write_chunks(backend, chunks) -> None:
    import numpy as np

    backend.index(chunks, np.ones((len(chunks), 4), dtype=np.float32), [c.text for c in chunks])


def a_with_others_holding_a_word(path):
    """Patient A of tenant t holds ordinary notes; patient Z, in t and in another tenant, holds
    3,000 notes with "quixotine", a word nobody else has."""
    from search.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend(path, "test-model", 4)
    write_chunks(backend, note_chunks("t", "A", [f"visit {i}: blood pressure reviewed" for i in range(50)]))
    for tenant in ("t", "other"):
        write_chunks(backend, note_chunks(tenant, "Z", [f"note {i}: quixotine given" for i in range(1500)]))
    return backend


def assert_lexical_work_is_the_patients_own(backend) -> None:
    from search.backends.base import Scope

    scope = Scope(tenant="t", patient_id="A")
    calls = lambda word: (lambda: backend.search_text(scope, word, 20), lambda: backend.has_terms("t", "A", [word]),  # noqa: E731
                          lambda: backend.has_terms("t", "A", [word[:5]], prefix=True))
    for call in calls("warming"):          # the first query on a connection reads the schema
        call()
    work = {word: tuple(vm_steps(backend, call) for call in calls(word)) for word in ("quixotine", "quinotixe")}
    held, nobody = work["quixotine"], work["quinotixe"]
    assert all(abs(a - b) <= 5 for a, b in zip(held, nobody)), work
    assert backend.search_text(scope, "quixotine", 20) == [] and not backend.has_terms("t", "A", ["quixotine"])
    assert len(backend.search_text(scope, "blood pressure", 100)) == 50
    assert backend.has_terms("t", "Z", ["quixotine"]) == {"quixotine"}


def test_a_word_only_other_patients_hold_costs_the_asking_patient_nothing(tmp_path):
    """Counted, not timed: the SQLite steps of the text search and of both term look-ups are the
    same for a word 3,000 chunks of other patients hold as for a word nobody holds."""
    assert_lexical_work_is_the_patients_own(a_with_others_holding_a_word(tmp_path / "index.sqlite"))


def test_an_index_of_the_earlier_layout_is_migrated_on_opening(tmp_path):
    """An index written before the scope column is rebuilt when opened: the same answers, and the
    same isolation of the work, without anyone re-indexing."""
    import sqlite3

    from search.backends.embedded import EmbeddedBackend

    path = tmp_path / "index.sqlite"
    a_with_others_holding_a_word(path).close()
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE VIRTUAL TABLE old_fts USING fts5(lexical, chunk_id UNINDEXED, tenant UNINDEXED, patient_id UNINDEXED,
                                                tokenize = 'porter unicode61');
        INSERT INTO old_fts SELECT lexical, chunk_id, tenant, patient_id FROM chunks_fts;
        DROP TABLE chunks_fts;
        ALTER TABLE old_fts RENAME TO chunks_fts;
        DELETE FROM meta WHERE key = 'schema_version';""")       # as that release wrote it: no version kept
    db.close()
    reopened = EmbeddedBackend(path, "test-model", 4)
    assert_lexical_work_is_the_patients_own(reopened)
    assert not [p for p in reopened.check("t").problems if "lexical" in p]      # no summaries: none written
    version = reopened._db().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    from search.backends.embedded import SCHEMA_VERSION

    assert int(version) == SCHEMA_VERSION


def test_an_index_written_by_a_newer_chartcite_is_refused_untouched(tmp_path):
    import sqlite3

    from search.backends.base import BackendError
    from search.backends.embedded import SCHEMA_VERSION, EmbeddedBackend

    path = tmp_path / "index.sqlite"
    a_with_others_holding_a_word(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    before = path.read_bytes()
    with pytest.raises(BackendError, match=r"written by a newer chartcite .* `chartcite index <files>`"):
        EmbeddedBackend(path, "test-model", 4)
    assert path.read_bytes() == before


# --- the audit trail never loses an answer -----------------------------------------------------

def write_entries(url: str, count: int, tag: str) -> None:
    from smart_app.audit import AuditTrail

    trail = AuditTrail(url)
    for i in range(count):
        trail.record("ask", "t", f"clinician-{tag}", "p", f"question {i}")


def test_two_processes_write_the_trail_while_it_is_read(tmp_path):
    """Two processes record at once while a third holds a read open for the whole time (the admin
    page, `chartcite audit`): every entry is written, none is refused as "database is locked"."""
    import multiprocessing
    import sqlite3

    from smart_app.audit import AuditTrail

    url = f"sqlite:///{tmp_path / 'audit.sqlite'}"
    trail = AuditTrail(url)
    trail.record("launch", "t", "someone", "p")
    reader = sqlite3.connect(tmp_path / "audit.sqlite", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM audit").fetchone()          # a read held open
    spawn = multiprocessing.get_context("spawn")
    writers = [spawn.Process(target=write_entries, args=(url, 150, tag)) for tag in "ab"]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=60)
    reader.execute("COMMIT")
    assert [w.exitcode for w in writers] == [0, 0]
    entries = trail.entries(limit=1000, kind="ask")
    assert len(entries) == 300 and len({e["id"] for e in entries}) == 300


def test_an_answer_the_trail_cannot_record_is_not_shown_and_is_counted(small_app, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from smart_app import audit as audit_module

    from .conftest import metric

    client = small_app.test_client()
    handle = demo_launch(client, SMALL)
    trail = small_app.extensions["chartcite.audit"]
    attempts = []

    def locked(entry):
        attempts.append(entry)
        raise OperationalError("INSERT INTO audit", {}, Exception("database is locked"))

    monkeypatch.setattr(audit_module, "RETRY_SECONDS", (0.01, 0.01))
    monkeypatch.setattr(trail, "_insert", locked)
    refused = client.post("/api/ask", json={"question": "any allergies?"}, headers={"X-Chartcite-Session": handle})
    assert refused.status_code == 503 and len(attempts) == 3
    body = refused.get_json()
    assert "could not be recorded in the audit trail" in body["error"] and "answer" not in body
    monkeypatch.undo()
    scraped = client.get("/metrics").get_data(as_text=True)
    assert metric(scraped, "chartcite_audit_failures_total") == 1


def test_audit_ids_are_not_row_numbers(small_app):
    client = small_app.test_client()
    handle = demo_launch(client, SMALL)
    ids = [client.post("/api/ask", json={"question": "any allergies?"},
                       headers={"X-Chartcite-Session": handle}).get_json()["audit_id"] for _ in range(2)]
    assert all(isinstance(i, str) and len(i) >= 20 for i in ids) and ids[0] != ids[1]
    assert small_app.extensions["chartcite.audit"].get(ids[1])["question"] == "any allergies?"


# --- every frame route has a limit -------------------------------------------------------------

class CountingRunner:
    """Starts no real sync: counts them and leaves the job in the state a test gives it."""

    def __init__(self, settings, state="done"):
        from workers.runner import TaskRunner

        self.inner = TaskRunner(settings)
        self.jobs = self.inner.jobs
        self.started, self.state = 0, state

    def enqueue_sync(self, tenant, patient_id, session_id=None):
        if not self.jobs.claim(tenant, patient_id):
            return False
        self.started += 1
        self.jobs.set(tenant, patient_id, self.state)
        return True

    def queue_depth(self):
        return 0


def limited_app(tmp_path, state="done", env=None, **limits):
    require_shared()
    from .conftest import SYNTHEA

    source = tmp_path / "source"
    source.mkdir(exist_ok=True)
    shutil.copy(SYNTHEA / f"{SMALL}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_SOURCE": str(source),
                              "CHARTCITE_DEMO_LAUNCH": "true",
                              **{f"CHARTCITE_RATE_LIMIT_{k.upper()}": v for k, v in limits.items()}, **(env or {})})
    return create_app(settings, runner=CountingRunner(settings, state))


def test_a_refresh_while_the_patients_sync_runs_joins_it(tmp_path):
    app = limited_app(tmp_path, state="running")
    client = app.test_client()
    handle = demo_launch(client, SMALL)                       # the launch starts the sync; it keeps running
    runner = app.extensions["chartcite.runner"]
    replies = [client.post("/api/sync", json={}, headers={"X-Chartcite-Session": handle}) for _ in range(20)]
    assert {r.status_code for r in replies} == {202} and all(r.get_json()["joined"] for r in replies)
    assert runner.started == 1


def test_refresh_starts_a_bounded_number_of_syncs_a_minute(tmp_path):
    app = limited_app(tmp_path, syncs="3/minute")
    client = app.test_client()
    handle = demo_launch(client, SMALL)
    runner = app.extensions["chartcite.runner"]
    before = runner.started
    codes = [client.post("/api/sync", json={}, headers={"X-Chartcite-Session": handle}).status_code for _ in range(10)]
    assert codes == [202] * 3 + [429] * 7 and runner.started - before == 3
    refused = client.post("/api/sync", json={}, headers={"X-Chartcite-Session": handle}).get_json()
    assert "refreshed several times" in refused["error"]


def test_every_frame_api_route_is_limited_per_session_across_workers(tmp_path):
    """Two app processes on one data dir (two gunicorn workers) share each session's allowance:
    every route of the frame's API answers 429 with a sentence once the session has spent it."""
    from smart_app.limits import frame_api_endpoints

    first = limited_app(tmp_path, reads="4/minute")
    second = limited_app(tmp_path, reads="4/minute")
    assert {"frame.status", "frame.context_bundle", "frame.record", "frame.saved_drafts", "frame.sync_now",
            "frame.ask"} <= set(frame_api_endpoints(first))
    for path in ("/api/status", "/api/context", "/api/drafts", f"/api/record?ref=Patient/{SMALL}"):
        handle = demo_launch(first.test_client(), SMALL)
        headers = {"X-Chartcite-Session": handle}
        codes = [app.test_client().get(path, headers=headers).status_code for app in (first, second) * 3]
        assert 429 not in codes[:4] and codes[4:] == [429, 429], (path, codes)
        refused = second.test_client().get(path, headers=headers)
        assert refused.status_code == 429 and "Too many requests from this window" in refused.get_json()["error"]


def test_wrong_admin_tokens_are_limited_and_audited(tmp_path):
    app = limited_app(tmp_path, env={"CHARTCITE_ADMIN_TOKEN": "the-right-one-0000"}, admin_refusals="5/minute")
    client = app.test_client()
    codes = [client.get("/metrics", headers={"Authorization": f"Bearer guess-{i}"}).status_code for i in range(8)]
    assert codes == [403] * 5 + [429] * 3
    # locked out: for a while the right token is refused too
    assert client.get("/metrics", headers={"Authorization": "Bearer the-right-one-0000"}).status_code == 429
    refused = app.extensions["chartcite.audit"].entries(kind="admin-refused", limit=100)
    assert len(refused) == 5 and all(e["request"] == "GET /metrics" for e in refused)


def test_a_route_whose_audit_line_cannot_be_written_answers_503_not_500(tmp_path, monkeypatch):
    """A refused admin token, the admin page and the frame's routes each leave an audit line: when
    the trail cannot be written, the answer is a 503 that says why, and /metrics counts it."""
    from smart_app.audit import AuditTrail, AuditUnavailable

    app = limited_app(tmp_path, env={"CHARTCITE_ADMIN_TOKEN": "the-right-one-0000"})
    client = app.test_client()

    def broken(*args, **kwargs):
        raise AuditUnavailable("the audit trail could not be written")

    monkeypatch.setattr(AuditTrail, "record", broken)
    refused = client.get("/metrics", headers={"Authorization": "Bearer a-guess"})
    assert refused.status_code == 503 and "audit trail could not be written" in refused.get_data(as_text=True)
    monkeypatch.undo()
    scraped = client.get("/metrics", headers={"Authorization": "Bearer the-right-one-0000"}).get_data(as_text=True)
    assert metric(scraped, "chartcite_audit_failures_total") >= 1


# --- terminal output ---------------------------------------------------------------------------

FORGED = "bad\x1b[2J\r\n[ok  ] client  all good\u202eevil"


def test_fields_from_outside_cannot_move_the_terminal_or_forge_a_line():
    from smart_app.ehr_check import Check, format_checks
    from smart_app.terminal import shown

    assert shown(FORGED) == "bad\\x1b[2J\\r\\n[ok  ] client  all good\\u202eevil"
    assert shown("Zoë, 5 mg — ok") == "Zoë, 5 mg — ok"
    printed = format_checks([Check("client", "fail", f"HTTP 401 invalid_client: {FORGED}", "fix it")])
    assert printed.count("\n") == 1 and "\x1b" not in printed and "\u202e" not in printed
    assert not any(line.startswith("[ok  ]") for line in printed.splitlines())


def test_the_audit_and_index_commands_escape_what_they_print(tmp_path):
    """`chartcite audit` (a question, a launch's patient id) and `chartcite index` (a file name)
    as an operator's terminal receives them: no ESC, no U+202E, no forged line."""
    import subprocess
    import sys

    from smart_app.audit import AuditTrail

    from .conftest import clean_env

    data = tmp_path / "data"
    data.mkdir()
    AuditTrail(f"sqlite:///{data / 'audit.sqlite'}").record("refused", "t", "dr", "p\x1b]0;x\x07", FORGED,
                                                             reason=FORGED)
    out = subprocess.run([sys.executable, "-m", "smart_app.cli", "audit"], env=clean_env(data_dir=data),
                         capture_output=True, text=True, timeout=120, encoding="utf-8")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\u202e" not in out.stdout and "\x07" not in out.stdout
    assert len(out.stdout.strip().splitlines()) == 1
    # The name as bytes: under an ASCII locale no str could name it; the bytes the locale cannot
    # decode are shown as the bytes they are.
    bad = os.path.join(os.fsencode(tmp_path), "in\x1b[31mput\u202e.json".encode("utf-8"))
    with open(bad, "w", encoding="utf-8") as fh:
        fh.write("{not json")
    out = subprocess.run([sys.executable, "-m", "smart_app.cli", "index", bad], env=clean_env(data_dir=data),
                         capture_output=True, text=True, timeout=300, encoding="utf-8")
    printed = out.stdout + out.stderr
    override = "\\u202e" if os.fsdecode("\u202e".encode("utf-8")) == "\u202e" else "\\xe2\\x80\\xae"
    assert "\x1b" not in printed and "\u202e" not in printed and f"\\x1b[31mput{override}" in printed, printed


# --- small ones --------------------------------------------------------------------------------

class StubRegistry:
    def __init__(self):
        self.updates = []

    def update_ehr(self, name, **changes):
        self.updates.append(changes)
        return None


def client_check_with_probes(monkeypatch, *probes):
    from fhir_ingest.connection.client_auth import ClientSecretBasic
    from smart_app import ehr_check

    registry = StubRegistry()
    checker = ehr_check.EhrChecker(registry, type("Ehr", (), {"name": "epic"})(), "https://chartcite.example", None)
    checker.config = {"token_endpoint": "https://ehr.example/token"}
    monkeypatch.setattr(ehr_check, "client_auth_for", lambda *_: ClientSecretBasic("cid", "s+cret", "form"))
    ours, other = probes
    # The deliberately wrong credentials ehr check also tries are told apart from ours, as an EHR
    # with a client registry tells them apart; the secret's two encodings get the answers given.
    decoy = ehr_check.Probe(401, "invalid_client", "HTTP 401 invalid_client: unknown credentials")

    def probe(auth):
        if getattr(auth, "secret", None) != "s+cret":
            return decoy
        return ours if auth.encoding == "form" else other

    monkeypatch.setattr(checker, "probe", probe)
    return checker.client_credentials(), registry


def test_ehr_check_switches_the_secret_encoding_only_when_the_other_was_accepted(monkeypatch):
    from smart_app.ehr_check import Probe

    refused = Probe(401, "invalid_client", "HTTP 401 invalid_client")
    check, registry = client_check_with_probes(monkeypatch, refused, Probe(503, "", "HTTP 503"))
    assert check.status == "warn" and "could not be verified" in check.detail and registry.updates == []
    check, registry = client_check_with_probes(monkeypatch, refused, Probe(None, "", "no answer (Timeout)"))
    assert check.status == "warn" and registry.updates == []
    check, registry = client_check_with_probes(monkeypatch, refused, Probe(400, "invalid_grant", "HTTP 400 invalid_grant"))
    assert check.status == "ok" and registry.updates == [{"secret_encoding": "raw"}]


def test_saved_drafts_are_listed_only_to_the_clinician_who_saved_them(small_app):
    client = small_app.test_client()
    sessions = small_app.extensions["chartcite.sessions"]
    trail = small_app.extensions["chartcite.audit"]
    tenant = small_app.config["CHARTCITE"].tenant
    demo_launch(client, SMALL)
    mine = trail.record("draft-saved", tenant, "dr-a", SMALL, draft_kind="pre-visit", draft={"kind": "pre-visit"})
    trail.record("draft-saved", tenant, "dr-b", SMALL, draft_kind="pre-visit", draft={"kind": "pre-visit"})
    _, handle = sessions.create(tenant, SMALL, clinician="dr-a", mode="demo")
    listed = client.get("/api/drafts", headers={"X-Chartcite-Session": handle}).get_json()
    assert [d["id"] for d in listed] == [mine] and {d["clinician"] for d in listed} == {"dr-a"}


# --- files in shared folders -------------------------------------------------------------------

MODEL = __import__("pathlib").Path("/models/minilm")


def test_planted_symlinks_in_the_cache_are_never_written_through(tmp_path, monkeypatch):
    """Another user made the lock file and the choice's usual temporary names symlinks to a file
    of chartcite's user: measuring and keeping the choice leaves that file as it was."""
    from search.models import onnx_embed

    cache = tmp_path / "cache"
    cache.mkdir()
    victim = tmp_path / "private.txt"
    victim.write_text("keep me", encoding="utf-8")
    victim.chmod(0o600)
    choice = onnx_embed.choice_file(MODEL, cache)
    for name in (choice.with_suffix(".tmp"), cache / ".choice.lock.tmp"):
        name.symlink_to(victim)
    monkeypatch.setattr(onnx_embed, "calibrate", lambda *args: {"variant": "dynamic"})
    assert onnx_embed.chosen_variant(MODEL, cache) == "dynamic"
    assert victim.read_text(encoding="utf-8") == "keep me"
    (cache / ".choice.lock").unlink()
    (cache / ".choice.lock").symlink_to(victim)
    choice.unlink()
    with pytest.raises(OSError, match="symlink"):
        onnx_embed.chosen_variant(MODEL, cache)
    assert victim.read_text(encoding="utf-8") == "keep me"
    choice.symlink_to(victim)                     # a planted choice file is replaced, not written through
    (cache / ".choice.lock").unlink()
    monkeypatch.setattr(onnx_embed, "processor_key", lambda: "Another CPU")
    assert onnx_embed.chosen_variant(MODEL, cache) == "dynamic"
    assert victim.read_text(encoding="utf-8") == "keep me" and not choice.is_symlink()


def test_a_cache_folder_every_user_may_write_is_refused_by_name(tmp_path, monkeypatch):
    from search.models import onnx_embed

    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setattr(onnx_embed, "calibrate", lambda *args: {"variant": "dynamic"})
    with pytest.raises(OSError, match=str(cache)):
        onnx_embed.chosen_variant(MODEL, cache)
    with pytest.raises(OSError, match="not sticky"):
        onnx_embed.int8_model(MODEL, cache)
    cache.chmod(0o1777)                                       # /tmp's kind of sharing is allowed
    assert onnx_embed.chosen_variant(MODEL, cache) == "dynamic"


@pytest.mark.parametrize("content", ["[]", '"dynamic"', "{\"%s\": [\"static\"]}", "{\"%s\": \"static\"}", "null"])
def test_a_choice_file_of_any_other_shape_is_measured_again(tmp_path, monkeypatch, content):
    from search.models import onnx_embed

    monkeypatch.setattr(onnx_embed, "processor_key", lambda: "This CPU")
    choice = onnx_embed.choice_file(MODEL, tmp_path)
    choice.write_text(content.replace("%s", "This CPU"), encoding="utf-8")
    measured = []
    monkeypatch.setattr(onnx_embed, "calibrate", lambda *args: measured.append(1) or {"variant": "static"})
    assert onnx_embed.chosen_variant(MODEL, tmp_path) == "static" and measured == [1]
    assert json.loads(choice.read_text(encoding="utf-8")) == {"This CPU": {"variant": "static"}}

"""Bulk Data rounds you can trust, in real processes on loopback (the stack of tests/test_smart.py:
sekmet-fhir loaded with Synthea behind the SMART test server, `chartcite` registered with Backend
Services). Each test is one way a round used to lose a record, skip a change, or fail a person:

- a backdated change in an incremental round replaced the patient's whole record with itself;
- files the EHR could not generate, or that broke off in transfer, advanced the cursor or
  restarted the whole export; one cursor served every group; an emptied index synced nothing;
- two syncs of one group at once crashed one of them, and a killed one left its data behind;
- fixed types and scopes were refused by an EHR that holds less, and its words were dropped;
- `ehr check` failed a server for Backend Services only and passed a Group of no one;
- status polling ignored the EHR's pacing.
- deletions never applied to members a Group names as `urn:uuid:`, by absolute URL or by identifier;
  `ehr check` passed a Group that does not exist on a server that ignores `_id`;
- a backdated resource widened every later round for a day; the messages said what was not so
  ("ignored _since" for one resource, "the cursor stays at none", "3 skipped" unnamed, an open
  round left behind by a Group that does not exist);
- files were downloaded one at a time, status polls ran up to a minute late, and a file read again
  after its retries ran out did not wait for the EHR's Retry-After.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from .fhir_servers import REPO, free_port
from .conftest import metric
from .test_smart import (ADMIN_TOKEN, CLIENT_ID, GROUP, OTHER, PID, TENANT, Stack, held_resource,  # noqa: F401
                         same_site, stack)

CONDITION = "bulk-test-condition"


@contextmanager
def bulk_misbehaving(stack: Stack, **behaviour):
    """The test Bulk server misbehaves as told (a backdate, failed types, a cut file, a delay…)
    for the block, and behaves again after it, whatever the block did."""
    stack.test_api("bulk", behaviour)
    try:
        yield
    finally:
        stack.test_api("bulk", {})


def kickoffs(stack: Stack) -> list[dict]:
    return [e for e in stack.ehr_log() if "$export" in e["path"]]


def put(stack: Stack, resource: dict) -> None:
    requests.put(f"{stack.upstream}/{resource['resourceType']}/{resource['id']}", json=resource, timeout=30,
                 headers={"Content-Type": "application/fhir+json"}).raise_for_status()


def condition(cid: str, patient: str, text: str) -> dict:
    return {"resourceType": "Condition", "id": cid, "subject": {"reference": f"Patient/{patient}"},
            "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                                           "code": "active"}]},
            "code": {"text": text}, "recordedDate": "2024-05-01"}


def cursor_of(stack: Stack, group: str = GROUP) -> str:
    """The group's cursor as `ehr list` shows it."""
    listed = json.loads(stack.cli("ehr", "list", "--json").stdout)
    row = next(e for e in listed if e["name"] == TENANT)
    return row["bulk_cursors"].get(group, {}).get("since", "")


def held_count(stack: Stack, patient: str) -> int:
    from search.service import SearchService

    svc = SearchService("embedded", Path(stack.env["CHARTCITE_DATA_DIR"]) / "index.sqlite")
    try:
        return len(svc.catalog.patient_resources(TENANT, patient))
    finally:
        svc.close()


def consistent(stack: Stack) -> None:
    checked = stack.cli("check", "--tenant", TENANT)
    assert checked.returncode == 0 and "consistent" in checked.stdout, checked.stdout


# --- whole-record replacement only on proof -------------------------------------------------------------

def test_a_backdated_change_is_merged_and_only_makes_the_next_round_reach_back(stack):
    """A changed resource whose lastUpdated predates `_since` (clocks that disagree) made the
    export look like the EHR's whole record, and the patient's record was replaced by that one
    resource. Now the round merges it, the record keeps everything else, and the next round asks
    from further back instead."""
    assert stack.cli("sync", "--tenant", TENANT, "--full").returncode == 0
    before = held_count(stack, PID)
    put(stack, condition(CONDITION, PID, "Backdated tinnitus"))
    with bulk_misbehaving(stack, backdate="2001-01-01T00:00:00Z"):
        stack.test_api("clear-log")
        round_ = stack.cli("sync", "--tenant", TENANT)
    assert round_.returncode == 0, round_.stderr
    assert "ignored _since" not in round_.stdout and "backdated" in round_.stdout, round_.stdout
    assert held_count(stack, PID) == before + 1, round_.stdout
    assert held_resource(stack, PID, f"Condition/{CONDITION}")["code"]["text"] == "Backdated tinnitus"
    consistent(stack)
    reached = kickoffs(stack)[-1]["args"]["_since"][0]
    stack.test_api("clear-log")
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    assert kickoffs(stack)[-1]["args"]["_since"][0] < cursor_of(stack) and reached


# --- cursors that cannot skip ---------------------------------------------------------------------------

def test_files_the_ehr_could_not_generate_keep_the_cursor_and_the_next_round_asks_again(stack):
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    cursor = cursor_of(stack)
    put(stack, condition("bulk-new-condition", PID, "Newly found gout"))
    with bulk_misbehaving(stack, fail_types=["Condition"]):
        failed = stack.cli("sync", "--tenant", TENANT)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "Failed to export" in failed.stdout and "the cursor stays at" in failed.stdout
    assert cursor_of(stack) == cursor
    status = json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["last_sync_status"]
    assert status.startswith("incomplete") and "Failed to export" in status
    assert held_resource(stack, PID, "Condition/bulk-new-condition") is None
    again = stack.cli("sync", "--tenant", TENANT)
    assert again.returncode == 0, again.stdout + again.stderr
    assert held_resource(stack, PID, "Condition/bulk-new-condition")["code"]["text"] == "Newly found gout"
    assert cursor_of(stack) > cursor


def test_a_file_that_will_not_download_is_read_again_by_itself(stack):
    """A file whose download keeps failing leaves the round open with the rest of it kept; the
    next sync downloads that file alone, with no new export, and finishes the round."""
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    cursor = cursor_of(stack)
    put(stack, condition("bulk-retried-condition", OTHER, "Retried migraine"))
    stack.test_api("faults", {"kind": "status", "status": 403, "path": "Condition.ndjson", "times": 1000})
    try:
        failed = stack.cli("sync", "--tenant", TENANT)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "incomplete: Condition" in failed.stdout and "reads this file again" in failed.stdout
        assert cursor_of(stack) == cursor
        stack.test_api("clear-faults")
        stack.test_api("clear-log")
        again = stack.cli("sync", "--tenant", TENANT)
    finally:
        stack.test_api("clear-faults")
    assert again.returncode == 0, again.stdout + again.stderr
    assert not kickoffs(stack), "the open round was taken up, not exported again"
    files = {e["path"].rsplit("/", 1)[1] for e in stack.ehr_log() if "/bulk-files/" in e["path"]}
    assert files == {"Condition.ndjson"}, files
    assert held_resource(stack, OTHER, "Condition/bulk-retried-condition") is not None
    assert cursor_of(stack) > cursor


def test_a_transfer_cut_mid_file_resumes_where_it_broke(stack):
    with bulk_misbehaving(stack, cut="Observation.ndjson", times=1):
        stack.test_api("clear-log")
        synced = stack.cli("sync", "--tenant", TENANT, "--full")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert len(kickoffs(stack)) == 1
    reads = [e for e in stack.ehr_log() if e["path"].endswith("/Observation.ndjson")]
    assert len(reads) == 2 and not reads[0]["range"], reads
    assert reads[1]["range"].startswith("bytes=") and int(reads[1]["range"][6:].rstrip("-")) > 0
    consistent(stack)


def test_each_group_keeps_its_own_cursor_and_a_new_group_gets_its_history(stack):
    put(stack, {"resourceType": "Group", "id": "other-group", "type": "person", "actual": True,
                "member": [{"entity": {"reference": f"Patient/{OTHER}"}}]})
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    cursor = cursor_of(stack)
    put(stack, condition("bulk-group-condition", PID, "Seen only by the registered group"))
    stack.test_api("clear-log")
    other = stack.cli("sync", "--tenant", TENANT, "--group", "other-group")
    assert other.returncode == 0, other.stdout + other.stderr
    assert "_since" not in kickoffs(stack)[-1]["args"]                   # its whole history, not changes
    assert "no round of group other-group has completed before: a full round" in other.stdout
    assert cursor_of(stack) == cursor and cursor_of(stack, "other-group")
    stack.test_api("clear-log")
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    assert kickoffs(stack)[-1]["args"]["_since"] == [cursor]
    assert held_resource(stack, PID, "Condition/bulk-group-condition") is not None


def test_an_emptied_index_starts_with_a_full_round_and_says_so(stack, tmp_path):
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    registry = f"sqlite:///{Path(stack.env['CHARTCITE_DATA_DIR']) / 'registry.sqlite'}"
    empty = {"CHARTCITE_DATA_DIR": str(tmp_path / "empty"), "CHARTCITE_REGISTRY_URL": registry}
    stack.test_api("clear-log")
    synced = stack.cli("sync", "--tenant", TENANT, env=empty)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "_since" not in kickoffs(stack)[-1]["args"]
    assert f"the index holds none of {TENANT}'s patients: a full round" in synced.stdout
    assert "synced 2 patients" in synced.stdout


def test_a_group_the_ehr_does_not_have_is_an_error_with_a_sentence(stack):
    with bulk_misbehaving(stack, unknown_groups="empty"):      # as the reference server answers
        missing = stack.cli("sync", "--tenant", TENANT, "--group", "no-such-group")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "the EHR has no Group no-such-group" in missing.stderr and "--group-id" in missing.stderr
    listed = json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["bulk_cursors"]
    assert "no-such-group" not in listed, listed      # its round is closed, not left "exporting" for good


# --- one sync at a time ---------------------------------------------------------------------------------

def round_state(stack: Stack) -> str:
    with sqlite3.connect(Path(stack.env["CHARTCITE_DATA_DIR"]) / "registry.sqlite", timeout=30) as db:
        row = db.execute("SELECT state FROM bulk_round ORDER BY started_at DESC LIMIT 1").fetchone()
    return row[0] if row else ""


def staged_rows(stack: Stack) -> int:
    path = Path(stack.env["CHARTCITE_DATA_DIR"]) / "bulk-staging.sqlite"
    with sqlite3.connect(path, timeout=30) as db:
        return db.execute("SELECT count(*) FROM bulk_staged").fetchone()[0]


def test_two_syncs_of_a_group_never_run_at_once_and_a_killed_one_is_taken_up(stack):
    """The second sync says who holds the group instead of dying on a locked database; a sync
    killed while indexing lets go of the group when its lease lapses, and the next one finishes
    its round from where it stopped (no second export) and removes what it staged."""
    lease = {"CHARTCITE_SYNC_LEASE_SECONDS": "4"}
    stack.test_api("bulk", {"delay": 4, "retry_after": 1})
    stack.test_api("clear-log")
    first = subprocess.Popen([sys.executable, "-m", "smart_app.cli", "sync", "--tenant", TENANT, "--full"], cwd=REPO,
                             env=stack.env | lease, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, encoding="utf-8")
    try:
        wait_until(lambda: kickoffs(stack), 120)
        second = stack.cli("sync", "--tenant", TENANT, env=lease)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "is already running" in second.stderr and "Traceback" not in second.stderr
        assert "database is locked" not in second.stderr
        wait_until(lambda: round_state(stack) == "indexing", 120, every=0.05)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        stack.test_api("bulk", {})
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert staged_rows(stack) > 0                                  # kept for the round's next taker
    time.sleep(5)                                                  # the killed sync's lease lapses
    taken_up = stack.cli("sync", "--tenant", TENANT, env=lease)
    assert taken_up.returncode == 0, taken_up.stdout + taken_up.stderr
    assert "taken up again" in taken_up.stdout and len(kickoffs(stack)) == 1
    assert staged_rows(stack) == 0
    assert not list(Path(stack.env["CHARTCITE_DATA_DIR"]).glob("chartcite-staging-*"))
    consistent(stack)


def wait_until(condition, seconds: float, every: float = 0.2):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not reached in {seconds} s")


# --- types, scopes and the EHR's words ------------------------------------------------------------------

def test_types_and_scopes_follow_what_the_ehr_offers_and_its_refusals_are_said_in_its_words(stack):
    stack.test_api("unsupported", {"types": ["Medication"]})
    try:
        stack.test_api("clear-log")
        synced = stack.cli("sync", "--tenant", TENANT)
        assert synced.returncode == 0, synced.stdout + synced.stderr
        token = [e for e in stack.ehr_log() if e.get("grant") == "client_credentials"][-1]
        assert "system/Condition.rs" in token["scope"] and "system/Medication.rs" not in token["scope"]
        assert "Medication" not in kickoffs(stack)[-1]["args"]["_type"][0].split(",")
        assert "not exported: Medication: not offered by this EHR" in synced.stdout
    finally:
        stack.test_api("unsupported", {"types": []})
    from fhir_ingest.connection.bulk import BULK_TYPES

    grantable = [f"system/{t}.rs" for t in [*BULK_TYPES, "Group"] if t != "Observation"]
    stack.test_api("client", {"grantable_system": grantable})
    try:
        refused = stack.cli("sync", "--tenant", TENANT)
        assert refused.returncode == 1
        assert "invalid_scope: Scopes system/Observation.rs could not be granted" in refused.stderr
        assert "fix:" in refused.stderr and f"ehr update {TENANT} --bulk-types" in refused.stderr
        status = json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["last_sync_status"]
        assert "could not be granted" in status and "AuthExpired" not in status
        narrowed = stack.cli("ehr", "update", TENANT, "--bulk-types", "Condition,Encounter")
        assert narrowed.returncode == 0, narrowed.stderr
        stack.test_api("clear-log")
        assert stack.cli("sync", "--tenant", TENANT).returncode == 0
        assert kickoffs(stack)[-1]["args"]["_type"] == ["Patient,Condition,Encounter"]
    finally:
        stack.test_api("client", {})
        assert stack.cli("ehr", "update", TENANT, "--bulk-types", "auto").returncode == 0


# --- ehr check for Backend Services ---------------------------------------------------------------------

def test_ehr_check_passes_a_backend_only_server_and_fails_a_group_of_no_one(stack):
    bulk_iss = same_site(stack.fhir)                     # the same server by another name: its own registration
    stack.test_api("client", {"backend_client_id": "chartcite-backend"})
    stack.test_api("smart-config", {"omit": ["authorization_endpoint", "capabilities"]})
    added = stack.cli("ehr", "add", "--name", "bulkonly", "--iss", bulk_iss, "--client-id", "launch-client-unused",
                      "--backend-client-id", "chartcite-backend", "--backend-only", "--group-id", GROUP)
    assert added.returncode == 0, added.stderr
    try:
        checked = stack.cli("ehr", "check", "bulkonly", "--json")
        checks = {c["name"]: c for c in json.loads(checked.stdout)}
        assert checked.returncode == 0, checked.stdout
        assert checks["discovery"]["status"] == "ok" and checks["client"]["status"] == "skip"
        assert checks["backend"]["status"] == "ok" and "chartcite-backend" in checks["backend"]["detail"]
        assert checks["group"]["detail"] == "the registered Group was found (2 members)"
        refused = requests.get(f"{stack.app}/launch", params={"iss": bulk_iss}, allow_redirects=False, timeout=30)
        assert refused.status_code == 400 and "background sync only" in refused.text
        put(stack, {"resourceType": "Group", "id": "empty-group", "type": "person", "actual": True})
        assert stack.cli("ehr", "update", "bulkonly", "--group-id", "empty-group").returncode == 0
        empty = stack.cli("ehr", "check", "bulkonly")
        assert empty.returncode == 1 and "[FAIL] group" in empty.stdout and "has no members" in empty.stdout
        assert stack.cli("ehr", "update", "bulkonly", "--group-id", "").returncode == 0
        none = stack.cli("ehr", "check", "bulkonly")
        assert "[warn] group" in none.stdout and "does not run" in none.stdout
        assert stack.cli("sync", "--tenant", "bulkonly").returncode == 2
        taken = stack.cli("ehr", "update", "bulkonly", "--iss", stack.fhir)
        assert taken.returncode == 2 and f"already registered as '{TENANT}'" in taken.stderr
        moved = stack.cli("ehr", "update", "bulkonly", "--iss", f"http://localhost:{free_port()}/fhir/")
        assert moved.returncode == 0, moved.stderr
    finally:
        stack.cli("ehr", "remove", "bulkonly")
        stack.test_api("smart-config", {"omit": []})
        stack.test_api("client", {})


# --- polite polling -------------------------------------------------------------------------------------

def status_polls(stack: Stack) -> list[dict]:
    return [e for e in stack.ehr_log() if "/bulk-status/" in e["path"] and e["method"] == "GET"]


def test_status_polling_follows_retry_after_and_sees_the_end_of_an_export_within_seconds(stack):
    """An export that takes 8 s and asks for a poll every second is polled every second (never
    sooner) and its end seen within about a second, where polls used to back off to once a minute;
    its X-Progress is in the progress bar. An EHR that names no wait is polled ever less often, but
    no more than a few seconds apart while the export is young."""
    with bulk_misbehaving(stack, delay=8, retry_after=1, progress="42% (test)"):
        stack.test_api("clear-log")
        synced = stack.cli("sync", "--tenant", TENANT)
        kicked = kickoffs(stack)[-1]["at"]
    assert synced.returncode == 0, synced.stderr
    polls = status_polls(stack)
    gaps = [b["at"] - a["at"] for a, b in zip(polls, polls[1:])]
    assert all(0.95 <= gap < 1.6 for gap in gaps), gaps                 # every second, as asked
    assert polls[-1]["at"] - (kicked + 8) < 1.6, gaps                    # the end seen within a poll
    assert "42% (test)" in synced.stderr
    with bulk_misbehaving(stack, delay=14, retry_after=None):
        stack.test_api("clear-log")
        assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    gaps = [b["at"] - a["at"] for a, b in zip(status_polls(stack), status_polls(stack)[1:])]
    assert len(gaps) <= 7 and gaps[0] >= 0.9 and all(earlier <= later + 0.2 for earlier, later in zip(gaps, gaps[1:]))
    assert max(gaps) < 5.6, gaps


def test_a_part_that_failed_for_good_ends_the_wait_and_a_retried_one_does_not(tmp_path):
    """`sync --workers` follows the round's parts; a part whose task gave up must end the wait with
    the error (the round left open for the next sync), where a part waiting for its retry keeps it."""
    import threading

    from smart_app.settings import Settings
    from workers.bulk_round import follow_round, round_deps
    from workers.sync import open_registry

    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path)})
    registry = open_registry(settings)
    rounds = round_deps(settings, registry, None).rounds
    round_ = rounds.new_round(TENANT, GROUP, "", [], "sync-1")
    rounds.update_round(round_.id, state="indexing")
    rounds.add_parts(round_.id, [["p1"], ["p2"]])
    for n, retrying in ((0, True), (1, False)):
        assert rounds.claim_part(round_.id, n, "worker-1", 60) == "claimed"
        rounds.fail_part(round_.id, n, "worker-1", "IndexError: boom", retrying=retrying)
    ended: list[dict] = []
    follower = threading.Thread(target=lambda: ended.append(follow_round(settings, registry, round_.id, every=0.05)),
                                daemon=True)
    follower.start()
    follower.join(0.5)
    assert not ended, "a part waiting for its retry must keep the wait"
    assert rounds.claim_part(round_.id, 0, "worker-2", 60) == "claimed"
    rounds.fail_part(round_.id, 0, "worker-2", "ValueError: for good")
    follower.join(5)
    assert ended and ended[0]["state"] == "failed"
    assert ended[0]["failed_parts"] == ["part 0: ValueError: for good", "part 1: IndexError: boom"]


def test_staged_resources_of_rounds_that_ended_are_swept(tmp_path):
    """A process killed between a round's end and its clean-up leaves patient data staged: the next
    sync of any group removes it, and keeps what an open round still needs."""
    from smart_app.settings import Settings
    from workers.bulk_round import round_deps, sweep_ended_rounds
    from workers.sync import open_registry

    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path)})
    deps = round_deps(settings, open_registry(settings), None)
    ended, open_ = deps.rounds.new_round(TENANT, GROUP, "", [], "a"), deps.rounds.new_round(TENANT, OTHER, "", [], "b")
    deps.rounds.update_round(ended.id, state="done")
    row = {"file_n": 0, "line": 1, "patient_id": PID, "ref": f"Condition/{CONDITION}", "origin": "x", "body": b""}
    deps.staging.add([row | {"round_id": rid} for rid in (ended.id, open_.id, "gone-round")])
    assert sweep_ended_rounds(deps) == 2
    assert deps.staging.round_ids() == {open_.id}


# --- what a round may remove (issue 41) -----------------------------------------------------------------

def held_refs(stack: Stack) -> dict[str, set[str]]:
    """Every resource the index holds, by patient."""
    from search.service import SearchService

    svc = SearchService("embedded", Path(stack.env["CHARTCITE_DATA_DIR"]) / "index.sqlite")
    try:
        return {pid: {f"{r['resourceType']}/{r['id']}" for r in svc.catalog.patient_resources(TENANT, pid)}
                for pid in (PID, OTHER)}
    finally:
        svc.close()


def last_status(stack: Stack) -> str:
    return json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["last_sync_status"]


def test_a_line_a_full_round_could_not_read_removes_nothing_of_its_type(stack):
    """Item 3: an AllergyIntolerance line cut short (not JSON) in a full round deleted the good copy
    held. Now the round removes nothing of that type, and `ehr list` warns instead of saying ok."""
    assert stack.cli("sync", "--tenant", TENANT, "--full").returncode == 0
    before = held_refs(stack)
    assert any(ref.startswith("AllergyIntolerance/") for refs in before.values() for ref in refs)
    with bulk_misbehaving(stack, broken_line="AllergyIntolerance.ndjson"):
        round_ = stack.cli("sync", "--tenant", TENANT, "--full")
    assert round_.returncode == 0, round_.stdout + round_.stderr
    assert held_refs(stack) == before
    assert "a Bulk round that could not read 1 line(s) of AllergyIntolerance" in round_.stdout
    status = last_status(stack)
    assert status.startswith("warning:") and "could not read 1 line(s) of AllergyIntolerance" in status, status
    consistent(stack)


@pytest.mark.parametrize("validators", [True, False])
def test_a_file_regenerated_between_a_cut_and_its_resume_is_read_again_from_its_start(stack, validators):
    """Item 5: an Observation file broke off half way and the EHR then served it regenerated (the
    same lines in another order): the resume spliced two versions and lost what was in neither
    half. Now a resume names the first response's ETag (If-Range): a changed file comes whole
    and is read from its start, as is a file that gave no validator; nothing is lost."""
    assert stack.cli("sync", "--tenant", TENANT, "--full").returncode == 0
    before = held_refs(stack)
    with bulk_misbehaving(stack, cut="Observation.ndjson", times=1, regenerate="Observation.ndjson",
                          no_validators=not validators):
        stack.test_api("clear-log")
        synced = stack.cli("sync", "--tenant", TENANT, "--full")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert held_refs(stack) == before
    assert "read again from its start" in synced.stdout
    reads = [e for e in stack.ehr_log() if e["path"].endswith("/Observation.ndjson")]
    assert not reads[-1]["range"], reads
    consistent(stack)


def test_a_transaction_time_in_the_future_never_becomes_the_cursor(stack):
    """Item 4: a manifest dated 2099 became the group's cursor, and every later round asked for
    changes since 2099 and found none. Now it is refused, the cursor stays at its last good value,
    `ehr list` warns, and the next round finds the change."""
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    cursor = cursor_of(stack)
    with bulk_misbehaving(stack, transaction_time="2099-01-01T00:00:00Z"):
        future = stack.cli("sync", "--tenant", TENANT)
    assert future.returncode == 0, future.stdout + future.stderr
    assert "the EHR's transactionTime 2099-01-01T00:00:00Z is after now" in future.stdout
    assert cursor_of(stack) == cursor
    status = last_status(stack)
    assert status.startswith("warning:") and "2099-01-01T00:00:00Z is after now" in status, status
    scraped = requests.get(f"{stack.app}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30).text
    assert metric(scraped, "chartcite_bulk_warnings_total", kind="future_cursor") >= 1
    put(stack, condition("after-the-future", PID, "Plantar fasciitis"))
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    assert held_resource(stack, PID, "Condition/after-the-future")["code"]["text"] == "Plantar fasciitis"
    assert held_refs(stack)[PID] >= {"Condition/after-the-future"}


def test_a_round_that_stops_making_progress_lets_its_lease_go(tmp_path):
    """Item 8 (and issue 44's): a sync stuck in its first embedding kept renewing its lease from a
    thread, so no other worker could take the round up. Now a lease is renewed only while the work
    moves: stuck, it is let go within the stall time and said; moving, it is kept."""
    from smart_app.settings import Settings
    from workers.bulk_round import Heartbeat, round_deps
    from workers.sync import open_registry

    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path)})
    rounds = round_deps(settings, open_registry(settings), None).rounds
    said: list[float] = []
    lease, stall = 1.0, 1.5
    for group in ("moving", "stuck"):
        assert rounds.take_lease(TENANT, group, "worker-1", lease) is None
    with Heartbeat(lambda: rounds.renew_lease(TENANT, "moving", "worker-1", lease), 0.25, stall) as moving, \
            Heartbeat(lambda: rounds.renew_lease(TENANT, "stuck", "worker-1", lease), 0.25, stall, said.append) as stuck:
        deadline = time.monotonic() + stall + lease + 1.5
        while time.monotonic() < deadline:
            moving.progress()
            time.sleep(0.1)
        assert rounds.take_lease(TENANT, "stuck", "worker-2", 60) is None, "a stuck round's lease went to another"
        assert rounds.take_lease(TENANT, "moving", "worker-2", 60) is not None, "a moving round kept its lease"
    assert stuck.stalled.is_set() and not moving.stalled.is_set() and len(said) == 1
# --- group members, deletions and ehr check (issue 44) ---------------------------------------------------

def observations_of(stack: Stack, patient: str, count: int) -> list[str]:
    bundle = requests.get(f"{stack.upstream}/Observation", params={"patient": patient, "_count": str(count)},
                          timeout=30).json()
    return [f"Observation/{e['resource']['id']}" for e in bundle["entry"]]


def test_deletions_apply_to_members_however_the_group_names_them(stack):
    """The SMART reference server names members `urn:uuid:<id>`; others write absolute URLs, or
    only the patient's identifier. A deleted resource of a member with nothing else in the round
    was kept (and the round said "1 deleted"); now it is removed, in each form."""
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    refs = observations_of(stack, PID, 3)
    for form, ref in zip(("urn", "absolute", "identifier"), refs):
        assert held_resource(stack, PID, ref) is not None
        stack.test_api("delete", {"ref": ref})
        with bulk_misbehaving(stack, members=form):
            synced = stack.cli("sync", "--tenant", TENANT)
        assert synced.returncode == 0, synced.stdout + synced.stderr
        assert held_resource(stack, PID, ref) is None, (form, synced.stdout)
        assert "1 deleted at the EHR (1 removed here)" in synced.stdout, synced.stdout
    consistent(stack)


def test_ehr_check_reads_the_group_by_its_id_and_names_one_the_ehr_does_not_have(stack):
    """This server, like the reference one, ignores `_id` in a Group search and answers every
    Group: `ehr check` passed a Group that does not exist and counted another group's members."""
    put(stack, {"resourceType": "Group", "id": "a-larger-group", "type": "person", "actual": True,
                "member": [{"entity": {"reference": f"Patient/{p}"}} for p in (PID, OTHER, PID)]})
    assert stack.cli("ehr", "update", TENANT, "--group-id", "NoSuchGroup").returncode == 0
    try:
        missing = stack.cli("ehr", "check", TENANT)
    finally:
        assert stack.cli("ehr", "update", TENANT, "--group-id", GROUP).returncode == 0
    assert missing.returncode == 1 and "[FAIL] group" in missing.stdout, missing.stdout
    assert "the EHR has no Group NoSuchGroup" in missing.stdout
    with bulk_misbehaving(stack, members="urn"):
        checked = json.loads(stack.cli("ehr", "check", TENANT, "--json").stdout)
    group = next(c for c in checked if c["name"] == "group")
    assert group["status"] == "ok" and group["detail"] == "the registered Group was found (2 members)", group


def test_a_failed_full_round_says_where_the_cursor_really_stays(stack):
    """An incomplete `--full` round said "the cursor stays at none (the next round is a full one)";
    the cursor kept its value and the next round was incremental."""
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    cursor = cursor_of(stack)
    with bulk_misbehaving(stack, fail_types=["Condition"]):
        failed = stack.cli("sync", "--tenant", TENANT, "--full")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"the cursor stays at {cursor}" in failed.stdout and "none" not in failed.stdout, failed.stdout
    status = json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["last_sync_status"]
    assert f"the cursor stays at {cursor}," in status, status
    stack.test_api("clear-log")
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    assert kickoffs(stack)[-1]["args"]["_since"] == [cursor]


def test_every_skipped_resource_is_named_in_the_round_and_in_ehr_list(stack):
    """A note whose text lives only at a URL cannot be read in a Bulk round: the round said
    "1 skipped" and never which."""
    note = {"resourceType": "DocumentReference", "id": "bulk-url-note", "status": "current",
            "subject": {"reference": f"Patient/{PID}"}, "date": "2024-05-02T10:00:00Z",
            "type": {"text": "Progress note"},
            "content": [{"attachment": {"contentType": "application/pdf", "url": "https://elsewhere.example/n.pdf"}}]}
    put(stack, note)
    synced = stack.cli("sync", "--tenant", TENANT)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "skipped: DocumentReference/bulk-url-note: note text could not be read" in synced.stdout, synced.stdout
    listed = stack.cli("ehr", "list")
    assert f"skipped in the last round of group {GROUP}: DocumentReference/bulk-url-note" in listed.stdout, listed.stdout
    status = json.loads(stack.cli("ehr", "list", "--json").stdout)[0]["last_sync_status"]
    assert "1 skipped: DocumentReference/bulk-url-note" in status, status


def test_a_backdated_resource_widens_the_next_round_once(stack):
    """The EHR sends one resource dated before `_since` in every round that reaches back to its
    real change: each round reached back a day again, re-exporting everything changed that day.
    Now the round that meets it a second time does not widen the next one."""
    assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    put(stack, condition("bulk-once-condition", OTHER, "Backdated once"))
    with bulk_misbehaving(stack, backdate="2001-01-01T00:00:00Z", backdate_only=["Condition/bulk-once-condition"]):
        assert stack.cli("sync", "--tenant", TENANT).returncode == 0        # meets it: reaches back
        stack.test_api("clear-log")
        again = stack.cli("sync", "--tenant", TENANT)                       # meets it again
        assert again.returncode == 0, again.stdout + again.stderr
        assert kickoffs(stack)[-1]["args"]["_since"][0] < cursor_of(stack)
        cursor = cursor_of(stack)
        stack.test_api("clear-log")
        assert stack.cli("sync", "--tenant", TENANT).returncode == 0
    assert kickoffs(stack)[-1]["args"]["_since"] == [cursor]                # no reach back a second time
    assert held_resource(stack, OTHER, "Condition/bulk-once-condition")["code"]["text"] == "Backdated once"


# --- pacing and concurrent downloads ---------------------------------------------------------------------

def file_reads(stack: Stack, name: str = "") -> list[dict]:
    return [e for e in stack.ehr_log() if "/bulk-files/" in e["path"] and name in e["path"]]


def test_a_file_read_again_after_its_retries_waits_for_the_ehrs_retry_after(stack):
    """A file that answers 503 with Retry-After 1 until the client's retries run out is read again
    by the round; that next series began 0.01 s after the last 503."""
    stack.test_api("faults", {"kind": "503", "retry_after": 1, "path": "Condition.ndjson", "times": 6})
    try:
        stack.test_api("clear-log")
        synced = stack.cli("sync", "--tenant", TENANT, "--full")
    finally:
        stack.test_api("clear-faults")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    reads = file_reads(stack, "Condition.ndjson")
    gaps = [b["at"] - a["at"] for a, b in zip(reads, reads[1:])]
    assert len(reads) == 7 and all(gap >= 0.95 for gap in gaps), gaps


def test_output_files_download_at_once_within_the_request_budget(stack):
    """Ten files each answering after 1.5 s took 15 s and more, one after another. Now as many
    download at once as the EHR's budget allows in flight (2 here), never more."""
    with bulk_misbehaving(stack, split=10, file_delay=1.5):
        stack.test_api("clear-log")
        synced = stack.cli("sync", "--tenant", TENANT, "--full")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    starts = sorted(e["at"] for e in file_reads(stack))
    assert len(starts) >= 6, len(starts)
    overlapping = [b - a for a, b in zip(starts, starts[1:]) if b - a < 1.0]
    assert overlapping, starts                                     # two began within one file's delay
    assert all(c - a >= 1.4 for a, c in zip(starts, starts[2:])), starts    # never three at once
    consistent(stack)

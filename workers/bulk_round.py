"""A Backend Services + Bulk Data round, as plain functions: `chartcite sync` and the Celery tasks
(workers/tasks.py) call them. The round's state lives in the registry database
(fhir_ingest/connection/rounds.py), so any process can take a round up where another left it.

1. The (registration, group)'s lease is taken, or the sync says who holds it.
2. The group's open round is resumed, or one is started: a full round when asked, when no round of
   this group completed before, or when the index holds none of the tenant's patients (said, in
   each case); otherwise from the group's cursor.
3. Export: the types chartcite reads that the EHR offers (its CapabilityStatement) and grants (the
   token's scopes), or hospital IT's own list; kick-off and polite polling.
4. Each file is downloaded into the shared staging, resumed where a transfer broke. A file that
   still fails leaves the round open: the next sync downloads that file alone.
5. The `deleted` list is applied, each resource for the patients of the round holding it.
6. The patients are split into parts, each indexed as its own task: on any Celery worker, or here,
   one after another. A part is claimed by one worker at a time; a worker that dies lets go.
7. The part that finishes last finishes the round: the cursor advances only when every file was
   read and indexed and the EHR reported none missing; the staging is emptied; the lease released.

Whole-record replacement only on proof: only a full round, asked without `_since`, that the EHR
exported without errors, replaces each patient's record with what it holds. An incremental
round merges and removes only what its `deleted` list names; resources dated before `_since`
(an EHR that ignores it, or clocks that disagree) only make later rounds reach further back.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from contextlib import closing
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

from fhir_ingest.connection.bulk import (BulkExport, BulkExportError, GroupNotFound, Manifest, SinceCheck,
                                         bulk_types, capability_statement, granted_types, group_members, instant,
                                         iso_instant)
from fhir_ingest.connection.bulk_staging import FileProgress, FileRestarted, StagedExport, download_file
from fhir_ingest.connection.client import FhirClient, FhirError, FhirUnavailable
from fhir_ingest.connection.fetch import declared_resources
from fhir_ingest.connection.registry import Ehr, Registry
from fhir_ingest.connection.rounds import ROUND_MAX_AGE, BulkRound, Rounds, holder_name
from fhir_ingest.connection.smart_auth import BackendServicesToken
from fhir_ingest.record.load import ANY_TYPE, LoadReport, RecordAssembler, shared_refs
from fhir_ingest.record.staging import HeldInMemory

from .progress import job_store

log = logging.getLogger(__name__)

Say = Callable[..., None]          # phase, done, total, note
# A file whose transfer breaks is resumed this many times in one sync before it is left to the next.
FILE_ATTEMPTS = 3
# A round that finds resources dated before its `_since` reaches back at most this far next time.
MAX_REACH_BACK = 24 * 3600.0
# "The EHR ignored _since" is said only when most of at least this many dated resources predate it:
# fewer cannot tell an EHR that ignores it from one that backdated a change or two.
SINCE_EVIDENCE = 20
# Skipped resources named on the registration's one-line status (the round's report names them all).
STATUS_SKIPPED = 5


class SyncRunning(RuntimeError):
    """Another sync holds this (registration, group)."""


class NoGroup(RuntimeError):
    """The registration has no Bulk Data group and none was given."""


class ClaimLost(RuntimeError):
    """This worker's claim on a part (or its round's lease) went to another: it stops, that one goes on."""


@dataclass
class RoundDeps:
    """What the steps of a round share: the settings, the registry and the rounds kept in it, the
    shared staging, and the search service the parts index with."""
    settings: object
    registry: Registry
    rounds: Rounds
    staging: StagedExport
    service: object

    @property
    def lease(self) -> float:
        return float(self.settings.sync_lease_seconds)

    @property
    def stall(self) -> float:
        return float(self.settings.sync_stall_seconds)

    def say_nothing(self, *args) -> None:
        return None


@lru_cache(maxsize=8)
def _rounds(engine) -> Rounds:
    return Rounds(engine)


@lru_cache(maxsize=8)
def _staging(url: str) -> StagedExport:
    return StagedExport(url)


def round_deps(settings, registry: Registry, service) -> RoundDeps:
    return RoundDeps(settings, registry, _rounds(registry.engine), _staging(settings.bulk_staging_db), service)


class Heartbeat:
    """Renews a lease or a claim while the work it covers makes progress, so that it outlives a
    long export or a long part and lapses soon after its holder dies or hangs. A beat every
    `every` seconds renews it only when `progress()` was called in the last `stall` seconds: a
    round stuck (in a model that never returns, on a socket that never answers) stops renewing
    whatever its threads do, says so once (`stalled`, `on_stall`) and lets go, so another worker
    or the next sync takes it up. `lost` is set when a renewal finds it taken by another, or when
    it stalled."""

    def __init__(self, renew: Callable[[], bool], every: float, stall: float,
                 on_stall: Callable[[float], None] | None = None):
        self.renew, self.every, self.stall, self.on_stall = renew, max(0.5, every), stall, on_stall
        self.lost, self.stalled, self._stop = threading.Event(), threading.Event(), threading.Event()
        self.last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="chartcite-lease", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def progress(self, *args, **kwargs) -> None:
        """A file, a batch of lines, a poll or a patient done: the work moves."""
        self.last_progress = time.monotonic()

    def saying(self, say: Say) -> Say:
        """`say`, counting each call as progress."""
        def said(*args, **kwargs) -> None:
            self.progress()
            say(*args, **kwargs)
        return said

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            idle = time.monotonic() - self.last_progress
            if idle > self.stall:
                if not self.stalled.is_set():
                    self.stalled.set()
                    self.lost.set()
                    log.warning("a sync made no progress for %.0f s: its lease is let go", idle)
                    if self.on_stall:
                        try:
                            self.on_stall(idle)
                        except Exception:
                            log.warning("could not record a stalled sync")
                continue
            try:
                if not self.renew():
                    self.lost.set()
            except Exception:       # the registry unreachable for a moment: the next beat tries again
                log.warning("could not renew a sync lease; trying again in %.0f s", self.every)


# --- the round from start to hand-over ------------------------------------------------------------------

def run_bulk_sync(settings, registry: Registry, ehr: Ehr, service, group_id: str = "", progress: Say | None = None,
                  full: bool = False, dispatch: Callable[[str, int], None] | None = None,
                  allow_removals: bool = False) -> dict:
    """One round for the registration's group (or `group_id`), resumed if one is open: run to its
    end here, or, with `dispatch` (a function queueing one part), handed to the workers once its
    files are read. Returns the round's summary, or where it stands when it was handed over or
    left open (files that could not be read)."""
    deps, say = round_deps(settings, registry, service), progress or (lambda *args: None)
    group = group_id or ehr.group_id
    if not group:
        raise NoGroup(f"{ehr.name} has no Bulk Data group: register the one the EHR defines for chartcite "
                      f"(`chartcite ehr update {ehr.name} --group-id ID`) or pass --group; chartcite never exports "
                      "every patient of an EHR")
    holder = f"{holder_name()}:{uuid.uuid4().hex[:8]}"
    held = deps.rounds.take_lease(ehr.name, group, holder, deps.lease)
    if held is not None:
        raise SyncRunning(running_sentence(ehr.name, group, held.holder, held.expires_at))
    handed_over = False
    try:
        sweep_ended_rounds(deps)
        def stalled(idle: float) -> None:
            deps.rounds.release_lease(ehr.name, group, holder)
            registry.record_sync(ehr.name, stalled_words(idle))
            job_store(settings).add("bulk_warnings", "stalled")

        with Heartbeat(lambda: deps.rounds.renew_lease(ehr.name, group, holder, deps.lease), deps.lease / 4,
                       deps.stall, stalled) as beat:
            say = beat.saying(say)
            round_ = advance(deps, ehr, begin_round(deps, ehr, group, full, holder, allow_removals), say)
            if round_.state == "indexing" and dispatch is not None:
                handed_over = dispatch_parts(deps, round_.id, dispatch)
            elif round_.state == "indexing":
                run_parts_here(deps, round_.id, say)
        summary = round_summary(deps, deps.rounds.round(round_.id))
        if summary["state"] == "incomplete":
            registry.record_sync(ehr.name, bulk_status(summary))
        return summary
    finally:
        if not handed_over:
            deps.rounds.release_lease(ehr.name, group, holder)


def stalled_words(idle: float) -> str:
    return (f"stalled: no file, line or patient done for {idle:.0f} s (CHARTCITE_SYNC_STALL_SECONDS); its lease was "
            f"let go, so another worker or the next sync takes the round up where it stopped")


def sweep_ended_rounds(deps: RoundDeps) -> int:
    """Staged resources of rounds that ended, or whose rows are gone (a process killed between a
    round's end and its clean-up), are removed: patient data is kept only while a round needs it."""
    ended = [rid for rid in deps.staging.round_ids()
             if (found := deps.rounds.round(rid)) is None or found.state in ("done", "abandoned")]
    for round_id in ended:
        deps.staging.remove(round_id)
    return len(ended)


def running_sentence(tenant: str, group: str, holder: str, expires_at: float) -> str:
    until = time.strftime("%H:%M:%S UTC", time.gmtime(expires_at))
    return (f"a sync of {tenant} (group {group}) is already running ({holder}); it holds the group until {until} "
            "and keeps renewing that while it runs. If its process died, the next sync after then takes its "
            "round up where it stopped")


def begin_round(deps: RoundDeps, ehr: Ehr, group: str, full: bool, holder: str,
                allow_removals: bool = False) -> BulkRound:
    """The group's open round, taken up by this holder, or a new one."""
    open_ = deps.rounds.open_round(ehr.name, group)
    if open_ is not None and time.time() - open_.started_at > ROUND_MAX_AGE:
        abandon(deps, open_, f"it was started over {ROUND_MAX_AGE / 3600:.0f} hours ago: its files have expired")
        open_ = None
    if open_ is not None and full and not open_.full:
        abandon(deps, open_, "a full round was asked for, which holds everything it would have")
        open_ = None
    if open_ is not None:
        deps.rounds.update_round(open_.id, lease_holder=holder, allow_removals=open_.allow_removals or allow_removals)
        deps.rounds.add_note(open_.id, f"taken up again at {iso_instant(time.time())}, where it stopped "
                                       f"({open_.state})")
        return deps.rounds.round(open_.id)
    since, notes = round_since(deps, ehr, group, full)
    return deps.rounds.new_round(ehr.name, group, since, notes, holder, allow_removals)


def round_since(deps: RoundDeps, ehr: Ehr, group: str, full: bool) -> tuple[str, list[str]]:
    """The `_since` of a new round ("" = full) and why a round is full when it was not asked to be."""
    if full:
        return "", ["a full round, as asked: each patient's record is replaced by what the EHR exports"]
    cursor = deps.rounds.cursor(ehr.name, group)
    if cursor is None or not cursor.since:
        return "", [f"no round of group {group} has completed before: a full round"]
    if not deps.service.has_patients(ehr.name):
        return "", [f"the index holds none of {ehr.name}'s patients: a full round, not changes since "
                    f"{cursor.since}"]
    start = instant(cursor.since)
    if cursor.reach_back and start is not None:
        return iso_instant(start - cursor.reach_back), []
    return cursor.since, []


def advance(deps: RoundDeps, ehr: Ehr, round_: BulkRound, say: Say) -> BulkRound:
    """The round taken as far as this process takes it: exported, its files read, its parts made."""
    if round_.state == "exporting":
        export_round(deps, ehr, round_, say)
    round_ = deps.rounds.round(round_.id)
    if round_.state == "downloading":
        download_round(deps, ehr, round_, say)
    round_ = deps.rounds.round(round_.id)
    if round_.state == "finishing":
        complete_round(deps, round_.id)
    return deps.rounds.round(round_.id)


def abandon(deps: RoundDeps, round_: BulkRound, reason: str) -> None:
    """A round that cannot be finished: its staged resources removed, its cursor unmoved."""
    deps.rounds.add_note(round_.id, f"abandoned: {reason}")
    deps.rounds.update_round(round_.id, state="abandoned")
    deps.staging.remove(round_.id)
    log.warning("a Bulk round was abandoned: %s", reason)


# --- export ---------------------------------------------------------------------------------------------

def signed_in_client(deps: RoundDeps, ehr: Ehr, types: list[str], group: str, statement: dict) -> tuple[
        FhirClient, BackendServicesToken]:
    """A FHIR client on a Backend Services token for exactly these types (and the Group, to read
    its members), signed in now so that a refusal is said before anything else happens."""
    from .sync import ehr_client

    declared = declared_resources(statement)
    scoped = types + (["Group"] if group and (not declared or "Group" in declared) else [])
    auth = BackendServicesToken(deps.registry, ehr, scoped)
    client = ehr_client(deps.settings, deps.registry, ehr, auth=auth)
    auth.token()
    return client, auth


def export_round(deps: RoundDeps, ehr: Ehr, round_: BulkRound, say: Say) -> None:
    """Kick-off (unless the round already has a status URL) and wait for the manifest; the files,
    the deletions and what the EHR could not export are recorded with the round."""
    from .sync import ehr_client

    statement = capability_statement(ehr_client(deps.settings, deps.registry, ehr))
    types, left_out = bulk_types(statement, ehr.bulk_types)
    client, auth = signed_in_client(deps, ehr, types, round_.group_id, statement)
    types, not_granted = granted_types(types, auth.granted)
    for line in left_out + not_granted:
        deps.rounds.add_note(round_.id, f"not exported: {line}")
    export = BulkExport(client)
    status_url = round_.status_url or start_export(deps, client, export, round_, types)
    try:
        manifest = export.wait(status_url, progress=say)
    except BulkExportError as exc:
        abandon(deps, round_, f"the EHR's export failed: {exc}")
        raise
    record_manifest(deps, round_.id, export, manifest)


def start_export(deps: RoundDeps, client: FhirClient, export: BulkExport, round_: BulkRound, types: list[str]) -> str:
    """The kick-off, after checking the Group exists; a refusal (no such Group, a kick-off the EHR
    turns down) ends the round there, so no round stays open for an export that never began."""
    try:
        check_group(client, round_.group_id)
        status_url = export.kickoff(round_.group_id, types, round_.since)
    except BulkExportError as exc:
        abandon(deps, round_, f"the export could not start: {exc}")
        raise
    deps.rounds.update_round(round_.id, status_url=status_url, types=",".join(types))
    return status_url


def check_group(client: FhirClient, group: str) -> None:
    """A Group the EHR does not have is an error with a sentence, not an empty round."""
    try:
        client.get_json(f"Group/{group}")
    except FhirError as exc:
        if exc.status in (404, 410):
            raise GroupNotFound(f"the EHR has no Group {group}: check the group id (`chartcite ehr update NAME "
                                f"--group-id ID`, or --group) against the Bulk Data group the EHR defines", 404) from exc
        if exc.status not in (401, 403):
            raise       # a Group chartcite may not read is left to the kick-off to judge


def record_manifest(deps: RoundDeps, round_id: str, export: BulkExport, manifest: Manifest) -> None:
    errors, warnings = export.error_issues(manifest)
    deleted = export.deleted_refs(manifest)
    deps.rounds.add_files(round_id, [("output", str(o.get("type", "")), o["url"]) for o in manifest.outputs])
    for warning in warnings:
        deps.rounds.add_note(round_id, f"the EHR noted: {warning}")
    deps.rounds.update_round(round_id, state="downloading", manifest=json.dumps(manifest.to_json()),
                             transaction_time=manifest.transaction_time, deleted=json.dumps(deleted),
                             export_errors=json.dumps(errors))


# --- download -------------------------------------------------------------------------------------------

def download_round(deps: RoundDeps, ehr: Ehr, round_: BulkRound, say: Say) -> None:
    """Every file not yet read, into the staging; then the deletions and the parts. A file that
    cannot be read after its attempts is marked failed and the round stays open for the next sync."""
    from .sync import ehr_client

    statement = capability_statement(ehr_client(deps.settings, deps.registry, ehr))
    client, _ = signed_in_client(deps, ehr, round_.types.split(",") if round_.types else [], round_.group_id,
                                 statement)
    manifest = Manifest.from_json(json.loads(round_.manifest))
    files = deps.rounds.files(round_.id, "output")
    read_files(deps, BulkExport(client), round_, manifest, [f for f in files if f.state != "done"],
               lambda done: say("downloading", done, len(files), "files"), len(files), say)
    if any(f.state != "done" for f in deps.rounds.files(round_.id, "output")):
        return
    make_parts(deps, client, round_)


def read_files(deps: RoundDeps, export: BulkExport, round_: BulkRound, manifest: Manifest, files: list,
               said: Callable[[int], None], total: int, say: Say | None = None) -> None:
    """The files read several at once, as many as the EHR's request budget lets run in flight (a
    file's body holds its budget slot until it is read, so downloads and any other request to the
    EHR share the budget); one file's parsing overlaps another's transfer. A file that ends the round stops the rest.
    `say` hears each file's lines as they come, which is the progress that keeps the lease."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    done = total - len(files)
    said(done)
    if not files:
        return
    with ThreadPoolExecutor(max_workers=download_slots(deps.settings, len(files)),
                            thread_name_prefix="chartcite-bulk-file") as pool:
        pending = {pool.submit(read_file, deps, export, round_, manifest, file, say) for file in files}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                if future.exception() is not None:
                    for other in pending:
                        other.cancel()
                    raise future.exception()
                done += 1
                said(done)


def download_slots(settings, files: int) -> int:
    """Files downloaded at once: the requests the EHR's budget allows in flight, at least one."""
    return max(1, min(files, int(settings.fhir_max_concurrency)))


def read_file(deps: RoundDeps, export: BulkExport, round_: BulkRound, manifest: Manifest, file,
              say: Say | None = None) -> None:
    """One output file, resumed from its recorded progress when the EHR shows it unchanged, else
    read again from its start; expired files abandon the round."""
    saved = json.loads(file.report or "{}")
    report, since = LoadReport(), SinceCheck(round_.since, backdated_before(deps, round_))
    report.merge_dict(saved.get("load") or {})
    since.resume(saved.get("since") or {})

    def recorded(progress: FileProgress) -> None:
        deps.rounds.update_file(round_.id, file.n, lines=progress.lines, bytes=progress.bytes,
                                validator=progress.validator,
                                report=json.dumps({"load": report.to_dict(), "since": since.to_dict()}))
        if say:
            say("downloading", progress.lines, 0, f"{file_name(file)}: lines")

    progress, error, attempts = FileProgress(file.lines, file.bytes, file.validator), "", 0
    while attempts < FILE_ATTEMPTS:       # a restart from byte 0 is no failed attempt: it cannot recur
        try:
            download_file(export, deps.staging, round_.id, file.n, file.url, file_name(file), manifest.requires_token,
                          progress, report, since, recorded)
            deps.rounds.update_file(round_.id, file.n, state="done", error="")
            return
        except FileRestarted as exc:
            # What was read of it came from another version of the file: it counts for nothing.
            deps.rounds.add_note(round_.id, str(exc))
            report, since, progress = LoadReport(), SinceCheck(round_.since, backdated_before(deps, round_)), FileProgress()
            recorded(progress)
        except (FhirUnavailable, BulkExportError) as exc:
            if exc.status in (404, 410):
                abandon(deps, round_, f"the EHR no longer serves its files ({exc})")
                raise
            error, attempts = str(exc), attempts + 1
            fresh = deps.rounds.files(round_.id)[file.n]
            progress = FileProgress(fresh.lines, fresh.bytes, fresh.validator)
    deps.rounds.update_file(round_.id, file.n, state="failed", error=error[:500], attempts=file.attempts + 1)
    log.warning("a Bulk output file could not be read (%s); the next sync reads it again from where it stopped",
                error[:200])


def backdated_before(deps: RoundDeps, round_: BulkRound) -> set[str]:
    """The resources the group's last completed round found dated before its `_since`."""
    for earlier in deps.rounds.rounds(round_.tenant, limit=50):          # the newest first
        if earlier.group_id == round_.group_id and earlier.state == "done" and earlier.id != round_.id:
            summary = json.loads(earlier.summary or "{}")
            if summary.get("state") == "done":
                return set((summary.get("since_seen") or {}).get("backdated") or [])
    return set()


def file_name(file) -> str:
    """How the report names a file's lines: its type and its place in the manifest."""
    return f"{file.type or 'output'}.{file.n}.ndjson"


def make_parts(deps: RoundDeps, client: FhirClient, round_: BulkRound) -> None:
    """Every file read: the deletions applied, and the patients split into parts."""
    patients = deps.staging.patients(round_.id)
    removed, applied, notes = apply_deletions(deps.service, client, round_.tenant, round_.group_id,
                                              json.loads(round_.deleted), patients)
    size = max(1, int(deps.settings.bulk_patients_per_part))
    parts = [patients[start:start + size] for start in range(0, len(patients), size)]
    deps.rounds.add_parts(round_.id, parts)
    deps.rounds.update_round(round_.id, state="indexing" if parts else "finishing",
                             summary=json.dumps({"deletion_removed": removed, "deletion_applied": applied,
                                                 "deletion_notes": notes}))


# --- deletions ------------------------------------------------------------------------------------------

@dataclass
class Deletions:
    """What a round's `deleted` list removes, per patient, and what it could not place."""
    by_patient: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def scoped_deletions(refs: list[str], holders: dict[str, set[str]], round_patients: set[str] | None) -> Deletions:
    """Where each resource a Bulk round lists as deleted is removed. The entry names only Type/id,
    which is one patient's at the EHR; but another input may have put the same Type/id under
    another patient of the tenant. So it is removed only for the patients of the round
    (`round_patients`; None: not known, then only when a single patient holds it) whose held
    record holds it, never guessed; the rest is kept and reported, as is any Type/id several
    patients hold."""
    deletions = Deletions()
    for ref in dict.fromkeys(refs):
        holding = holders.get(ref, set())
        if round_patients is not None:
            applies = holding & round_patients
        else:
            applies = holding if len(holding) == 1 else set()
        for patient_id in sorted(applies):
            deletions.by_patient.setdefault(patient_id, []).append(ref)
        if len(holding) > 1 or holding - applies:
            deletions.notes.append(deletion_note(ref, holding, applies, round_patients is not None))
    return deletions


def deletion_note(ref: str, holding: set[str], applies: set[str], members_known: bool) -> str:
    removed = f"removed for {', '.join(sorted(applies))}" if applies else "removed for none of them"
    kept = holding - applies
    why = ("not patients of this export" if members_known else
           "the export's patients are not known, and the entry does not say whose it was")
    return (f"{ref}, deleted at the EHR, is held for {len(holding)} patient(s) of this tenant: {removed}"
            + (f"; kept for {', '.join(sorted(kept))} ({why})" if kept else ""))


def round_patients(client: FhirClient, group_id: str, exported: list[str]) -> tuple[set[str] | None, list[str]]:
    """The patients a round is about (the Group's members and whoever the export holds), and a
    note when the Group could not be read."""
    try:
        members = group_members(client, group_id)
    except FhirUnavailable:
        raise
    except FhirError as exc:
        return None, [f"the Group {group_id} could not be read ({exc}): a deleted resource was removed only where "
                      f"a single patient held it"]
    notes = [f"the Group {group_id} has {len(members.unread)} member(s) chartcite cannot read as a patient: "
             f"{'; '.join(members.unread[:5])}; a deleted resource is removed only for the members it can read"
             ] if members.unread else []
    if members.unread:
        log.warning("a Bulk Data Group has %d member(s) chartcite cannot read as a patient", len(members.unread))
    return members.patients | set(exported), notes


def apply_deletions(service, client: FhirClient, tenant: str, group_id: str, deleted: list[str],
                    exported: list[str]) -> tuple[int, int, list[str]]:
    """The round's `deleted` list applied, each resource for the patient(s) of the round holding
    it, the summaries counting without them (in the same write). Returns the chunks removed, how
    many of the listed resources were removed for someone, and the report's notes."""
    if not deleted:
        return 0, 0, []
    members, notes = round_patients(client, group_id, exported)
    deletions = scoped_deletions(deleted, service.holders(tenant, deleted), members)
    removed = sum(service.delete_resources(tenant, pid, refs) for pid, refs in deletions.by_patient.items())
    applied = len({ref for refs in deletions.by_patient.values() for ref in refs})
    return removed, applied, notes + deletions.notes


# --- parts ----------------------------------------------------------------------------------------------

def dispatch_parts(deps: RoundDeps, round_id: str, dispatch: Callable[[str, int], None]) -> bool:
    """Each part not done queued for the workers; the round's lease is theirs from now on."""
    for part in deps.rounds.parts(round_id):
        if part.state != "done":
            dispatch(round_id, part.n)
    return True


def run_parts_here(deps: RoundDeps, round_id: str, say: Say) -> None:
    """The embedded default: the parts one after another in this process."""
    parts = [p for p in deps.rounds.parts(round_id) if p.state != "done"]
    total = sum(len(json.loads(p.patients)) for p in parts)
    before = 0
    for part in parts:
        index_part(deps, round_id, part.n, lambda phase, done, _total, note="": say(phase, before + done, total, note))
        before += len(json.loads(part.patients))


def index_part(deps: RoundDeps, round_id: str, n: int, say: Say | None = None) -> dict:
    """One part of a round indexed by whichever worker claims it first; the part that completes
    the round finishes it. Returns the part's counts, or {"state": "done" | "busy"} when it was
    not this worker's to index."""
    holder = holder_name()
    claim = deps.rounds.claim_part(round_id, n, holder, deps.lease)
    if claim != "claimed":
        return {"part": n, "state": claim}
    round_ = deps.rounds.round(round_id)
    patients = json.loads(next(p for p in deps.rounds.parts(round_id) if p.n == n).patients)

    def renew() -> bool:
        return deps.rounds.renew_claim(round_id, n, holder, deps.lease) and \
            deps.rounds.renew_round_lease(round_id, deps.lease)

    def stalled(idle: float) -> None:
        deps.rounds.fail_part(round_id, n, holder, stalled_words(idle), retrying=True)
        job_store(deps.settings).add("bulk_warnings", "stalled")

    try:
        with Heartbeat(renew, deps.lease / 4, deps.stall, stalled) as beat:
            result = index_patients(deps, round_, patients, beat.saying(say or deps.say_nothing), beat)
    except ClaimLost:
        log.warning("a Bulk part was taken over by another worker: this one stops")
        return {"part": n, "state": "busy"}
    except BaseException as exc:
        from .sync import TRANSIENT

        deps.rounds.fail_part(round_id, n, holder, f"{type(exc).__name__}: {exc}", retrying=isinstance(exc, TRANSIENT))
        raise
    finished, left = deps.rounds.finish_part(round_id, n, holder, result)
    if finished and left == 0 and deps.rounds.move_round(round_id, "indexing", "finishing"):
        complete_round(deps, round_id)
    return {"part": n, "state": "done"} | {k: v for k, v in result.items() if k != "report"}


def index_patients(deps: RoundDeps, round_: BulkRound, patients: list[str], say: Say, beat: Heartbeat) -> dict:
    """The part's patients from the staging, each record assembled and checked as any input's,
    indexed a few at a time, searchable together at the end, and marked synced."""
    from search.indexer import IndexResult

    owned = deps.staging.owned(round_.id, patients)
    shared = deps.staging.shared(round_.id, shared_refs(r for items in owned.values() for r, _ in items))
    report = LoadReport()
    assembler = RecordAssembler(report, staging=HeldInMemory(owned, shared))
    # Only a full round the EHR exported without errors is each patient's whole record, as of its
    # transactionTime, less the types it could not read whole.
    whole = round_.full and not json.loads(round_.export_errors)
    unread = unread_types(deps, round_)
    totals = IndexResult()
    name = f"Bulk round {round_.id[:8]}"
    records = (assembler.record(pid, whole=whole, as_of=round_.transaction_time, partial_types=unread, name=name)
               for pid in patients)
    with deps.service.deferred_refresh():
        with closing(deps.service.index_in_turn(round_.tenant, records, report, round_.allow_removals)) as indexed:
            for done, result in enumerate(indexed, start=1):
                if beat.lost.is_set():
                    raise ClaimLost("another worker took this part over")
                totals.merge(result)
                say("indexing", done, len(patients))
    # Marked synced once searchable: a failure before the refresh leaves the part to be indexed again.
    synced_at = "" if ahead_of_clock(round_.transaction_time) else round_.transaction_time
    for pid in patients:
        deps.registry.mark_patient_synced(round_.tenant, pid, synced_at)
    return {"patients": totals.patients, "resources": totals.resources, "chunks": totals.chunks,
            "embedded": totals.embedded, "removed": totals.removed, "problems": len(totals.problems),
            "problem_list": [[p.ref, p.reason] for p in totals.problems[:LoadReport.KEPT]],
            "report": report.to_dict()}


def unread_types(deps: RoundDeps, round_: BulkRound) -> dict[str, str]:
    """The types a round could not read whole (a file with a line it could not read): the round
    removes nothing of them. A file of no stated type stands for every type."""
    unread = {}
    for file in deps.rounds.files(round_.id, "output"):
        count = (json.loads(file.report or "{}").get("load") or {}).get("skipped_count", 0)
        if count:
            unread.setdefault(file.type or ANY_TYPE, f"a Bulk round that could not read {count} line(s) of "
                                                     f"{file_name(file)}")
    return unread


# --- the end of a round ---------------------------------------------------------------------------------

def complete_round(deps: RoundDeps, round_id: str) -> dict:
    """Every part indexed: the cursor advances if every file was read and the EHR reported none
    missing; the registration's status says how it went; the staging is emptied; the lease let go."""
    round_ = deps.rounds.round(round_id)
    summary = round_summary(deps, round_) | {"state": "done" if not json.loads(round_.export_errors) else "incomplete"}
    ahead = ahead_of_clock(round_.transaction_time)
    if ahead:
        summary["cursor_refused"] = ahead
        job_store(deps.settings).add("bulk_warnings", "future_cursor")
        log.warning("a Bulk round's transactionTime is ahead of the clock: the cursor stays where it was")
    elif summary["state"] == "done":
        deps.rounds.advance_cursor(round_.tenant, round_.group_id, round_.transaction_time, reach_back(summary))
    deps.registry.record_sync(round_.tenant, bulk_status(summary))
    deps.staging.remove(round_id)
    deps.rounds.update_round(round_id, state="done", summary=json.dumps(summary))
    deps.rounds.release_lease(round_.tenant, round_.group_id, round_.lease_holder)
    job_store(deps.settings).add("bulk_syncs", "done" if summary["state"] == "done" else "incomplete")
    for kind in ("held_back", "not_removed"):
        if summary.get(kind):
            job_store(deps.settings).add("bulk_warnings", kind)
    log.info("bulk round finished: %s patients, %s resources, %s chunks embedded, %s export errors",
             summary["patients"], summary["resources"], summary["embedded"], summary["export_errors"])
    return summary


# How far ahead of this machine's clock the EHR's may run before its transactionTime is refused.
CLOCK_SKEW = 300.0


def ahead_of_clock(transaction_time: str, now: float | None = None) -> str:
    """Why a transactionTime may not become the next `_since` (after now, beyond the clock skew
    allowed: every later round would ask for changes after it, and see none), or ''."""
    moment = instant(transaction_time)
    now = time.time() if now is None else now
    if moment is None or moment <= now + CLOCK_SKEW:
        return ""
    return (f"the EHR's transactionTime {transaction_time} is after now ({iso_instant(now)}): refused as the next "
            f"_since, the cursor stays at its last good value")


def reach_back(summary: dict) -> float:
    """How far before its cursor the next round asks: as far back as this round's resources dated
    before its `_since` went (clocks that disagree), at most a day; resources the round before
    already found backdated do not count again (`SinceCheck`), so one reaches back once."""
    seen = summary.get("since_seen") or {}
    start = instant(summary.get("since") or "")
    if seen.get("earliest") is None or start is None:
        return 0.0
    return min(MAX_REACH_BACK, max(0.0, start - seen["earliest"]))


def round_summary(deps: RoundDeps, round_: BulkRound) -> dict:
    """What the round did and where it stands, from its files, parts and notes (no patient data
    beyond the deletion notes' ids, which the person running the sync needs)."""
    if round_.state == "done" and round_.summary:
        stored = json.loads(round_.summary)
        if "state" in stored:
            return stored
    files, parts = deps.rounds.files(round_.id, "output"), deps.rounds.parts(round_.id)
    report = LoadReport()
    for file in files:
        report.merge_dict(json.loads(file.report or "{}").get("load") or {})
    results = [json.loads(p.result or "{}") for p in parts]
    for result in results:
        report.merge_dict(result.get("report") or {})
    total = lambda key: sum(r.get(key, 0) for r in results)
    early = json.loads(round_.summary or "{}")
    seen = SinceCheck.summed([json.loads(f.report or "{}").get("since") or {} for f in files])
    errors = json.loads(round_.export_errors)
    cursor = deps.rounds.cursor(round_.tenant, round_.group_id)
    return {"round": round_.id, "group": round_.group_id, "state": open_state(round_, files, parts),
            "patients": total("patients"), "resources": report.resources_read, "chunks": total("chunks"),
            "embedded": total("embedded"), "deleted": len(json.loads(round_.deleted)),
            "deletions_applied": early.get("deletion_applied", 0),
            "removed_chunks": total("removed") + early.get("deletion_removed", 0),
            "skipped": len(report.skipped) + total("problems"), "skipped_items": skipped_items(report, results),
            "export_errors": len(errors),
            "export_error_words": errors[:5], "failed_files": [f"{file_name(f)}: {f.error}" for f in files
                                                               if f.state == "failed"],
            "transaction_time": round_.transaction_time, "since": round_.since, "full_export": round_.full,
            "cursor": cursor.since if cursor is not None else "",
            "since_ignored": since_ignored(seen), "since_seen": seen,
            "deletion_notes": early.get("deletion_notes", []), "notes": json.loads(round_.notes),
            "held_back": [f"{i.origin}: {i.reason}" for i in report.held_back],
            "not_removed": [f"{i.origin}: {i.reason}" for i in report.not_removed],
            "parts": len(parts), "parts_done": sum(p.state == "done" for p in parts)}


def skipped_items(report: LoadReport, part_results: list[dict]) -> list[str]:
    """Every resource the round left out, with where it was read or its reference, and why."""
    return [f"{s.origin}: {s.reason}" for s in report.skipped] + \
        [f"{ref}: {reason}" for result in part_results for ref, reason in result.get("problem_list") or []]


def since_ignored(seen: dict) -> bool:
    """Whether the export shows the EHR ignored `_since`: most of what it dated predates it, over
    enough resources to tell that from a few backdated changes."""
    return seen["dated"] >= SINCE_EVIDENCE and seen["older"] * 2 > seen["dated"]


def open_state(round_: BulkRound, files: list, parts: list) -> str:
    """Where a round not yet summed up stands, in a word."""
    if round_.state in ("done", "abandoned"):
        return round_.state
    if any(f.state == "failed" for f in files):
        return "incomplete"
    return round_.state


def bulk_status(summary: dict) -> str:
    """The registration's last-sync line (`ehr list`, /admin): ok, or a warning (removals held
    back, types not read whole, a cursor refused) or incomplete, with why."""
    if summary["state"] == "incomplete":
        words = "; ".join(summary["failed_files"][:3] or summary["export_error_words"][:3])
        return (f"incomplete: {summary['patients']} patients indexed, but part of the export is missing ({words}); "
                f"the cursor stays at {cursor_words(summary)}, so the next sync asks again")
    counts = (f"{summary['patients']} patients, {summary['resources']} resources, {summary['deleted']} deleted at "
              f"the EHR ({summary.get('deletions_applied', 0)} removed here)")
    if summary["since_ignored"]:
        counts += (" (the EHR ignored _since and sent everything: merged, nothing removed; `chartcite sync --full` "
                   "applies deletions it does not list)")
    if summary["skipped"]:
        items = summary.get("skipped_items") or []
        counts += f", {summary['skipped']} skipped: " + "; ".join(items[:STATUS_SKIPPED]) + \
            (f"; and {summary['skipped'] - STATUS_SKIPPED} more (`chartcite ehr list` names them)"
             if summary["skipped"] > STATUS_SKIPPED else "")
    warnings = round_warnings(summary)
    if summary.get("held_back"):
        return f"held back: {counts}; " + "; ".join(warnings)
    return f"warning: {counts}; " + "; ".join(warnings) if warnings else f"ok: {counts}"


def round_warnings(summary: dict) -> list[str]:
    """What a person should know of a round that otherwise went well, a sentence each (a few)."""
    held_back = summary.get("held_back") or []
    warnings = [f"{len(held_back)} removal(s) over the budget held back ({held_back[0]})"] if held_back else []
    not_removed = summary.get("not_removed") or []
    if not_removed:
        warnings.append(f"{len(not_removed)} patient(s) kept what the round lacked ({not_removed[0]})")
    if summary.get("cursor_refused"):
        warnings.append(summary["cursor_refused"])
    return warnings


def cursor_words(summary: dict) -> str:
    """Where the group's cursor stays after a round that did not complete: its value, or none."""
    return summary.get("cursor") or "none (the next round is a full one)"


# --- the registration's use case ------------------------------------------------------------------------

def bulk_sync(settings, service, tenant: str, group_id: str = "", full: bool = False,
              dispatch: Callable[[str, int], None] | None = None) -> dict:
    """A round for the registered EHR `tenant`, its outcome recorded on the registration and in the
    deployment's tallies. A group another sync holds is skipped, not an error."""
    from .sync import TRANSIENT, open_registry

    registry = open_registry(settings)
    ehr = registry.ehr(tenant)
    if ehr is None:
        raise LookupError(f"no registered EHR named {tenant}")
    tally = job_store(settings)
    try:
        summary = run_bulk_sync(settings, registry, ehr, service, group_id, full=full, dispatch=dispatch)
    except SyncRunning as exc:
        log.info("bulk sync skipped: another sync holds the group")
        return {"skipped": str(exc)}
    except TRANSIENT:
        registry.record_sync(tenant, "retrying: the EHR or the index was unavailable")
        tally.add("bulk_syncs", "retrying")
        raise
    except Exception as exc:
        registry.record_sync(tenant, f"failed: {exc}")
        tally.add("bulk_syncs", "failed")
        raise
    return {k: summary[k] for k in ("round", "state", "patients", "resources", "chunks", "embedded", "deleted",
                                    "export_errors", "parts")}


def forget_registration(settings, registry: Registry, tenant: str) -> None:
    """A registration removed: its rounds' staged resources, rounds, cursors and lease go too."""
    deps = round_deps(settings, registry, None)
    for round_ in deps.rounds.rounds(tenant, limit=1000):
        deps.staging.remove(round_.id)
    deps.rounds.delete_round_rows(tenant)


def group_cursors(settings, registry: Registry, tenant: str) -> dict[str, dict]:
    """Each group's cursor, the state of its open round, if any, and what its last finished round
    skipped (`ehr list`)."""
    rounds = _rounds(registry.engine)
    found = {c.group_id: {"since": c.since, "open_round": "", "last_skipped": None} for c in rounds.cursors(tenant)}
    for round_ in rounds.rounds(tenant, limit=50):       # the newest first
        if round_.state == "abandoned":
            continue
        group = found.setdefault(round_.group_id, {"since": "", "open_round": "", "last_skipped": None})
        if round_.state != "done":
            group["open_round"] = group["open_round"] or round_.state
        elif group["last_skipped"] is None:
            group["last_skipped"] = json.loads(round_.summary or "{}").get("skipped_items", [])
    for group in found.values():
        group["last_skipped"] = group["last_skipped"] or []
    return found


def follow_round(settings, registry: Registry, round_id: str, progress: Say | None = None,
                 every: float = 2.0) -> dict:
    """Wait for a round handed to the workers to end, reporting its parts as they are done. A part
    that failed for good (no retry coming) ends the wait: the round stays open, its cursor where it
    was, and the next sync of the group indexes what is left."""
    deps = round_deps(settings, registry, None)
    while True:
        round_ = deps.rounds.round(round_id)
        if round_.state in ("done", "abandoned"):
            return round_summary(deps, round_)
        parts = deps.rounds.parts(round_id)
        failed = [p for p in parts if p.state == "failed"]
        if failed and not any(p.state in ("pending", "running") for p in parts):
            return round_summary(deps, round_) | {"state": "failed",
                                                  "failed_parts": [f"part {p.n}: {p.error}" for p in failed]}
        done = sum(len(json.loads(p.patients)) for p in parts if p.state == "done")
        if progress:
            progress("indexing on the workers", done, sum(len(json.loads(p.patients)) for p in parts), "")
        time.sleep(every)

"""Keeping the index in step with the record's source: the use cases, as plain functions.

- `sync_patient`: one patient from a registered EHR (the launching session's token, or chartcite's
  Backend Services token) or from the demo bundle folder; problems, medications and allergies are
  indexed first on a first sync, progress is reported for the frame, the job's state says how it
  ended, and the EHR's clock becomes the cursor of the next incremental sync.
- Bulk Data rounds are in workers/bulk_round.py.

The Celery tasks (workers/tasks.py) are thin wrappers over these. `settings` is the application's settings object (any object with its
attributes: this package does not import the web app).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urlsplit

from fhir_ingest.connection.budget import budget_for
from fhir_ingest.connection.client import AuthExpired, FhirClient, FhirUnavailable
from fhir_ingest.record.contract import PatientNotFound
from fhir_ingest.record.load import BundleDirectorySource, LoadReport
from fhir_ingest.connection.registry import Ehr, Registry
from fhir_ingest.connection.smart_auth import BackendServicesToken, SessionTokens
from search.backends.base import BackendUnavailable

from .progress import job_store

log = logging.getLogger(__name__)

# Faults that pass: the task is retried with backoff.
TRANSIENT = (BackendUnavailable, FhirUnavailable, ConnectionError, TimeoutError)
# A patient sync that could not reach its source waits this long before each next attempt (the
# frame counts down and offers Retry; a relaunch or Retry starts one at once), then gives up.
RETRY_DELAYS = (5, 15, 30, 60, 120, 300, 300, 300)


class RetryLater(Exception):
    """The record source could not be reached: try this sync again in `seconds`. Celery workers
    re-queue the task with that countdown; the in-process runner sets a timer."""

    def __init__(self, seconds: float, cause: Exception):
        super().__init__(f"retry in {seconds:.0f} s ({type(cause).__name__})")
        self.seconds, self.cause = seconds, cause


@lru_cache(maxsize=8)
def _registry(url: str, key: str, frame_origins_ttl: float) -> Registry:
    return Registry(url, key, frame_origins_ttl)


def open_registry(settings) -> Registry:
    settings.prepare_data_dir()
    return _registry(settings.registry_db, settings.ensure_token_key(), float(settings.frame_origins_cache_seconds))


def ehr_client(settings, registry: Registry, ehr: Ehr, session_id: str | None = None,
               interactive: bool = False, auth=None) -> FhirClient:
    """A FHIR client on the session's user token, or on a Backend Services token without one (or
    on `auth`, a token provider of the caller's), drawing on the deployment's request budget for
    that EHR and counting its answers by status. `interactive`: a clinician is waiting, so an EHR
    that cannot be reached is said within seconds (and the sync retried on a schedule) rather than
    after a long series of retries."""
    if auth is None:
        auth = SessionTokens(registry, session_id, ehr) if session_id else BackendServicesToken(registry, ehr)
    budget = budget_for(urlsplit(ehr.iss).netloc, settings.fhir_max_concurrency,
                        settings.fhir_max_requests_per_second, settings.redis_url)
    tally = job_store(settings)
    return FhirClient(ehr.iss, auth, timeout=settings.fhir_timeout_seconds, budget=budget,
                      on_status=lambda status: tally.add("ehr_requests", status),
                      retries=3 if interactive else 5, unreachable_retries=2 if interactive else 5)


# --- one patient --------------------------------------------------------------------------------------

@dataclass
class PatientRead:
    records: list
    report: LoadReport
    server_time: str = ""          # the EHR's clock when the read began ("" for the bundle folder)
    fetched: int = 0
    from_ehr: bool = False
    not_read: list[str] = field(default_factory=list)   # kinds of record the EHR did not give, one line each


def read_ehr_patient(settings, registry: Registry, ehr: Ehr, patient_id: str, held: list[dict],
                     session_id: str | None, progress=None) -> PatientRead:
    """The patient's record from the EHR: everything on the first sync, then what changed since the
    last one (by the EHR's own clock), merged into the resources chartcite already holds."""
    from fhir_ingest.connection.fetch import fetch_patient, to_record
    from fhir_ingest.record.load import source_answer_over

    client = ehr_client(settings, registry, ehr, session_id, interactive=True)
    cursor = registry.patient_synced(ehr.name, patient_id)
    since = cursor.server_time if cursor and held else ""
    server_time = client.server_time()
    granted = SessionTokens(registry, session_id, ehr).granted() if session_id else ""
    fetched = fetch_patient(client, patient_id, since, progress, granted)
    record, report = to_record(patient_id, source_answer_over(held, fetched.resources), fetched.problems, ehr.name)
    return PatientRead([record] if record else [], report, server_time, len(fetched.resources), True,
                       fetched.not_read)


def read_patient(settings, registry: Registry, service, tenant: str, patient_id: str, session_id: str | None,
                 progress) -> PatientRead:
    ehr = registry.ehr(tenant)
    if ehr is None:
        records, report = BundleDirectorySource(settings.demo_source, settings.read_limits()).read_patient(patient_id)
        return PatientRead(records, report, fetched=sum(len(r.resources) for r in records))
    held = service.held_resources(tenant, patient_id)
    return read_ehr_patient(settings, registry, ehr, patient_id, held, session_id, progress)


def sync_patient(settings, service, tenant: str, patient_id: str, session_id: str | None = None) -> dict:
    """Read one patient's record from the tenant's source and index it, reporting progress and how
    it ended in the job store (the frame and /metrics read it)."""
    jobs = job_store(settings)
    held = jobs.get(tenant, patient_id)
    attempts = held.attempts if held else 0        # attempts that could not reach the source so far
    jobs.set(tenant, patient_id, "running", "reading")
    registry = open_registry(settings)

    def progress(phase, done, total):
        jobs.set(tenant, patient_id, "running", phase, done, total)

    try:
        read = read_patient(settings, registry, service, tenant, patient_id, session_id, progress)
        # A first sync: the whole record is searchable by its words within seconds, and by meaning
        # as the vectors follow (problems, medications and allergies first).
        first = bool(read.records) and not service.patient(tenant, patient_id)
        jobs.set(tenant, patient_id, "running", "words" if first else "embedding", 0, 0)
        result = service.index_records(tenant, read.records, progress, words_first=first, report=read.report)
    except TRANSIENT as exc:
        delay = record_unreachable(jobs, tenant, patient_id, exc, attempts)
        if delay is None:
            raise
        raise RetryLater(delay, exc) from exc
    except Exception as exc:
        record_patient_failure(jobs, tenant, patient_id, exc)
        raise
    if read.from_ehr:
        registry.mark_patient_synced(tenant, patient_id, read.server_time)
    jobs.add("patient_syncs", "done")
    jobs.set(tenant, patient_id, "done", "done", result.chunks, result.chunks, message=sync_notice(read, result),
             attempts=0)
    skipped = len(read.report.skipped) + len(result.problems)
    log.info("patient synced: %s resources fetched, %s chunks (%s new, %s removed), %s skipped", read.fetched,
             result.chunks, result.embedded, result.removed, skipped)
    return {"fetched": read.fetched, "chunks": result.chunks, "embedded": result.embedded,
            "removed": result.removed, "skipped": skipped}


def record_unreachable(jobs, tenant: str, patient_id: str, exc: Exception, attempts: int) -> float | None:
    """A sync that could not reach the EHR (or the index): the job waits for its next attempt,
    saying so in words the frame shows; None once the attempts are spent (the job has failed)."""
    import time

    source = "the record index" if isinstance(exc, BackendUnavailable) else "the EHR"
    if attempts >= len(RETRY_DELAYS):
        jobs.set(tenant, patient_id, "failed", "done", message=f"{source} could not be reached", attempts=attempts)
        jobs.add("patient_syncs", "unreachable")
        log.warning("patient sync gave up: %s could not be reached after %s attempts", source, attempts)
        return None
    delay = RETRY_DELAYS[attempts]
    jobs.set(tenant, patient_id, "waiting", "retrying", message=f"{source[0].upper()}{source[1:]} could not be reached",
             retry_at=time.time() + delay, attempts=attempts + 1)
    jobs.add("patient_syncs", "retrying")
    log.warning("patient sync could not reach %s (%s): retrying in %s s", source, type(exc).__name__, delay)
    return delay


def record_patient_failure(jobs, tenant: str, patient_id: str, exc: Exception) -> None:
    """The job's state and the sync tally for a sync that did not finish."""
    if isinstance(exc, PatientNotFound):
        state, outcome, message = "failed", "not_found", "patient not found in the record source"
    elif isinstance(exc, AuthExpired):
        state, outcome = "failed", "sign_in_expired"
        message = str(exc) if not exc.renewable else "the EHR sign-in expired: open chartcite from the EHR again"
        log.warning("patient sync stopped: the EHR sign-in expired")
    else:
        state, outcome, message = "failed", "failed", type(exc).__name__
    # The frame offers no Retry once the sign-in has ended (only a new launch can read the record).
    phase = "retrying" if state == "queued" else "sign_in_expired" if outcome == "sign_in_expired" else "done"
    jobs.set(tenant, patient_id, state, phase, message=message)
    jobs.add("patient_syncs", outcome)


def sync_notice(read: PatientRead, result) -> str:
    """What the frame says after a sync that left something out: unreadable notes, and the kinds
    of record this EHR does not give chartcite (one line each, as the sync found them)."""
    unread = unreadable_notes(read.report, result)
    parts = [f"{unread} note{'s' if unread > 1 else ''} could not be read from the EHR"] if unread else []
    if read.not_read:
        parts.append("Not read from this EHR: " + "; ".join(read.not_read))
    return ". ".join(parts)


def unreadable_notes(report, result) -> int:
    """Notes whose text could not be fetched or read: the frame says how many, never silent."""
    refs = {s.origin for s in report.skipped if "attachment could not be fetched" in s.reason}
    refs |= {p.ref for p in result.problems if "text could not be read" in p.reason}
    return len(refs)

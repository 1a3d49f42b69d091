"""Thin, idempotent task wrappers around fhir_ingest and search. Tasks take ids, not objects.

Idempotent by key: chunk ids are derived from tenant, resource type, id, versionId and part, and
a chunk whose text and model are unchanged is neither re-embedded nor rewritten, so running a
task twice (or re-running one a dead worker left half done) converges to the same index.
"""
from __future__ import annotations

import json
import logging

from celery import Celery, shared_task

from fhir_ingest.client import FhirUnavailable
from fhir_ingest.load import BundleDirectorySource, essentials
from search.backend import BackendUnavailable

from .progress import job_store

log = logging.getLogger(__name__)
_app: Celery | None = None
_services: dict = {}
TRANSIENT = (BackendUnavailable, FhirUnavailable, ConnectionError, TimeoutError)
RETRY = {"autoretry_for": TRANSIENT, "retry_backoff": True, "retry_backoff_max": 300, "retry_jitter": True,
         "max_retries": 6}


def bind(app: Celery) -> None:
    global _app
    _app = app


def _settings():
    if _app is None:
        raise RuntimeError("workers.tasks used before make_celery(settings)")
    return _app.conf.chartcite_settings


def service_for(settings):
    """One SearchService (model + backend connection) per worker process and configuration."""
    from search.service import SearchService

    options = settings.search_options()
    key = json.dumps(options, sort_keys=True, default=str)
    if key not in _services:
        _services[key] = SearchService(**options)
    return _services[key]


def source_for(settings) -> BundleDirectorySource:
    """The demo tenant's records: the bundle folder (registered EHRs are read over FHIR)."""
    return BundleDirectorySource(settings.demo_source)


@shared_task(name="chartcite.index_bundle", **RETRY)
def index_bundle(tenant: str, path: str) -> dict:
    """Index one file or folder of bundles/NDJSON."""
    summary = service_for(_settings()).index_paths(tenant, [path])
    result = summary.result
    log.info("indexed %s patients, %s chunks (%s new) from a bundle path", result.patients, result.chunks, result.embedded)
    return {"patients": result.patients, "chunks": result.chunks, "embedded": result.embedded,
            "skipped": len(summary.load.skipped) + len(result.problems)}


@shared_task(name="chartcite.sync_patient", **RETRY)
def sync_patient(tenant: str, patient_id: str, session_id: str | None = None) -> dict:
    """Read one patient's record from the tenant's source and index it, reporting progress for the
    frame. A registered EHR is read over FHIR with the launching session's token (or chartcite's
    Backend Services token); the demo tenant reads the bundle folder."""
    from fhir_ingest.client import AuthExpired
    from smart_app.sources import open_registry, read_ehr_patient

    settings = _settings()
    jobs = job_store(settings)
    jobs.set(tenant, patient_id, "running", "reading")
    registry = open_registry(settings)
    ehr = registry.ehr(tenant)
    service = service_for(settings)

    def progress(phase, done, total):
        jobs.set(tenant, patient_id, "running", phase, done, total)

    try:
        if ehr is None:
            records, report = source_for(settings).read_patient(patient_id)
            server_time, fetched = "", sum(len(r.resources) for r in records)
        else:
            held = service.backend.patient_resources(tenant, patient_id)
            records, report, server_time, fetched = read_ehr_patient(settings, registry, ehr, patient_id, held,
                                                                     session_id, progress)
        if records and not service.patient(tenant, patient_id):
            jobs.set(tenant, patient_id, "running", "essentials", 0, 0)
            service.index_records(tenant, [essentials(r) for r in records])
        jobs.set(tenant, patient_id, "running", "embedding", 0, 0)
        result = service.index_records(tenant, records, progress)
    except KeyError:
        jobs.set(tenant, patient_id, "failed", "done", message="patient not found in the record source")
        jobs.add("patient_syncs", "not_found")
        raise
    except AuthExpired as exc:
        jobs.set(tenant, patient_id, "failed", "done", message=str(exc) if not exc.renewable else
                 "the EHR sign-in expired: open chartcite from the EHR again")
        jobs.add("patient_syncs", "sign_in_expired")
        log.warning("patient sync stopped: the EHR sign-in expired")
        raise
    except TRANSIENT as exc:
        jobs.set(tenant, patient_id, "queued", "retrying", message=type(exc).__name__)
        jobs.add("patient_syncs", "retrying")
        raise
    except Exception as exc:
        jobs.set(tenant, patient_id, "failed", "done", message=type(exc).__name__)
        jobs.add("patient_syncs", "failed")
        raise
    if ehr is not None:
        registry.mark_patient_synced(tenant, patient_id, server_time)
    unread = unreadable_notes(report, result)
    jobs.add("patient_syncs", "done")
    jobs.set(tenant, patient_id, "done", "done", result.chunks, result.chunks,
             message=f"{unread} note{'s' if unread > 1 else ''} could not be read from the EHR" if unread else "")
    log.info("patient synced: %s resources fetched, %s chunks (%s new, %s removed), %s skipped", fetched,
             result.chunks, result.embedded, result.removed, len(report.skipped) + len(result.problems))
    return {"fetched": fetched, "chunks": result.chunks, "embedded": result.embedded, "removed": result.removed,
            "skipped": len(report.skipped) + len(result.problems)}


def unreadable_notes(report, result) -> int:
    """Notes whose text could not be fetched or read: the frame says how many, never silent."""
    refs = {s.origin for s in report.skipped if "attachment could not be fetched" in s.reason}
    refs |= {p.ref for p in result.problems if "text could not be read" in p.reason}
    return len(refs)


@shared_task(name="chartcite.index_patient", **RETRY)
def index_patient(tenant: str, patient_id: str) -> dict:
    """The walking skeleton's name for a full sync of one patient."""
    return sync_patient.run(tenant, patient_id)


@shared_task(name="chartcite.index_resources", **RETRY)
def index_resources(tenant: str, patient_id: str, refs: list[str]) -> dict:
    """Re-index after these resources changed. Chunks cross-reference the rest of the record
    (a trend, a panel, a drug's reason), so the patient's record is re-chunked; only chunks whose
    text changed are embedded and written."""
    return sync_patient.run(tenant, patient_id) | {"refs": len(refs)}


@shared_task(name="chartcite.delete_resources", **RETRY)
def delete_resources(tenant: str, refs: list[str]) -> dict:
    """Resources that disappeared or became entered-in-error leave the index."""
    removed = service_for(_settings()).backend.delete_refs(tenant, refs)
    return {"removed": removed}


@shared_task(name="chartcite.reindex_tenant", **RETRY)
def reindex_tenant(tenant: str) -> dict:
    """Rebuild the tenant's index with the configured model and swap it in atomically."""
    return {"chunks": service_for(_settings()).reindex(tenant)}


@shared_task(name="chartcite.sync_tenant")
def sync_tenant(tenant: str) -> dict:
    """Celery beat's periodic job: a registered EHR gets a bulk sync; the demo tenant queues a
    sync of every patient in its bundle folder."""
    from smart_app.sources import open_registry

    from .runner import TaskRunner

    settings = _settings()
    if open_registry(settings).ehr(tenant) is not None:
        bulk_sync.delay(tenant)
        return {"queued": "bulk"}
    runner = TaskRunner(settings)
    queued = sum(1 for pid in source_for(settings).patient_ids() if runner.enqueue_sync(tenant, pid))
    return {"queued": queued}


@shared_task(name="chartcite.sync_all")
def sync_all() -> dict:
    """Celery beat's entry point: every registered EHR (read afresh, so a new registration is
    picked up without restarting beat) and the demo tenant."""
    from smart_app.sources import open_registry

    settings = _settings()
    tenants = [e.name for e in open_registry(settings).ehrs()]
    if settings.demo_launch:
        tenants.append(settings.tenant)
    for tenant in tenants:
        sync_tenant.delay(tenant)
    return {"tenants": len(tenants)}


@shared_task(name="chartcite.bulk_sync", **RETRY)
def bulk_sync(tenant: str, group_id: str = "") -> dict:
    """Backend Services + Bulk Data export of the EHR's group, indexed patient by patient."""
    from smart_app.sources import open_registry, run_bulk_sync

    settings = _settings()
    registry = open_registry(settings)
    ehr = registry.ehr(tenant)
    if ehr is None:
        raise KeyError(f"no registered EHR named {tenant}")
    tally = job_store(settings)
    try:
        summary = run_bulk_sync(settings, registry, ehr, service_for(settings), group_id)
    except TRANSIENT:
        registry.record_sync(tenant, "retrying: the EHR or the index was unavailable")
        tally.add("bulk_syncs", "retrying")
        raise
    except Exception as exc:
        registry.record_sync(tenant, f"failed: {type(exc).__name__}")
        tally.add("bulk_syncs", "failed")
        raise
    tally.add("bulk_syncs", "done")
    log.info("bulk sync: %s patients, %s resources, %s deleted", summary["patients"], summary["resources"],
             summary["deleted"])
    return summary

"""Thin, idempotent task wrappers around fhir_ingest and search. Tasks take ids, not objects.

Idempotent by key: chunk ids are derived from tenant, resource type, id, versionId and part, and
a chunk whose text and model are unchanged is neither re-embedded nor rewritten, so running a
task twice (or re-running one a dead worker left half done) converges to the same index.
"""
from __future__ import annotations

import json
import logging

from celery import Celery, shared_task

from fhir_ingest.load import BundleDirectorySource
from search.backend import BackendUnavailable

from .progress import job_store

log = logging.getLogger(__name__)
_app: Celery | None = None
_services: dict = {}
TRANSIENT = (BackendUnavailable, ConnectionError, TimeoutError)
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
    """Where patient records come from. Until the SMART/FHIR client lands, the bundle folder."""
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
def sync_patient(tenant: str, patient_id: str) -> dict:
    """Read one patient's record from the source and index it, reporting progress for the frame."""
    settings = _settings()
    jobs = job_store(settings)
    jobs.set(tenant, patient_id, "running", "reading")
    try:
        records, report = source_for(settings).read_patient(patient_id)
        jobs.set(tenant, patient_id, "running", "embedding", 0, 0)

        def progress(phase, done, total):
            jobs.set(tenant, patient_id, "running", phase, done, total)

        result = service_for(settings).index_records(tenant, records, progress)
    except KeyError:
        jobs.set(tenant, patient_id, "failed", "done", message="patient not found in the record source")
        raise
    except TRANSIENT as exc:
        jobs.set(tenant, patient_id, "queued", "retrying", message=type(exc).__name__)
        raise
    except Exception as exc:
        jobs.set(tenant, patient_id, "failed", "done", message=type(exc).__name__)
        raise
    jobs.set(tenant, patient_id, "done", "done", result.chunks, result.chunks)
    log.info("patient synced: %s chunks (%s new, %s removed), %s skipped", result.chunks, result.embedded,
             result.removed, len(report.skipped) + len(result.problems))
    return {"chunks": result.chunks, "embedded": result.embedded, "removed": result.removed}


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
    """Celery beat's periodic job: queue a sync of every patient in the tenant's source."""
    from .runner import TaskRunner

    runner = TaskRunner(_settings())
    queued = sum(1 for pid in source_for(_settings()).patient_ids() if runner.enqueue_sync(tenant, pid))
    return {"queued": queued}

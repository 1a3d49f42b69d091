"""Thin, idempotent task wrappers around fhir_ingest and search. Tasks take ids, not objects."""
from __future__ import annotations

import json
import logging

from celery import Celery, shared_task

from fhir_ingest.load import BundleDirectorySource

from .progress import JobStore

log = logging.getLogger(__name__)
_app: Celery | None = None


def bind(app: Celery) -> None:
    global _app
    _app = app


def _settings():
    if _app is None:
        raise RuntimeError("workers.tasks used before make_celery(settings)")
    return _app.conf.chartcite_settings


_services: dict = {}


def service_for(settings):
    """One SearchService (model + backend connection) per worker process and configuration."""
    from search.service import SearchService

    options = settings.search_options()
    key = json.dumps(options, sort_keys=True, default=str)
    if key not in _services:
        _services[key] = SearchService(**options)
    return _services[key]


@shared_task(name="chartcite.index_bundle", bind=True, max_retries=3, retry_backoff=True)
def index_bundle(self, tenant: str, path: str) -> dict:
    """Index one file or folder of bundles/NDJSON. Re-running it leaves the same index."""
    summary = service_for(_settings()).index_paths(tenant, [path])
    result = summary.result
    log.info("indexed %s patients, %s chunks (%s new) from a bundle path", result.patients, result.chunks, result.embedded)
    return {"patients": result.patients, "chunks": result.chunks, "embedded": result.embedded,
            "skipped": len(summary.load.skipped) + len(result.problems)}


@shared_task(name="chartcite.index_patient", bind=True, max_retries=3, retry_backoff=True)
def index_patient(self, tenant: str, patient_id: str) -> dict:
    """Read one patient's record from the configured source and index it, reporting progress."""
    settings = _settings()
    jobs = JobStore(settings.state_path)
    jobs.set(tenant, patient_id, "running", "reading")
    try:
        records, report = BundleDirectorySource(settings.demo_source).read_patient(patient_id)
        svc = service_for(settings)
        jobs.set(tenant, patient_id, "running", "embedding", 0, 0)

        def progress(phase, done, total):
            jobs.set(tenant, patient_id, "running", phase, done, total)

        result = svc.index_records(tenant, records, progress)
    except KeyError:
        jobs.set(tenant, patient_id, "failed", "done", message="patient not found in the record source")
        raise
    except Exception as exc:
        jobs.set(tenant, patient_id, "failed", "done", message=type(exc).__name__)
        raise
    jobs.set(tenant, patient_id, "done", "done", result.chunks, result.chunks)
    log.info("patient indexed: %s chunks (%s new, %s removed), %s skipped", result.chunks, result.embedded,
             result.removed, len(report.skipped) + len(result.problems))
    return {"chunks": result.chunks, "embedded": result.embedded, "removed": result.removed}

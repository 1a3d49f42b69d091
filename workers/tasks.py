"""Celery tasks: thin wrappers over the use cases in workers/sync.py and the SearchService. Tasks
take ids, not objects; each reads the settings and its SearchService from the Celery app it runs in.

Idempotent by key: chunk ids are derived from tenant, resource type, id, versionId and part, and
a chunk whose text and model are unchanged is neither re-embedded nor rewritten, so running a
task twice (or re-running one a dead worker left half done) converges to the same index.
"""
from __future__ import annotations

import logging

from celery import shared_task

from . import bulk_round, sync
from .progress import job_store

log = logging.getLogger(__name__)
RETRY = {"autoretry_for": sync.TRANSIENT, "retry_backoff": True, "retry_backoff_max": 300, "retry_jitter": True,
         "max_retries": 6}


def settings_of(task):
    return task.app.conf.chartcite_settings


def service_of(task):
    """One SearchService (model + backend connection) per Celery app, made on first use."""
    conf = task.app.conf
    if conf.get("chartcite_service") is None:
        from search.service import SearchService

        conf.chartcite_service = SearchService(**conf.chartcite_settings.search_options())
    return conf.chartcite_service


@shared_task(bind=True, name="chartcite.index_bundle", **RETRY)
def index_bundle(self, tenant: str, path: str) -> dict:
    """Index one file or folder of bundles/NDJSON."""
    summary = service_of(self).index_paths(tenant, [path])
    result = summary.result
    log.info("indexed %s patients, %s chunks (%s new) from a bundle path", result.patients, result.chunks, result.embedded)
    return {"patients": result.patients, "chunks": result.chunks, "embedded": result.embedded,
            "skipped": len(summary.load.skipped) + len(result.problems)}


def synced_or_retried(task, tenant: str, patient_id: str, session_id: str | None, scheduled: bool) -> dict:
    """sync.sync_patient, with its own retry schedule: a scheduled retry runs only if the job is
    still waiting for it (a relaunch or Retry may have started a sync meanwhile), and a source that
    could not be reached re-queues the task after the job's countdown. Run in-process, the
    RetryLater goes to the runner, which sets a timer instead."""
    if scheduled and not job_store(settings_of(task)).resume(tenant, patient_id):
        return {"skipped": "a newer sync of this patient took over"}
    try:
        return sync.sync_patient(settings_of(task), service_of(task), tenant, patient_id, session_id)
    except sync.RetryLater as later:
        if task.request.is_eager:
            raise
        raise task.retry(args=(tenant, patient_id, session_id, True), countdown=later.seconds, max_retries=None)


@shared_task(bind=True, name="chartcite.sync_patient")
def sync_patient(self, tenant: str, patient_id: str, session_id: str | None = None, scheduled: bool = False) -> dict:
    """One patient from the tenant's source into the index (workers/sync.py)."""
    return synced_or_retried(self, tenant, patient_id, session_id, scheduled)


@shared_task(bind=True, name="chartcite.index_resources")
def index_resources(self, tenant: str, patient_id: str, refs: list[str]) -> dict:
    """Re-index after these resources changed. Chunks cross-reference the rest of the record
    (a trend, a panel, a drug's reason), so the patient's record is re-chunked; only chunks whose
    text changed are embedded and written."""
    return synced_or_retried(self, tenant, patient_id, None, False) | {"refs": len(refs)}


@shared_task(bind=True, name="chartcite.delete_resources", **RETRY)
def delete_resources(self, tenant: str, patient_id: str, refs: list[str]) -> dict:
    """Resources of this patient that disappeared or became entered-in-error leave the index."""
    return {"removed": service_of(self).delete_resources(tenant, patient_id, refs)}


@shared_task(bind=True, name="chartcite.reindex_tenant", **RETRY)
def reindex_tenant(self, tenant: str) -> dict:
    """Rebuild the tenant's index with the configured model and swap it in atomically."""
    return {"chunks": service_of(self).reindex(tenant)}


@shared_task(bind=True, name="chartcite.sync_tenant")
def sync_tenant(self, tenant: str) -> dict:
    """Celery beat's periodic job: a registered EHR gets a bulk sync; the demo tenant queues a
    sync of every patient in its bundle folder (one not already queued or running)."""
    from fhir_ingest.record.load import BundleDirectorySource

    settings = settings_of(self)
    ehr = sync.open_registry(settings).ehr(tenant)
    if ehr is not None and not ehr.group_id:
        # Background sync of a registration is its Bulk Data group; chartcite never exports every
        # patient of an EHR on its own (`ehr check` says so).
        return {"skipped": "no Bulk Data group registered"}
    if ehr is not None:
        bulk_sync.delay(tenant)
        return {"queued": "bulk"}
    jobs = job_store(settings)
    queued = 0
    for pid in BundleDirectorySource(settings.demo_source).patient_ids():
        if jobs.claim(tenant, pid):
            sync_patient.delay(tenant, pid)
            queued += 1
    return {"queued": queued}


@shared_task(bind=True, name="chartcite.sync_all")
def sync_all(self) -> dict:
    """Celery beat's entry point: every registered EHR (read afresh, so a new registration is
    picked up without restarting beat) and the demo tenant."""
    settings = settings_of(self)
    tenants = [e.name for e in sync.open_registry(settings).ehrs()]
    if settings.demo_launch:
        tenants.append(settings.tenant)
    for tenant in tenants:
        sync_tenant.delay(tenant)
    return {"tenants": len(tenants)}


@shared_task(bind=True, name="chartcite.bulk_sync", **RETRY)
def bulk_sync(self, tenant: str, group_id: str = "", full: bool = False) -> dict:
    """A Bulk Data round of the EHR's group: kick-off, status and downloads on this worker, then
    each part of the patients indexed as its own task on any worker (in-process when eager)."""
    dispatch = None if self.request.is_eager else queue_part(self.app)
    return bulk_round.bulk_sync(settings_of(self), service_of(self), tenant, group_id, full, dispatch)


def queue_part(app):
    """Queues one part of a round on the app's broker."""
    task = app.tasks["chartcite.index_bulk_part"]
    return lambda round_id, n: task.delay(round_id, n)


@shared_task(bind=True, name="chartcite.index_bulk_part", **RETRY)
def index_bulk_part(self, round_id: str, n: int) -> dict:
    """One part of a Bulk round: the patients indexed, and the round finished if it was the last.
    Run twice (a redelivered task), it finds the part done or claimed; claimed by a worker that may
    have died, it looks again when that claim would have lapsed."""
    settings = settings_of(self)
    deps = bulk_round.round_deps(settings, sync.open_registry(settings), service_of(self))
    result = bulk_round.index_part(deps, round_id, n)
    if result.get("state") == "busy" and not self.request.is_eager:
        raise self.retry(countdown=settings.sync_lease_seconds, max_retries=None)
    return result

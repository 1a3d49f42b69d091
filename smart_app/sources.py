"""Where a tenant's records come from: the demo bundle folder, or a registered EHR's FHIR API read
with a launched session's token (patient sync) or chartcite's Backend Services token (bulk)."""
from __future__ import annotations

import logging
from functools import lru_cache
from urllib.parse import urlsplit

from fhir_ingest.budget import budget_for
from fhir_ingest.client import FhirClient

from .registry import Ehr, Registry
from .settings import Settings
from .smart import BackendServicesToken, SessionTokens

log = logging.getLogger(__name__)


@lru_cache(maxsize=8)
def _registry(url: str, key: str) -> Registry:
    return Registry(url, key)


def open_registry(settings: Settings) -> Registry:
    settings.prepare_data_dir()
    return _registry(settings.registry_db, settings.ensure_token_key())


def ehr_client(settings: Settings, registry: Registry, ehr: Ehr, session_id: str | None = None) -> FhirClient:
    """A FHIR client on the session's user token, or on a Backend Services token without one,
    drawing on the deployment's request budget for that EHR and counting its answers by status."""
    from workers.progress import job_store

    auth = SessionTokens(registry, session_id, ehr) if session_id else BackendServicesToken(registry, ehr)
    budget = budget_for(urlsplit(ehr.iss).netloc, int(settings.number("fhir_max_concurrency")),
                        settings.number("fhir_max_requests_per_second"), settings.redis_url)
    tally = job_store(settings)
    return FhirClient(ehr.iss, auth, timeout=settings.number("fhir_timeout_seconds"), budget=budget,
                      on_status=lambda status: tally.add("ehr_requests", status))


def read_ehr_patient(settings: Settings, registry: Registry, ehr: Ehr, patient_id: str, held: list[dict],
                     session_id: str | None, progress=None):
    """The patient's record from the EHR: everything on the first sync, then what changed since the
    last one (by the EHR's own clock), merged into the resources chartcite already holds."""
    from fhir_ingest.fhir_source import fetch_patient, to_record
    from fhir_ingest.load import merge_resources

    client = ehr_client(settings, registry, ehr, session_id)
    cursor = registry.patient_synced(ehr.name, patient_id)
    since = cursor.server_time if cursor and held else ""
    server_time = client.server_time()
    fetched = fetch_patient(client, patient_id, since, progress)
    record, report = to_record(patient_id, merge_resources(held, fetched.resources), fetched.problems, ehr.name)
    return ([record] if record else []), report, server_time, len(fetched.resources)


def run_bulk_sync(settings: Settings, registry: Registry, ehr: Ehr, service, group_id: str = "",
                  progress=None, full: bool = False) -> dict:
    """One Backend Services + Bulk Data round for an EHR: export what changed since the last
    round's transactionTime, drop deleted resources, merge each patient's changes into what
    chartcite holds and re-index them. The export is parked on disk and indexed a patient at a
    time. Nothing is lost on failure: the cursor moves only at the end."""
    from fhir_ingest.bulk import BulkExport, SinceCheck
    from fhir_ingest.fhir_source import PATIENT_SEARCHES
    from fhir_ingest.load import LoadReport, RecordAssembler

    def say(phase, done=0, total=0, note=""):
        if progress:
            progress(phase, done, total, note)

    def downloaded(items):
        for count, item in enumerate(items, start=1):
            if count % 1000 == 0:
                say("downloading", count, 0, "resources")
            yield item

    client = ehr_client(settings, registry, ehr)
    export = BulkExport(client)
    types = ("Patient", "Medication", *PATIENT_SEARCHES)
    report = LoadReport()
    # An export is never a patient's whole record (it may be incremental, and it is sorted by type):
    # each patient's part is merged into what chartcite holds, and only `deleted` removes anything.
    assembler = RecordAssembler(report, settings.data_dir)
    cursor = "" if full else ehr.bulk_since          # full: everything again, each record whole
    since = SinceCheck(cursor)
    try:
        with export.job(group_id or ehr.group_id, types, cursor) as status_url:
            manifest = export.wait(status_url, progress=say)
            assembler.add(since.watch(downloaded(export.resources(manifest))))
            deleted = export.deleted_refs(manifest)
            errors = export.error_messages(manifest)
        if since.ignored:
            log.warning("the EHR ignored _since and exported every resource again: unchanged ones are not "
                        "re-embedded, and what the export no longer holds is removed")
        # A full export (none asked for, or _since ignored) without errors is each patient's whole
        # record: an EHR that sends no `deleted` output for it still has its deletions applied.
        full = (not cursor or since.ignored) and not errors
        removed = service.backend.delete_refs(ehr.name, deleted) if deleted else 0
        chunks = embedded = 0
        patients = assembler.patient_ids()
        for i, pid in enumerate(patients, start=1):
            result = service.index_record(ehr.name, assembler.record(pid, whole=full))
            chunks, embedded, removed = chunks + result.chunks, embedded + result.embedded, removed + result.removed
            registry.mark_patient_synced(ehr.name, pid, manifest.transaction_time)
            say("indexing", i, len(patients))
    finally:
        assembler.close()
    summary = {"patients": len(patients), "resources": report.resources_read, "chunks": chunks,
               "embedded": embedded, "deleted": len(deleted), "removed_chunks": removed,
               "skipped": len(report.skipped), "export_errors": len(errors),
               "transaction_time": manifest.transaction_time}
    summary |= {"since_ignored": since.ignored, "full_export": full}
    status = f"ok: {len(patients)} patients, {report.resources_read} resources, {len(deleted)} deleted"
    if since.ignored:
        status += f" (the EHR ignored _since: full export, {embedded} of {chunks} chunks embedded)"
    if errors or report.skipped:
        status += f", {len(errors)} export errors, {len(report.skipped)} skipped"
    registry.record_sync(ehr.name, status, bulk_since=manifest.transaction_time)
    return summary

"""Reading records from a real FHIR server: per-patient FHIR search sync and a Bulk Data export.

Starts sekmet-fhir on loopback, loads N patients of the shared Synthea set (one Synthea run, so
their practitioner references resolve), then measures
- patient sync: the searches chartcite makes on a launch (one per type, paged), per patient:
  requests, resources/s, p50/p95 seconds per patient;
- incremental sync of an unchanged patient (`_lastUpdated`): requests and seconds;
- Bulk Data: kick-off to manifest, download, check and staging of every NDJSON line: resources/s.
No embedding here (bench/ingest.py measures that). The first line names the processor; the last is
for scripts: `fhir_sync: sync_resources_per_s=… sync_p50_s=… bulk_resources_per_s=… rss_mb=… cpu="…" cores=… isa=…`.
Usage: python bench/fhir_sync.py [--patients N]
"""
from __future__ import annotations

import argparse
import csv
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402
from fhir_ingest.connection.bulk import BulkExport, SinceCheck  # noqa: E402
from fhir_ingest.connection.bulk_staging import FileProgress, StagedExport, download_file  # noqa: E402
from fhir_ingest.connection.client import FhirClient  # noqa: E402
from fhir_ingest.connection.fetch import fetch_patient  # noqa: E402
from fhir_ingest.record.kinds import PATIENT_SEARCHES  # noqa: E402
from fhir_ingest.record.load import LoadReport  # noqa: E402
from tests.fhir_servers import load_synthea, start_sekmet, stop  # noqa: E402


def one_run_patients(synthea: Path, n: int) -> list[str]:
    with open(synthea / "MANIFEST.tsv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    state = "california"
    return [r["patient_id"] for r in rows if state in r["source_path"]][:n]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--patients", type=int, default=10)
    parser.add_argument("--synthea", default=str(REPO.parent / "shared" / "data" / "synthea"))
    args = parser.parse_args()
    print(header(), flush=True)
    synthea = Path(args.synthea)
    ids = one_run_patients(synthea, args.patients)
    with tempfile.TemporaryDirectory() as tmp:
        process, base = start_sekmet(Path(tmp))
        try:
            started = time.perf_counter()
            load_synthea(base, synthea, ids, "bench-group")
            print(f"loaded {len(ids)} patients into sekmet-fhir in {time.perf_counter() - started:.1f}s")
            times, resources, requests_made = [], 0, 0
            for pid in ids:
                client = FhirClient(base, max_concurrency=2)
                t = time.perf_counter()
                fetched = fetch_patient(client, pid)
                times.append(time.perf_counter() - t)
                resources += len(fetched.resources)
                requests_made += client.requests_made
            total = sum(times)
            p95 = statistics.quantiles(times, n=20)[-1] if len(times) >= 2 else times[0]
            print(f"patient sync: {len(ids)} patients, {resources} resources, {requests_made} requests in {total:.1f}s "
                  f"= {resources / total:.0f} resources/s; per patient p50 {statistics.median(times):.2f}s, "
                  f"p95 {p95:.2f}s ({len(PATIENT_SEARCHES)} searches + Patient read + Medication look-up)")
            client = FhirClient(base)
            since = client.server_time()
            t = time.perf_counter()
            again = fetch_patient(client, ids[0], since=since)
            print(f"incremental sync of an unchanged patient: {len(again.resources)} resources, "
                  f"{client.requests_made - 1} requests, {time.perf_counter() - t:.2f}s")
            export = BulkExport(FhirClient(base), poll_first=0.5)
            t = time.perf_counter()
            with export.job("bench-group") as status:
                manifest = export.wait(status)
                kicked = time.perf_counter() - t
                report = LoadReport()
                with tempfile.TemporaryDirectory() as staging:
                    # Downloaded, checked and parked as a round parks them, for any worker to index.
                    store = StagedExport(f"sqlite:///{staging}/bulk-staging.sqlite")
                    for n, output in enumerate(manifest.outputs):
                        download_file(export, store, "bench", n, output["url"], f"{output.get('type')}.{n}.ndjson",
                                      manifest.requires_token, FileProgress(), report, SinceCheck(""), lambda _: None)
                    patients = len(store.patients("bench"))
            elapsed = time.perf_counter() - t
            print(f"bulk export: {report.resources_read} resources for {patients} patients in {elapsed:.1f}s "
                  f"(manifest after {kicked:.1f}s) = {report.resources_read / elapsed:.0f} resources/s, "
                  f"{len(report.skipped)} skipped")
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"peak RSS of this process: {rss:.0f} MB")
        finally:
            stop(process)
    print(f"fhir_sync: sync_resources_per_s={resources / total:.0f} sync_p50_s={statistics.median(times):.2f} "
          f"bulk_resources_per_s={report.resources_read / elapsed:.0f} rss_mb={rss:.0f} {fields()}")


if __name__ == "__main__":
    main()

"""Indexing throughput and memory on the shared Synthea records, beside the model's raw encode rate.

Prints resources/s, chunks/s, embedded texts/s and peak RSS for indexing every patient bundle
into a fresh embedded index, then the raw encode rate of the same model on the same texts
(the ceiling), and a last line a script can read:
`ingest: texts_per_s=… raw_fp32_texts_per_s=… ratio=… rss_mb=…`.
Usage: python bench/ingest.py [SYNTHEA_DIR] [--patients N]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fhir_ingest.chunk import PatientChunker  # noqa: E402
from fhir_ingest.load import load_resources  # noqa: E402
from search.service import SearchService  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("synthea", nargs="?", default=str(REPO.parent / "shared" / "data" / "synthea"))
    parser.add_argument("--patients", type=int, default=0, help="only the first N shared patients (default: all)")
    args = parser.parse_args()
    files = sorted(Path(args.synthea).glob("*.json.gz"))
    if args.patients:
        files = files[: args.patients]
    with tempfile.TemporaryDirectory() as tmp:
        svc = SearchService("embedded", Path(tmp) / "index.sqlite")
        t = time.perf_counter()
        embedder = svc.embedder
        load_s = time.perf_counter() - t

        t = time.perf_counter()
        records, report = load_resources(files)
        read_s = time.perf_counter() - t

        t = time.perf_counter()
        result = svc.index_records("bench", records)
        index_s = time.perf_counter() - t
        total_s = read_s + index_s

        texts = []
        for record in records:
            texts += [c.text for c in PatientChunker("bench", record.patient_id, record.resources, embedder.budget()).chunks()]
        t = time.perf_counter()
        embedder.encode(texts)
        encode_s = time.perf_counter() - t

        t = time.perf_counter()
        again = svc.index_records("bench", records)
        reindex_s = time.perf_counter() - t
        svc.close()

    print(f"machine: {os.cpu_count()} cores; model {embedder.name} loaded in {load_s:.1f}s")
    print(f"patients {len(records)}  resources {report.resources_read}  chunks {result.chunks}  skipped {len(report.skipped)}")
    print(f"read+check    {read_s:7.1f}s  {report.resources_read / read_s:8.0f} resources/s")
    print(f"index (all)   {total_s:7.1f}s  {report.resources_read / total_s:8.1f} resources/s  "
          f"{result.chunks / total_s:7.1f} chunks/s  {result.embedded / index_s:7.1f} embedded texts/s")
    print(f"raw encode    {encode_s:7.1f}s  {len(texts) / encode_s:7.1f} texts/s  (the model's ceiling on these texts)")
    print(f"re-index      {reindex_s:7.1f}s  embedded {again.embedded} of {again.chunks} (unchanged chunks are skipped)")
    print(f"peak RSS      {peak_rss_mb():7.0f} MB")
    rate, raw = result.embedded / index_s, len(texts) / encode_s
    print(f"ingest: texts_per_s={rate:.1f} raw_fp32_texts_per_s={raw:.1f} ratio={rate / raw:.2f} "
          f"rss_mb={peak_rss_mb():.0f}")


if __name__ == "__main__":
    main()

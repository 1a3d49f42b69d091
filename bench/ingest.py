"""Indexing throughput and memory on the shared Synthea records, beside the model's raw encode rate.

Prints resources/s, chunks/s, embedded texts/s and peak RSS for indexing every patient bundle
into a fresh embedded index, then the raw encode rate of the same model on the same texts
(the ceiling), and a last line a script can read:
`ingest: texts_per_s=… raw_fp32_texts_per_s=… ratio=… rss_mb=…`.
Usage: python bench/ingest.py [SYNTHEA_DIR] [--patients N] [--precision fp32|int8]
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
from search.models.embedders import load_embedder  # noqa: E402
from search.nlp.annotate import default_annotator  # noqa: E402
from search.service import SearchService  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, spent: list[float]):
    """`fn`, adding the seconds each call takes to spent[0]."""
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("synthea", nargs="?", default=str(REPO.parent / "shared" / "data" / "synthea"))
    parser.add_argument("--patients", type=int, default=0, help="only the first N shared patients (default: all)")
    parser.add_argument("--precision", choices=("int8", "fp32"), default="int8", help="the embedding backend indexing uses")
    args = parser.parse_args()
    files = sorted(Path(args.synthea).glob("*.json.gz"))
    if args.patients:
        files = files[: args.patients]
    # The int8 model is built once per machine and cached (~/.cache/chartcite/models), as deployed.
    with tempfile.TemporaryDirectory() as tmp:
        svc = SearchService("embedded", Path(tmp) / "index.sqlite", precision=args.precision)
        t = time.perf_counter()
        embedder = svc.embedder
        default_annotator()           # as a server does at start: the NLP pipeline is not ingest's cost
        load_s = time.perf_counter() - t
        embed_s = [0.0]
        embedder.encode = timed(embedder.encode, embed_s)

        t = time.perf_counter()
        summary = svc.index_paths("bench", files)      # as `chartcite index` does: a patient at a time
        index_s = time.perf_counter() - t
        result, report = summary.result, summary.load
        index_rss = peak_rss_mb()

        t = time.perf_counter()
        again = svc.index_paths("bench", files)
        reindex_s = time.perf_counter() - t
        svc.close()

    texts = []
    for path in files:
        for record in load_resources([path])[0]:
            texts += [c.text for c in PatientChunker("bench", record.patient_id, record.resources, embedder.budget()).chunks()]
    # The same texts embedded alone, in one call, by the backend indexing used: what the rest of
    # ingest costs on top (reading, checking, chunking, annotating, writing, and per-patient batches).
    in_encode_s = embed_s[0]
    t = time.perf_counter()
    embedder.encode(texts)
    alone_s = time.perf_counter() - t
    fp32 = load_embedder(None, "fp32")          # the ceiling the issue measures against: PyTorch fp32
    fp32.encode(texts[:64])
    t = time.perf_counter()
    fp32.encode(texts)
    encode_s = time.perf_counter() - t

    rate, raw = result.embedded / index_s, len(texts) / encode_s
    print(f"machine: {os.cpu_count()} cores; model {embedder.name} and the NLP pipeline loaded in {load_s:.1f}s")
    print(f"patients {result.patients}  resources {report.resources_read}  chunks {result.chunks}  skipped {len(report.skipped)}")
    print(f"index (all)   {index_s:7.1f}s  {report.resources_read / index_s:8.1f} resources/s  "
          f"{result.chunks / index_s:7.1f} chunks/s  {rate:7.1f} embedded texts/s")
    print(f"  in encode calls {in_encode_s:7.1f}s ({100 * in_encode_s / index_s:.0f}%; the next patients are prepared on a "
          f"thread meanwhile, so this includes time shared with them)")
    print(f"  the same texts embedded alone ({args.precision}, one call): {alone_s:.1f}s; everything else costs "
          f"{index_s - alone_s:.1f}s ({100 * (index_s - alone_s) / index_s:.0f}% of indexing)")
    print(f"raw encode    {encode_s:7.1f}s  {raw:7.1f} texts/s  (PyTorch fp32, the same model and texts)")
    print(f"re-index      {reindex_s:7.1f}s  embedded {again.result.embedded} of {again.result.chunks} (unchanged chunks are skipped)")
    print(f"peak RSS      {index_rss:7.0f} MB while indexing; {peak_rss_mb():.0f} MB with the fp32 model loaded too")
    print(f"ingest: texts_per_s={rate:.1f} raw_fp32_texts_per_s={raw:.1f} ratio={rate / raw:.2f} "
          f"rss_mb={index_rss:.0f} precision={args.precision} other_share={(index_s - alone_s) / index_s:.2f}")


if __name__ == "__main__":
    main()

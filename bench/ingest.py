"""Indexing throughput and memory on the shared Synthea records, beside the model's raw encode rate.

Prints resources/s, chunks/s, embedded texts/s and peak RSS for indexing every patient bundle
into a fresh embedded index, what everything but embedding costs (against the same texts
embedded alone in the calls indexing makes, before and after, in wall and CPU time), then the
raw encode rate of the same model on the same texts under PyTorch fp32 (the ceiling), and a
last line a script can read:
`ingest: texts_per_s=… raw_fp32_texts_per_s=… ratio=… rss_mb=… … cpu="…" cores=… isa=…`; the first line
names the processor.
Usage: python bench/ingest.py [SYNTHEA_DIR] [--patients N] [--precision fp32|int8]
                              [--int8 dynamic|static|openvino|auto]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402
from fhir_ingest.record.chunk import PatientChunker  # noqa: E402
from fhir_ingest.record.load import load_resources  # noqa: E402
from search.collector import collect_less_often  # noqa: E402
from search.indexer import FIRST_GROUP, PATIENTS_PER_ENCODE  # noqa: E402
from search.models.embedders import DEFAULT_INT8, load_embedder  # noqa: E402
from search.models.onnx_embed import INT8_SETTINGS  # noqa: E402
from search.nlp.annotate import default_annotator  # noqa: E402
from search.service import SearchService  # noqa: E402


def peak_rss_mb() -> float:
    """This process's peak RSS since the last reset_peak_rss()."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    """Start the peak over (Linux: writing 5 to clear_refs resets VmHWM), so the indexing run's
    peak does not include the encode of every text at once measured before it."""
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")
    except OSError:
        pass


def timed(fn, spent: list[float]):
    """`fn`, adding the seconds each call takes to spent[0]."""
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t
    return wrapper


def patient_texts(files: list[Path], embedder) -> list[list[str]]:
    """Each patient's chunk texts, the patients in the order indexing takes them (by id)."""
    texts = {}
    for path in files:
        for record in load_resources([path])[0]:
            chunker = PatientChunker("bench", record.patient_id, record.resources, embedder.budget())
            texts[record.patient_id] = [c.text for c in chunker.chunks()]
    return [texts[patient_id] for patient_id in sorted(texts)]


def as_indexing_groups(per_patient: list[list[str]]) -> list[list[str]]:
    """The texts in the calls indexing makes: FIRST_GROUP patients, then PATIENTS_PER_ENCODE at a
    time (the int8 model scales activations per batch, and batches form within a call)."""
    groups, start, size = [], 0, FIRST_GROUP
    while start < len(per_patient):
        groups.append([text for texts in per_patient[start:start + size] for text in texts])
        start, size = start + size, PATIENTS_PER_ENCODE
    return groups


def embedded_in_groups(embedder, groups: list[list[str]]) -> None:
    """Every group queued at once, as indexing queues a group before it collects the one before."""
    for collect in [embedder.encode_soon(group) for group in groups]:
        collect()


def measured(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) that `fn()` takes."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def raw_fp32_seconds(texts: list[str]) -> float:
    """PyTorch fp32 encoding the texts, the ceiling the int8 path is measured against, in a fresh
    process: the indexing process's allocator settings (OpenVINO's) must not slow it down."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "texts.json"
        path.write_text(json.dumps(texts), encoding="utf-8")
        done = subprocess.run([sys.executable, __file__, "--raw-fp32", str(path)], capture_output=True, text=True, encoding="utf-8")
    if done.returncode:
        sys.exit(f"the raw fp32 encode failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def encode_raw_fp32(path: str) -> None:
    """In the child: load PyTorch fp32, warm it up, print the seconds the texts take."""
    texts = json.loads(Path(path).read_text(encoding="utf-8"))
    fp32 = load_embedder(None, "fp32")
    fp32.encode(texts[:64])
    print(measured(lambda: fp32.encode(texts))[0])


def main() -> None:
    if sys.argv[1:2] == ["--raw-fp32"]:
        encode_raw_fp32(sys.argv[2])
        return
    print(header(), flush=True)
    collect_less_often()          # as the command line and the server do
    parser = argparse.ArgumentParser()
    parser.add_argument("synthea", nargs="?", default=str(REPO.parent / "shared" / "data" / "synthea"))
    parser.add_argument("--patients", type=int, default=0, help="only the first N shared patients (default: all)")
    parser.add_argument("--precision", choices=("int8", "fp32"), default="int8", help="the embedding backend indexing uses")
    parser.add_argument("--int8", choices=INT8_SETTINGS, default=DEFAULT_INT8, help="the int8 variant (CHARTCITE_INT8)")
    args = parser.parse_args()
    files = sorted(Path(args.synthea).glob("*.json.gz"))
    if args.patients:
        files = files[: args.patients]
    # The int8 model is built once per machine and cached (~/.cache/chartcite/models), as deployed.
    with tempfile.TemporaryDirectory() as tmp:
        svc = SearchService("embedded", Path(tmp) / "index.sqlite", precision=args.precision, int8=args.int8)
        t = time.perf_counter()
        embedder = svc.embedder
        default_annotator()           # as a server does at start: the NLP pipeline is not ingest's cost
        load_s = time.perf_counter() - t
        # The same texts embedded alone, in the calls indexing makes, by the backend indexing uses:
        # what the rest of ingest (reading, checking, chunking, annotating, writing) costs on top.
        # Measured before and after indexing, as this machine's speed drifts by 10-15% over minutes.
        groups = as_indexing_groups(patient_texts(files, embedder))
        texts = [text for group in groups for text in group]
        before_s, before_cpu = measured(lambda: embedded_in_groups(embedder, groups))
        reset_peak_rss()
        waited_s = [0.0]
        encode_soon = embedder.encode_soon
        embedder.encode_soon = lambda *args, **kwargs: timed(encode_soon(*args, **kwargs), waited_s)
        summaries = []
        index_s, index_cpu = measured(lambda: summaries.append(svc.index_paths("bench", files)))  # as `chartcite index` does
        embedder.encode_soon = encode_soon
        summary = summaries[0]
        result, report = summary.result, summary.load
        index_rss = peak_rss_mb()
        after_s, after_cpu = measured(lambda: embedded_in_groups(embedder, groups))
        reindex_s, _ = measured(lambda: summaries.append(svc.index_paths("bench", files)))
        again = summaries[1]
        svc.close()

    encode_s = raw_fp32_seconds(texts)

    alone_s, alone_cpu = (before_s + after_s) / 2, (before_cpu + after_cpu) / 2
    rate, raw = result.embedded / index_s, len(texts) / encode_s
    print(f"model {embedder.name} and the NLP pipeline loaded in {load_s:.1f}s")
    print(f"patients {result.patients}  resources {report.resources_read}  chunks {result.chunks}  skipped {len(report.skipped)}")
    print(f"index (all)   {index_s:7.1f}s  {report.resources_read / index_s:8.1f} resources/s  "
          f"{result.chunks / index_s:7.1f} chunks/s  {rate:7.1f} embedded texts/s")
    print(f"  waiting for vectors {waited_s[0]:5.1f}s ({100 * waited_s[0] / index_s:.0f}%; the next patients are prepared on "
          f"a thread and the previous ones written while the model embeds)")
    print(f"  the same texts embedded alone ({args.precision}, in the same {len(groups)} calls): {before_s:.1f}s before "
          f"indexing, {after_s:.1f}s after; everything else costs {index_s - alone_s:.1f}s ({100 * (index_s - alone_s) / index_s:.0f}% of indexing)")
    print(f"  CPU time: indexing {index_cpu:.1f}s, the texts embedded alone {alone_cpu:.1f}s; everything else "
          f"{index_cpu - alone_cpu:.1f}s ({100 * (index_cpu - alone_cpu) / index_cpu:.0f}% of indexing's CPU)")
    print(f"raw encode    {encode_s:7.1f}s  {raw:7.1f} texts/s  (PyTorch fp32, the same model and texts)")
    print(f"re-index      {reindex_s:7.1f}s  embedded {again.result.embedded} of {again.result.chunks} (unchanged chunks are skipped)")
    print(f"peak RSS      {index_rss:7.0f} MB while indexing (the fp32 encode runs in a process of its own)")
    print(f"ingest: texts_per_s={rate:.1f} raw_fp32_texts_per_s={raw:.1f} ratio={rate / raw:.2f} "
          f"rss_mb={index_rss:.0f} precision={args.precision} other_share={(index_s - alone_s) / index_s:.2f} "
          f"model={embedder.name} {fields()}")


if __name__ == "__main__":
    main()

"""Memory bounded by design (issue 41, items 6 and 7): long NDJSON lines and large bundles.

1. The line splitter behind Bulk downloads and NDJSON files, in process: one line of `--line-mb`
   MB arriving in 16 kB chunks, against ordinary lines of the same total size (it was quadratic:
   32 MB took 106 s in a round).
2. `chartcite index` as a real process, a fresh data directory each, model load included, with
   its peak RSS: an NDJSON file whose one line is `--line-mb` MB of spaces beside two results;
   a bundle of `--bundle-mb` MB (blank scans inline, each under the attachment cap) that is
   parsed as a stream; and an NDJSON file of ordinary lines (Provenance: read and checked, not
   embedded) of the same size as the long line, beside the same two results.

Prints the processor first and, last, a line for scripts:
`long_lines: split_long_s=… split_ordinary_s=… line_s=… line_rss_mb=… bundle_s=… bundle_rss_mb=…
ordinary_s=… ordinary_rss_mb=… cpu="…" cores=… isa=…`.
Usage: python bench/long_lines.py [--line-mb 32] [--bundle-mb 100]
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402
from bench.hostile_size import PATIENT, observation  # noqa: E402


def split_seconds(body: bytes) -> float:
    from fhir_ingest.record.reader import split_lines

    chunks = (body[i:i + 2**14] for i in range(0, len(body), 2**14))
    started = time.perf_counter()
    for _ in split_lines(chunks):
        pass
    return time.perf_counter() - started


def index_process(path: Path, folder: Path, name: str) -> tuple[str, float, float]:
    """`chartcite index` on one file under /usr/bin/time's watch: wall time and peak RSS."""
    env = dict(os.environ, CHARTCITE_DATA_DIR=str(folder / f"data-{name}"), HF_HUB_OFFLINE="1")
    env.pop("CHARTCITE_BACKEND", None)
    started = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "smart_app.cli", "index", str(path)],
                         cwd=REPO, env=env, capture_output=True, text=True, encoding="utf-8")
    seconds = time.perf_counter() - started
    rss = int(out.stderr.strip().splitlines()[-1]) / 1024
    summary = next((line for line in out.stdout.splitlines() if line.startswith("patients:")), out.stderr[-300:])
    size = sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else path.stat().st_size
    return (f"{name:28} {size / 1e6:8.1f} MB  {seconds:7.1f} s  peak RSS {rss:6.0f} MB  "
            f"exit {out.returncode}  | {summary}"), seconds, rss


def long_line_file(path: Path, megabytes: int) -> None:
    with path.open("wb") as out:
        out.write(json.dumps(observation(1) | {"subject": {"reference": "Patient/bench-p"}}).encode() + b"\n")
        out.write(b" " * (megabytes * 2**20) + b"\n")
        out.write(json.dumps(observation(2)).encode() + b"\n")


def ordinary_file(path: Path, megabytes: int) -> None:
    """Ordinary lines of the same total size, of a type read, checked and counted but not embedded
    (Provenance), so that both files measure reading, not the model."""
    with path.open("wb") as out:
        out.write(json.dumps(observation(1)).encode() + b"\n")
        i = 0
        while out.tell() < megabytes * 2**20:
            out.write(json.dumps({"resourceType": "Provenance", "id": f"prov-{i}", "recorded": "2024-05-01T09:00:00Z",
                                  "target": [{"reference": f"Observation/obs-{i}"}],
                                  "agent": [{"who": {"reference": "Practitioner/bench-doc"}}]}).encode() + b"\n")
            i += 1
        out.write(json.dumps(observation(2)).encode() + b"\n")


def scanned_bundle(path: Path, megabytes: int) -> None:
    """A bundle of `megabytes` MB: the patient, a few results and blank scans of 16 MB each."""
    scan = base64.b64encode(b"%PDF-1.4\n" + bytes(12 * 2**20)).decode()
    with path.open("w", encoding="utf-8") as out:
        out.write('{"resourceType": "Bundle", "type": "collection", "entry": [')
        out.write(json.dumps({"resource": PATIENT}))
        for i in range(5):
            out.write(", " + json.dumps({"resource": observation(i)}))
        n = 0
        while out.tell() < megabytes * 2**20:
            out.write(", " + json.dumps({"resource": {
                "resourceType": "DocumentReference", "id": f"scan-{n}", "status": "current",
                "type": {"text": "Scanned document"}, "subject": {"reference": "Patient/bench-p"},
                "date": "2024-05-01T09:00:00Z",
                "content": [{"attachment": {"contentType": "application/pdf", "data": scan}}]}}))
            n += 1
        out.write("]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--line-mb", type=int, default=32)
    parser.add_argument("--bundle-mb", type=int, default=100)
    args = parser.parse_args()
    print(header(), flush=True)
    size = args.line_mb * 2**20
    split_long = split_seconds(b" " * size + b"\n")
    line = json.dumps(observation(0)).encode() + b"\n"
    split_ordinary = split_seconds(line * (size // len(line)))
    print(f"splitting {args.line_mb} MB in 16 kB chunks: one line {split_long:.3f} s, ordinary lines "
          f"{split_ordinary:.3f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        long_line_file(folder / "long-line.ndjson", args.line_mb)
        text, line_s, line_rss = index_process(folder / "long-line.ndjson", folder, f"{args.line_mb}MB-line")
        print(text, flush=True)
        ordinary_file(folder / "ordinary.ndjson", args.line_mb)
        text, ordinary_s, ordinary_rss = index_process(folder / "ordinary.ndjson", folder,
                                                       f"{args.line_mb}MB-ordinary-lines")
        print(text, flush=True)
        scanned_bundle(folder / "bundle.json", args.bundle_mb)
        text, bundle_s, bundle_rss = index_process(folder / "bundle.json", folder, f"{args.bundle_mb}MB-bundle")
        print(text, flush=True)
    print(f"long_lines: split_long_s={split_long:.3f} split_ordinary_s={split_ordinary:.3f} line_s={line_s:.1f} "
          f"line_rss_mb={line_rss:.0f} ordinary_s={ordinary_s:.1f} ordinary_rss_mb={ordinary_rss:.0f} "
          f"bundle_s={bundle_s:.1f} bundle_rss_mb={bundle_rss:.0f} {fields()}")


if __name__ == "__main__":
    main()

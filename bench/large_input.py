"""Large inputs through `chartcite index` (issue 41, "memory bounded by design"): a bundle of
about `--mb` MB and an NDJSON set (one file per resource type, as a Bulk export writes them) of the
same size, made from the shared Synthea records.

The records are copied with every resource id rewritten (the same old id always becomes the same
new one within a copy), so each copy is a patient of its own; in the NDJSON set the bundles'
`urn:uuid:` references are written as `Type/id`, as an export writes them. Both inputs are
generated into a temporary folder (or `--folder`) and never kept; the Synthea records are the
shared ones (their source and licence: ../shared/data/synthea/SOURCE.md and LICENSE).

Each input is indexed by a real `chartcite index` process into a fresh data directory (embedded
index, the default model), model load included, under /usr/bin/time: wall time, peak RSS, and
resources/s (resources read ÷ wall time). Then, with `--largest-patient`, the same for one
patient's record made of as many copies of the largest shared record's resources as fit in
`--patient-mb` MB (one patient, ordinary resources): what one patient's size costs in memory.

Prints the processor first and, last, a line for scripts:
`large_input: bundle_mb=… bundle_s=… bundle_rss_mb=… ndjson_mb=… ndjson_s=… ndjson_rss_mb=… … cpu=…`.
`--read-only` measures the input side alone in its own process (read, check, park on disk, and
every patient's record assembled as indexing asks for it), without the model and the index.
Usage: python bench/large_input.py [--mb 600] [--inputs bundle,ndjson,patient] [--patient-mb 60] [--read-only]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.copies import copied_bundle_json  # noqa: E402
from bench.long_lines import index_process  # noqa: E402
from bench.machine import fields, header  # noqa: E402
from tests.conftest import SYNTHEA  # noqa: E402

LOCAL_REFERENCE = re.compile(r'"urn:uuid:([0-9a-f-]{36})"')


def sources(synthea: Path) -> list[Path]:
    return sorted(synthea.glob("*.json.gz"))


def copied_entries(source: Path, copy: int) -> list[dict]:
    """The bundle's entries with every resource id replaced by one of this copy's own (copy 0 keeps
    the originals); each entry keeps its fullUrl and resource only (a collection's entries)."""
    return [{"fullUrl": e["fullUrl"], "resource": e["resource"]} for e in copied_bundle_json(source, copy)["entry"]
            if isinstance(e.get("resource"), dict)]


def copies(synthea: Path):
    """Every shared record, then again as copy 1, 2…, without end: (copy, entries)."""
    records, copy = sources(synthea), 0
    while True:
        for source in records:
            yield copy, copied_entries(source, copy)
        copy += 1


def write_bundle(path: Path, synthea: Path, megabytes: int) -> tuple[int, int]:
    """A collection Bundle of about `megabytes` MB: (patients, resources)."""
    patients = resources = 0
    with path.open("w", encoding="utf-8") as out:
        out.write('{"resourceType": "Bundle", "type": "collection", "entry": [')
        first = True
        for _, entries in copies(synthea):
            for entry in entries:
                out.write(("" if first else ",\n") + json.dumps(entry, separators=(",", ":")))
                first = False
            patients, resources = patients + 1, resources + len(entries)
            if out.tell() >= megabytes * 2**20:
                break
        out.write("]}")
    return patients, resources


def export_line(entry: dict, refs: dict[str, str]) -> str:
    """One resource as an export's line: the bundle's `urn:uuid:` references as `Type/id`."""
    line = json.dumps(entry["resource"], separators=(",", ":"))
    return LOCAL_REFERENCE.sub(lambda m: f'"{refs.get(m.group(1), "urn:uuid:" + m.group(1))}"', line)


def write_ndjson(folder: Path, synthea: Path, megabytes: int) -> tuple[int, int]:
    """One NDJSON file per resource type, of about `megabytes` MB together: (patients, resources)."""
    folder.mkdir()
    files: dict[str, object] = {}
    patients = resources = written = 0
    try:
        for _, entries in copies(synthea):
            refs = {e["fullUrl"][len("urn:uuid:"):]: f"{e['resource']['resourceType']}/{e['resource']['id']}"
                    for e in entries if e["fullUrl"].startswith("urn:uuid:")}
            for entry in entries:
                rtype = entry["resource"]["resourceType"]
                if rtype not in files:
                    files[rtype] = (folder / f"{rtype}.ndjson").open("w", encoding="utf-8")
                line = export_line(entry, refs) + "\n"
                files[rtype].write(line)
                written += len(line)
            patients, resources = patients + 1, resources + len(entries)
            if written >= megabytes * 2**20:
                break
    finally:
        for fh in files.values():
            fh.close()
    return patients, resources


def write_one_patient(path: Path, synthea: Path, megabytes: int) -> tuple[int, int]:
    """One patient's bundle of about `megabytes` MB: the largest shared record, its clinical
    resources copied again and again with new ids, every copy under the one Patient."""
    largest = max(sources(synthea), key=lambda p: p.stat().st_size)
    patient = next(e for e in copied_entries(largest, 0) if e["resource"]["resourceType"] == "Patient")
    resources = 1
    with path.open("w", encoding="utf-8") as out:
        out.write('{"resourceType": "Bundle", "type": "collection", "entry": [' + json.dumps(patient))
        copy = 0
        while out.tell() < megabytes * 2**20:
            entries = copied_entries(largest, copy)
            own = next(e["resource"]["id"] for e in entries if e["resource"]["resourceType"] == "Patient")
            for entry in entries:
                if entry["resource"]["resourceType"] != "Patient":
                    # the copy's references to its own patient point at the one patient
                    out.write(",\n" + json.dumps(entry, separators=(",", ":")).replace(own, patient["resource"]["id"]))
                    resources += 1
            copy += 1
        out.write("]}")
    return 1, resources


def read_process(path: Path, folder: Path) -> tuple[str, float, float]:
    """The input side of `chartcite index` alone, in a process of its own: every resource read,
    checked and parked, then every patient's record assembled from the parking as indexing asks
    for it (no model, no index). Wall time and peak RSS."""
    code = ("import resource, sys, time; from fhir_ingest.record.load import LoadReport, assembled; "
            "from fhir_ingest.record.reader import read_path; t = time.perf_counter(); report = LoadReport(); "
            f"a = assembled(read_path({str(path)!r}), report, {str(folder)!r}); m = a.__enter__(); "
            "n = sum(len(m.record(p).resources) for p in m.patient_ids()); a.__exit__(None, None, None); "
            "print(n, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, encoding="utf-8")
    resources, seconds, rss = out.stdout.split()
    return f"read and assembled: {resources} resources in {float(seconds):.1f} s, peak RSS {float(rss):.0f} MB", \
        float(seconds), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=600, help="size of the bundle and of the NDJSON set")
    parser.add_argument("--inputs", default="bundle,ndjson", help="any of bundle, ndjson, patient")
    parser.add_argument("--patient-mb", type=int, default=60, help="size of the one-patient bundle")
    parser.add_argument("--synthea", default=str(SYNTHEA))
    parser.add_argument("--folder", default=None, help="where to generate (default: a temporary folder)")
    parser.add_argument("--read-only", action="store_true",
                        help="measure the input side alone (read, check, park, assemble), not the indexing")
    args = parser.parse_args()
    synthea, wanted = Path(args.synthea), args.inputs.split(",")
    print(header(), flush=True)
    figures = []
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        folder = Path(tmp)
        makers = {"bundle": (folder / "population.json", write_bundle, args.mb),
                  "ndjson": (folder / "export", write_ndjson, args.mb),
                  "patient": (folder / "one-patient.json", write_one_patient, args.patient_mb)}
        for name in wanted:
            path, make, megabytes = makers[name]
            patients, resources = make(path, synthea, megabytes)
            size = sum(f.stat().st_size for f in ([path] if path.is_file() else path.iterdir())) / 1e6
            print(f"{name}: {size:.0f} MB, {patients} patients, {resources:,} resources", flush=True)
            if args.read_only:
                text, seconds, rss = read_process(path, folder)
            else:
                text, seconds, rss = index_process(path, folder, name)
            print(f"{text}  | {resources / seconds:.0f} resources/s", flush=True)
            figures.append(f"{name}_mb={size:.0f} {name}_patients={patients} {name}_resources={resources} "
                           f"{name}_s={seconds:.1f} {name}_rss_mb={rss:.0f}")
            if path.is_file():
                path.unlink()
    print(f"large_input: {' '.join(figures)} {fields()}")


if __name__ == "__main__":
    main()

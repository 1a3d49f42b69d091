"""Read FHIR R4 resources from Bundles (.json / .json.gz), NDJSON and directories of these.

Every resource comes out with its position ("file.json.gz#entry[12]", "file.ndjson:7"), and
anything that cannot be read comes out as a `ReadProblem` with its position, so the caller can
report it and carry on with the rest of the file.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

BUNDLE_SUFFIXES = (".json", ".json.gz")
NDJSON_SUFFIXES = (".ndjson", ".ndjson.gz", ".jsonl", ".jsonl.gz")


@dataclass
class RawResource:
    resource: dict
    origin: str


@dataclass
class ReadProblem:
    origin: str
    reason: str


ReadItem = Union[RawResource, ReadProblem]


def _open_text(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "r", encoding="utf-8")


def iter_files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.is_file() and child.name.endswith(BUNDLE_SUFFIXES + NDJSON_SUFFIXES):
                yield child
    else:
        yield path


def read_path(path: str | Path) -> Iterator[ReadItem]:
    """Yield every resource (or problem) found under `path`."""
    path = Path(path)
    if not path.exists():
        yield ReadProblem(str(path), "no such file or directory")
        return
    for file in iter_files(path):
        if file.name.endswith(NDJSON_SUFFIXES):
            yield from read_ndjson(file)
        else:
            yield from read_json_file(file)


def read_ndjson(file: Path) -> Iterator[ReadItem]:
    try:
        with _open_text(file) as fh:
            for lineno, line in enumerate(fh, start=1):
                origin = f"{file.name}:{lineno}"
                if not line.strip():
                    continue
                try:
                    resource = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield ReadProblem(origin, f"bad JSON: {exc.msg} at column {exc.colno}")
                    continue
                if not isinstance(resource, dict) or "resourceType" not in resource:
                    yield ReadProblem(origin, "not a FHIR resource (no resourceType)")
                    continue
                if resource["resourceType"] == "Bundle":
                    yield from bundle_entries(resource, origin)
                else:
                    yield RawResource(resource, origin)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        yield ReadProblem(file.name, f"unreadable file: {exc}")


def read_json_file(file: Path) -> Iterator[ReadItem]:
    try:
        with _open_text(file) as fh:
            document = json.load(fh)
    except json.JSONDecodeError as exc:
        yield ReadProblem(file.name, f"bad JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
        return
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        yield ReadProblem(file.name, f"unreadable file: {exc}")
        return
    if not isinstance(document, dict) or "resourceType" not in document:
        yield ReadProblem(file.name, "not a FHIR resource (no resourceType)")
    elif document["resourceType"] == "Bundle":
        yield from bundle_entries(document, file.name)
    else:
        yield RawResource(document, file.name)


def bundle_entries(bundle: dict, origin: str) -> Iterator[ReadItem]:
    """Entries of a transaction, batch, collection or searchset Bundle, with urn:uuid resolved."""
    entries = bundle.get("entry") or []
    local_refs = {}
    for entry in entries:
        resource = entry.get("resource") if isinstance(entry, dict) else None
        full_url = entry.get("fullUrl") if isinstance(entry, dict) else None
        if isinstance(resource, dict) and full_url and resource.get("id") and resource.get("resourceType"):
            local_refs[full_url] = f"{resource['resourceType']}/{resource['id']}"
    for index, entry in enumerate(entries):
        position = f"{origin}#entry[{index}]"
        resource = entry.get("resource") if isinstance(entry, dict) else None
        if not isinstance(resource, dict) or "resourceType" not in resource:
            if isinstance(entry, dict) and entry.get("request", {}).get("method") == "DELETE":
                continue  # a delete instruction carries no resource
            yield ReadProblem(position, "bundle entry without a resource")
            continue
        if resource["resourceType"] == "Bundle":
            yield from bundle_entries(resource, position)
            continue
        yield RawResource(resolve_references(resource, local_refs), position)


def resolve_references(node, local_refs: dict):
    """Rewrite `urn:uuid:` references that point into the same bundle to `Type/id`."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "reference" and isinstance(value, str) and value in local_refs:
                out[key] = local_refs[value]
            else:
                out[key] = resolve_references(value, local_refs)
        return out
    if isinstance(node, list):
        return [resolve_references(item, local_refs) for item in node]
    return node

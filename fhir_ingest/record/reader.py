"""Read FHIR R4 resources from Bundles (.json / .json.gz), NDJSON and directories of these.

Every resource comes out with its position ("file.json.gz#entry[12]", "file.ndjson:7") and the
document it came from (a bundle file, a bare resource file, an NDJSON line) with what the document
says of itself (a Bundle file or not, a `Patient/$everything` searchset or not): what decides
whether the input may be a patient's whole record (see `load.py`). Anything that cannot be read
comes out as a `ReadProblem` with its position, and anything read with a repair (undecodable bytes replaced, an
id taken from the entry's fullUrl) as a `ReadWarning`, so the caller reports it and carries on.
A bad file, line, entry or byte costs only itself.
"""
from __future__ import annotations

import gzip
import io
import json
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Union
from urllib.parse import parse_qsl, urlsplit

import ijson
import orjson

from fhir_ingest.record.reference_table import ReferenceTable

BUNDLE_SUFFIXES = (".json", ".json.gz")
NDJSON_SUFFIXES = (".ndjson", ".ndjson.gz", ".jsonl", ".jsonl.gz")
# Deeper than any real resource (extensions of extensions, contained resources) and far below the
# depth at which Python's own JSON reader and the FHIR models give up with a RecursionError.
MAX_RESOURCE_DEPTH = 64
MAX_BUNDLE_NESTING = 8
# An attachment's `data` (base64) over this is left out of its resource, reported, and the rest
# indexed: a scanned PDF of 24 MB fits; chartcite indexes 200,000 characters of a note anyway.
MAX_ATTACHMENT_BYTES = 32 * 2**20
# A JSON file larger than this is parsed as a stream, entry by entry; smaller ones whole (faster).
STREAM_OVER = 64 * 2**20
READ_CHUNK = 1 << 16
# Damage to a compressed stream: gzip reports it with any of these.
DAMAGED = (OSError, EOFError, zlib.error)


# One NDJSON line longer than this is not read (a resource of 64 MB is not a clinical record but
# a fault or an attack); its bytes are passed over, not held, and the line is reported.
MAX_LINE_BYTES = 64 * 2**20


class LineTooLong(bytes):
    """An empty stand-in for a line over MAX_LINE_BYTES; `skipped` is how many bytes it had."""
    skipped = 0


def split_lines(chunks: Iterator[bytes], max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """Lines from chunks of bytes, in time linear in the bytes: the pieces of a line are kept in a
    list and joined once, not re-split as one growing buffer at every chunk."""
    pieces: list[bytes] = []
    held = passed_over = 0          # bytes of the current line kept, and passed over once over the cap
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if passed_over or held + len(piece) > max_line:
                passed_over += held + len(piece)
                pieces, held = [], 0
            else:
                pieces.append(piece)
                held += len(piece)
            if end < 0:
                break
            yield line_of(pieces, held, passed_over, 1)
            pieces, held, passed_over, start = [], 0, 0, end + 1
    if held or passed_over:
        yield line_of(pieces, held, passed_over, 0)


def line_of(pieces: list[bytes], held: int, passed_over: int, newline: int) -> tuple[int, bytes]:
    if passed_over:
        too_long = LineTooLong()
        too_long.skipped = passed_over
        return passed_over + newline, too_long
    return held + newline, b"".join(pieces)


@dataclass(frozen=True)
class ReadLimits:
    """How far a compressed file may expand before it is read no further: a few hundred kilobytes
    of gzip can hold gigabytes of the same byte, which take time to read through. Memory does not
    depend on it (files are streamed, lines and attachments capped); so the ratio to the
    compressed size, which also stops real records (a blank scan compresses 300 times), is off
    unless set. The settings CHARTCITE_MAX_EXPANDED_MB and CHARTCITE_MAX_EXPANSION_RATIO set them."""
    max_expanded_bytes: int = 1024 * 2**20
    max_expansion_ratio: float = 0.0      # 0 = no ratio limit

    def for_file(self, compressed_bytes: int) -> tuple[int, str]:
        """The bytes a file of this compressed size may expand to, and the limit that sets it."""
        by_ratio = int(self.max_expansion_ratio * max(compressed_bytes, 1))
        if self.max_expansion_ratio > 0 and by_ratio < self.max_expanded_bytes:
            return by_ratio, (f"more than {self.max_expansion_ratio:g} times its compressed size of "
                              f"{compressed_bytes:,} bytes (CHARTCITE_MAX_EXPANSION_RATIO)")
        return self.max_expanded_bytes, (f"to more than {self.max_expanded_bytes / 2**20:g} MB "
                                         f"(CHARTCITE_MAX_EXPANDED_MB)")


DEFAULT_LIMITS = ReadLimits()


class TooExpanded(Exception):
    """A compressed file expanded beyond its limit (the message says which)."""


class ExpansionGuard(io.RawIOBase):
    """The decompressed stream, counted as it is read: past the limit it raises instead of handing
    out more, so checking never costs more memory than the limit allows (no inflating it all)."""

    def __init__(self, stream: BinaryIO, limit: int, words: str):
        super().__init__()
        self.stream, self.limit, self.words, self.expanded = stream, limit, words, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self.stream.readinto(buffer)
        self.expanded += count
        if self.expanded > self.limit:
            raise TooExpanded(f"the file expands {self.words}")
        return count

    def close(self) -> None:
        self.stream.close()
        super().close()


@dataclass(frozen=True)
class Document:
    """The unit a resource was read in: a file, or one line of an NDJSON file."""
    key: str = ""              # unique within a run (the file's path, and the line); "" = a source with its own
                               # authority rule (a patient's EHR sync, a Bulk export)
    name: str = ""             # as the report names it
    bundle: bool = False       # a Bundle file: an NDJSON line (each line its own document) or a bare resource never is
    everything_of: str = ""    # the patient whose `Patient/$everything` searchset this Bundle says it is
    partial: str = ""          # why the Bundle is only part of an answer (a filtered search, a page), or ""
    as_of: str = ""            # the Bundle's own date (`Bundle.timestamp`), or ""


NO_DOCUMENT = Document()


@dataclass
class RawResource:
    resource: dict
    origin: str
    document: Document = NO_DOCUMENT


@dataclass
class ReadProblem:
    origin: str
    reason: str


@dataclass
class ReadWarning:
    origin: str
    reason: str


ReadItem = Union[RawResource, ReadProblem, ReadWarning]


def _open_binary(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> BinaryIO:
    if not path.name.endswith(".gz"):
        return open(path, "rb")
    limit, words = limits.for_file(path.stat().st_size)
    return io.BufferedReader(ExpansionGuard(gzip.open(path, "rb"), limit, words))


def iter_files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        for child in sorted(path.rglob("*")):
            if child.is_file() and child.name.endswith(BUNDLE_SUFFIXES + NDJSON_SUFFIXES):
                yield child
    else:
        yield path


def read_path(path: str | Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ReadItem]:
    """Yield every resource (or problem, or warning) found under `path`."""
    path = Path(path)
    if not path.exists():
        yield ReadProblem(str(path), "no such file or directory")
        return
    for file in iter_files(path):
        if file.name.endswith(NDJSON_SUFFIXES):
            yield from read_ndjson(file, limits)
        else:
            yield from read_json_file(file, limits)


def decode_utf8(raw: bytes, origin: str) -> tuple[str, ReadWarning | None]:
    """Text of `raw`; bytes that are not UTF-8 are replaced (U+FFFD) and reported with their offset,
    so one bad byte costs one character, not the file."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        text = raw.decode("utf-8", errors="replace")
        bad = raw[exc.start:exc.end]
        return text, ReadWarning(origin, f"bytes that are not UTF-8 (first: 0x{bad.hex()} at byte offset {exc.start}) "
                                         f"were replaced with U+FFFD")


def parse_json(text: str) -> object:
    """The parsed document. orjson reads valid JSON about twice as fast as `json`; what it refuses
    (NaN, integers beyond 64 bits, lone surrogates, deep nesting, bad JSON) goes to `json`, which
    reads the first three exactly as before and words the errors (line and column)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def read_ndjson(file: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ReadItem]:
    lineno = 0
    try:
        with _open_binary(file, limits) as fh:
            for lineno, (_, line) in enumerate(split_lines(iter(lambda: fh.read(READ_CHUNK), b"")), start=1):
                origin = f"{file.name}:{lineno}"
                if isinstance(line, LineTooLong):
                    yield ReadProblem(origin, f"a line of {line.skipped:,} bytes, over the {MAX_LINE_BYTES // 2**20} "
                                              f"MB a line may hold: not read")
                elif line.strip():
                    yield from read_line(line, origin, Document(f"{file}:{lineno}", origin))
    except TooExpanded as exc:
        yield ReadProblem(f"{file.name}:{lineno + 1}", f"{exc}: the rest of the file is skipped; "
                                                     f"the lines before it were read")
    except DAMAGED as exc:
        where = f"after line {lineno}" if lineno else "at its start"
        yield ReadProblem(f"{file.name}:{lineno + 1}", f"the file is damaged {where} ({_describe(exc)}); "
                                                     f"the lines before it were read")


def read_line(line: bytes, origin: str, document: Document) -> Iterator[ReadItem]:
    text, warning = decode_utf8(line, origin)
    if warning:
        yield warning
    try:
        resource = parse_json(text)
    except json.JSONDecodeError as exc:
        yield ReadProblem(origin, f"bad JSON: {exc.msg} at column {exc.colno}")
        return
    except ValueError as exc:
        yield ReadProblem(origin, str(exc))
        return
    yield from document_items(resource, origin, document)


def read_json_file(file: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[ReadItem]:
    """A Bundle or a resource file: read whole up to STREAM_OVER bytes (fastest), else as a
    stream, entry by entry, so that memory does not grow with the file."""
    try:
        with _open_binary(file, limits) as fh:
            raw = fh.read(STREAM_OVER + 1)
    except TooExpanded as exc:
        yield ReadProblem(file.name, f"{exc}: the file is skipped")
        return
    except DAMAGED as exc:
        yield ReadProblem(file.name, f"unreadable file: {_describe(exc)}")
        return
    if len(raw) > STREAM_OVER:
        del raw
        yield from read_large_bundle(file, limits)
        return
    text, warning = decode_utf8(raw, file.name)
    if warning:
        yield warning
    try:
        parsed = parse_json(text)
    except json.JSONDecodeError as exc:
        yield ReadProblem(file.name, f"bad JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
        return
    except ValueError as exc:
        yield ReadProblem(file.name, str(exc))
        return
    yield from document_items(parsed, file.name, file_document(parsed, file))


def read_large_bundle(file: Path, limits: ReadLimits) -> Iterator[ReadItem]:
    """A file over STREAM_OVER bytes, parsed as a stream (ijson): a first pass reads what the
    Bundle says of itself and its entries' fullUrls (for local references), a second hands out
    the entries one at a time. A file that turns out bad yields what came before the fault."""
    refs = ReferenceTable()
    try:
        with _open_binary(file, limits) as fh:
            head, count = bundle_outline(fh, refs)
        if head.get("resourceType") != "Bundle":
            yield ReadProblem(file.name, f"a {head.get('resourceType') or 'JSON document'} of more than "
                                         f"{STREAM_OVER // 2**20} MB that is not a Bundle: not read")
            return
        document = bundle_document(head, str(file), file.name, count)
        with _open_binary(file, limits) as fh:
            entries = ijson.items(fh, "entry.item", use_float=True)
            yield from entry_items(enumerate(entries), file.name, document, refs, assign_ids=True)
    except TooExpanded as exc:
        yield ReadProblem(file.name, f"{exc}: the rest of the file is skipped")
    except DAMAGED as exc:
        yield ReadProblem(file.name, f"unreadable file: {_describe(exc)}")
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        yield ReadProblem(file.name, f"bad JSON: {str(exc)[:200]}; the entries before it were read")
    finally:
        refs.close()


# What a streamed Bundle's outline keeps of its own fields (any other, however large, is passed over).
OUTLINE_FIELDS = {"resourceType", "id", "type", "timestamp", "total", "link"}


def bundle_outline(fh: BinaryIO, refs: ReferenceTable) -> tuple[dict, int]:
    """What a Bundle says of itself (OUTLINE_FIELDS) and how many entries it has, from one
    streaming pass that keeps no entry; its entries' fullUrl → `Type/id` go into `refs`."""
    head, builders, key = {}, {}, None
    entry: dict = {}
    count = 0
    for prefix, event, value in ijson.parse(fh, use_float=True):
        if prefix == "" and event == "map_key":
            key = value
            if key in OUTLINE_FIELDS:
                builders[key] = ijson.ObjectBuilder()
            continue
        if key is None or prefix == "":
            continue
        if key in OUTLINE_FIELDS:
            builders[key].event(event, value)
        elif prefix == "entry.item" and event in ("start_map", "end_map"):
            if event == "end_map":
                count += 1
                local_reference(entry, refs)
            entry = {}
        elif prefix in ("entry.item.fullUrl", "entry.item.resource.resourceType", "entry.item.resource.id"):
            entry[prefix.rsplit(".", 1)[1]] = value
    refs.flush()
    head = {name: builder.value for name, builder in builders.items()}
    return head, count


def local_reference(entry: dict, refs: ReferenceTable) -> None:
    """fullUrl → `Type/id` for one entry outlined, its id taken from a `urn:uuid` fullUrl when it has none."""
    full_url, rtype, rid = entry.get("fullUrl"), entry.get("resourceType"), entry.get("id")
    if not rid and isinstance(full_url, str) and full_url.startswith("urn:uuid:"):
        rid = full_url[len("urn:uuid:"):]
    if isinstance(full_url, str) and isinstance(rtype, str) and isinstance(rid, str) and rid:
        refs.add(full_url, f"{rtype}/{rid}")


def file_document(parsed: object, file: Path) -> Document:
    """What a whole file says of itself: a Bundle or a bare resource; a `Patient/$everything`
    searchset; a part of an answer; its date."""
    if not isinstance(parsed, dict) or parsed.get("resourceType") != "Bundle":
        return Document(str(file), file.name)
    return bundle_document(parsed, str(file), file.name)


def bundle_document(bundle: dict, key: str, name: str, entries: int | None = None) -> Document:
    """`entries`: how many entries it has, when they are not in `bundle` (a streamed file)."""
    timestamp = bundle.get("timestamp")
    return Document(key, name, bundle=True, everything_of=everything_patient(bundle),
                    partial=partial_words(bundle, entries), as_of=timestamp if isinstance(timestamp, str) else "")


# Parameters that change how a search answer is written, not what it holds.
PRESENTATION_PARAMETERS = {"_format", "_pretty", "_elements_format"}


def bundle_links(bundle: dict) -> list[dict]:
    links = bundle.get("link")
    return [link for link in links if isinstance(link, dict)] if isinstance(links, list) else []


def self_url(bundle: dict) -> str:
    return next((link["url"] for link in bundle_links(bundle)
                 if link.get("relation") == "self" and isinstance(link.get("url"), str)), "")


def everything_patient(bundle: dict) -> str:
    """The patient id of a searchset Bundle whose self link is `.../Patient/<id>/$everything`, else ''."""
    if bundle.get("type") != "searchset":
        return ""
    parts = urlsplit(self_url(bundle)).path.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-3] == "Patient" and parts[-1] == "$everything":
        return parts[-2]
    return ""


def partial_words(bundle: dict, entries: int | None = None) -> str:
    """Why a searchset Bundle holds only part of a record, or '': a search other than the
    patient's `$everything`, a filtered one (`_since`, `_type`, `start`, `_count` with a full
    page…), one page of several, or fewer entries than its `total` counts. What a search leaves
    out it says nothing of."""
    if bundle.get("type") != "searchset":
        return ""
    url = self_url(bundle)
    if not everything_patient(bundle):
        return f"a search ({urlsplit(url).path.rsplit('/', 1)[-1] or 'no self link'}), not a whole record"
    if entries is None:
        entries = len(bundle["entry"]) if isinstance(bundle.get("entry"), list) else 0
    parameters = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    filters = sorted(set(parameters) - PRESENTATION_PARAMETERS - ({"_count"} if page_not_full(parameters, entries)
                                                                   else set()))
    if filters:
        return f"a `$everything` filtered by {', '.join(f'`{name}`' for name in filters)}"
    paging = sorted({link.get("relation") for link in bundle_links(bundle)} & {"next", "previous", "prev"})
    if paging:
        return f"a `$everything` page that links to a {' and a '.join(paging)} page"
    total = bundle.get("total")
    if isinstance(total, int) and not isinstance(total, bool) and total > entries:
        return f"a `$everything` holding {entries} of the {total} entries its total counts"
    return ""


def page_not_full(parameters: dict[str, str], entries: int) -> bool:
    """A page size (`_count`) the answer did not fill: nothing was left for a next page."""
    count = parameters.get("_count", "")
    return count.isdigit() and entries < int(count)


def document_items(parsed: object, origin: str, document: Document) -> Iterator[ReadItem]:
    """One parsed JSON document (a file or an NDJSON line): a Bundle's entries or one resource."""
    if not isinstance(parsed, dict) or "resourceType" not in parsed:
        yield ReadProblem(origin, "not a FHIR resource (no resourceType)")
    elif not isinstance(parsed["resourceType"], str):
        yield ReadProblem(origin, f"invalid resourceType {str(parsed['resourceType'])[:40]}: it must name a type")
    elif parsed["resourceType"] == "Bundle":
        yield from bundle_entries(parsed, origin, document)
    else:
        yield from checked_shape(parsed, origin, document)


def checked_shape(resource: dict, origin: str, document: Document,
                  local_refs: dict | None = None) -> Iterator[ReadItem]:
    """The resource, with its bundle's local references resolved and any attachment over
    MAX_ATTACHMENT_BYTES left out (and reported), unless it nests too deep to read safely
    (validating walks it recursively)."""
    oversize: list[tuple[dict, int]] = []
    if not within_depth(resource, local_refs or {}, MAX_RESOURCE_DEPTH, oversize):
        yield ReadProblem(origin, f"{resource['resourceType']} nested more than {MAX_RESOURCE_DEPTH} levels deep")
        return
    for attachment, size in oversize:
        del attachment["data"]
        yield ReadWarning(origin, f"{resource['resourceType']}/{resource.get('id')}: an attachment of {size:,} bytes, "
                                  f"over the {MAX_ATTACHMENT_BYTES // 2**20} MB an attachment may hold: left out; "
                                  f"the rest of the resource is indexed")
    yield RawResource(resource, origin, document)


def within_depth(node: dict | list, local_refs: dict[str, str], levels_left: int,
                 oversize: list[tuple[dict, int]] | None = None) -> bool:
    """Whether `node` nests at most `levels_left` levels (itself the first), rewriting on the way,
    in place, the references that point into the same bundle (`urn:uuid:`, absolute fullUrls) to
    `Type/id`, and noting in `oversize` the attachments whose `data` is over the cap. One walk
    does all: it was several, and the largest cost of reading. The recursion stops at the limit,
    far below Python's own."""
    if levels_left < 1:
        return False
    children = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in children:
        if isinstance(value, (dict, list)):
            if not within_depth(value, local_refs, levels_left - 1, oversize):
                return False
        elif key in ("reference", "url") and isinstance(value, str):
            # One look-up, not `in` then `[]`: a streamed bundle's table is a query each time.
            resolved = local_refs.get(value)
            if resolved is not None:
                node[key] = resolved
        elif key == "data" and oversize is not None and isinstance(value, str) and len(value) > MAX_ATTACHMENT_BYTES:
            oversize.append((node, len(value)))
    return True


def bundle_entries(bundle: dict, origin: str, document: Document, nesting: int = 1) -> Iterator[ReadItem]:
    """Entries of a transaction, batch, collection or searchset Bundle, with urn:uuid resolved.

    An entry without an id (the usual POST shape of a transaction) gets the one its `urn:uuid`
    fullUrl names, reported as a warning, so the same bundle read twice gives the same ids."""
    if nesting > MAX_BUNDLE_NESTING:
        yield ReadProblem(origin, f"Bundles nested more than {MAX_BUNDLE_NESTING} deep")
        return
    entries = bundle.get("entry") or []
    if not isinstance(entries, list):
        yield ReadProblem(origin, "Bundle.entry is not a list")
        return
    warnings = [w for w in (assign_entry_id(e, f"{origin}#entry[{i}]") for i, e in enumerate(entries)) if w]
    yield from warnings
    yield from entry_items(enumerate(entries), origin, document, local_references(entries), nesting)


def entry_items(entries: Iterable[tuple[int, object]], origin: str, document: Document, local_refs: dict[str, str],
                nesting: int = 1, assign_ids: bool = False) -> Iterator[ReadItem]:
    """Each numbered entry's resource (or problem), its bundle's local references resolved;
    `assign_ids`: an id is taken from the fullUrl here (entries streamed one at a time)."""
    for index, entry in entries:
        position = f"{origin}#entry[{index}]"
        warning = assign_entry_id(entry, position) if assign_ids else None
        if warning:
            yield warning
        resource = entry.get("resource") if isinstance(entry, dict) else None
        if not isinstance(resource, dict) or "resourceType" not in resource:
            if not _is_delete(entry):      # a delete instruction carries no resource
                yield ReadProblem(position, "bundle entry without a resource")
            continue
        if not isinstance(resource["resourceType"], str):
            yield ReadProblem(position, f"invalid resourceType {str(resource['resourceType'])[:40]}: it must name a type")
            continue
        if resource["resourceType"] == "Bundle":
            yield from bundle_entries(resource, position, document, nesting + 1)
            continue
        yield from checked_shape(resource, position, document, local_refs)


def _is_delete(entry: object) -> bool:
    request = entry.get("request") if isinstance(entry, dict) else None
    return isinstance(request, dict) and request.get("method") == "DELETE"


def assign_entry_id(entry: object, position: str) -> ReadWarning | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("resource"), dict):
        return None
    resource, full_url = entry["resource"], entry.get("fullUrl")
    if resource.get("id") or not isinstance(full_url, str) or not full_url.startswith("urn:uuid:"):
        return None
    derived = full_url[len("urn:uuid:"):]
    try:
        uuid.UUID(derived)
    except ValueError:
        return None
    resource["id"] = derived
    return ReadWarning(position, f"{resource.get('resourceType')} had no id; its fullUrl's uuid {derived} is used")


def local_references(entries: list) -> dict[str, str]:
    """fullUrl → `Type/id` for the bundle's own entries (urn:uuid and absolute URLs alike)."""
    refs = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("resource"), dict):
            continue
        resource, full_url = entry["resource"], entry.get("fullUrl")
        rtype, rid = resource.get("resourceType"), resource.get("id")
        if isinstance(full_url, str) and isinstance(rtype, str) and isinstance(rid, str) and rid:
            refs[full_url] = f"{rtype}/{rid}"
    return refs


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

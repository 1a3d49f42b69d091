"""FHIR Bulk Data Access ($export), client side: which types to ask for, kick-off, polite polling,
downloads that resume where they broke, deletions and errors.

- The types are the kinds chartcite reads (its registry of kinds), narrowed to those the EHR's
  CapabilityStatement offers and its granted scopes cover, or as hospital IT narrowed them.
- The status URL is polled no faster than the EHR's Retry-After asks and ever slower (capped),
  reporting X-Progress; a failed export is said in the EHR's own words.
- An output file is read as its bytes arrive (it can be larger than memory), its lines split in
  linear time and capped (`MAX_LINE_BYTES`); a transfer cut mid-file is resumed from the last
  complete line with an HTTP Range request made conditional by `If-Range` on the validator (ETag
  or Last-Modified) its first response gave, so a file regenerated in between is never spliced:
  the EHR then sends it whole and it is read again from its start, as is a file that gave no
  validator.
- `deleted` outputs name resources gone since `_since`; `error` outputs are OperationOutcomes: an
  issue of severity error or fatal means part of the export is missing.
An export interrupted by shutdown is cancelled with DELETE so the EHR can drop its files.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import requests

from .client import FhirClient, FhirError, FhirUnavailable, issue_words, outcome_words, retry_after_seconds
from .fetch import declared_resources, scope_covers
from ..record.kinds import PATIENT_SEARCHES, REFERENCED_TYPES
from ..record.normalize import ref_id
from ..record.reader import MAX_LINE_BYTES, split_lines

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int, str], None]     # phase, done, total, note

# What a Bulk round asks for: every kind chartcite reads that names its patient, the Patient, and
# the Medications orders point at. A note's Binary is not exported (a Group export of Binary is
# every attachment of the EHR); notes carry their text or are read at a launch.
BULK_TYPES = ("Patient", *PATIENT_SEARCHES, *(t for t in REFERENCED_TYPES if t not in ("Patient", "Binary")))
# The status URL is polled as the EHR's Retry-After says (never sooner, nor sooner than POLL_FLOOR,
# and up to POLL_LONGEST). Without one, the first wait is POLL_FIRST seconds and each half as long
# again as the one before, up to a ceiling of POLL_SHORT seconds while the export is young, then a
# tenth of the time it has run, up to POLL_MAX: a short export is seen done within seconds and a
# long one costs a few dozen polls, not thousands.
POLL_FIRST, POLL_FLOOR, POLL_SHORT, POLL_MAX, POLL_LONGEST = 1.0, 0.5, 5.0, 60.0, 600.0
# OperationOutcome issue codes a server uses for "poll again later" (Bulk Data: "a transient code").
TRANSIENT_CODES = {"transient", "lock-error", "no-store", "exception", "timeout", "incomplete", "throttled"}


class BulkExportError(FhirError):
    """The export cannot go on; the message says why in the EHR's own words."""


class GroupNotFound(BulkExportError):
    pass


@dataclass
class Manifest:
    transaction_time: str
    requires_token: bool
    outputs: list[dict]
    deleted: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)

    @classmethod
    def from_json(cls, body: dict) -> "Manifest":
        listed = lambda key: [o for o in body.get(key) or [] if isinstance(o, dict) and o.get("url")]
        return cls(str(body.get("transactionTime", "")), bool(body.get("requiresAccessToken")), listed("output"),
                   listed("deleted"), listed("error"))

    def to_json(self) -> dict:
        return {"transactionTime": self.transaction_time, "requiresAccessToken": self.requires_token,
                "output": self.outputs, "deleted": self.deleted, "error": self.errors}


@dataclass
class Poll:
    """One answer of the status URL: the manifest when the export is done, else its progress and
    how long the EHR asks to wait."""
    manifest: Manifest | None = None
    progress: str = ""
    retry_after: float = 0.0


# --- which types ------------------------------------------------------------------------------------

def capability_statement(client: FhirClient) -> dict:
    """The EHR's CapabilityStatement, read without a token (FHIR serves it to anyone), so the
    token can be asked for exactly what the EHR offers; {} when it cannot be read."""
    try:
        response = client.request("GET", "metadata", authorized=False)
        body = response.json() if response.status_code == 200 else {}
    except (FhirError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def bulk_types(statement: dict, override: str = "") -> tuple[list[str], list[str]]:
    """The types to export and, one line each, the ones left out and why: every kind chartcite
    reads that the CapabilityStatement declares (all of them when it declares none), or the
    registration's own list (`ehr update --bulk-types`) as IT wrote it."""
    if override:
        return override.split(","), []
    declared = declared_resources(statement)
    types = [t for t in BULK_TYPES if not declared or t in declared]
    left_out = [f"{t}: not offered by this EHR (its CapabilityStatement)" for t in BULK_TYPES if t not in types]
    return types, left_out


def granted_types(types: list[str], granted: str) -> tuple[list[str], list[str]]:
    """The types the granted scopes cover (all, when the EHR did not say what it granted)."""
    if not granted:
        return types, []
    kept = [t for t in types if scope_covers(granted, t)]
    return kept, [f"{t}: not granted (scopes)" for t in types if t not in kept]


# --- the export -------------------------------------------------------------------------------------

class BulkExport:
    def __init__(self, client: FhirClient, poll_first: float = POLL_FIRST, poll_max: float = POLL_MAX,
                 give_up_after: float = 6 * 3600.0):
        self.client = client
        self.poll_first = poll_first
        self.poll_max = poll_max
        self.give_up_after = give_up_after

    def kickoff(self, group_id: str = "", types: tuple[str, ...] | list[str] = (), since: str = "") -> str:
        path = f"Group/{group_id}/$export" if group_id else "Patient/$export"
        params = {}
        if types:
            params["_type"] = ",".join(types)
        if since:
            params["_since"] = since
        response = self.client.request("GET", path, params=params, headers={"Prefer": "respond-async"})
        if response.status_code == 202 and response.headers.get("Content-Location"):
            return response.headers["Content-Location"]
        if group_id and response.status_code == 404:
            raise GroupNotFound(f"the EHR has no Group {group_id} ({outcome_words(response)})", 404)
        raise BulkExportError(f"the EHR refused the Bulk export ({response.status_code}: "
                              f"{outcome_words(response)})", response.status_code)

    def poll(self, status_url: str) -> Poll:
        """One look at the status URL. 429 and 503 are waited out inside the client (Retry-After);
        a 4xx or 5xx whose OperationOutcome is transient is "not yet", any other means the export
        failed, said in the EHR's words. `retry_after` is 0 when the EHR named no wait."""
        response = self.client.request("GET", status_url, retry_statuses={429, 502, 503, 504})
        if response.status_code == 200:
            return Poll(Manifest.from_json(response.json()))
        wait = retry_after_seconds(response.headers.get("Retry-After"), 0.0)
        if response.status_code == 202:
            return Poll(None, response.headers.get("X-Progress", "in progress")[:100], wait)
        if response.status_code >= 500 and transient_outcome(response):
            return Poll(None, "the EHR asked to poll again later", wait)
        raise BulkExportError(f"the EHR's export failed ({response.status_code}: {outcome_words(response)})",
                              response.status_code)

    def wait(self, status_url: str, progress: Progress | None = None,
             sleep: Callable[[float], None] = time.sleep) -> Manifest:
        """Poll until the manifest, as the EHR's Retry-After says, else backing off (`poll_wait`)."""
        delay, started = self.poll_first, time.monotonic()
        while True:
            poll = self.poll(status_url)
            if poll.manifest is not None:
                return poll.manifest
            if progress:
                progress("exporting", 0, 0, poll.progress)
            elapsed = time.monotonic() - started
            if elapsed > self.give_up_after:
                raise BulkExportError(f"the EHR's export did not finish in {self.give_up_after / 3600:.0f} hours")
            wait = poll_wait(poll.retry_after, delay, elapsed, self.poll_max)
            sleep(wait)
            delay = wait * 1.5

    def cancel(self, status_url: str) -> None:
        try:
            self.client.request("DELETE", status_url)
        except FhirError:
            log.warning("could not cancel a bulk export; the EHR will expire it")

    @contextmanager
    def job(self, group_id: str = "", types: tuple[str, ...] = (), since: str = ""):
        """The status URL of a running export; cancelled if the caller stops before the end."""
        status_url = self.kickoff(group_id, types, since)
        finished = False
        try:
            yield status_url
            finished = True
        finally:
            if not finished:
                self.cancel(status_url)

    def open_file(self, url: str, requires_token: bool, offset: int = 0,
                  validator: str = "") -> tuple[requests.Response, bool]:
        """An output file streaming from its start, or from byte `offset` when `validator` (the
        ETag or Last-Modified of the response the earlier bytes came from) shows it unchanged:
        `If-Range` asks for the rest only if so (unencoded, so byte offsets mean the same).
        Returns the response and whether it resumes at `offset` (else it is the whole file)."""
        resume = bool(offset and validator)
        headers = {"Range": f"bytes={offset}-", "If-Range": validator, "Accept-Encoding": "identity"} if resume else None
        response = self.client.request("GET", url, accept="application/fhir+ndjson", authorized=requires_token,
                                       stream=True, headers=headers)
        if response.status_code == 206 and resume:
            return response, True
        if response.status_code != 200:
            words = outcome_words(response)
            response.close()
            raise BulkExportError(f"a Bulk output file answered {response.status_code}: {words}", response.status_code)
        return response, False

    def small_file(self, url: str, requires_token: bool) -> Iterator[dict]:
        """Each JSON line of a small file (a `deleted` or `error` output), read whole."""
        response, _ = self.open_file(url, requires_token)
        with response:
            try:
                body = response.content
            except requests.RequestException as exc:
                raise FhirUnavailable(f"a Bulk output file broke off: {type(exc).__name__}") from exc
        for line in body.splitlines():
            if line.strip():
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    yield value

    def deleted_refs(self, manifest: Manifest) -> list[str]:
        refs = []
        for output in manifest.deleted:
            for bundle in self.small_file(output["url"], manifest.requires_token):
                for entry in bundle.get("entry") or []:
                    request = entry.get("request") if isinstance(entry, dict) else None
                    if not isinstance(request, dict):
                        continue
                    if request.get("method") == "DELETE" and str(request.get("url", "")).count("/") == 1:
                        refs.append(request["url"])
        return refs

    def error_issues(self, manifest: Manifest) -> tuple[list[str], list[str]]:
        """The `error` outputs' issues: (errors, warnings). An error or fatal issue means part of
        the export is missing; a warning (an ignored parameter) loses nothing."""
        errors, warnings = [], []
        for output in manifest.errors:
            for outcome in self.small_file(output["url"], manifest.requires_token):
                for issue in outcome.get("issue") or []:
                    if isinstance(issue, dict):
                        severity = str(issue.get("severity") or "error")
                        (warnings if severity in ("warning", "information") else errors).append(issue_words(issue))
        return errors, warnings


def poll_wait(retry_after: float, delay: float, elapsed: float, poll_max: float = POLL_MAX) -> float:
    """How long to wait before the next status poll: the EHR's Retry-After when it gave one (it
    knows when its export ends; the Bulk Data spec asks clients to follow it); else our own
    back-off `delay`, capped at a few seconds for a young export and a tenth of its age after."""
    if retry_after > 0:
        return min(POLL_LONGEST, max(POLL_FLOOR, retry_after))
    return max(POLL_FLOOR, min(delay, poll_max, max(POLL_SHORT, elapsed / 10)))


def transient_outcome(response: requests.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    issues = body.get("issue") if isinstance(body, dict) else None
    return bool(issues) and all(isinstance(i, dict) and i.get("code") in TRANSIENT_CODES for i in issues)


def ndjson_lines(response: requests.Response, skip: int = 0, chunk_size: int = 1 << 14,
                 max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """The complete lines of a streaming NDJSON body, each with the number of bytes it took
    (newline included), after skipping the first `skip` bytes; a last line without its newline is
    complete when the body ends. Each chunk is searched once for newlines, so a long line costs
    linear time; a line over `max_line` bytes comes out as an empty `LineTooLong`. A transfer
    that breaks off raises FhirUnavailable: what was yielded before stands, the rest is read
    again from there. (A read that meets the break loses what it had read, so reads are small.)"""
    try:
        yield from split_lines(iter_skipped(response.iter_content(chunk_size), skip), max_line)
    except requests.RequestException as exc:
        raise FhirUnavailable(f"a Bulk output file broke off: {type(exc).__name__}") from exc


def iter_skipped(chunks: Iterator[bytes], skip: int) -> Iterator[bytes]:
    for chunk in chunks:
        if skip:
            dropped = min(skip, len(chunk))
            chunk, skip = chunk[dropped:], skip - dropped
        if chunk:
            yield chunk


@dataclass
class GroupMembers:
    """The patients a Group names, and, one line each, the members chartcite could not read as a
    patient (a reference to another type, an identifier no patient or several patients carry)."""
    patients: set[str] = field(default_factory=set)
    unread: list[str] = field(default_factory=list)


# Identifiers resolved per Patient search (token OR-search: `identifier=a,b,c`).
IDENTIFIERS_PER_SEARCH = 50


def group_members(client: FhirClient, group_id: str) -> GroupMembers:
    """The patients a Group names (`member.entity`), in every form a server writes them:
    `Patient/<id>`, an absolute URL, `urn:uuid:<id>` (the SMART reference server), or only the
    patient's identifier, resolved by a Patient search."""
    return read_group_members(client, client.get_json(f"Group/{group_id}"))


def read_group_members(client: FhirClient, group: dict) -> GroupMembers:
    members = group.get("member") if isinstance(group.get("member"), list) else []
    found, by_identifier = GroupMembers(), []
    for member in members:
        entity = member.get("entity") if isinstance(member, dict) else None
        entity = entity if isinstance(entity, dict) else {}
        patient = member_patient_id(entity)
        if patient:
            found.patients.add(patient)
        elif identifier_key(entity.get("identifier")):
            by_identifier.append(identifier_key(entity["identifier"]))
        else:
            found.unread.append(f"a member that is not a patient reference ({entity.get('reference') or 'no reference'})")
    resolved, unread = patients_by_identifier(client, by_identifier)
    found.patients |= resolved
    found.unread += unread
    return found


def member_patient_id(entity: dict) -> str:
    """The Patient id a member's reference names, or '' when it names something else."""
    reference = entity.get("reference")
    if not isinstance(reference, str) or not reference or "?" in reference:
        return ""
    if reference.startswith("urn:uuid:"):
        # A bare id names no type: it is a patient when the member says so or says nothing.
        return reference[9:] if entity.get("type", "Patient") == "Patient" else ""
    parts = reference.rstrip("/").split("/")
    if "_history" in parts:
        parts = parts[:parts.index("_history")]
    return parts[-1] if len(parts) >= 2 and parts[-2] == "Patient" else ""


def identifier_key(identifier) -> tuple[str, str] | None:
    """(system, value) of an Identifier; None without a value."""
    if not isinstance(identifier, dict) or not isinstance(identifier.get("value"), str) or not identifier["value"]:
        return None
    return str(identifier.get("system") or ""), identifier["value"]


def patients_by_identifier(client: FhirClient, keys: list[tuple[str, str]]) -> tuple[set[str], list[str]]:
    """The patient each identifier names (a Patient search, a batch at a time); an identifier that
    no patient or several patients carry is said, not guessed."""
    found: dict[tuple[str, str], set[str]] = {key: set() for key in keys}
    for start in range(0, len(keys), IDENTIFIERS_PER_SEARCH):
        batch = keys[start:start + IDENTIFIERS_PER_SEARCH]
        asked = ",".join(f"{system}|{value}" if system else value for system, value in batch)
        for patient in client.search("Patient", {"identifier": asked}):
            for key in batch:
                if carries_identifier(patient, key):
                    found[key].add(str(patient.get("id", "")))
    resolved = {next(iter(ids)) for ids in found.values() if len(ids) == 1}
    # The identifier's value (an MRN, often) is left out: these lines reach reports and logs.
    unread = [f"a member known only by an identifier of system {system or '(none)'} that "
              f"{'no patient' if not ids else f'{len(ids)} patients'} of the EHR carry"
              for (system, _value), ids in found.items() if len(ids) != 1]
    return resolved, unread


def carries_identifier(patient: dict, key: tuple[str, str]) -> bool:
    system, value = key
    return any(identifier_key(i) == key or (not system and identifier_key(i) and identifier_key(i)[1] == value)
               for i in patient.get("identifier") or [])


class SinceCheck:
    """Resources an export dated before `_since`. An incremental export holds resources changed
    after `_since`; older ones mean the EHR ignores `_since` (most of them: Epic's export is not
    incremental) or dates changes by another clock than its transactionTime. Either way this only
    widens what later rounds ask for (`reach_back`); it never decides that the export is a whole
    record, which would remove what it does not hold.

    Each such resource is kept as `Type/id@lastUpdated` (`backdated`), so that the next round,
    which reaches back and meets the same resource again, is not widened by it a second time:
    only a backdated resource not `known` from the round before moves `earliest`."""

    KEPT = 1000          # backdated resources remembered per file (an EHR ignoring _since has thousands)

    def __init__(self, since: str, known: set[str] | frozenset[str] = frozenset()):
        self.since = instant(since) if since else None
        self.known = known
        self.dated = self.older = 0
        self.earliest = None             # the oldest lastUpdated among those before _since not known
        self.backdated: list[str] = []

    def see(self, resource: dict) -> None:
        if self.since is None:
            return
        meta = resource.get("meta") if isinstance(resource.get("meta"), dict) else {}
        updated = instant(str(meta.get("lastUpdated", "")))
        if updated is None:
            return
        self.dated += 1
        if updated < self.since:
            self.older += 1
            key = f"{resource.get('resourceType')}/{resource.get('id')}@{meta.get('lastUpdated')}"
            if len(self.backdated) < self.KEPT:
                self.backdated.append(key)
            if key not in self.known:
                self.earliest = updated if self.earliest is None else min(self.earliest, updated)

    def resume(self, saved: dict) -> None:
        """Counts recorded before a download broke off, taken up again."""
        self.dated, self.older = saved.get("dated", 0), saved.get("older", 0)
        self.earliest, self.backdated = saved.get("earliest"), list(saved.get("backdated") or [])

    def to_dict(self) -> dict:
        return {"dated": self.dated, "older": self.older, "earliest": self.earliest, "backdated": self.backdated}

    @staticmethod
    def summed(seen: list[dict]) -> dict:
        earliest = [s["earliest"] for s in seen if s.get("earliest") is not None]
        return {"dated": sum(s.get("dated", 0) for s in seen), "older": sum(s.get("older", 0) for s in seen),
                "earliest": min(earliest) if earliest else None,
                "backdated": [key for s in seen for key in s.get("backdated") or []]}


def instant(text: str) -> float | None:
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def iso_instant(seconds: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

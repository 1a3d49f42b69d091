"""FHIR Bulk Data Access ($export), client side: kick-off, polling, downloads, deletions, errors.

The kick-off asks `Prefer: respond-async`; the status URL is polled with exponential backoff that
honours Retry-After, reporting X-Progress; outputs are read as NDJSON (with the access token when
the manifest says `requiresAccessToken`); `deleted` outputs name resources gone since `_since`;
`error` outputs are OperationOutcomes to report. An export interrupted by shutdown is cancelled
with DELETE so the EHR can drop its files.
"""
from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import requests

from .client import FhirClient, FhirError, retry_after_seconds
from ..record.normalize import ref_id
from ..record.reader import RawResource, ReadItem, ReadProblem

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int, str], None]     # phase, done, total, note


@dataclass
class Manifest:
    transaction_time: str
    requires_token: bool
    outputs: list[dict]
    deleted: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)

    @classmethod
    def from_json(cls, body: dict) -> "Manifest":
        return cls(body.get("transactionTime", ""), bool(body.get("requiresAccessToken")), body.get("output") or [],
                   body.get("deleted") or [], body.get("error") or [])


class BulkExportError(FhirError):
    pass


class BulkExport:
    def __init__(self, client: FhirClient, poll_first: float = 1.0, poll_max: float = 120.0, give_up_after: float = 6 * 3600):
        self.client = client
        self.poll_first = poll_first
        self.poll_max = poll_max
        self.give_up_after = give_up_after

    def kickoff(self, group_id: str = "", types: tuple[str, ...] = (), since: str = "") -> str:
        path = f"Group/{group_id}/$export" if group_id else "Patient/$export"
        params = {}
        if types:
            params["_type"] = ",".join(types)
        if since:
            params["_since"] = since
        response = self.client.request("GET", path, params=params, headers={"Prefer": "respond-async"})
        if response.status_code != 202 or not response.headers.get("Content-Location"):
            raise BulkExportError(f"bulk export kick-off answered {response.status_code}", response.status_code)
        return response.headers["Content-Location"]

    def wait(self, status_url: str, progress: Progress | None = None) -> Manifest:
        delay, started = self.poll_first, time.monotonic()
        while True:
            response = self.client.request("GET", status_url)
            if response.status_code == 200:
                return Manifest.from_json(response.json())
            if response.status_code != 202:
                raise BulkExportError(f"bulk export failed on the EHR ({response.status_code})", response.status_code)
            if progress:
                progress("exporting", 0, 0, response.headers.get("X-Progress", "in progress")[:100])
            if time.monotonic() - started > self.give_up_after:
                raise BulkExportError("bulk export did not finish in time")
            time.sleep(min(self.poll_max, retry_after_seconds(response.headers.get("Retry-After"), delay)))
            delay = min(self.poll_max, delay * 2)

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

    def _lines(self, manifest: Manifest, url: str) -> Iterator[tuple[int, str]]:
        """An output file's lines as they arrive: an export file can be larger than memory."""
        response = self.client.request("GET", url, accept="application/fhir+ndjson", authorized=manifest.requires_token,
                                       stream=True)
        with response:
            if response.status_code != 200:
                raise BulkExportError(f"bulk output download answered {response.status_code}", response.status_code)
            try:
                for number, line in enumerate(response.iter_lines(decode_unicode=False), start=1):
                    if line.strip():
                        yield number, line.decode("utf-8", errors="replace")
            except requests.RequestException as exc:
                # The cursor has not moved: the next round exports the same changes again.
                raise BulkExportError(f"bulk output download broke off: {type(exc).__name__}") from exc

    def resources(self, manifest: Manifest) -> Iterator[ReadItem]:
        for output in manifest.outputs:
            name = f"{output.get('type', '?')}.ndjson"
            for number, line in self._lines(manifest, output["url"]):
                try:
                    resource = json.loads(line)
                except ValueError as exc:
                    yield ReadProblem(f"{name}:{number}", f"not JSON: {exc.msg}")
                    continue
                if not isinstance(resource, dict) or "resourceType" not in resource:
                    yield ReadProblem(f"{name}:{number}", "line is not a FHIR resource")
                    continue
                yield RawResource(resource, f"{name}:{number}")

    def deleted_refs(self, manifest: Manifest) -> list[str]:
        refs = []
        for output in manifest.deleted:
            for _, line in self._lines(manifest, output["url"]):
                bundle = json.loads(line)
                for entry in bundle.get("entry") or []:
                    request = entry.get("request") or {}
                    if request.get("method") == "DELETE" and request.get("url", "").count("/") == 1:
                        refs.append(request["url"])
        return refs

    def error_messages(self, manifest: Manifest) -> list[str]:
        messages = []
        for output in manifest.errors:
            for _, line in self._lines(manifest, output["url"]):
                outcome = json.loads(line)
                messages += [str(i.get("diagnostics") or i.get("code")) for i in outcome.get("issue") or []]
        return messages


def group_members(client: FhirClient, group_id: str) -> set[str]:
    """The patients a Group names (`member.entity`): the patients a Group export is about."""
    group = client.get_json(f"Group/{group_id}")
    members = group.get("member") if isinstance(group.get("member"), list) else []
    refs = (ref_id(m.get("entity")) for m in members if isinstance(m, dict))
    return {ref.split("/", 1)[1] for ref in refs if ref.startswith("Patient/")}


class SinceCheck:
    """Did the EHR honour `_since`? Some do not (Epic's export is not incremental): they send the
    whole record again. An incremental export holds resources changed after `_since`; when most of
    the resources that carry meta.lastUpdated predate it, the export is a full one. (A few
    stragglers are tolerated: an EHR may track changes by another clock.)"""

    def __init__(self, since: str):
        self.since = _instant(since) if since else None
        self.dated = self.older = 0

    def watch(self, items: Iterator[ReadItem]) -> Iterator[ReadItem]:
        for item in items:
            if self.since is not None and isinstance(item, RawResource):
                updated = _instant(str((item.resource.get("meta") or {}).get("lastUpdated", "")))
                if updated is not None:
                    self.dated += 1
                    self.older += updated < self.since
            yield item

    @property
    def ignored(self) -> bool:
        return self.since is not None and self.dated > 0 and self.older * 2 > self.dated


def _instant(text: str) -> float | None:
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()

"""One patient's record read from an EHR's FHIR API: a search per resource type (paged), notes'
attachments fetched from Binary, conditional references resolved, and, after the first sync, only
what changed since (`_lastUpdated`), merged into what chartcite already holds.
"""
from __future__ import annotations

import base64
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .client import FhirClient, FhirError
from ..record.contract import PatientNotFound
from ..record.kinds import PATIENT_SEARCHES
from ..record.load import SOURCE, LoadReport, PatientRecord, check_items
from ..record.normalize import human_name
from ..record.reader import RawResource, ReadItem, ReadProblem

log = logging.getLogger(__name__)

PAGE_SIZE = 100
SEARCHES_AT_ONCE = 4      # threads issuing a patient's searches; the request budget caps those in flight
_CONDITIONAL = re.compile(r"^[A-Z][A-Za-z]+\?[^\s]+$")

Progress = Callable[[str, int, int], None]


@dataclass
class FetchResult:
    resources: list[dict]
    problems: list[ReadProblem] = field(default_factory=list)
    requests: int = 0
    not_read: list[str] = field(default_factory=list)     # one line per kind of record this EHR did not give


@dataclass
class Offer:
    """What this EHR gives chartcite of a patient: the searches to run (type → the parameter naming
    the patient), which of them its CapabilityStatement does not declare (tried, and skipped if
    refused: some servers serve more than they declare), and, one line each, the kinds it does not
    give and why."""
    searches: dict[str, str]
    undeclared: set[str] = field(default_factory=set)
    not_read: list[str] = field(default_factory=list)


def offered_searches(statement: dict, granted: str = "") -> Offer:
    """Every kind chartcite indexes that the granted scopes cover, searched with the patient
    parameter the server's CapabilityStatement declares for it (its own when the statement lists
    no parameters). A kind the statement declares without any patient search is skipped; one it
    does not declare is tried."""
    offered = declared_resources(statement)
    offer = Offer({})
    for rtype, param in PATIENT_SEARCHES.items():
        if granted and not scope_covers(granted, rtype):
            offer.not_read.append(f"{rtype}: not granted (scopes)")
            continue
        entry = offered.get(rtype)
        declared = {p.get("name") for p in (entry or {}).get("searchParam") or [] if isinstance(p, dict)}
        chosen = next((p for p in (param, "patient", "subject") if not declared or p in declared), None)
        if chosen is None:
            offer.not_read.append(f"{rtype}: this EHR offers no search by patient")
            continue
        offer.searches[rtype] = chosen
        if entry is None:
            offer.undeclared.add(rtype)
    return offer


def declared_resources(statement: dict) -> dict[str, dict]:
    """The resource types a CapabilityStatement declares for its server side, each with its entry."""
    rests = statement.get("rest") if isinstance(statement.get("rest"), list) else []
    return {r.get("type"): r for rest in rests if isinstance(rest, dict) and rest.get("mode", "server") == "server"
            for r in rest.get("resource") or [] if isinstance(r, dict)}


def scope_covers(granted: str, resource_type: str) -> bool:
    """Do the granted SMART scopes (v1 or v2, patient/user/system, wildcards) allow reading the type?"""
    for scope in granted.split():
        context, _, rest = scope.partition("/")
        rtype, _, access = rest.partition(".")
        if context in ("patient", "user", "system") and rtype in (resource_type, "*") and \
                (access in ("read", "*") or ("r" in access.split("?")[0] and set(access.split("?")[0]) <= set("cruds"))):
            return True
    return False


def fetch_patient(client: FhirClient, patient_id: str, since: str = "", progress: Progress | None = None,
                  granted: str = "") -> FetchResult:
    """Everything of the patient the EHR offers (or, with `since`, what changed from then),
    attachments inlined. A kind the EHR does not offer, or refuses, is skipped with one line."""
    try:
        statement = client.get_json("metadata")
    except FhirError:
        statement = {}
    offer = offered_searches(statement, granted)
    resources: list[dict] = []
    problems: list[ReadProblem] = []
    steps = len(offer.searches) + 1
    try:
        resources.append(client.get_json(f"Patient/{patient_id}"))
    except FhirError as exc:
        if exc.status == 404:
            raise PatientNotFound("the EHR has no such patient") from exc
        raise
    not_read = list(offer.not_read)

    def search(rtype: str, param: str) -> list[dict]:
        params = {param: patient_id, "_count": str(PAGE_SIZE)}
        if since:
            params["_lastUpdated"] = f"ge{since}"
        return list(client.search(rtype, params))

    # The kinds are searched side by side (the request budget keeps the EHR's limit on requests in
    # flight): one after another, a large record waited on each search's round trip in turn.
    with ThreadPoolExecutor(SEARCHES_AT_ONCE, thread_name_prefix="chartcite-fetch") as pool:
        running = {rtype: pool.submit(search, rtype, param) for rtype, param in offer.searches.items()}
        try:
            for i, (rtype, future) in enumerate(running.items(), start=1):
                try:
                    resources += future.result()
                except FhirError as exc:
                    if exc.status not in (400, 403, 404, 405, 501) and rtype not in offer.undeclared:
                        raise
                    why = "not offered by this EHR" if rtype in offer.undeclared else "the EHR refused the search"
                    not_read.append(f"{rtype}: {why} ({exc.status or 'error'})")
                if progress:
                    progress("fetching", i, steps)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    resources += referenced_medications(client, resources)
    resolver = ConditionalResolver(client)
    for resource in resources:
        problems += inline_attachments(client, resource)
        resolver.rewrite(resource)
    if progress:
        progress("fetching", steps, steps)
    if not_read:
        log.info("kinds of record this EHR did not give: %s", "; ".join(not_read))
    return FetchResult(resources, problems, client.requests_made, not_read)


def referenced_medications(client: FhirClient, resources: list[dict]) -> list[dict]:
    """The Medications the patient's medication records point at (read by id, not by patient)."""
    ids = sorted({ref.split("/", 1)[1] for r in resources
                  for ref in [(r.get("medicationReference") or {}).get("reference", "")] if ref.startswith("Medication/")})
    return list(client.search("Medication", {"_id": ",".join(ids), "_count": str(PAGE_SIZE)})) if ids else []


def attachments_of(resource: dict) -> Iterable[dict]:
    if resource.get("resourceType") == "DocumentReference":
        for content in resource.get("content") or []:
            if isinstance(content.get("attachment"), dict):
                yield content["attachment"]
    elif resource.get("resourceType") == "DiagnosticReport":
        yield from (a for a in resource.get("presentedForm") or [] if isinstance(a, dict))


def inline_attachments(client: FhirClient, resource: dict) -> list[ReadProblem]:
    """Attachments that point at a Binary are fetched (Accept = their contentType) and carried as
    base64 `data`, the form the chunker decodes (text, HTML, RTF, PDF)."""
    problems = []
    for attachment in attachments_of(resource):
        if attachment.get("data") or not attachment.get("url"):
            continue
        try:
            raw = client.binary(attachment["url"], attachment.get("contentType", ""))
        except FhirError as exc:
            problems.append(ReadProblem(f"{resource['resourceType']}/{resource.get('id')}",
                                        f"attachment could not be fetched ({exc.status or exc}); the note is indexed without it"))
            continue
        attachment["data"] = base64.b64encode(raw).decode()
    return problems


class ConditionalResolver:
    """`Practitioner?identifier=...` references are resolved to `Type/id` and a display name
    where the EHR finds exactly one match; otherwise the reference keeps a readable display."""

    def __init__(self, client: FhirClient):
        self.client = client
        self.cache: dict[str, dict] = {}

    def rewrite(self, node) -> None:
        if isinstance(node, dict):
            ref = node.get("reference")
            if isinstance(ref, str) and _CONDITIONAL.match(ref):
                node.update(self.resolve(ref))
            for value in node.values():
                if isinstance(value, (dict, list)):
                    self.rewrite(value)
        elif isinstance(node, list):
            for item in node:
                self.rewrite(item)

    def resolve(self, ref: str) -> dict:
        if ref not in self.cache:
            rtype, query = ref.split("?", 1)
            params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            try:
                found = list(self.client.search(rtype, params | {"_count": "2"}))
            except FhirError:
                found = []
            if len(found) == 1:
                match = found[0]
                self.cache[ref] = {"reference": f"{rtype}/{match['id']}", "display": human_name(match) or match.get("name", "")}
            else:
                self.cache[ref] = {"reference": ref, "display": ref.split("|")[-1]}
        return dict(self.cache[ref])


def to_record(patient_id: str, resources: list[dict], problems: list[ReadProblem],
              origin: str) -> tuple[PatientRecord | None, LoadReport]:
    """Check the fetched resources like a file's: malformed ones reported and skipped."""
    items: list[ReadItem] = [RawResource(r, f"{origin}:{r.get('resourceType')}/{r.get('id')}") for r in resources]
    records, report = check_items(items + list(problems))
    record = next((r for r in records if r.patient_id == patient_id), None)
    if record is not None:
        record.authority = SOURCE     # a sync of the patient from its own EHR is the authority on that record
    return record, report

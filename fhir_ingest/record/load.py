"""Files → checked resources grouped by patient, with a report of everything read and skipped.

Evidence, not mention, decides what an input may remove (README, "What an input may remove").
One rule, in `against_held`, for files, EHR syncs and Bulk rounds alike: an input removes a held
resource only when

- it is complete: a whole record (below), unfiltered, every page read, every line of that type
  parsed (`PatientRecord.partial_types`), no export error;
- it is not older than what it removes: its own date (`Bundle.timestamp`, the manifest's
  `transactionTime`, else its newest `meta.lastUpdated`) is not before the held resource's
  `meta.lastUpdated`;
- it is for that patient;

and even then not when it would remove more than the removal budget's share of the patient's
held record (`RemovalBudget`), unless the operator allows it. Anything else merges, and the
report says why in one line per patient.

A document is a patient's whole record only when it shows itself to be: a Bundle file holding the
patient's own Patient, no other patient's, and at least one clinical resource of the patient,
with every resource of the patient in the input coming from it, and not a search page or a
filtered search (`reader.partial_words`). Unless it is a `Patient/$everything` searchset, it
replaces only when it confirms at least as many of the resources held as it would remove: a
Patient with a result or two never passes for a record. Anything else (an NDJSON export, each line
its own document; a stray Observation of patient B in patient A's bundle; a bundle of several
patients) is merged. The patient's own EHR sync and a full Bulk round are the record source's
answer: their versions replace what is held as they are, and what they lack leaves under the rule.
"""
from __future__ import annotations

import re
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable, Iterator

from .compact import LARGE_RECORD, CompactResources, Resources, empty_like, is_compact, lookup_of, of_types, refs_of
from .contract import PatientNotFound
from .kinds import CLINICAL_TYPES, IGNORED_TYPES, INDEXED_TYPES, SUPPORT_TYPES, clinical_date
from .normalize import binary_ref, patient_of, ref_id
from .reader import DEFAULT_LIMITS, Document, RawResource, ReadItem, ReadLimits, ReadProblem, ReadWarning, read_path
from .staging import PatientStaging, StagedResource
from .validate import InvalidResource, check_content, check_identity, checked_later

EARLIEST_PLAUSIBLE_YEAR = 1900
# Indexed kinds a patient's results point at that may name no patient themselves (R4's
# Specimen.subject is optional): kept, and joined to the record of each patient who refers to them.
REFERENCED_WITHOUT_PATIENT = frozenset({"Specimen"})


@dataclass
class Skipped:
    origin: str
    reason: str


UNTYPED = "(no type)"


@dataclass
class LoadReport:
    resources_read: int = 0
    by_type: Counter = field(default_factory=Counter)
    ignored: Counter = field(default_factory=Counter)       # deliberately not indexed (billing, directory data...)
    not_indexed: Counter = field(default_factory=Counter)   # read fine, of a type chartcite has no renderer for
    skipped: list[Skipped] = field(default_factory=list)    # unreadable or invalid: not indexed
    skipped_types: Counter = field(default_factory=Counter) # invalid resources of a known type, by type
    warnings: list[Skipped] = field(default_factory=list)   # indexed, with something a person should know
    added_to: list[str] = field(default_factory=list)       # patients whose input was not their whole record
    not_removed: list[Skipped] = field(default_factory=list)  # one line per patient: why what it lacks stays
    held_back: list[Skipped] = field(default_factory=list)  # removals over the budget, not carried out

    # A report travels between processes (a Bulk round's files and parts are read on any worker):
    # its lists are kept to this many entries each, with how many there were.
    KEPT = 200

    def to_dict(self) -> dict:
        listed = lambda items: [[i.origin, i.reason] for i in items[:self.KEPT]]
        return {"resources_read": self.resources_read, "by_type": dict(self.by_type), "ignored": dict(self.ignored),
                "not_indexed": dict(self.not_indexed), "skipped_types": dict(self.skipped_types),
                "skipped": listed(self.skipped), "skipped_count": len(self.skipped),
                "warnings": listed(self.warnings), "warnings_count": len(self.warnings),
                "added_to": self.added_to[:self.KEPT], "added_to_count": len(self.added_to),
                "not_removed": listed(self.not_removed), "not_removed_count": len(self.not_removed),
                "held_back": listed(self.held_back), "held_back_count": len(self.held_back)}

    def merge_dict(self, data: dict) -> None:
        """Another report's dict added to this one (what was left out of its lists is counted)."""
        self.resources_read += data.get("resources_read", 0)
        for name in ("by_type", "ignored", "not_indexed", "skipped_types"):
            getattr(self, name).update(data.get(name) or {})
        for name in ("skipped", "warnings", "not_removed", "held_back"):
            items = [Skipped(origin, reason) for origin, reason in data.get(name) or []]
            left_out = data.get(f"{name}_count", len(items)) - len(items)
            if left_out > 0:
                items.append(Skipped("…", f"and {left_out} more"))
            getattr(self, name).extend(items)
        self.added_to.extend(data.get("added_to") or [])

    def type_rows(self) -> list[tuple[str, int, int, int, str]]:
        """(type, read, skipped, ignored, what became of it) for every type the input held."""
        rows = []
        for rt in sorted(set(self.by_type) | set(self.skipped_types)):
            read, skipped = self.by_type[rt] + self.skipped_types[rt], self.skipped_types[rt]
            fate = ("indexed" if rt in INDEXED_TYPES else "read to complete other records" if rt in SUPPORT_TYPES
                    else f"ignored: {IGNORED_TYPES[rt]}" if rt in IGNORED_TYPES else "not indexed: no renderer")
            rows.append((rt, read, skipped, self.ignored[rt], fate))
        # Every resource read has its row, so the rows add up to `resources_read`: one whose type
        # is not a string names no type to count it under.
        untyped = self.resources_read - sum(row[1] for row in rows)
        if untyped > 0:
            rows.append((UNTYPED, untyped, untyped, 0, "skipped: no resource type"))
        return rows


# What entitles a patient's record to replace what the index holds for the patient.
SOURCE = "source"            # the record source's own answer (the patient's EHR sync, a full Bulk round): as is
EVERYTHING = "everything"    # the patient's `Patient/$everything` searchset
WHOLE_BUNDLE = "bundle"      # a bundle that looks like the whole record: replaces only what it confirms
MERGE = ""                   # anything else: merged into what is held, removing nothing


@dataclass
class PatientRecord:
    patient_id: str
    resources: Resources      # a list of dicts; a large record's as CompactResources (compact.py)
    authority: str = SOURCE
    document: str = ""       # the document a whole record was read in, as the report names it
    as_of: str = ""          # the input's own date: Bundle.timestamp, a Bulk manifest's transactionTime
    partial_types: dict[str, str] = field(default_factory=dict)   # type → why the input lacks some of it
    origins: dict[str, str] = field(default_factory=dict)    # Type/id → where it was read, for the report
    strays: set[str] = field(default_factory=set)            # Type/id read in a document not the patient's own

    @property
    def complete(self) -> bool:
        """Whether the record may replace what is held (what it lacks leaving the index)."""
        return self.authority != MERGE

    @property
    def patient(self) -> dict:
        return next(of_types(self.resources, ("Patient",)), None) or {"resourceType": "Patient", "id": self.patient_id}


def ref_of(resource: dict) -> str:
    return f"{resource['resourceType']}/{resource.get('id')}"


def merge_resources(held: Resources, changed: Resources) -> Resources:
    """What chartcite holds, with every changed resource replacing an older version of itself,
    never a newer one (`version_order`); compact when either is (a large record stays small)."""
    if is_compact(held) or is_compact(changed):
        merged = held.only(None) if is_compact(held) else CompactResources(held)
        for resource in changed:
            current = merged.get(ref_of(resource))
            if current is None or version_order(resource, current) >= 0:
                merged.put(resource)
        return merged
    by_ref = {ref_of(r): r for r in held}
    for resource in changed:
        current = by_ref.get(ref_of(resource))
        if current is None or version_order(resource, current) >= 0:
            by_ref[ref_of(resource)] = resource
    return list(by_ref.values())


def source_answer_over(held: list[dict], answer: list[dict]) -> list[dict]:
    """What chartcite holds with the record source's own answer over it: the EHR's current version
    of a resource replaces whatever is held, whose version may have come from another input that
    numbers versions its own way (kept, it would hide the EHR's updates for good)."""
    by_ref = {ref_of(r): r for r in held}
    by_ref.update((ref_of(r), r) for r in answer)
    return list(by_ref.values())


def version_order(first: dict, second: dict) -> int:
    """Which of two copies of one resource is the newer version: > 0 `first`, < 0 `second`, 0 when
    their meta cannot tell. meta.versionId first, as numbers when both are numbers; then
    meta.lastUpdated, as instants."""
    a, b = meta_of(first), meta_of(second)
    va, vb = version_number(a), version_number(b)
    if va is not None and vb is not None and va != vb:
        return 1 if va > vb else -1
    ta, tb = instant_of(a.get("lastUpdated")), instant_of(b.get("lastUpdated"))
    if ta is not None and tb is not None and ta != tb:
        return 1 if ta > tb else -1
    return 0


def meta_of(resource: dict) -> dict:
    return resource["meta"] if isinstance(resource.get("meta"), dict) else {}


def version_number(meta: dict) -> int | None:
    version = str(meta.get("versionId") or "")
    return int(version) if re.fullmatch(r"[0-9]{1,18}", version) else None


def instant_of(value) -> datetime | None:
    """An instant (a time zone assumed UTC when the value names none), or None."""
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def version_words(resource: dict) -> str:
    meta = meta_of(resource)
    words = [f"version {meta['versionId']}"] if meta.get("versionId") else []
    words += [f"last updated {meta['lastUpdated']}"] if meta.get("lastUpdated") else []
    return ", ".join(words) or "no version"


@dataclass(frozen=True)
class RemovalBudget:
    """The share of a patient's held record one input may remove, as rsync's `--max-delete`:
    a removal over it is not carried out but reported, unless the operator allows it
    (`--allow-removals`). CHARTCITE_MAX_REMOVAL_SHARE sets the share."""
    share: float = 0.5
    allowed: bool = False

    def exceeded(self, removing: int, held: int) -> bool:
        return not self.allowed and removing > self.share * held


DEFAULT_BUDGET = RemovalBudget()
ANY_TYPE = "*"          # in `partial_types`: the input could not read whole a part of unknown type


def against_held(record: PatientRecord, held: Resources, report: LoadReport | None = None,
                 budget: RemovalBudget = DEFAULT_BUDGET) -> PatientRecord:
    """The record as it is to be indexed, given the resources the index holds for the patient: the
    record alone when it may replace them, else merged into them, in part or whole (and the report
    says why). A version older than the one held never replaces it, except from the record source."""
    resources = record.resources if record.authority == SOURCE else newer_than_held(record, held, report)
    if record.authority == MERGE or (record.authority == WHOLE_BUNDLE and not confirms_held(record, held, report)):
        if report is not None and record.authority != MERGE:
            report.added_to.append(record.patient_id)
        return replace(record, resources=merge_resources(held, resources), authority=MERGE)
    present = set(refs_of(resources))
    lacking = [r for r in held if ref_of(r) not in present]
    kept = kept_by_rule(record, lacking, report)
    removing = len(lacking) - len(kept)
    if removing and budget.exceeded(removing, len(held)):
        if report is not None:
            report.held_back.append(Skipped(record.document or "input", over_budget_words(record, removing, held,
                                                                                          budget)))
        return replace(record, resources=merge_resources(held, resources), authority=MERGE)
    return replace(record, resources=resources + kept)


def kept_by_rule(record: PatientRecord, lacking: list[dict], report: LoadReport | None) -> list[dict]:
    """The held resources the record lacks that it may not remove: of a type it did not read whole,
    or newer than the record itself. One line per reason says why they stay."""
    as_of = record_date(record)
    kept, reasons, newer = [], Counter(), []
    for resource in lacking:
        why = record.partial_types.get(resource["resourceType"]) or record.partial_types.get(ANY_TYPE)
        updated = held_date(resource)
        if why:
            reasons[why] += 1
        elif updated is not None and (as_of is None or updated > as_of):
            newer.append(updated)
        else:
            continue
        kept.append(resource)
    if newer:
        newest = max(newer).date()
        reasons[f"older than the record held ({as_of.date()} vs {newest})" if as_of is not None else
                f"undated, and the record held is dated ({newest})"] += len(newer)
    if report is not None:
        for why, count in reasons.items():
            report.not_removed.append(Skipped(record.document or "input", f"patient {record.patient_id}: {why}: "
                                                                          f"merged, {count} held resource(s) kept"))
    return kept


def record_date(record: PatientRecord) -> datetime | None:
    """How recent the input is: its own date when it gives one, else its newest `meta.lastUpdated`."""
    own = instant_of(record.as_of) if record.as_of else None
    if own is not None:
        return own
    return max((when for r in record.resources if (when := held_date(r)) is not None), default=None)


def held_date(resource: dict) -> datetime | None:
    updated = meta_of(resource).get("lastUpdated")
    return instant_of(updated) if updated else None


def over_budget_words(record: PatientRecord, removing: int, held: list[dict], budget: RemovalBudget) -> str:
    return (f"would remove {removing} of the {len(held)} resources held for patient {record.patient_id}, more than "
            f"the removal budget of {budget.share:.0%} (CHARTCITE_MAX_REMOVAL_SHARE): not carried out, merged; "
            f"run again with --allow-removals to carry it out")


def newer_than_held(record: PatientRecord, held: Resources, report: LoadReport | None) -> Resources:
    """The record's resources, where the index holds a newer version of one, that version. What
    changes a resource held is reported when it is kept out as older, and when it came in a
    document that is not the patient's own (a stray), even if newer and indexed."""
    held_by_ref = lookup_of(held)
    if not held_by_ref:
        return record.resources       # nothing held to compare with (a large record stays as it is)
    resources = empty_like(record.resources)
    for resource in record.resources:
        ref = ref_of(resource)
        current = held_by_ref.get(ref)
        if current is None or current == resource:
            resources.append(resource)
            continue
        newer = version_order(resource, current) >= 0
        resources.append(resource if newer else current)
        if report is not None and (not newer or ref in record.strays):
            report.warnings.append(Skipped(record.origins.get(ref, record.document or "input"),
                                           change_words(record, ref, resource, current, newer)))
    return resources


def change_words(record: PatientRecord, ref: str, resource: dict, current: dict, newer: bool) -> str:
    where = (f", read in a document that is not patient {record.patient_id}'s own,"
             if ref in record.strays else "")
    if newer:
        return (f"{ref}{where} changes the record held for patient {record.patient_id} "
                f"({version_words(current)} → {version_words(resource)}): indexed as the newer version")
    return (f"{ref}{where} is older ({version_words(resource)}) than the version held for patient "
            f"{record.patient_id} ({version_words(current)}), which stays")


def confirms_held(record: PatientRecord, held: Resources, report: LoadReport | None) -> bool:
    """Whether a bundle that looks whole holds enough of what is held to replace it: what it would
    remove is no more than what it confirms. A Patient with a new result beside a record of
    hundreds would otherwise empty it."""
    held_refs = set(refs_of(held))
    present = set(refs_of(record.resources))
    confirmed, removed = held_refs & present, held_refs - present
    if not removed or len(removed) <= len(confirmed):
        return True
    if report is not None:
        report.warnings.append(Skipped(record.document, f"holds only {len(confirmed)} of the {len(held_refs)} "
                                                        f"resources held for patient {record.patient_id}: merged "
                                                        f"into the record held, nothing removed"))
    return False


def load_resources(paths: Iterable[str | Path],
                   limits: ReadLimits = DEFAULT_LIMITS) -> tuple[list[PatientRecord], LoadReport]:
    """Read and check every resource under `paths`; malformed ones are reported and skipped."""
    return check_items(item for path in paths for item in read_path(path, limits))


def check_items(items: Iterable[ReadItem]) -> tuple[list[PatientRecord], LoadReport]:
    """Check read resources (from files or an EHR) and group them by patient, in memory."""
    report = LoadReport()
    with assembled(items, report) as assembler:
        return list(assembler.records()), report


@contextmanager
def assembled(items: Iterable[ReadItem], report: LoadReport, directory: str | Path | None = None):
    """The checked items parked on disk, to be handed out one patient at a time."""
    assembler = RecordAssembler(report, directory)
    try:
        assembler.add(items)
        yield assembler
    finally:
        assembler.close()


def checked(items: Iterable[ReadItem], report: LoadReport, damaged: set[str] | None = None) -> Iterator[RawResource]:
    """The resources that pass the checks, one at a time; the rest are counted in `report`, and
    the names of the documents they were read in noted in `damaged` (such a document is not a whole
    record). A patient's own resources are checked against the FHIR model later (`content_checked`,
    when the patient's record is assembled): they are counted here as read and uncounted if they fail."""
    for item in items:
        if isinstance(item, ReadProblem):
            report.skipped.append(Skipped(item.origin, item.reason))
            if damaged is not None:
                damaged.add(item.origin.split("#", 1)[0])
            continue
        if isinstance(item, ReadWarning):
            report.warnings.append(Skipped(item.origin, item.reason))
            continue
        report.resources_read += 1
        resource = item.resource
        try:
            check_identity(resource, lambda words, origin=item.origin: report.warnings.append(Skipped(origin, words)))
        except InvalidResource as exc:
            skip(report, item.origin, resource, str(exc))
            if damaged is not None:
                damaged.add(item.document.name)
            continue
        patient = patient_of(resource)
        if not checked_later(resource, patient):
            resource = content_checked(resource, item.origin, report)
            if resource is None:
                continue
        rt = resource["resourceType"]
        if rt in INDEXED_TYPES and not patient and rt not in REFERENCED_WITHOUT_PATIENT:
            skip(report, item.origin, resource, f"{rt}/{resource['id']} names no patient it belongs to")
            continue
        report.by_type[rt] += 1
        if rt in IGNORED_TYPES:
            report.ignored[rt] += 1
        elif rt not in INDEXED_TYPES | SUPPORT_TYPES:
            report.not_indexed[rt] += 1
        yield RawResource(resource, item.origin, item.document)


def content_checked(resource: dict, origin: str, report: LoadReport) -> dict | None:
    """The resource as indexed (a malformed narrative left out), or None when its content is
    invalid, reported as skipped."""
    try:
        return check_content(resource, lambda words: report.warnings.append(Skipped(origin, words)))
    except InvalidResource as exc:
        skip(report, origin, resource, str(exc))
        return None


def skip(report: LoadReport, origin: str, resource: dict, reason: str) -> None:
    report.skipped.append(Skipped(origin, reason))
    if isinstance(resource.get("resourceType"), str):
        report.skipped_types[resource["resourceType"]] += 1


def implausible_date(resource: dict, today: date | None = None) -> str:
    """A clinical date in the future or before 1900 is kept as recorded, and said."""
    when = clinical_date(resource)[:10]
    try:
        day = date.fromisoformat(when) if len(when) == 10 else date(int(when[:4]), 1, 1)
    except ValueError:
        return ""
    today = today or date.today()
    ref = f"{resource['resourceType']}/{resource['id']}"
    if day > today + timedelta(days=1):
        return f"{ref} is dated {when}, in the future: indexed as recorded"
    if day.year < EARLIEST_PLAUSIBLE_YEAR:
        return f"{ref} is dated {when}, before {EARLIEST_PLAUSIBLE_YEAR}: indexed as recorded"
    return ""


def shared_refs(resources: Iterable[dict]) -> set[str]:
    """The patient-less resources a patient's resources point at: a Medication, a result's
    Specimen, a note's Binary. One pass: `resources` may be a generator, or parse as it is read."""
    refs = set()
    for r in resources:
        refs |= {ref for field in ("medicationReference", "specimen") if (ref := ref_id(r.get(field)))}
        attachments = [c.get("attachment") for c in r.get("content") or [] if isinstance(c, dict)]
        attachments += r.get("presentedForm") or [] if isinstance(r.get("presentedForm"), list) else []
        refs |= {ref for a in attachments if isinstance(a, dict) and (ref := binary_ref(a.get("url")))}
    return refs


class RecordAssembler:
    """Checked resources → one record per patient, with duplicates settled and authority decided."""

    def __init__(self, report: LoadReport, directory: str | Path | None = None, staging=None):
        """`staging`: resources already parked elsewhere (a Bulk round's, checked on reading),
        offering PatientStaging's reading methods; by default they are parked in `directory`."""
        self.report = report
        self.staging = staging if staging is not None else PatientStaging(directory or tempfile.gettempdir())
        self.damaged: set[str] = set()      # names of documents with an entry that could not be read

    def add(self, items: Iterable[ReadItem]) -> None:
        for raw in checked(items, self.report, self.damaged):
            self.staging.add(raw.resource, patient_of(raw.resource), raw.origin, raw.document)

    def patient_ids(self) -> list[str]:
        return self.staging.patient_ids()

    def record(self, patient_id: str, whole: bool = False, as_of: str = "",
               partial_types: dict[str, str] | None = None, name: str = "") -> PatientRecord:
        """The patient's record; `whole` when the caller knows the input is the patient's whole
        record whatever its documents (a full Bulk Data export without errors), dated `as_of`,
        less the types it could not read whole (`partial_types`: type → why); `name`: what the
        report calls an input that is not one document (a Bulk round)."""
        partial_types = dict(partial_types or {})
        # A large record is held as bytes from the first resource on, never whole as dicts.
        compact = self.staging.count(patient_id) > LARGE_RECORD
        staged = []
        for item in self.staging.owned(patient_id):
            resource_type = item.resource["resourceType"]
            if self.passes_content_check(item, patient_id):
                staged.append(item.compacted() if compact else item)
            else:       # the copy held, if any, is not removed for a copy that could not be read
                partial_types.setdefault(resource_type, f"a {resource_type} that could not be read ({item.origin})")
        if not staged:
            return PatientRecord(patient_id, [], MERGE)     # nothing of it passed the checks
        kept = newest_versions(staged, self.report)
        resources = CompactResources.of_bodies((item.body, item.resource["resourceType"], item.resource["id"])
                                               for item in kept) if compact else [item.resource for item in kept]
        for ref in sorted(shared_refs(resources)):
            medication = self.staging.shared(ref)
            if medication is not None:
                resources.append(medication)
        document = self.staging.document(staged[0].document)
        authority = SOURCE if whole else self.authority_of(patient_id, staged)
        if authority == MERGE:
            self.report.added_to.append(patient_id)
            why = self.partial(document)
            if why and len({s.document for s in staged}) == 1:
                self.report.not_removed.append(Skipped(document.name, f"patient {patient_id}: {why}: "
                                                                      f"merged, nothing removed"))
        foreign = self.staging.foreign_documents(patient_id)
        return PatientRecord(patient_id, resources, authority, document.name or name, as_of or document.as_of,
                             partial_types,
                             {ref_of(item.resource): item.origin for item in kept},
                             {ref_of(item.resource) for item in kept if item.document in foreign})

    def passes_content_check(self, item: StagedResource, patient_id: str) -> bool:
        """Whether the staged resource's content passes (checked now if `checked_later`; counted
        as read when it was staged, it is uncounted if not)."""
        if not checked_later(item.resource, patient_id):
            return True
        resource_type = item.resource["resourceType"]
        item.resource = content_checked(item.resource, item.origin, self.report)
        if item.resource is None:
            self.report.by_type[resource_type] -= 1
            return False
        warning = implausible_date(item.resource) if item.resource["resourceType"] in INDEXED_TYPES else ""
        if warning:
            self.report.warnings.append(Skipped(item.origin, warning))
        return True

    def authority_of(self, patient_id: str, staged: list[StagedResource]) -> str:
        """What the input shows of itself for this patient: the whole record (a Bundle file holding
        the patient's own Patient, no other's, and a clinical resource of the patient, with all of
        the patient's resources; the patient's `$everything` searchset) or a part to merge."""
        documents = {s.document for s in staged}
        if len(documents) != 1 or "" in documents:
            return MERGE
        document = self.staging.document(documents.pop())
        if not document.bundle or self.partial(document) or self.staging.patients_defined(document.key) != {patient_id}:
            return MERGE
        if not any(s.resource["resourceType"] in CLINICAL_TYPES for s in staged):
            return MERGE          # a Patient alone (or with directory data) says nothing of the record
        return EVERYTHING if document.everything_of == patient_id else WHOLE_BUNDLE

    def partial(self, document: Document) -> str:
        """Why a Bundle is not all of what it answers: it says so itself, or an entry of it could not be read."""
        if document.partial:
            return document.partial
        return "a Bundle with an entry that could not be read" if document.bundle and document.name in self.damaged \
            else ""

    def records(self) -> Iterator[PatientRecord]:
        """Every patient with a resource that passed the checks."""
        for pid in self.patient_ids():
            record = self.record(pid)
            if record.resources:
                yield record

    def close(self) -> None:
        self.staging.close()


def newest_versions(staged: list[StagedResource], report: LoadReport) -> list[StagedResource]:
    """One resource per `Type/id`: the newest by `version_order`, else the later in the input. A
    duplicate that differs is reported; an identical copy is merely dropped."""
    kept: dict[str, StagedResource] = {}
    for item in staged:
        ref = ref_of(item.resource)
        previous = kept.get(ref)
        if previous is None:
            kept[ref] = item
            continue
        newer, older = (item, previous) if version_order(item.resource, previous.resource) >= 0 else (previous, item)
        kept[ref] = newer
        if newer.whole() != older.whole():
            report.warnings.append(Skipped(older.origin, f"{ref} appears again at {newer.origin} with other content; "
                                                         f"the newer version (there) is indexed"))
    return list(kept.values())


class BundleDirectorySource:
    """A folder of per-patient bundles standing in for an EHR (the demo launch and tests).

    Files are named `<patient-id>.json[.gz]` as Synthea writes them; other files are scanned.
    """

    def __init__(self, root: str | Path, limits: ReadLimits = DEFAULT_LIMITS):
        self.root = Path(root)
        self.limits = limits

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.glob("*.json*") if p.is_file())

    def patient_ids(self) -> list[str]:
        return [p.name.split(".json")[0] for p in self.files()]

    def path_for(self, patient_id: str) -> Path:
        for p in self.files():
            if p.name.split(".json")[0] == patient_id:
                return p
        raise PatientNotFound("no bundle for that patient")

    def read_patient(self, patient_id: str) -> tuple[list[PatientRecord], LoadReport]:
        return load_resources([self.path_for(patient_id)], self.limits)

    def patient_resource(self, patient_id: str) -> dict | None:
        """The Patient resource alone (for a picker), without checking the rest of the bundle."""
        for item in read_path(self.path_for(patient_id), self.limits):
            if isinstance(item, RawResource) and item.resource.get("resourceType") == "Patient":
                return item.resource
        return None

"""Files → checked resources grouped by patient, with a report of everything read and skipped."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from .chunk import group_by_patient
from .normalize import INDEXED_TYPES, SUPPORT_TYPES, InvalidResource, check_resource, patient_of
from .reader import RawResource, ReadItem, ReadProblem, read_path


@dataclass
class Skipped:
    origin: str
    reason: str


@dataclass
class LoadReport:
    resources_read: int = 0
    by_type: Counter = field(default_factory=Counter)
    not_indexed: Counter = field(default_factory=Counter)   # read fine, but of a type chartcite does not index
    skipped: list[Skipped] = field(default_factory=list)

    def merge(self, other: "LoadReport") -> None:
        self.resources_read += other.resources_read
        self.by_type.update(other.by_type)
        self.not_indexed.update(other.not_indexed)
        self.skipped.extend(other.skipped)


@dataclass
class PatientRecord:
    patient_id: str
    resources: list[dict]

    @property
    def patient(self) -> dict:
        for r in self.resources:
            if r["resourceType"] == "Patient":
                return r
        return {"resourceType": "Patient", "id": self.patient_id}


ESSENTIAL_TYPES = {"Patient", "Condition", "AllergyIntolerance", "MedicationRequest", "Medication", "Immunization"}


def essentials(record: PatientRecord) -> PatientRecord:
    """The problem list, medications and allergies: indexed first on a new patient's sync so the
    clinician can ask about them while results, notes and visits are still embedding."""
    return PatientRecord(record.patient_id, [r for r in record.resources if r["resourceType"] in ESSENTIAL_TYPES])


def load_resources(paths: Iterable[str | Path]) -> tuple[list[PatientRecord], LoadReport]:
    """Read and check every resource under `paths`; malformed ones are reported and skipped."""
    return check_items(item for path in paths for item in read_path(path))


def check_items(items: Iterable[ReadItem]) -> tuple[list[PatientRecord], LoadReport]:
    """Check read resources (from files or an EHR) and group them by patient."""
    report = LoadReport()
    grouped = group_by_patient(checked(items, report))
    records = [PatientRecord(pid, resources) for pid, resources in sorted(grouped.items())]
    return records, report


def checked(items: Iterable[ReadItem], report: LoadReport) -> Iterator[dict]:
    """The resources that pass the checks, one at a time; the rest are counted in `report`."""
    for item in items:
        if isinstance(item, ReadProblem):
            report.skipped.append(Skipped(item.origin, item.reason))
            continue
        assert isinstance(item, RawResource)
        report.resources_read += 1
        try:
            resource = check_resource(item.resource)
        except InvalidResource as exc:
            report.skipped.append(Skipped(item.origin, str(exc)))
            continue
        rt = resource["resourceType"]
        if rt in INDEXED_TYPES and not patient_of(resource):
            report.skipped.append(Skipped(item.origin, f"{rt}/{resource['id']} names no patient it belongs to"))
            continue
        report.by_type[rt] += 1
        if rt not in INDEXED_TYPES | SUPPORT_TYPES:
            report.not_indexed[rt] += 1
        yield resource


class BundleDirectorySource:
    """A folder of per-patient bundles standing in for an EHR (the demo launch and tests).

    Files are named `<patient-id>.json[.gz]` as Synthea writes them; other files are scanned.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.glob("*.json*") if p.is_file())

    def patient_ids(self) -> list[str]:
        return [p.name.split(".json")[0] for p in self.files()]

    def path_for(self, patient_id: str) -> Path:
        for p in self.files():
            if p.name.split(".json")[0] == patient_id:
                return p
        raise KeyError("no bundle for that patient")  # the id stays out of logs and tracebacks

    def read_patient(self, patient_id: str) -> tuple[list[PatientRecord], LoadReport]:
        return load_resources([self.path_for(patient_id)])

    def patient_resource(self, patient_id: str) -> dict | None:
        """The Patient resource alone (for a picker), without checking the rest of the bundle."""
        for item in read_path(self.path_for(patient_id)):
            if isinstance(item, RawResource) and item.resource.get("resourceType") == "Patient":
                return item.resource
        return None

"""What a kind of FHIR resource is to chartcite, in one place: whether it is indexed or only read to
complete others, how an EHR is searched for it, where its clinical date is, how it renders to
chunk text, the typed fact it states, and whether a first sync indexes it first.

`KINDS` is filled by the package (`fhir_ingest.record.kinds`), which imports every family module;
everything else (the indexed and ignored lists, the EHR's searches and scopes, the Bulk `_type`,
the date logic) is derived from it there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Resolver = Callable[[str], "dict | None"]        # "Type/id" → the resource this record holds, or None
# (the patient's PatientChunker, a resource) → its Chunks; the chunker gives references, windows, notes.
Renderer = Callable[[object, dict], list]
# (a resource, a Resolver) → its typed Fact (fhir_ingest.record.facts), or None.
FactReader = Callable[[dict, Resolver], object]


@dataclass(frozen=True)
class Kind:
    resource_type: str
    family: str                       # the module that holds it ('medications')
    dates: tuple[str, ...] = ()       # where its clinically relevant date is, in order of preference
    render: Renderer | None = None    # None: read only to complete other records
    fact: FactReader | None = None
    search: str | None = "patient"    # the search parameter naming the patient; None: read through references
    essential: bool = False           # the problem list, medications, allergies: embedded first on a first sync
    title: str = ""                   # the element whose name titles the side panel ('code', 'vaccineCode')

    @property
    def indexed(self) -> bool:
        return self.render is not None


KINDS: dict[str, Kind] = {}


def kind_of(resource_type: str) -> Kind | None:
    return KINDS.get(resource_type)


def clinical_date(resource: dict) -> str:
    """The resource's clinically relevant date as recorded (ISO), by its kind's date fields."""
    kind = KINDS.get(resource.get("resourceType"))
    for name in kind.dates if kind else ():
        value = resource.get(name)
        if name == "context" and isinstance(value, dict):
            value = value.get("period")
        if name == "collection" and isinstance(value, dict):      # a Specimen's collection
            value = value.get("collectedDateTime") or value.get("collectedPeriod")
        if isinstance(value, dict):
            value = value.get("start") or value.get("end")
        if isinstance(value, str) and value:
            return value
    return ""

"""The one data contract between ingest and search: `Chunk`."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass
class Chunk:
    tenant: str
    patient_id: str
    resource_type: str
    resource_id: str
    part: str                      # which piece of the resource ("0", "sec-2", "trend-90d")
    text: str                      # what is searched and embedded
    label: str                     # chip text: "2024-03-12 · Lab · HbA1c 7.9 %"
    date: str = ""                 # clinically relevant date, ISO (YYYY-MM-DD or full)
    semantic_type: str = ""        # medication, lab, vital, problem, allergy, encounter, procedure, note, ...
    category: str = ""             # note type, observation category, ...
    sections: list[str] = field(default_factory=list)     # the note headings this chunk holds
    version_id: str = ""
    status: str = ""
    codes: list[dict] = field(default_factory=list)       # codings as objects: system, code, display
    concepts: list[dict] = field(default_factory=list)    # filled by search.annotate
    refs: list[str] = field(default_factory=list)         # every resource the text draws on; refs[0] is the source
    fact: dict = field(default_factory=dict)              # the typed fact (fhir_ingest.record.facts), as a dict
    embedding_model: str = ""

    @property
    def ref(self) -> str:
        return f"{self.resource_type}/{self.resource_id}"

    @property
    def chunk_id(self) -> str:
        # The patient is part of the key: one `Type/id` under two patients of a tenant is two records.
        key = "|".join([self.tenant, self.patient_id, self.resource_type, self.resource_id, self.version_id, self.part])
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def to_dict(self) -> dict:
        # Lists copied one level down: dataclasses.asdict's deep copy was most of the client's
        # time writing chunks to Elasticsearch.
        d = {name: list(value) if isinstance(value, list) else value
             for name in self.__dataclass_fields__ for value in (getattr(self, name),)}
        d["chunk_id"] = self.chunk_id
        d["ref"] = self.ref
        d["source"] = self.ref          # the FHIR reference the side panel opens
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Chunk":
        names = cls.__dataclass_fields__.keys()
        chunk = cls(**{k: v for k, v in d.items() if k in names})
        # A chunk stored before codes became objects and headings a list reads as one written now;
        # its typed fact arrives when its patient is next indexed (the changed chunk is rewritten).
        chunk.codes = [c if isinstance(c, dict) else dict(zip(("system", "code", "display"), (c.split("|") + ["", ""])[:3]))
                       for c in chunk.codes]
        if "sections" not in d and d.get("section"):
            chunk.sections = [h.strip() for h in d["section"].split(",") if h.strip()]
        return chunk


def make_label(date: str, kind: str, words: str, limit: int = 60) -> str:
    words = " ".join(words.split())
    if len(words) > limit:
        words = words[: limit - 1].rstrip() + "…"
    parts = [p for p in (date[:10], kind, words) if p]
    return " · ".join(parts)


class PatientNotFound(LookupError):
    """The record source has no such patient. The id stays out of the message: logs carry it."""

"""Checked FHIR resources of one patient → `Chunk`s.

One chunk per structured resource (its facts in a sentence a clinician would write), notes split
on their headings into chunks that fit the embedding model's window, lab panels with their
values, and trend summaries per analyte so "how has her BP been?" hits one chunk.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Callable, Iterator

from .compact import Resources, lookup_of, of_types
from .contract import Chunk, make_label
from .datatypes import dosage_text
from .facts import Fact, NoteFact, SeriesFact, codings_of
from .kinds import KINDS, clinical_date, fact_of
from .kinds.observations import observation_category, observation_value, point_of
from .normalize import binary_ref, code_keys, codings, concept_text, contained, ref_id, status_code
from .notes import NoteDecodeError, decode_attachment, note_sentences, section_kind, split_sections
from .words import _join, _sentence, _to_date, day

log = logging.getLogger(__name__)

WITHDRAWN = {"entered-in-error"}
# Where a resource says it was entered in error: `status` for most, a Condition's or an allergy's
# `verificationStatus`, a Goal's `lifecycleStatus`.
STATUS_FIELDS = ("status", "verificationStatus", "lifecycleStatus")


def withdrawn(resource: dict) -> bool:
    """Entered in error: never a chunk (DESIGN, the Chunk contract)."""
    return any(status_code(resource, name) in WITHDRAWN for name in STATUS_FIELDS)


def series_key(resource: dict) -> str:
    """What one trend follows: a (system, code), LOINC preferred, so two local code systems that
    happen to share a code never mix (a pulse in a potassium trend)."""
    keys = [c for c in codings(resource.get("code")) if c.get("code")]
    loinc = [c for c in keys if c.get("system") == "http://loinc.org"]
    chosen = (loinc or keys or [{}])[0]
    return f"{chosen.get('system', '')}|{chosen.get('code', '')}" if chosen else ""


TREND_WINDOWS = (30, 90, 365)
# About 60 pages of text, a few hundred chunks: longer "notes" are scanned books or machine output.
MAX_NOTE_CHARS = 200_000


def sentences_of(body: str) -> list[str]:
    """A text's sentences line by line, by the clinical sentence rules (the whole text if none)."""
    return [s.text for line in body.split("\n") for s in note_sentences(line)] or [body]


@dataclass
class TextBudget:
    """How much text one chunk may hold, counted the way the embedding model counts it."""
    max_tokens: int
    count_tokens: Callable[[str], int]

    def fits(self, text: str) -> bool:
        # An ASCII text never has more word pieces than characters: a short one fits uncounted
        # (most structured chunks; counting each cost as much as the rest of chunking).
        if len(text) <= self.max_tokens and text.isascii():
            return True
        return self.count_tokens(text) <= self.max_tokens


@dataclass
class ChunkProblem:
    ref: str
    reason: str


def encounter_of(r: dict) -> str:
    """`Encounter/<id>` of the encounter a resource belongs to (`encounter`, a medication's
    `context`, a document's `context.encounter`, an encounter's `partOf`), or ''."""
    if r.get("resourceType") == "Encounter":
        return ref_id(r.get("partOf"))
    context = r.get("context") if isinstance(r.get("context"), dict) else {}
    listed = context.get("encounter") if isinstance(context.get("encounter"), list) else []
    for candidate in (r.get("encounter"), context, *listed):
        ref = ref_id(candidate)
        if ref.startswith("Encounter/"):
            return ref
    return ""


# --- the chunker ------------------------------------------------------------------------------

class PatientChunker:
    """Chunks for one patient's resources, references resolved against all of them: a list of
    dicts, or a large record's compact resources, parsed as each part or reference needs them
    (fhir_ingest/record/compact.py). What it keeps of the record is references, not resources."""

    def __init__(self, tenant: str, patient_id: str, resources: Resources, budget: TextBudget):
        self.tenant = tenant
        self.patient_id = patient_id
        self.budget = budget
        self.by_ref = lookup_of(resources)        # Type/id → resource (`get`, `in`)
        self.resources = resources
        self.problems: list[ChunkProblem] = []
        self._facts: dict[str, Fact | None] = {}
        self.fitted: set[str] = set()     # chunk ids packed to fit the window already (notes)
        self.conditions_by_encounter: dict[str, list[str]] = defaultdict(list)    # Encounter/id → Condition/ids
        for r in of_types(resources, ("Condition",)):
            enc = ref_id(r.get("encounter"))
            if enc:
                self.conditions_by_encounter[enc].append(f"Condition/{r['id']}")
        # DiagnosticReports whose note text is already indexed through a DocumentReference twin.
        self.note_twins = set()
        for r in of_types(resources, ("DocumentReference",)):
            for ident in r.get("identifier") or []:
                value = ident.get("value") or ""
                if value.startswith("urn:uuid:"):
                    self.note_twins.add("DiagnosticReport/" + value[len("urn:uuid:"):])
            for rel in r.get("relatesTo") or []:
                target = ref_id(rel.get("target"))
                if target.startswith("DiagnosticReport/"):
                    self.note_twins.add(target)

    def resolve(self, ref: str) -> dict | None:
        """A resource of this record by `Type/id` (what the kinds' readers resolve references with)."""
        return self.by_ref.get(ref)

    def encounter_conditions(self, encounter: str) -> list[dict]:
        """The Conditions of the record that name this encounter (`Encounter/<id>`), in order."""
        return [c for ref in self.conditions_by_encounter.get(encounter, []) if (c := self.by_ref.get(ref)) is not None]

    def date_of(self, r: dict) -> str:
        """The resource's clinical date; when it records none, its encounter's (a MIMIC diagnosis
        is dated only by its admission), and an encounter's, the one it is part of."""
        seen = set()
        while r is not None and f"{r['resourceType']}/{r.get('id')}" not in seen:
            when = clinical_date(r)
            if when:
                return when
            seen.add(f"{r['resourceType']}/{r.get('id')}")
            r = self.by_ref.get(encounter_of(r))
        return ""

    def problem(self, ref: str, reason: str) -> None:
        """Something of this resource could not be rendered: the index report says what."""
        self.problems.append(ChunkProblem(ref, reason))

    def fact(self, r: dict) -> Fact | None:
        """The resource's typed fact (by its kind), read once however many chunks it makes."""
        ref = f"{r['resourceType']}/{r['id']}"
        if ref not in self._facts:
            try:
                self._facts[ref] = fact_of(r, self.resolve)
            except (KeyError, TypeError, AttributeError, ValueError):
                # A reader failing on a checked resource is a bug in chartcite: the chunk keeps its
                # text (answers word it from there) and the traceback is logged (code, not data).
                log.error("the %s fact reader failed: a bug", r["resourceType"], exc_info=True)
                self._facts[ref] = None
            fact = self._facts[ref]
            if fact is not None and not fact.date:
                fact.date = self.date_of(r)
        return self._facts[ref]

    def new_chunk(self, r: dict, part: str, text: str, label: str, semantic_type: str,
                  category: str = "", sections: list[str] | None = None, codes: list[dict] | None = None,
                  refs: list[str] | None = None, when: str | None = None, status: str = "",
                  fact: Fact | None = None) -> Chunk:
        ref = f"{r['resourceType']}/{r['id']}"
        fact = fact if fact is not None else self.fact(r)
        return Chunk(
            tenant=self.tenant, patient_id=self.patient_id, resource_type=r["resourceType"],
            resource_id=r["id"], part=part, text=text, label=label,
            date=when if when is not None else self.date_of(r), semantic_type=semantic_type,
            category=category, sections=list(sections or []),
            version_id=str((r.get("meta") or {}).get("versionId") or ""), status=status,
            codes=codes or [], refs=[ref] + [x for x in (refs or []) if x != ref],
            fact=fact.to_dict() if fact is not None else {},
        )

    def chunks(self) -> list[Chunk]:
        return self.chunks_of(self.resources) + self.trend_part()

    def chunks_of(self, resources: list[dict]) -> list[Chunk]:
        """The chunks of some of the record's resources (each fitted to the window), references
        resolved against the whole record: a large record is chunked a part at a time
        (search/record_parts.py), and its parts together make what `chunks()` makes."""
        out: list[Chunk] = []
        for r in resources:
            if withdrawn(r):
                continue
            render = self.renderer(r["resourceType"])
            if render is None:
                continue
            try:
                out.extend(render(self, r))
            except (NoteDecodeError, ValueError) as exc:      # the resource's data: reported, skipped
                self.problems.append(ChunkProblem(f"{r['resourceType']}/{r.get('id')}", f"could not be chunked: {exc}"))
            except (KeyError, TypeError, AttributeError) as exc:
                # A renderer failing on a checked resource is a bug in chartcite: the resource is
                # still reported and the rest of the record indexed, and the traceback is logged
                # (code, not data) so the bug is seen and fixed.
                log.error("the %s renderer failed (%s): a bug", r["resourceType"], type(exc).__name__, exc_info=True)
                self.problems.append(ChunkProblem(f"{r['resourceType']}/{r.get('id')}", f"could not be chunked: {exc}"))
        return [piece for chunk in out for piece in self.within_window(chunk)]

    def trend_part(self) -> list[Chunk]:
        """The trend summaries of the whole record, fitted to the window."""
        return list(self.trend_pieces())

    def trend_pieces(self) -> Iterator[Chunk]:
        """The same, one at a time: a large record's summaries (each fact holds every reading of
        its window) are written a group at a time, never all held at once."""
        for chunk in self.trend_chunks():
            yield from self.within_window(chunk)

    def forget_rendered(self) -> None:
        """Drop what rendering cached (facts, the notes already fitted): a part's chunks need it
        only until they are made, and a large record's would otherwise grow with the record."""
        self._facts.clear()
        self.fitted.clear()

    @staticmethod
    def renderer(resource_type: str):
        """The renderer of a resource type (its kind's), or None for a type that is not indexed."""
        kind = KINDS.get(resource_type)
        return kind.render if kind is not None else None

    def within_window(self, chunk: Chunk) -> list[Chunk]:
        """A structured chunk too long for the model's window (a 30-question survey, a big panel)
        becomes several, each repeating its lead ("Survey result on 2023-02-01:") so it reads alone."""
        if chunk.chunk_id in self.fitted or self.budget.fits(chunk.text):
            return [chunk]
        lead, sep, body = chunk.text.partition(": ")
        if not sep:
            lead, body = "", chunk.text
        out = []
        room = self.room_after(lead)
        for i, (piece, _) in enumerate(self.fit_section(room, "", body, self.structured_units(room))):
            text = f"{lead}: {piece}" if lead else piece
            out.append(replace(chunk, part=f"{chunk.part}.{i}", text=text))
        return out

    def reason_text(self, r) -> str:
        reasons = [concept_text(c) for c in r.get("reasonCode") or []]
        for x in r.get("reasonReference") or []:
            target = self.by_ref.get(ref_id(x))
            reasons.append(concept_text((target or {}).get("code")) or x.get("display", ""))
        return _join(reasons)

    def reason_refs(self, r) -> list[str]:
        return [ref_id(x) for x in r.get("reasonReference") or [] if ref_id(x) in self.by_ref]

    @staticmethod
    def dosage_text(dosages: list[dict]) -> str:
        return _join((dosage_text(d) for d in dosages or [] if isinstance(d, dict)), " | ")

    @staticmethod
    def notes_text(r) -> str:
        notes = _join((n.get("text", "") for n in r.get("note") or [] if isinstance(n, dict)), " ")
        return f"Note: {notes}" if notes else ""

    # Notes and reports -----------------------------------------------------------------------
    def attachment_text(self, r, attachment: dict) -> str:
        """Plain text of an attachment: its inline data, or the Binary it points at when this input
        holds it (relative or absolute URL, a urn:uuid the reader resolved, or contained)."""
        if attachment.get("data"):
            return decode_attachment(attachment)
        url = attachment.get("url")
        binary = contained(r, url) or self.by_ref.get(binary_ref(url))
        if binary and binary.get("data"):
            return decode_attachment({"data": binary["data"],
                                      "contentType": attachment.get("contentType") or binary.get("contentType", "")})
        raise NoteDecodeError("its content is neither inline nor in this input (attachment URL not fetched)")

    def readable_attachments(self, r, attachments: list) -> tuple[list[str], list[str]]:
        """(texts, reasons): every attachment that could be read, and why the others could not."""
        texts, reasons = [], []
        for i, attachment in enumerate(attachments):
            if not isinstance(attachment, dict):
                continue
            try:
                texts.append(self.attachment_text(r, attachment))
            except NoteDecodeError as exc:
                reasons.append(f"attachment {i + 1} ({attachment.get('contentType') or 'no content type'}): {exc}")
        return texts, reasons

    def note_chunks(self, r, text: str, note_type: str, when: str, semantic: str,
                    refs: list[str] | None = None, part_prefix: str = "") -> list[Chunk]:
        """Pack a note's sections into chunks that fit the model's window; never mix two notes."""
        header = f"{note_type} of {when}" if when else note_type
        if len(text) > MAX_NOTE_CHARS:
            # Bounded time and memory whatever arrives; what is left out is reported, never silent.
            self.problems.append(ChunkProblem(f"{r['resourceType']}/{r['id']}", f"a note of {len(text):,} characters: "
                                              f"the first {MAX_NOTE_CHARS:,} are indexed, the rest is not"))
            text = text[:MAX_NOTE_CHARS]
        room = self.room_after(header)
        pieces: list[tuple[str, str, int]] = []  # (heading, text, tokens)
        for section in split_sections(text):
            if re.fullmatch(r"\d{4}-\d{2}-\d{2}", section.text.strip()) and not section.heading:
                continue  # the template's date line; the date is in the header already
            for piece, tokens in self.fit_section(room, section.heading, section.text):
                pieces.append((section.heading, piece, tokens))
        chunks, current, used, headings = [], "", 0, []
        def flush():
            if current:
                n = len(chunks)
                named = [h for h in dict.fromkeys(headings) if h]
                label = make_label(when, "Note", _join(named) or note_type)
                fact = NoteFact(name=note_type, codes=codings_of(r.get("code") if r["resourceType"] == "DiagnosticReport"
                                                                 else r.get("type")),
                                date=clinical_date(r), status=str(r.get("status") or ""), note_type=note_type,
                                sections=named, section_kinds=[section_kind(h) for h in named])
                chunks.append(self.new_chunk(r, f"{part_prefix}sec{n}", f"{header}. {current}", label, semantic,
                                             category=note_type, sections=named, refs=refs,
                                             status=r.get("status", ""), fact=fact))
        for heading, piece, tokens in pieces:
            if current and used + tokens > room:
                flush()
                current, used, headings = piece, tokens, [heading]
            else:
                current, used = f"{current} {piece}".strip(), used + tokens
                headings.append(heading)
        flush()
        self.fitted.update(c.chunk_id for c in chunks)
        return chunks

    def room_after(self, header: str) -> int:
        """Word pieces left in the window for text after "<header>. "."""
        return self.budget.max_tokens - self.budget.count_tokens(f"{header}.")

    def fit_section(self, room: int, heading: str, body: str, units=None) -> list[tuple[str, int]]:
        """A section as one or more pieces with their token counts, each of which fits in `room`
        (see room_after), cut between `units` (by default the body's sentences). Each unit is
        counted once and pieces are sized by adding counts: the model's word pieces never cross a
        space, so text joined by spaces counts as the sum of its parts (counting every growing
        candidate again was most of chunking's time)."""
        lead = f"{heading}:" if heading else ""
        lead_size = self.budget.count_tokens(lead)
        # Most sections fit whole: counting them once is far cheaper than finding their sentences
        # (the clinical sentence rules cost most of a first sync's words-first write).
        whole = self.budget.count_tokens(body)
        if lead_size + whole <= room:
            return [(f"{heading}: {body}" if heading else body, lead_size + whole)]
        # Cut between sentences as a clinician reads them, never at "Dr." or "p.o.".
        units = (units or sentences_of)(body)
        sizes = [self.budget.count_tokens(unit) for unit in units]
        continued_size = self.budget.count_tokens(f"{heading} (continued):") if heading else 0
        pieces, current, used = [], lead, lead_size
        for unit, size in zip(units, sizes):
            if current and used + size > room:
                pieces.append((current, used))
                current = f"{heading} (continued): {unit}" if heading else unit
                used = continued_size + size
            else:
                current, used = f"{current} {unit}".strip(), used + size
        if current:
            pieces.append((current, used))
        # A single sentence longer than the window is cut on words rather than silently truncated.
        out = []
        for piece, used in pieces:
            out += [(piece, used)] if used <= room else self.cut_on_words(room, piece)
        return out

    def structured_units(self, room: int):
        """The units a structured text is cut between: its "; "-joined items (a survey's answers,
        a panel's results), and the sentences of an item too long alone. Finding sentences in a
        long run of survey answers cost the clinical sentence rules a second per survey."""
        def units(body: str) -> list[str]:
            items = re.split(r"(?<=;) ", body)
            return [unit for item in items
                    for unit in ([item] if self.budget.count_tokens(item) <= room else sentences_of(item))]
        return units

    def cut_on_words(self, room: int, text: str) -> list[tuple[str, int]]:
        """Pieces of `text` (with their token counts) that fit in `room`, cut between words in one pass."""
        room = max(1, room)      # a header that fills the window still leaves one word per piece
        pieces, current, used = [], [], 0
        for word in text.split():
            size = self.budget.count_tokens(word)
            if current and used + size > room:
                pieces.append((" ".join(current), used))
                current, used = [], 0
            current.append(word)
            used += size
        if current:
            pieces.append((" ".join(current), used))
        return pieces

    # Trends ----------------------------------------------------------------------------------
    def trend_chunks(self) -> Iterator[Chunk]:
        """Per analyte with two or more values: one summary per window ending at its last value.
        A series keeps each reading's date and `Type/id`, and a window's readings are resolved when
        its summary is written: a large record's observations are never all parsed at once."""
        series: dict[str, list[tuple[str, str]]] = defaultdict(list)      # key → [(date, Observation/id)]
        for r in of_types(self.resources, ("Observation",)):
            if withdrawn(r):
                continue
            key, when = series_key(r), clinical_date(r)
            if not key or not _to_date(when):
                continue
            value = observation_value(r)
            numeric = r.get("valueQuantity") or any(c.get("valueQuantity") for c in r.get("component") or [])
            if numeric and value:
                series[key].append((when, f"Observation/{r['id']}"))
        for code, readings in series.items():
            if len(readings) < 2:
                continue
            readings.sort(key=lambda reading: reading[0])
            last = _to_date(readings[-1][0])
            previous_members = None
            for days in TREND_WINDOWS + (None,):
                members = [ref for when, ref in readings
                           if days is None or _to_date(when) >= last - timedelta(days=days)]
                if len(members) < 2 or members == previous_members:
                    continue
                previous_members = members
                yield self.trend_chunk([self.by_ref[ref] for ref in members], days)

    def trend_chunk(self, members: list[dict], days: int | None) -> Chunk:
        latest = members[-1]
        name = concept_text(latest.get("code"))
        category = observation_category(latest)
        semantic = "vital" if category == "vital-signs" else "lab" if category == "laboratory" else "observation"
        shown = members[-12:]
        readings = "; ".join(f"{day(clinical_date(o))} {observation_value(o)}" for o in shown)
        window = f"last {days} days" if days else "all recorded values"
        first_day, last_day = day(clinical_date(members[0])), day(clinical_date(latest))
        text = _sentence(
            f"Trend of {name} ({window}, {first_day} to {last_day}, {len(members)} readings):",
            f"{readings}.", f"Latest {observation_value(latest)} on {last_day}.",
        )
        label = make_label(last_day, "Trend", f"{name} · {window}")
        refs = [f"Observation/{o['id']}" for o in reversed(members)]
        fact = SeriesFact(name=name, codes=codings_of(latest.get("code")), date=clinical_date(latest),
                          window=window, points=[point_of(o) for o in members])
        return self.new_chunk(latest, f"trend-{days or 'all'}", text, label, semantic, category="trend",
                              codes=code_keys(latest.get("code")), refs=refs, when=last_day, fact=fact)


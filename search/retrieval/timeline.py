"""Time a question anchors to the patient's own events rather than to a date.

"labs before the surgery", "since she started insulin", "at her first prenatal visit",
"peri-op", "over the past 2 years": each becomes a date window found in this patient's record
(the event's date from its chunks), so the filter stage narrows by it like an explicit date.
Relative windows count back from the record's newest entry: records are read as they stand.
"""
from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, replace
from datetime import date, timedelta

from search.nlp.annotate import RecordTerm, asserted_keys, default_annotator
from search.backends.base import Backend, Scope

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10, "twelve": 12}
_NUMBER = r"(\d{1,2}|" + "|".join(NUMBERS) + ")"
UNIT_DAYS = {"day": 1, "week": 7}
RELATIVE = re.compile(rf"\b(?:last|past|previous|prior)\s+{_NUMBER}\s+(day|week|month|year)s?\b", re.I)
LAST_N = re.compile(rf"\b(?:last|past|previous|recent|latest|most recent)\s+{_NUMBER}\b(?!\s+(?:day|week|month|year)s?\b)",
                    re.I)
# Relation, optional ordinal, the event: "before the surgery", "since she started insulin",
# "at her first prenatal visit", "after his MI".
_RELATION = r"\b(before|prior to|pre-?op(?:erative(?:ly)?)?|after|following|since|post-?op(?:erative(?:ly)?)?|at|during|around|peri-?op(?:erative(?:ly)?)?)"
ANCHOR = re.compile(
    _RELATION + r"\s+(?:(?:the|her|his|their|that|this)\s+)?(?:(?:she|he|they|the patient)\s+(?:was\s+)?"
    r"(?:started|began|went)\s+(?:on\s+)?|(?:starting|start of|initiation of)\s+)?"
    r"(?:(first|initial|last|latest|most recent|recent)\s+)?([a-z0-9][a-z0-9' -]{1,40}?)\s*(?=[?,.;]|$|\b(?:was|were|did|is|and)\b)",
    re.I)
PERI_OP_ALONE = re.compile(r"\b(peri-?op(?:erative(?:ly)?)?|pre-?op(?:erative(?:ly)?)?|post-?op(?:erative(?:ly)?)?)\b", re.I)
SURGERY_WORDS = re.compile(r"\b(surgery|surgeries|operation|op|procedure)\b", re.I)
SURGICAL = re.compile(r"ectomy|otomy|ostomy|plasty|bypass|replacement|implantation|graft|repair|insertion|excision|"
                      r"extraction|amputation|fixation|transplant|cesarean|ligation|surgical|thrombectomy", re.I)
SEVERAL = re.compile(r"\b(few|several|couple|all|each|every|multiple|many|visits|physicals|appointments|surgeries|"
                     r"operations|procedures|admissions|stays)\b", re.I)
VISIT_WORDS = re.compile(r"\b(visit|appointment|admission|stay|hospitalization|encounter|check-?up|physical)\b", re.I)
# Words that point at the stay or visit the clinician is in ("this admission", "since admission",
# "on this encounter"): the window is that encounter's period, not a phrase to look up in the record.
_STAY = r"(?:hospital\s+)?(?:admission|stay|hospitali[sz]ation|inpatient stay)"
_VISIT = r"(?:visit|encounter)"
CURRENT_STAY = re.compile(
    rf"\b(?:(?:on|in|during|for|at)\s+)?(?:this|the current|current|present|the present)\s+({_STAY}|{_VISIT})\b|"
    rf"\bsince\s+(admission|(?:she|he|they|the patient|pt)\s+(?:was|were|got)\s+admitted)\b", re.I)
INPATIENT_CLASSES = {"IMP", "ACUTE", "NONAC"}


@dataclass
class Anchor:
    date_from: str
    date_to: str
    note: str
    missing: str = ""      # the question points at a stay the record does not hold: said, not searched


def number(word: str) -> int:
    return int(word) if word.isdigit() else NUMBERS[word.lower()]


def last_n(question: str) -> int:
    """'last 3 A1c values' → 3 (0 when the question asks for no count)."""
    m = LAST_N.search(question)
    return number(m.group(1)) if m else 0


def relative_window(backend: Backend, scope: Scope, question: str) -> Anchor | None:
    """'over the past 2 years' → from two years before the record's newest entry."""
    m = RELATIVE.search(question)
    if not m:
        return None
    newest = newest_day(backend, scope)
    if newest is None:
        return None
    start = back_from(newest, number(m.group(1)), m.group(2).lower())
    return Anchor(start.isoformat(), "", f"{m.group(0)} of the record (to {newest.isoformat()})")


def back_from(day: date, count: int, unit: str) -> date:
    """Calendar arithmetic: six months before 1 Jan 2025 is 1 Jul 2024 (the day clamped to the month)."""
    if unit in ("day", "week"):
        return day - timedelta(days=count * UNIT_DAYS[unit])
    months = day.year * 12 + day.month - 1 - count * (12 if unit == "year" else 1)
    year, month = divmod(months, 12)
    return date(year, month + 1, min(day.day, calendar.monthrange(year, month + 1)[1]))


def newest_day(backend: Backend, scope: Scope) -> date | None:
    hits = backend.latest(scope, 1)
    chunks = backend.get_chunks(scope.tenant, [h.chunk_id for h in hits])
    return _day(chunks[0].date) if chunks else None


def current_stay_window(backend: Backend, scope: Scope, question: str) -> Anchor | None:
    """"This admission", "since admission", "on this visit": the encounter in progress, else the
    latest inpatient stay (any visit, for "this visit / encounter"). None when the question points
    at no such stay; an Anchor with `missing` set when it does and the record holds none."""
    m = CURRENT_STAY.search(question)
    if not m:
        return None
    words = m.group(0).strip()
    any_visit = bool(m.group(1)) and re.fullmatch(_VISIT, m.group(1), re.I) is not None
    stay = current_stay(backend, scope, any_visit)
    if stay is None:
        kind = "visit" if any_visit else "hospital admission"
        return Anchor("", "", words, missing=f"No {kind} in progress or recorded for '{words}' to refer to")
    start, end, status = stay
    still = status == "in-progress" or not end
    note = f"{words}: the {'current' if still else 'latest'} {'visit' if any_visit else 'stay'} " \
           f"({start} to {'now' if still else end})"
    return Anchor(start, "" if still else end, note)


def current_stay(backend: Backend, scope: Scope, any_visit: bool) -> tuple[str, str, str] | None:
    """(start, end, status) of the encounter in progress, else the newest one of the kinds asked
    (inpatient stays, or any visit); a planned or cancelled encounter is not a stay."""
    hits = backend.latest(replace(scope, semantic_types=("encounter",)), 500)
    stays = []
    for chunk in backend.get_chunks(scope.tenant, [h.chunk_id for h in hits]):
        fact, start = chunk.fact or {}, (chunk.date or "")[:10]
        status = str(fact.get("status") or chunk.status or "")
        if chunk.resource_type != "Encounter" or not start or status in ("planned", "cancelled", "entered-in-error"):
            continue
        if any_visit or fact.get("encounter_class", "") in INPATIENT_CLASSES:
            stays.append((status == "in-progress", start, str(fact.get("end") or "")[:10], status))
    if not stays:
        return None
    _, start, end, status = max(stays)
    return start, end, status


def event_window(backend: Backend, scope: Scope, question: str, terms: list[RecordTerm]) -> Anchor | None:
    """The window a relation to one of the patient's events describes, or None."""
    m = ANCHOR.search(question)
    relation, ordinal, event = (m.group(1), m.group(2) or "", m.group(3)) if m else ("", "", "")
    if not m:
        alone = PERI_OP_ALONE.search(question)
        if not alone:
            return None
        relation, event = alone.group(1), "surgery"
    if SEVERAL.search(event):
        return None       # "at the last few physicals" spans several events: a trend, not a window
    when = event_dates(backend, scope, event, terms)
    if not when:
        return None
    first = ordinal.lower() in ("first", "initial") or re.search(r"start|began|went on|since", m.group(0) if m else "", re.I)
    day = when[0] if first else when[-1]
    note = f"{relation} {ordinal + ' ' if ordinal else ''}{event} ({day.isoformat()})"
    if relation.lower() == "during" and not ordinal and len(when) > 1:      # an episode: all of it
        return Anchor(when[0].isoformat(), when[-1].isoformat(), f"during {event} ({when[0]} to {when[-1]})")
    return window(relation.lower(), day, note)


def event_dates(backend: Backend, scope: Scope, event: str, terms: list[RecordTerm]) -> list[date]:
    """The dates of the record's entries for an event phrase, oldest first: by its concepts, or
    for "the surgery" the surgical procedures."""
    surgery = bool(SURGERY_WORDS.search(event))
    keys = sorted(asserted_keys(default_annotator().annotate([event], terms, in_question=True)[0]))
    kinds = ("encounter",) if VISIT_WORDS.search(event) else ("procedure",) if surgery else ()
    if keys:
        hits = backend.search_concepts(replace(scope, semantic_types=kinds), keys, 200)
    elif surgery:
        hits = backend.latest(replace(scope, semantic_types=("procedure",)), 500)
    else:
        return []
    chunks = backend.get_chunks(scope.tenant, [h.chunk_id for h in hits])
    if surgery and not keys:
        chunks = [c for c in chunks if SURGICAL.search(c.text)]
    chunks = the_event_itself(chunks, set(keys), terms)
    return sorted({d for c in chunks if c.category != "trend" and (d := _day(c.date))})


def the_event_itself(chunks: list, keys: set[str], terms: list[RecordTerm]) -> list:
    """The entries that are the event, not a later note recalling it: a coded entry, or a note
    whose title names it ("Cardiac Catheterization Report"). An operative note of three days
    later that says "it was felt necessary to perform cardiac catheterization" dates a mention,
    and "after the cath" had started the window after the carotid surgery. Where only notes'
    prose names the event, those dates are all there is."""
    if not keys:
        return chunks
    titles = {c.text.partition(". ")[0] for c in chunks if c.semantic_type == "note"}
    titled = {t for t, found in zip(titles, default_annotator().annotate(list(titles), terms)) if asserted_keys(found) & keys}
    itself = [c for c in chunks if c.semantic_type != "note" or c.text.partition(". ")[0] in titled]
    return itself or chunks


def window(relation: str, day: date, note: str) -> Anchor:
    """Before: the half year leading to it; after / since: from it on; at / during: the day;
    peri-operative: a month either side; pre- and post-operative: the month before or after."""
    if relation.startswith(("peri", "around")):
        return Anchor((day - timedelta(days=30)).isoformat(), (day + timedelta(days=30)).isoformat(), note)
    if relation.startswith("pre"):
        return Anchor((day - timedelta(days=30)).isoformat(), (day - timedelta(days=1)).isoformat(), note)
    if relation.startswith("post"):
        return Anchor(day.isoformat(), (day + timedelta(days=30)).isoformat(), note)
    if relation in ("before", "prior to"):
        return Anchor((day - timedelta(days=183)).isoformat(), (day - timedelta(days=1)).isoformat(), note)
    if relation in ("after", "following", "since"):
        return Anchor(day.isoformat(), "", note)
    return Anchor(day.isoformat(), day.isoformat(), note)


def _day(iso: str) -> date | None:
    try:
        return date.fromisoformat(iso[:10])
    except (TypeError, ValueError):
        return None


def anchor(backend: Backend, scope: Scope, question: str, terms: list[RecordTerm],
           explicit: bool) -> Anchor | None:
    """The question's window from the patient's own timeline, unless it names dates itself."""
    if explicit:
        return None
    return (current_stay_window(backend, scope, question) or relative_window(backend, scope, question)
            or event_window(backend, scope, question, terms))

"""Claim-level verification of generated statements against the evidence they cite.

Deterministic: a statement survives only if it cites evidence of this answer, and the clinical
concepts it names (with their negation), the numbers and the dates it states are all found in
the cited chunks. Anything else is removed and counted, never shown.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from fhir_ingest.record.contract import Chunk

from search.nlp.annotate import RecordTerm, default_annotator

MONTH_DATE = re.compile(r"\b(Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|Jun(?:e)?|Jul(?:y)?|Aug(?:ust)?|"
                        r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?\s+(\d{1,2}),?\s+(\d{4})\b", re.I)
ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")


@dataclass
class Verdict:
    supported: bool
    reason: str = ""


def dates_in(text: str) -> tuple[set[str], str]:
    """ISO dates named in the text, and the text with them taken out (so their digits are not
    checked again as numbers)."""
    found = {m.group(0) for m in ISO_DATE.finditer(text)}
    for m in MONTH_DATE.finditer(text):
        try:
            month = datetime.strptime(m.group(1)[:3].title(), "%b").month
            found.add(f"{int(m.group(3)):04d}-{month:02d}-{int(m.group(2)):02d}")
        except ValueError:
            continue
    return found, MONTH_DATE.sub(" ", ISO_DATE.sub(" ", text))


def numbers_in(text: str) -> set[str]:
    return {_norm_number(n) for n in NUMBER.findall(text)}


def _norm_number(n: str) -> str:
    return n.rstrip("0").rstrip(".") if "." in n else n.lstrip("0") or "0"


MIN_WORDS = 3


def verify_statement(statement: str, cited: list[Chunk], terms: list[RecordTerm]) -> Verdict:
    if not cited:
        return Verdict(False, "cites no evidence of this answer")
    if len(re.findall(r"\w+", statement)) < MIN_WORDS or not re.search(r"[A-Za-z]{2}", statement):
        return Verdict(False, "not a sentence a clinician could read on its own")
    evidence_text = " ".join(f"{c.label} {c.text} {c.date[:10]}" for c in cited)
    stated_dates, rest = dates_in(statement)
    known_dates, evidence_rest = dates_in(evidence_text)
    missing_dates = stated_dates - known_dates
    if missing_dates:
        return Verdict(False, f"date not in the cited evidence: {sorted(missing_dates)[0]}")
    known_numbers = numbers_in(evidence_rest) | {_norm_number(p) for d in known_dates for p in d.split("-")}
    missing_numbers = numbers_in(rest) - known_numbers
    if missing_numbers:
        return Verdict(False, f"number not in the cited evidence: {sorted(missing_numbers)[0]}")
    [concepts] = default_annotator().annotate([statement], terms)
    if not (concepts or stated_dates or numbers_in(rest)):
        # "Yes." cites something but states nothing a reader could check against it.
        return Verdict(False, "names no clinical fact, number or date to check")
    cited_concepts = [c for chunk in cited for c in chunk.concepts]
    for concept in concepts:
        same = [c for c in cited_concepts if c["key"] == concept["key"]]
        if not same:
            return Verdict(False, f"names {concept['display']!r}, which the cited evidence does not")
        if not any(bool(c.get("negated")) == bool(concept["negated"]) for c in same):
            state = "denies" if concept["negated"] else "asserts"
            return Verdict(False, f"{state} {concept['display']!r}, the cited evidence does the opposite")
    return Verdict(True)

"""Small words-level helpers shared by the renderers: a day of an ISO date, a sentence from
optional parts, a de-duplicated list, a SNOMED display without its tag. (A resource's clinically
relevant date is its kind's: fhir_ingest.record.kinds.clinical_date.)"""
from __future__ import annotations

import re
from datetime import date
from typing import Iterable

def day(iso: str) -> str:
    return iso[:10] if iso else ""


def _to_date(iso: str) -> date | None:
    try:
        return date.fromisoformat(iso[:10])
    except (TypeError, ValueError):
        return None


def _sentence(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p and p.strip())


def _join(items: Iterable[str], sep: str = ", ") -> str:
    seen, out = set(), []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return sep.join(out)


def _strip_tag(display: str) -> str:
    """'Prediabetes (finding)' → 'Prediabetes' for labels; the full display stays in the text."""
    return re.sub(r"\s*\((?:disorder|finding|situation|procedure|substance|product|qualifier value|"
                  r"observable entity|physical object|morphologic abnormality|regime/therapy|event|environment|record artifact)\)\s*$",
                  "", display or "")



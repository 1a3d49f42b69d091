"""Plain-language names beside clinical terms: "osteomyelitis (a bone infection)".

The table is `data/plain_terms.tsv`, the project's own (CC0), small on purpose: a term is glossed
only where the table has it, and a draft glosses at most a few terms so it stays short. No
consumer-health vocabulary with a licence that allows shipping is installable here.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).parent / "data" / "plain_terms.tsv"


@lru_cache(maxsize=1)
def plain_terms() -> dict[str, str]:
    rows = {}
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            term, _, plain = line.partition("\t")
            rows[term.strip().lower()] = plain.strip()
    return rows


def glosses(text: str, already: set[str], most: int) -> list[str]:
    """"term: plain name" for the table's terms the text uses, not yet glossed in the draft
    (`already`), longest terms first, at most `most`. Said beside the quote, never inside it."""
    done: list[str] = []
    for term in sorted(plain_terms(), key=len, reverse=True):
        if len(done) >= most or term in already:
            continue
        # A term inside a longer one glossed ("stenosis" in "carotid stenosis") is left alone.
        if re.search(rf"\b{re.escape(term)}(?:e?s)?\b", text, re.I) and not any(term in longer for longer in done):
            done.append(term)
    already.update(done)
    return [f"{term}: {plain_terms()[term]}" for term in done]

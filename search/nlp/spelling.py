"""Misspelt clinical words in a question, corrected against the terminology's vocabulary before
the question is read ("retinopahty" -> retinopathy, "fossamax" -> fosamax), within the bounds
terminology.correct keeps: never one real word or drug into another. Every correction is
returned, so the diagnostics can show it."""
from __future__ import annotations

import re

from search.nlp.terminology import correct

_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{4,}")


def spelled(question: str) -> tuple[str, list[tuple[str, str]]]:
    """(the question with its misspelt words corrected, [(typed, corrected)])."""
    corrections: list[tuple[str, str]] = []

    def fix(match: re.Match) -> str:
        word = match.group(0)
        found = correct(word)
        if found is None:
            return word
        corrections.append((word, found[0]))
        return found[0]

    return _WORD.sub(fix, question), corrections

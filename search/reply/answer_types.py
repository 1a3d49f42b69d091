"""What kind of answer a question wants, and whether a sentence has that kind of content.

"Which side...?" is answered by a sentence that names a side, "what did the scan show?" by one
that reports a finding, "what is she taking?" by one with a drug's dose, "how much / what size?"
by one with a number, "when?" by one with a date. A sentence of the right note that lacks the
kind of content asked for (the operation's name, when the question asks why or which side) is
ranked below one that has it. These read how a question is put, never a particular question.
"""
from __future__ import annotations

import re

WANTS = {
    "side": re.compile(r"\bwhich (?:side|leg|arm|hip|knee|eye|ear|lung|kidney|breast|foot|hand|shoulder|one)\b|"
                       r"\bleft or right\b|\bright or left\b", re.I),
    "finding": re.compile(r"\b(?:show|shows|showed|find|found|reveal|revealed|results?|say|said)\b", re.I),
    "medication": re.compile(r"\b(?:taking|take|takes|medicines?|medications?|meds|prescribed|dose|dosage|"
                             r"antibiotics?|drugs?)\b", re.I),
    "amount": re.compile(r"\bhow (?:much|many|long|big|large)\b|\bwhat size\b|\bweigh\w*\b", re.I),
    "time": re.compile(r"\bwhen\b|\bwhat (?:year|date)\b", re.I),
}
HAS = {
    "side": re.compile(r"\b(?:left|right|bilateral\w*)\b", re.I),
    "finding": re.compile(r"\b(?:revealed|reveals|showed|shows|showing|demonstrat\w+|consistent with|no evidence|"
                          r"negative for|positive for|noted|identified|found|impression|diagnos\w+|there is|"
                          r"there are|did not)\b", re.I),
    "medication": re.compile(r"\b\d+(?:\.\d+)?\s*(?:mg|mcg|g|units?|ml|meq)\b|\b(?:every|daily|b\.i\.d|t\.i\.d|"
                             r"q\.?\d+\s*h|weekly|p\.o\.)", re.I),
    "amount": re.compile(r"\d"),
    "time": re.compile(r"\b(?:19|20)\d\d\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b(?:ago|since)\b", re.I),
}
BONUS = 0.12


def wanted(question: str) -> list[str]:
    return [kind for kind, pattern in WANTS.items() if pattern.search(question)]


def answer_type_bonus(kinds: list[str], sentence: str) -> float:
    """BONUS for each kind of content asked for that the sentence has."""
    return BONUS * sum(1 for kind in kinds if HAS[kind].search(sentence))

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
    "side": re.compile(r"\bwhich (?:side|leg|arm|hip|knee|eye|ear|lung|kidney|breast|foot|hand|shoulder)\b|"
                       r"\bleft or right\b|\bright or left\b", re.I),
    "finding": re.compile(r"\b(?:show|shows|showed|find|found|reveal|revealed|results?|say|said)\b", re.I),
    "medication": re.compile(r"\b(?:taking|take|takes|medicines?|medications?|meds|prescribed|dose|dosage|"
                             r"antibiotics?|drugs?|pills?|inhalers?)\b|\bwhat did (?:they|you|the doctors?) give\b|"
                             r"\bon anything\b", re.I),
    "amount": re.compile(r"\bhow (?:much|many|long|big|large)\b|\bwhat size\b|\bweigh\w*\b", re.I),
    # "When was it found?", not "was it infected when they took it out?"
    "time": re.compile(r"^\W*when\b|\bwhat (?:year|date|day|month)\b|\bhow long ago\b", re.I),
}
HAS = {
    "side": re.compile(r"\b(?:left|right|bilateral\w*)\b", re.I),
    "finding": re.compile(r"\b(?:revealed|reveals|showed|shows|showing|demonstrat\w+|consistent with|no evidence|"
                          r"negative for|positive for|noted|identified|found|impression|diagnos\w+|there is|"
                          r"there are|did not)\b", re.I),
    "medication": re.compile(r"\b\d+(?:\.\d+)?\s*(?:mg|mcg|g|units?|ml|meq)\b|\b(?:every|daily|b\.i\.d|t\.i\.d|"
                             r"q\.?\d+\s*h|weekly|p\.o\.)|\bprescribed\b", re.I),
    "amount": re.compile(r"\d"),
    "time": re.compile(r"\b(?:19|20)\d\d\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b(?:ago|since)\b", re.I),
}
BONUS = 0.12
# Kinds no sentence can answer without: "which side?" is not answered by a sentence naming no side,
# "how much?" by one with no number, "when?" by one with no time, "what is he taking?" by one with
# no drug (a dose or a prescription in a note, a medication record). A finding may be put in words
# the patterns do not know, so it only ranks.
REQUIRED = ("side", "amount", "time", "medication")
ALLERGY = re.compile(r"\ballerg", re.I)
WHY = re.compile(r"\bwhy\b|\bhow come\b|\bwhat (?:was|is) the reason\b", re.I)


def wanted(question: str) -> list[str]:
    kinds = [kind for kind, pattern in WANTS.items() if pattern.search(question)]
    # "What drug allergies...?" asks for allergies, not for a drug taken.
    return [k for k in kinds if not (k == "medication" and ALLERGY.search(question))]


def required(question: str) -> list[str]:
    """The kinds of content the question cannot be answered without; none when it asks why (a reason
    is wanted, not the drug or the date it names: "why did they take her off the blood thinner?")."""
    return [] if WHY.search(question) else [kind for kind in wanted(question) if kind in REQUIRED]


def answer_type_bonus(kinds: list[str], sentence: str) -> float:
    """BONUS for each kind of content asked for that the sentence has."""
    return BONUS * sum(1 for kind in kinds if HAS[kind].search(sentence))


def has_asked_content(kinds: list[str], sentence: str, dated: bool = False, medication: bool | None = None) -> bool:
    """Whether the sentence has a kind of content the question cannot be answered without (any one,
    when it asks for several). `dated`: the evidence carries its own clinical date (a coded record's
    onset or date, which the draft states), which answers "when?"; `medication`: for a coded
    record, whether it is a medication record (its type says so, not its words)."""
    required = [kind for kind in kinds if kind in REQUIRED]
    return not required or any(_has(kind, sentence, dated, medication) for kind in required)


def _has(kind: str, sentence: str, dated: bool, medication: bool | None) -> bool:
    if kind == "medication" and medication is not None:
        return medication
    return bool(HAS[kind].search(sentence)) or (kind == "time" and dated)

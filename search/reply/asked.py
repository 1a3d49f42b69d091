"""The thing a question asks a finding of, which the evidence must name.

"What did pathology say about the appendix?", "h pylori result from the EGD", "battery status at
the last device check", "results of his swallow study", "is an amputation planned": the question
asks what a named test, report or plan found. A sentence about the appendix, the EGD or the device
that never names pathology, H. pylori, the battery or an amputation does not answer it, however
similar it reads; such a question goes to the care team. These patterns are about how a question
is put, never about a particular test.
"""
from __future__ import annotations

import re

from search.nlp.lexicon import STOP_WORDS

_THING = r"([a-z][a-z0-9-]*(?:\s+[a-z][a-z0-9-]*)?)"
PATTERNS = [
    # what did pathology say / what did the MRI show
    re.compile(rf"\bwhat (?:did|does|do) (?:the |his |her |my |their )?{_THING} (?:say|show|find|reveal)\b", re.I),
    # results of his swallow study / result of the biopsy
    re.compile(rf"\bresults? (?:of|from|on) (?:the |his |her |my |their )?{_THING}\b", re.I),
    # h pylori result / battery status / edss score / swallow study results
    re.compile(rf"\b{_THING} (?:results?|status|score|level|reading|findings?)\b", re.I),
    # is an amputation planned / was a biopsy scheduled
    re.compile(rf"\b(?:is|was|are|were) (?:an? |the |any )?{_THING} (?:planned|scheduled|recommended|needed|booked)\b",
               re.I),
]
# "What was the stone made of?" asks for a composition: a sentence must say what it is made of.
COMPOSITION_ASKED = re.compile(r"\bmade (?:of|from)\b|\bcomposition\b", re.I)
COMPOSITION_SAID = re.compile(r"\b(?:made (?:of|from|up of)|compos(?:ed|ition)|consist(?:s|ed|ing)? of)\b", re.I)
GENERIC = {"test", "tests", "study", "report", "scan", "result", "results", "last", "latest", "recent", "first", "any"}


def asked_things(question: str) -> list[list[str]]:
    """The words of each thing the question asks a finding of, without stop words."""
    things = []
    for pattern in PATTERNS:
        for m in pattern.finditer(question):
            words = [w for w in re.findall(r"[a-z0-9]+", m.group(1).lower())
                     if w not in STOP_WORDS and (len(w) > 1)]
            named = [w for w in words if w not in GENERIC]
            if named:
                things.append(words)
    return things


def missing_thing(question: str, texts: list[str]) -> str:
    """The asked thing (or "what it is made of") that none of the evidence texts names; "" when named."""
    said = " ".join(texts).lower()
    if COMPOSITION_ASKED.search(question) and not COMPOSITION_SAID.search(said):
        return "what it is made of"
    for words in asked_things(question):
        if not all(re.search(rf"\b{re.escape(w[:5])}", said) for w in words):
            return " ".join(words)
    return ""

"""Clinical abbreviations in a question, read through the terminology's inventory
(search/nlp/data/terminology: the imantsm list, MIT, with hand-reviewed overrides).

"hx of CVA?" also reads "cerebrovascular accident", "osteoporosis - any fx?" reads "fracture", so
the lexicon and the record's own coded names can match what the clinician meant. A token is read
as an abbreviation when it is typed in capitals, or in lower case when it is no ordinary English
word ("fx", "etoh", "dnr"; never "as", "us", "fit"), and only where no other matcher already
recognised the word. Which meaning is meant depends on what the words around it are about ("colon
ca" is a cancer, "ca on the BMP" calcium): the question's context is inferred from them. An
abbreviation with several long forms contributes each; the record then says which it holds.
"""
from __future__ import annotations

import re

from search.nlp import terminology
from search.nlp.lexicon import STOP_WORDS

_TOKEN = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:[/-][A-Za-z0-9]+)?\b")
_CAPITALS = re.compile(r"^[A-Z][A-Z0-9]{1,7}s?$")
# What the words around a token are about, for the terminology's context-dependent meanings.
_BODY = re.compile(r"\b(colon|colorectal|prostate|breast|lung|skin|bladder|kidney|renal|liver|pancreatic|ovarian|"
                   r"cervical|uterine|thyroid|brain|rectal|gastric|stomach|esophageal|head and neck|bone)\s+$", re.I)
_HISTORY = re.compile(r"\b(h/o|hx|dx|history of|diagnosed with)\s+$", re.I)
_LAB = re.compile(r"\b(labs?|levels?|values?|results?|trend\w*|panel|bmp|cmp|cbc|ua|urinalysis|draws?|tests?|"
                  r"blood work|bloodwork)\b", re.I)
_DRUG = re.compile(r"\b(on|taking|takes|rx|dose|doses|dosing|mg|meds?|medications?|prescribed|refills?)\b", re.I)


def context_at(question: str, start: int) -> str | None:
    """What the question is about around a token: a problem (after an organ or "h/o"), a lab, a
    drug, or nothing the words say."""
    before = question[:start]
    if _BODY.search(before) or _HISTORY.search(before):
        return "problem"
    if _LAB.search(question):
        return "lab"
    if _DRUG.search(question):
        return "drug"
    return None


def is_abbreviation_like(token: str) -> bool:
    word = token.lower()
    if _CAPITALS.match(token) or terminology.has_reviewed_meaning(token):
        return True
    return len(word) >= 2 and word not in STOP_WORDS and not terminology.is_common_word(word)


def expansions(question: str, covered: list[tuple[int, int]]) -> list[tuple[int, str, list[str]]]:
    """(offset, abbreviation, long forms) for each abbreviation no matcher covered."""
    found = []
    for match in _TOKEN.finditer(question):
        start, end = match.span()
        token = match.group(0)
        if not is_abbreviation_like(token) or (any(s < end and start < e for s, e in covered)
                                                 and not reviewed_as_ambiguous(token)
                                                 and not typed_with_several_meanings(token)) or after_my(question, start, token):
            continue
        context = context_at(question, start)
        forms = terminology.abbreviation(token, context) or (
            terminology.abbreviation(token[:-1], context) if token.endswith("s") and len(token) > 2 else [])
        if forms:
            found.append((start, token, by_the_other_words(forms, question, token)))
    return found


_MY = re.compile(r"\b(?:my|your|our)\s+$", re.I)


def after_my(question: str, start: int, token: str) -> bool:
    """A lower-case word after "my", "your" or "our" is the asker's own word for a person or a
    thing ("my mom" is the mother, not milk of magnesia); an abbreviation is typed in capitals."""
    return token.islower() and _MY.search(question[:start]) is not None


def reviewed_as_ambiguous(token: str) -> bool:
    """A token the reviewed overrides give several meanings ("IPV": intimate partner violence or
    the polio vaccine): read through all of them even when one vocabulary already matched it, so
    the record can say which it holds."""
    return terminology.has_reviewed_meaning(token) and len(terminology.abbreviation(token, None)) > 1


def typed_with_several_meanings(token: str) -> bool:
    """An abbreviation typed in capitals that the inventory gives several long forms ("CEA":
    carcinoembryonic antigen or carotid endarterectomy): read through all of them even when the
    lexicon matched one, so the patient's record can say which it holds."""
    return _CAPITALS.match(token) is not None and len(terminology.abbreviation(token, None)) > 1


def by_the_other_words(forms: list[str], question: str, token: str) -> list[str]:
    """Of several meanings, the ones that share a word with the rest of the question ("OD and OS
    at the eye visit": right eye, not overdose); all of them when none does."""
    if len(forms) < 2:
        return forms
    words = {w for w in re.findall(r"[a-z]{3,}", question.lower()) if w != token.lower() and w not in STOP_WORDS}
    shared = [form for form in forms if words & set(re.findall(r"[a-z]{3,}", form.lower()))]
    return shared or forms

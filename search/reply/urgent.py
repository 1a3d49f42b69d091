"""Emergency detection in a patient's message: a small, documented rule set, negation-aware.

A message that describes an emergency happening now is flagged at the top for the clinician, and
the draft begins with the deployment's urgent instructions (setting `REPLY_URGENT_TEXT`). The rules
are deliberately few and literal; they flag, they never diagnose. A sign is not flagged when the
clause denies it ("no chest pain", "not short of breath") or places it clearly in the past with no
word of now ("had chest pain in 2019"). Thoughts of self-harm are flagged whenever not denied.

| sign | phrases matched (case-insensitive) |
| --- | --- |
| chest pain | chest pain/pressure/tightness/hurts, pain in (my/his/her) chest, having a heart attack |
| breathing | can't/cannot/couldn't breathe, trouble/difficulty breathing, short(ness) of breath, gasping, choking |
| stroke | face drooping, slurred speech, can't move/feel (one side, arm, leg), sudden weakness/numbness, having a stroke |
| bleeding | bleeding (that) won't stop, heavy bleeding, vomiting/coughing (up) blood, blood in vomit |
| consciousness | passed out, fainted, unconscious, unresponsive, won't wake up, having a seizure |
| allergy | throat (is) closing/swelling, tongue/lips swelling, anaphylaxis |
| self-harm | suicide, suicidal, kill myself, end my life, want to die, hurt myself, overdose |
"""
from __future__ import annotations

import re
from dataclasses import dataclass

SIGNS = {
    "chest pain": r"chest (?:pain|pressure|tightness|hurts?|is hurting)|pains? in (?:my|his|her|the) chest|(?:having|is having|am having) a heart attack",
    "breathing": r"(?:can'?t|cannot|can not|couldn'?t|unable to) (?:catch (?:my|his|her) )?breath(?:e|ing)?|"
                 r"(?:trouble|difficulty|hard time|struggling) breathing|short(?:ness)? of breath|gasping|choking",
    "stroke": r"face (?:is )?droop\w*|slurred speech|slurring|(?:can'?t|cannot) (?:move|feel) (?:my|his|her) "
              r"(?:arm|leg|face|left|right)|sudden (?:weakness|numbness)|(?:having|is having|am having) a stroke",
    "bleeding": r"bleeding (?:that )?(?:won'?t|will not|doesn'?t|does not) stop|heavy bleeding|bleeding heavily|"
                r"(?:vomiting|throwing up|coughing(?: up)?) blood|blood in (?:my|his|her) vomit",
    "consciousness": r"passed out|fainted|unconscious|unresponsive|won'?t wake up|(?:having|is having) a seizure|seizing",
    "allergy": r"throat (?:is )?(?:closing|swelling|swollen)|(?:tongue|lips?) (?:is |are )?swell\w*|anaphyla\w*",
    "self-harm": r"suicid\w*|kill (?:my|him|her)sel(?:f|ves)|end (?:my|his|her) life|want(?:s)? to die|"
                 r"hurt (?:my|him|her)self|overdos\w*",
}
DENIAL = re.compile(r"\b(?:no|not|never|denies|denied|without|don'?t|doesn'?t|didn'?t|isn'?t|wasn'?t|haven'?t|hasn'?t|"
                    r"no longer|nor|free of)\b[^.;,!?]*$", re.I)
PAST = re.compile(r"\b(?:ago|last (?:year|month|week|summer|winter|spring|fall)|in (?:19|20)\d\d|years? back|used to|"
                  r"back in|history of|years ago|when (?:he|she|i) was)\b", re.I)
NOW = re.compile(r"\b(?:now|right now|currently|today|tonight|this (?:morning|afternoon|evening)|since|still|keeps?|"
                 r"is having|am having|are having|started|getting worse)\b", re.I)
CLAUSE = re.compile(r"[.;!?\n]|\bbut\b", re.I)


@dataclass(frozen=True)
class UrgentSign:
    sign: str
    phrase: str


def urgent_signs(message: str) -> list[UrgentSign]:
    """The emergency signs the message describes as happening (not denied, not only in the past)."""
    found = []
    for sign, pattern in SIGNS.items():
        for m in re.finditer(rf"\b(?:{pattern})", message, re.I):
            clause_start = max((c.end() for c in CLAUSE.finditer(message, 0, m.start())), default=0)
            before = message[clause_start:m.start()]
            if DENIAL.search(before):
                continue
            sentence = _sentence_around(message, m.start(), m.end())
            if sign != "self-harm" and PAST.search(sentence) and not NOW.search(sentence):
                continue
            found.append(UrgentSign(sign, m.group(0)))
            break
    return found


def _sentence_around(text: str, start: int, end: int) -> str:
    left = max((c.end() for c in re.finditer(r"[.!?\n]", text[:start])), default=0)
    right = re.search(r"[.!?\n]", text[end:])
    return text[left:end + (right.start() if right else len(text) - end)]

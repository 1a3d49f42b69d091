"""The shipped synonym, abbreviation and drug-class table, and the text normalisation built on it.

Clinicians type "HTN", "K+", "water pill" and "Fosamax"; the record says "Essential hypertension
(disorder)", "Potassium [Moles/volume] in Blood", "Hydrochlorothiazide 25 MG Oral Tablet" and
"Alendronic acid 10 MG Oral Tablet". Both sides are mapped to the same canonical terms, so the
lexical index matches them (on every backend) and the answer layer can check support.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).parent / "data" / "lexicon.tsv"

STOP_WORDS = frozenset("""
a about above after again all also am an and any anything are as at be been before being below between both
but by can could did do does doing done down during each ever few for from further get gets got had has have
having he her here hers herself him himself his how i if in into is it its itself just last latest like me
mg more most much my myself no nor not now of off on once only or other our ours out over own patient patients
pt please recent recently same she should show so some such tell than that the their them then there these they
this those through to too under until up very was we were what whats when where which while who whom why will
with would you your yours yes ok okay any anything did does current currently value values level levels result
results most recent time times date dates give given get got see seen check checked record records chart history
hx ever still know known taking take takes has had any on did visit note
""".split())

_WORD = re.compile(r"[a-z0-9]+(?:[+'-][a-z0-9]+)*\+?")


@dataclass
class Entry:
    canonical: str
    semantic_type: str
    surfaces: list[str]
    question_only: bool = False
    case_sensitive: bool = False
    drug_class: str = ""


@dataclass
class Match:
    canonical: str
    semantic_type: str
    surface: str
    start: int
    end: int
    drug_class: str = ""


@dataclass
class Lexicon:
    entries: list[Entry] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path = TABLE) -> "Lexicon":
        entries = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.split("\t")
            canonical, semantic_type, surfaces = cols[0], cols[1], cols[2]
            flags = cols[3].split() if len(cols) > 3 else []
            flagset = set("".join(f for f in flags if not f.startswith("class:")))
            drug_class = next((f.split(":", 1)[1] for f in flags if f.startswith("class:")), "")
            entries.append(Entry(canonical, semantic_type, [s.strip() for s in surfaces.split("|") if s.strip()],
                                 question_only="q" in flagset, case_sensitive="C" in flagset,
                                 drug_class=drug_class))
        return cls(entries)

    @property
    def _patterns(self):
        return _compile(tuple((e.canonical, e.semantic_type, tuple(e.surfaces), e.question_only,
                               e.case_sensitive, e.drug_class) for e in self.entries))

    def find(self, text: str, in_question: bool) -> list[Match]:
        """Every table entry mentioned in `text` (longest surface form first)."""
        found = []
        for pattern, entry in self._patterns:
            if entry[3] and not in_question:
                continue
            for m in pattern.finditer(text):
                found.append(Match(entry[0], entry[1], m.group(0), m.start(), m.end(), entry[5]))
        return found

    def expansion_terms(self, text: str, in_question: bool) -> list[str]:
        """Canonical names (and drug classes) for what `text` mentions, to add to its lexical form."""
        terms = []
        for m in self.find(text, in_question):
            terms.append(m.canonical)
            if m.drug_class:
                terms.append(m.drug_class)
        return sorted(set(terms))


@lru_cache(maxsize=8)
def _compile(entries: tuple) -> list:
    compiled = []
    for entry in entries:
        surfaces = sorted(entry[2], key=len, reverse=True)
        alternation = "|".join(re.escape(s) for s in surfaces)
        flags = 0 if entry[4] else re.IGNORECASE
        # "k+" ends in a non-word character, so the right boundary is "not followed by a word character".
        compiled.append((re.compile(rf"(?<![\w+])(?:{alternation})(?!\w)", flags), entry))
    return compiled


@lru_cache(maxsize=1)
def default_lexicon() -> Lexicon:
    return Lexicon.load()


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def content_tokens(text: str) -> list[str]:
    return [t for t in tokens(text) if t not in STOP_WORDS and len(t) > 1 or t in ("k+",)]


def lexical_text(text: str, lexicon: Lexicon | None = None) -> str:
    """What the BM25 index stores for a chunk: its words plus canonical names and drug classes."""
    lexicon = lexicon or default_lexicon()
    extra = lexicon.expansion_terms(text, in_question=False)
    return text + (" || " + " ; ".join(extra) if extra else "")

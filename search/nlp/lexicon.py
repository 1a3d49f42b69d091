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
what's whats how's hows where's who's whos she's he's it's that's there's isn't wasn't doesn't didn't hasn't
""".split())

_WORD = re.compile(r"[a-z0-9]+(?:[+'-][a-z0-9]+)*\+?")


@dataclass
class Entry:
    canonical: str
    semantic_type: str
    surfaces: list[str]                       # synonyms of the canonical name
    question_only: bool = False
    case_sensitive: bool = False
    members: dict[str, list[str]] = field(default_factory=dict)   # member name → its other names (brands)


@dataclass
class Lexicon:
    entries: list[Entry] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path = TABLE) -> "Lexicon":
        entries = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.split("\t") + ["", ""]
            canonical, semantic_type, surfaces, flags, members = cols[:5]
            if not canonical or not semantic_type:
                raise ValueError(f"{path.name}:{lineno}: needs a canonical name and a semantic type")
            parsed_members = {}
            for item in filter(None, members.split("|")):
                name, _, others = item.partition("=")
                parsed_members[name.strip()] = [o.strip() for o in others.split("/") if o.strip()]
            entries.append(Entry(canonical, semantic_type, [s.strip() for s in surfaces.split("|") if s.strip()],
                                 question_only="q" in flags, case_sensitive="C" in flags, members=parsed_members))
        return cls(entries)


def lexicon_key(canonical: str) -> str:
    """The concept key of a lexicon entry's canonical name."""
    return f"lex:{canonical}"


@lru_cache(maxsize=1)
def default_lexicon() -> Lexicon:
    """The shipped lexicon: the hand-reviewed table, merged with the entries built from the
    maintained terminologies (drug classes with their ingredients and brands, lab analytes,
    vaccine groups)."""
    return merged(Lexicon.load().entries + terminology_entries())


def merged(entries: list[Entry]) -> Lexicon:
    """One entry per (canonical name, flags): entries naming the same thing pool their surfaces
    and members, so a name is one concept whichever table it came from."""
    by_name: dict[tuple, Entry] = {}
    for entry in entries:
        key = (entry.canonical, entry.semantic_type, entry.question_only, entry.case_sensitive)
        held = by_name.get(key)
        if held is None:
            by_name[key] = Entry(entry.canonical, entry.semantic_type, list(entry.surfaces), entry.question_only,
                                 entry.case_sensitive, {m: list(o) for m, o in entry.members.items()})
            continue
        held.surfaces += [s for s in entry.surfaces if s not in held.surfaces]
        for member, others in entry.members.items():
            known = held.members.setdefault(member, [])
            known += [o for o in others if o not in known]
    return Lexicon(list(by_name.values()))


# Words shorter than this are matched only in questions ("cr", "k", "bun" would misfire in notes).
SHORT_SURFACE = 4


def terminology_entries() -> list[Entry]:
    """Lexicon entries from search/nlp/terminology.py: each clinical drug class with its member
    ingredients and their other names (brands, synonyms; ordinary English words left out), every
    other ingredient that has other names, each lab analyte with the names clinicians use, and each
    vaccine group with its shorthand and trade names (matched in questions only: in a record the
    vaccine's CVX code says which group it is)."""
    from search.nlp import terminology as t

    entries, classed = [], set()
    for cls in t.clinical_classes():
        members = {ingredient: other_names(ingredient) for ingredient in sorted(cls.members)}
        classed |= set(members)
        entries.append(Entry(cls.name, "medication", [cls.name, *cls.words], members=members))
    for ingredient in sorted(t.all_ingredients() - classed):
        names = other_names(ingredient)
        if names:
            entries.append(Entry(ingredient, "medication", [ingredient, *names]))
    for analyte, names in t.lab_analytes().items():
        long = [n for n in names if len(n) >= SHORT_SURFACE]
        # Two letters ("ca", "pt", "k") are read as abbreviations, in context (abbreviations.py).
        short = [n for n in names if 3 <= len(n) < SHORT_SURFACE]
        entries += [Entry(analyte, "lab", [analyte, *long])] + ([Entry(analyte, "lab", short, question_only=True)] if short else [])
    by_group: dict[str, list[str]] = {}
    for word, groups in t.vaccine_words().items():
        for group in groups:
            by_group.setdefault(group, []).append(word)
    entries += [Entry(vaccine_concept(group), "immunization", sorted(words), question_only=True)
                for group, words in sorted(by_group.items())]
    return entries


def other_names(ingredient: str) -> list[str]:
    """An ingredient's other names (brands, synonyms) that are not ordinary English words."""
    from search.nlp import terminology as t

    return sorted(n for n in t.drug_names(ingredient) - {ingredient} if not t.is_common_word(n) and len(n) >= 3)


def vaccine_concept(group: str) -> str:
    """The concept a CDC vaccine group is known by ("ZOSTER" -> "zoster vaccine")."""
    return f"{group.lower()} vaccine"


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def content_tokens(text: str) -> list[str]:
    return [t for t in tokens(text) if t not in STOP_WORDS and len(t) > 1 or t in ("k+",)]


def clean_text(text: str) -> str:
    """Text as it can be stored and searched: lone surrogates (which no encoder accepts) replaced."""
    return text.encode("utf-8", errors="replace").decode("utf-8")

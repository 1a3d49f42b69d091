"""Misspelt clinical words in a question, corrected against the clinical vocabulary before the
question is read ("retinopahty" -> retinopathy, "fossamax" -> fosamax), bounded so that it never
turns one real word or one drug into another. Every correction is returned, so the diagnostics can
show it.

The vocabulary is the terminology's (drug names and brands, class, vaccine and lab words,
abbreviation long forms) and the shipped lexicon's.
"""
from __future__ import annotations

import re
from functools import lru_cache

from search.nlp import terminology as t
from search.nlp.lexicon import default_lexicon

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


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """Every surface form the tables and the shipped lexicon know (drug names, brands, class words,
    vaccine words and trade names, lab names and groups, abbreviation long forms, the lexicon's
    problems, symptoms and procedures) and the words of four letters or more inside them
    ("retinopathy" from "diabetic retinopathy"), lower case, sorted."""
    forms: set[str] = set(t._drugs().names)
    for cls in t.clinical_classes():
        forms.update(t.norm(w) for w in (cls.name, *cls.words))
    forms.update(t._vaccines().words)
    forms.update(t.norm(s) for s in t._vaccines().short.values())
    labs = t._labs()
    forms.update(labs.names)
    forms.update(labs.group_words)
    ab = t._abbreviations()
    for long_forms in (*ab.source.values(), *ab.overrides.values()):
        forms.update(t.norm(f) for f in long_forms)
    for entry in default_lexicon().entries:
        forms.update(t.norm(s) for s in (entry.canonical, *entry.surfaces))
        for member, others in entry.members.items():
            forms.update(t.norm(s) for s in (member, *others))
    for form in list(forms):
        if " " in form:
            forms.update(w for w in t._TOKEN.findall(form) if len(w) >= 4)
    return tuple(sorted(f for f in forms if f))


@lru_cache(maxsize=1)
def _spelling() -> tuple[frozenset[str], tuple[str, ...], frozenset[str]]:
    """(known words, correction targets, drug words)."""
    known: set[str] = set()
    for form in vocabulary():
        known.add(form)
        known.update(t._TOKEN.findall(form))
    known.update(a.lower() for a in t._abbreviations().source)
    drug_words = frozenset(w for name in t._drugs().names for w in {name, *t._TOKEN.findall(name)})
    targets = tuple(sorted(w for w in known if len(w) >= 4 and " " not in w and t._TOKEN.fullmatch(w)))
    return frozenset(known), targets, drug_words


def is_known(word: str) -> bool:
    """Whether a word or phrase is in the vocabulary (or is a common English word)."""
    known = _spelling()[0]
    return any(form in known for form in t._variants(word)) or t.is_common_word(word)


def correct(word: str) -> tuple[str, float] | None:
    """The vocabulary word a misspelt word was meant to be, with a similarity in (0, 1]:
    "retinopahty" -> ("retinopathy", 0.91), "labetolol" -> labetalol, "fossamax" -> fosamax.

    Bounded so that it never turns one drug, or any real word, into another: only words of five
    letters or more that are neither in the vocabulary (drug names, brands, abbreviations, class
    and lab words...) nor common English words; at most one edit under eight letters and two from
    eight (a swap of neighbouring letters is one edit); the first letter kept; and no answer when
    two different words are equally close. None when nothing is corrected; the caller shows the
    correction it makes in its diagnostics."""
    from rapidfuzz import process
    from rapidfuzz.distance import OSA

    w = t.norm(word)
    if len(w) < 5 or not t._TOKEN.fullmatch(w) or is_known(w):
        return None
    known, targets, drug_words = _spelling()
    limit = 1 if len(w) < 8 else 2
    hits = process.extract(w, targets, scorer=OSA.distance, score_cutoff=limit, limit=None)
    hits = [(form, d) for form, d, _ in hits if form[0] == w[0] and abs(len(form) - len(w)) <= limit]
    if not hits:
        return None
    best = min(d for _, d in hits)
    closest = sorted({form for form, d in hits if d == best})
    if len(closest) != 1:
        closest = resolve_tie(w, closest)
        if closest is None:
            return None
    target = closest[0]
    # the typed word may itself be a drug the tables lack: never trade it for a neighbour of the
    # same letters that is also a drug unless it is a single edit away
    if target in drug_words and best > 1 and len(w) < 10:
        return None
    return target, round(1 - best / max(len(w), len(target)), 2)


def resolve_tie(typed: str, closest: list[str]) -> list[str] | None:
    """Equally close words that are one: the same drug (a brand and its ingredient), or endings
    of one stem ("diabetis": diabetes, diabetic), where the word keeping the typed ending wins (a
    slip is rarely in the ending). None for a real tie, which is left uncorrected."""
    if len({t.ingredients_of(form) or form for form in closest}) == 1:
        return closest
    if len({_stemmer().stemWord(form) for form in closest}) == 1:
        return [max(closest, key=lambda form: (_common_ending(form, typed), form))]
    return None


def _common_ending(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


@lru_cache(maxsize=1)
def _stemmer():
    import snowballstemmer      # the stemmer the index uses (search/nlp/vocabulary.py)

    return snowballstemmer.stemmer("porter")

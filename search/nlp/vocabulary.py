"""Clinical words known without reading any patient's record.

A clinical word of a question that this patient's record never uses ("transplant" for a patient
who never had one, "breast" in breast cancer for a patient with prostate cancer) means the record
cannot answer it. Which words count as clinical used to be read from every record of the tenant:
"does he have african?" then showed `absent: african` in one patient's answer because the word
occurs in another patient's record, and nothing at all when no record had it — an oracle across
patients. Nothing a clinician sees may depend on another patient's record, so "clinical" comes
from sources that hold no patient:
- a word on its own counts when it belongs to the shipped lexicon's canonical clinical names;
- a word qualifying a concept the question names ("breast" cancer, "liver" transplant) counts
  from the lexicon's synonyms and class members as well. On its own such a word is too often an
  everyday one ("pill" of "water pill"), and questions worded with it were refused as not in the
  record. (The abbreviation inventory's long forms were measured as qualifiers too: "first" of
  "first prenatal visit" and "meningitis" of a meningococcal vaccine refused answerable questions.)
"""
from __future__ import annotations

from functools import lru_cache

from search.nlp.lexicon import default_lexicon, tokens

SHORTEST_WORD = 4       # shorter ones are mostly function words and units ("and", "per", "mg")


@lru_cache(maxsize=1)
def clinical_words() -> frozenset[str]:
    """Words of the lexicon's canonical clinical names ("liver" of liver function tests)."""
    return _words(entry.canonical for entry in default_lexicon().entries)


@lru_cache(maxsize=1)
def qualifier_words() -> frozenset[str]:
    """Words that, right before a named concept, say which one is meant ("breast", "kidney")."""
    names = []
    for entry in default_lexicon().entries:
        # A class's members are ingredients, and their other names brands: a brand's words
        # ("ortho" of Ortho Tri-Cyclen) qualify nothing.
        names += [*entry.surfaces, *entry.members]
    return clinical_words() | _words(names)


def is_clinical_word(word: str, qualifier: bool = False) -> bool:
    """In the vocabulary as written or as the singular of a plural ("transplants")."""
    words = qualifier_words() if qualifier else clinical_words()
    return word in words or (word.endswith("s") and word[:-1] in words)


def _words(names) -> frozenset[str]:
    return frozenset(t for name in names for t in tokens(name) if len(t) >= SHORTEST_WORD)

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

import re
from functools import lru_cache

from search.nlp.lexicon import default_lexicon, tokens
from search.nlp.terminology import is_common_word, long_form_words

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


# --- the words a question asks about -----------------------------------------------------------

# Words that say how a question is put or what about the thing is wanted, never which thing: an
# answer's attributes ("dose", "date", "score"), comparison and counting ("same", "different",
# "both"), time relations ("prior", "post-op") and charting ("flagged", "on file"). A word of these
# that the record never uses says nothing about whether the record holds the answer.
PHRASING = frozenset("""
dose doses dosage dosing strength value values score scores result results date dates grade grades level levels
regimen regimens session sessions instruction instructions content contents series reason reasons reading readings
time times number numbers amount amounts frequency duration name names status detail details info information
same different both either neither other others another each every total overall average much many more less
prior previous past recent first initial last latest final next current currently today yesterday ago
post-op postop pre-op preop peri-op periop post pre long short early late earlier later soon far anything anywhere
flagged noted charted documented recorded mentioned listed logged entered written file chart record records note
notes list lists way back up down home high low okay fine normal abnormal correct right true wrong yes
hx h/o dx dx'd rx tx dz f/u fu dc d/c inpt outpt pt pts
""".split())
VERB_FORM = re.compile(r"^[a-z]{3,}(?:ed|ing)$")


def is_phrasing(word: str) -> bool:
    """A word of how the question is put ("dose", "first", "reassessed", "flagged")."""
    return word in PHRASING or (word.endswith("s") and word[:-1] in PHRASING) \
        or (VERB_FORM.match(word) is not None and word not in clinical_words())


def clinical_not_lay(word: str) -> bool:
    """A word clinical sources write out (the abbreviation inventory's long forms: "pathology",
    "amputation") and no name of the lexicon uses: the lexicon holds the lay names ("water
    pill", "birth control pill"), and a lay word the record does not use may still be answered
    by the record's clinical name."""
    forms = {word, word[:-1] if word.endswith("s") else word}
    return bool(forms & long_form_words()) and not forms & qualifier_words()


def names_a_clinical_thing(word: str, abbreviation: bool = False) -> bool:
    """A word that can only be about a clinical thing: a clinical abbreviation ("dnr", "ahi"), or
    a word no ordinary English uses ("monofilament", "hypopnea"). Everyday words ("pill", "baby")
    and the question's phrasing are never required of the record: when they are the question's
    point, its concepts or its meaning carry it."""
    if is_phrasing(word) or not re.fullmatch(r"[a-z][a-z/-]*[a-z0-9]", word):
        return False
    if abbreviation:
        return True
    singular = word[:-1] if word.endswith("s") else word
    return len(word) >= SHORTEST_WORD and not is_common_word(word) and not is_common_word(singular)


def presence_prefix(word: str) -> str:
    """What of a word to look for in the record so that its other endings count ("anaphylactic"
    finds "anaphylaxis", "imaging" "image", "detox" "detoxification"): at most its first six
    letters and no more than its Porter stem, cut until the stemmer leaves it as it is (the index
    holds stems, and a prefix query is stemmed too)."""
    stem = _porter().stemWord(word)
    prefix = min(word[:6], stem, key=len)
    while len(prefix) > 3 and _porter().stemWord(prefix) != prefix:
        prefix = prefix[:-1]
    return prefix


@lru_cache(maxsize=1)
def _porter():
    import snowballstemmer      # the stemmer SQLite FTS5's porter tokenizer and the index use
    return snowballstemmer.stemmer("porter")

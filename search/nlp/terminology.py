"""Clinical terminology from maintained sources, for reading clinicians' questions and records.

Drugs (RxNorm ingredients with RXCUIs, brand names, FDA pharmacologic classes), the drug classes
clinicians name ("blood thinner", "beta-lactam") with allergy cross-reactivity, CDC vaccines (CVX
codes and groups), common labs (LOINC codes, clinician names, groups), clinical abbreviations, and
the common English words (spelling correction against all of these is search/nlp/spelling.py).

The tables live in search/nlp/data/terminology/: built ones come from public sources through
scripts/build_terminology.py, hand-reviewed ones say so in their header; SOURCES.md gives source,
version and licence of each. Everything is loaded once on first use and never changed, so every
function here is a pure lookup. Words are compared in lower case with runs of spaces folded;
class, vaccine and lab words also match in the plural and with hyphens or spaces ("beta-lactams",
"beta lactam").

    >>> sorted(ingredients_of("Norco"))
    ['acetaminophen', 'hydrocodone']
    >>> sorted(ingredients_in("Acetaminophen 325 MG / Oxycodone Hydrochloride 10 MG Oral Tablet [Percocet]"))
    ['acetaminophen', 'oxycodone']
    >>> clinical_class("blood thinners"), "warfarin" in members_of("anticoagulant")
    ('anticoagulant', True)
    >>> sorted(vaccine_groups("shingles shot"))
    ['ZOSTER']
"""
from __future__ import annotations

import gzip
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).parent / "data" / "terminology"

# Abbreviation contexts understood by abbreviation().
CONTEXTS = ("lab", "drug", "problem", "procedure", "encounter", "vaccine")


# ---------------------------------------------------------------------------------------------
# Reading the tables
# ---------------------------------------------------------------------------------------------

def _rows(name: str) -> list[dict[str, str]]:
    """Rows of a table in DATA: '#' lines are comments, the first other line names the columns."""
    path = DATA / name
    text = gzip.decompress(path.read_bytes()).decode("utf-8") if name.endswith(".gz") else path.read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    columns = lines[0].split("\t")
    return [dict(zip(columns, (c.strip() for c in ln.split("\t")))) for ln in lines[1:]]


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split("|") if v.strip()]


_EDGE = re.compile(r"^[\s\"'`.,;:!?]+|[\s\"'`.,;:!?]+$")


_CLOSE = {"(": ")", "[": "]", "{": "}"}
_OPEN = {v: k for k, v in _CLOSE.items()}


def norm(text: str) -> str:
    """A word or phrase as the tables hold it: lower case, no trademark signs or edge punctuation,
    single spaces ("Eliquis®" -> "eliquis", " Blood  Thinners? " -> "blood thinners")."""
    text = unicodedata.normalize("NFKC", text).replace("\u00ae", "").replace("\u2122", "")
    text = text.replace("\u2019", "'").replace("\u2010", "-").replace("\u2011", "-").replace("\u2013", "-")
    text = _EDGE.sub("", text)
    # brackets around the whole text go ("(Eliquis)", "(Eliquis"); "protamine sulfate (USP)" keeps its own
    while text and text[0] in "([{" and (text.count(text[0]) > text.count(_CLOSE[text[0]])
                                  or (text[-1:] == _CLOSE[text[0]] and not re.search(r"[()\[\]{}]", text[1:-1]))):
        text = _EDGE.sub("", text[1:-1] if text[-1:] == _CLOSE[text[0]] else text[1:])
    while text and text[-1] in ")]}" and text.count(text[-1]) > text.count(_OPEN[text[-1]]):
        text = _EDGE.sub("", text[:-1])
    return re.sub(r"\s+", " ", text).lower()


def _singulars(word: str) -> list[str]:
    """Singular forms a plural might have ("therapies", "boxes", "statins", "SSRIs"); only ever
    looked up in the tables, so a wrong guess ("sinusiti") finds nothing."""
    forms = []
    if len(word) > 4 and word.endswith("ies"):
        forms.append(word[:-3] + "y")
    if len(word) > 4 and re.search(r"(ss|x|ch|sh)es$", word):
        forms.append(word[:-2])
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        forms.append(word[:-1])
    return forms


def _variants(text: str, plural: bool = True) -> list[str]:
    """Spellings to try for a word or phrase: as given, with hyphens as spaces or without them,
    spaces as hyphens, and (plural=True) the last word in the singular."""
    base = norm(text)
    forms = [base, base.replace("-", " "), base.replace(" ", "-"), base.replace("-", "")]
    if plural:
        for f in list(forms):
            head, _, last = f.rpartition(" ")
            forms.extend(f"{head} {one}" if head else one for one in _singulars(last))
    return list(dict.fromkeys(f for f in forms if f))


# ---------------------------------------------------------------------------------------------
# Drugs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Drugs:
    rxcui: dict[str, str]                       # ingredient -> RXCUI ("" if unknown)
    names: dict[str, frozenset[str]]            # any drug word -> the ingredients it means
    brands: frozenset[str]
    epc: dict[str, frozenset[str]]              # ingredient -> FDA EPC names


@lru_cache(maxsize=1)
def _drugs() -> _Drugs:
    rxcui, names, brands = {}, {}, set()
    for r in _rows("drug_ingredients.tsv"):
        rxcui[r["ingredient"]] = r["rxcui"]
        names[r["ingredient"]] = frozenset([r["ingredient"]])
    for r in _rows("drug_ingredients.tsv"):
        for syn in _split(r["synonyms"]):
            names.setdefault(syn, frozenset([r["ingredient"]]))
    for r in _rows("drug_words.tsv"):
        names[norm(r["word"])] = frozenset(_split(r["ingredients"]))
    for r in _rows("drug_brands.tsv"):
        brands.add(r["brand"])
        names.setdefault(r["brand"], frozenset(_split(r["ingredients"])))   # never over a generic name
    epc = {r["ingredient"]: frozenset(_split(r["epc"])) for r in _rows("drug_classes.tsv")}
    return _Drugs(rxcui, names, frozenset(brands), epc)


def _drug_lookup(word: str) -> frozenset[str]:
    names = _drugs().names
    for form in _variants(word, plural=False):
        if form in names:
            return names[form]
    return frozenset()


def ingredients_of(word: str) -> frozenset[str]:
    """The RxNorm ingredients a drug word means: an ingredient, an international or official
    synonym ("paracetamol", "alendronic acid"), clinician shorthand ("hctz") or a brand name, a
    combination brand giving each of its ingredients ("Percocet" -> acetaminophen, oxycodone).
    Salt forms are reduced to the ingredient ("warfarin sodium" -> warfarin). Empty if unknown."""
    found = _drug_lookup(word)
    if found:
        return found
    bare = re.sub(r"\s*\((usp|nf|as [^)]*)\)", "", norm(word))     # "protamine sulfate (USP)"
    if bare != norm(word):
        return ingredients_of(bare)
    # "atorvastatin calcium", "hydrocodone bitartrate": the ingredient followed by salt words
    words = bare.split()
    for k in range(len(words) - 1, 0, -1):
        found = _drug_lookup(" ".join(words[:k]))
        if found and len(found) == 1 and all(_is_salt_word(w) for w in words[k:]):
            return found
    return frozenset()


# Salt words after an ingredient name that RxNorm's precise ingredients (synonyms in
# drug_ingredients.tsv) do not cover, chiefly for ingredients beginning with "a" (see SOURCES.md).
_SALT = frozenset("""hydrochloride hcl hydrobromide sodium potassium calcium magnesium besylate mesylate maleate
tartrate bitartrate succinate fumarate citrate acetate phosphate sulfate hyclate monohydrate dihydrate
trihydrate hydrate anhydrous propionate dipropionate valerate medoxomil etexilate furoate acetonide""".split())


def _is_salt_word(word: str) -> bool:
    return word in _SALT


def all_ingredients() -> frozenset[str]:
    """Every ingredient the drug tables know."""
    return frozenset(_drugs().rxcui)


def ingredient_of(word: str) -> str | None:
    """The one canonical RxNorm ingredient a drug word means ("Eliquis" -> "apixaban",
    "alendronic acid" and "Fosamax" -> "alendronate"); None if unknown or a combination."""
    found = ingredients_of(word)
    return next(iter(found)) if len(found) == 1 else None


def is_brand(word: str) -> bool:
    """Whether the word is a drug brand name (RxNorm or FDA)."""
    return any(form in _drugs().brands for form in _variants(word, plural=False))


def rxcui(ingredient: str) -> str | None:
    """The RxNorm RXCUI of an ingredient (or of what a drug word means, if one ingredient)."""
    ing = ingredient_of(ingredient)
    return (_drugs().rxcui.get(ing) or None) if ing else None


# What may stand before the ingredient in an RxNorm clinical drug name: a pack, a duration or
# volume ("24 HR", "0.3 ML", "120 ACTUAT"), an application number, "Abuse-Deterrent".
_DRUG_NAME_PREFIX = re.compile(r"^(\{[^}]*\}|\d[\d.,]*\s+(hr|ml|actuat|day|mg|unt)|nda\d+|bla\d+|abuse-deterrent)\s+")


def ingredients_in(drug_name: str) -> frozenset[str]:
    """The ingredients a medication's name holds, written as RxNorm and the records write it:
    "Acetaminophen 325 MG / Oxycodone Hydrochloride 10 MG Oral Tablet [Percocet]" -> acetaminophen,
    oxycodone; "24 HR metoprolol succinate 100 MG Extended Release Oral Tablet" -> metoprolol;
    "Sulfamethoxazole / Trimethoprim"; "Tylenol PM Pill". Each part is read up to its strength, and
    the longest run of its leading words that names a drug counts; a bracketed brand adds its own."""
    text = norm(drug_name)
    brand = re.search(r"\[([^\]]+)\]$", text)
    if brand:
        text = text[:brand.start()].strip()
    found: set[str] = set()
    for part in text.split(" / "):
        while _DRUG_NAME_PREFIX.match(part):
            part = _DRUG_NAME_PREFIX.sub("", part, count=1)
        words = re.sub(r"\s+\d.*$", "", part).split()
        for k in range(len(words), 0, -1):
            ings = ingredients_of(" ".join(words[:k]))
            if ings:
                found |= ings
                break
    if brand:
        found |= ingredients_of(brand.group(1))
    return frozenset(found)


@lru_cache(maxsize=4096)
def drug_names(ingredient: str) -> frozenset[str]:
    """Every word the tables know for an ingredient: its name, synonyms, shorthand and the brands
    that contain it (for finding it in a record's text)."""
    ing = ingredient_of(ingredient) or norm(ingredient)
    return _names_by_ingredient().get(ing, frozenset())


@lru_cache(maxsize=1)
def _names_by_ingredient() -> dict[str, frozenset[str]]:
    """The drug words turned round: each ingredient to every word that means it. Built once: the
    lexicon asks for the names of every ingredient, and scanning all words for each took 2 s of
    every process's start."""
    by_ingredient: dict[str, set[str]] = {}
    for name, ings in _drugs().names.items():
        for ing in ings:
            by_ingredient.setdefault(ing, set()).add(name)
    return {ing: frozenset(names) for ing, names in by_ingredient.items()}


# ---------------------------------------------------------------------------------------------
# Drug classes and cross-reactivity
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DrugClass:
    name: str
    words: tuple[str, ...]
    members: frozenset[str]
    allergy_group: bool
    note: str


@dataclass(frozen=True)
class CrossReaction:
    """An allergy to consider: a class or ingredient, how likely it cross-reacts, and the source."""
    other: str
    risk: str
    note: str


@dataclass(frozen=True)
class _Classes:
    by_name: dict[str, DrugClass]
    words: dict[str, str]                           # word -> class name
    of_ingredient: dict[str, frozenset[str]]        # ingredient -> clinical classes
    cross: dict[str, tuple[CrossReaction, ...]]     # class or ingredient -> cross-reactions


@lru_cache(maxsize=1)
def _classes() -> _Classes:
    rows = {r["class"]: r for r in _rows("clinical_classes.tsv")}
    by_epc: dict[str, set[str]] = {}
    for ing, epcs in _drugs().epc.items():
        for e in epcs:
            by_epc.setdefault(e, set()).add(ing)
    resolved: dict[str, frozenset[str]] = {}

    def resolve(name: str, seen: tuple[str, ...] = ()) -> frozenset[str]:
        if name in resolved:
            return resolved[name]
        if name in seen or name not in rows:
            raise ValueError(f"clinical_classes.tsv: class {name!r} is unknown or defined in a cycle")
        members: set[str] = set()
        for item in _split(rows[name]["members"]):
            if item.startswith("EPC:"):
                members |= by_epc.get(item[4:], set())
            elif item.startswith("class:"):
                members |= resolve(item[6:], seen + (name,))
            else:
                members.add(item)
        resolved[name] = frozenset(members - set(_split(rows[name]["exclude"])))
        return resolved[name]

    by_name, words, of_ingredient = {}, {}, {}
    for name, r in rows.items():
        cls = DrugClass(name, tuple(_split(r["words"])), resolve(name), r["allergy"] == "yes", r["note"])
        by_name[name] = cls
        for w in (name, *cls.words):
            words.setdefault(norm(w), name)
        for ing in cls.members:
            of_ingredient.setdefault(ing, set()).add(name)
    cross: dict[str, list[CrossReaction]] = {}
    for r in _rows("cross_reactivity.tsv"):
        cross.setdefault(r["a"], []).append(CrossReaction(r["b"], r["risk"], r["note"]))
        cross.setdefault(r["b"], []).append(CrossReaction(r["a"], r["risk"], r["note"]))
    return _Classes(by_name, words, {k: frozenset(v) for k, v in of_ingredient.items()},
                    {k: tuple(v) for k, v in cross.items()})


def clinical_class(word: str) -> str | None:
    """The clinical drug class a word names ("blood thinners" -> "anticoagulant", "beta-lactams"
    -> "beta-lactam antibacterial", "water pill" -> "diuretic", "PCN" -> "penicillin"), or None."""
    words = _classes().words
    for form in _variants(word):
        if form in words:
            return words[form]
    return None


def clinical_classes() -> tuple[DrugClass, ...]:
    """Every clinical drug class, with its words, members and note."""
    return tuple(_classes().by_name.values())


def members_of(clinical_class_or_word: str) -> frozenset[str]:
    """The RxNorm ingredients of a clinical class (given by name or by any of its words)."""
    name = clinical_class(clinical_class_or_word)
    return _classes().by_name[name].members if name else frozenset()


@lru_cache(maxsize=1)
def _parents() -> dict[str, frozenset[str]]:
    """Each clinical class and the classes that name it among their members ("class:antiplatelet"
    in antithrombotic)."""
    parents: dict[str, set[str]] = {}
    for r in _rows("clinical_classes.tsv"):
        for item in _split(r["members"]):
            if item.startswith("class:"):
                parents.setdefault(item[6:], set()).add(r["class"])
    return {k: frozenset(v) for k, v in parents.items()}


def neighbouring_classes(clinical_class_or_word: str) -> frozenset[str]:
    """The classes beside a class under the same broader one: antiplatelets beside
    anticoagulants (both antithrombotics), loop beside thiazide diuretics. What a clinician asking
    for one may be shown as what it is, never as the one asked for."""
    name = clinical_class(clinical_class_or_word)
    if not name:
        return frozenset()
    parents = _parents()
    return frozenset(child for child, above in parents.items() if above & parents.get(name, frozenset())) - {name}


def classes_of(drug: str, *, epc: bool = True) -> frozenset[str]:
    """The classes of a drug word (ingredient, synonym or brand; a combination gives the classes
    of each ingredient): the clinical classes it belongs to (lower case, as in clinical_classes())
    and, with epc=True, its FDA Established Pharmacologic Classes (FDA's capitalisation)."""
    found: set[str] = set()
    for ing in ingredients_of(drug) or {norm(drug)}:
        found |= _classes().of_ingredient.get(ing, frozenset())
        if epc:
            found |= _drugs().epc.get(ing, frozenset())
    return frozenset(found)


def epc_of(ingredient: str) -> frozenset[str]:
    """FDA Established Pharmacologic Classes of an ingredient (from the 2019 NDC Directory)."""
    ing = ingredient_of(ingredient)
    return _drugs().epc.get(ing, frozenset()) if ing else frozenset()


def cross_reactions(drug_or_class: str) -> tuple[CrossReaction, ...]:
    """The allergies to consider before giving a drug, or for an allergy recorded to a class:
    every allergy class (allergy = yes in clinical_classes.tsv) that holds the drug ("same class")
    or, for a class, that overlaps it, and the classes and ingredients cross_reactivity.tsv links
    to any of those. An ingredient's own broad classes ("antibiotic") are not allergy classes."""
    classes = _classes()
    name = clinical_class(drug_or_class)
    ingredients = ingredients_of(drug_or_class)
    if name:
        members = classes.by_name[name].members
        own = {c.name for c in classes.by_name.values()
               if c.allergy_group and (c.name == name or c.members & members)}
    else:
        own = {c for ing in ingredients for c in classes.of_ingredient.get(ing, ())
               if classes.by_name[c].allergy_group}
    found: dict[str, CrossReaction] = {c: CrossReaction(c, "same class", classes.by_name[c].note) for c in sorted(own)}
    for key in sorted(own | set(ingredients)):
        for cr in classes.cross.get(key, ()):
            found.setdefault(cr.other, cr)
    return tuple(found.values())


def cross_reactive(drug_or_class: str) -> frozenset[str]:
    """Names of the classes (and single ingredients) whose recorded allergy should be considered
    before giving a drug or a member of a class: "amoxicillin" -> penicillin, beta-lactam
    antibacterial, cephalosporin, carbapenem. See cross_reactions() for the risk and source."""
    return frozenset(cr.other for cr in cross_reactions(drug_or_class))


# ---------------------------------------------------------------------------------------------
# Vaccines
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Vaccines:
    groups_of_code: dict[str, frozenset[str]]
    words: dict[str, frozenset[str]]                # word -> groups
    group_names: dict[str, str]                     # lower-case group -> CDC spelling
    short: dict[str, str]                           # cvx -> short description


@lru_cache(maxsize=1)
def _vaccines() -> _Vaccines:
    groups_of_code, words, short = {}, {}, {}
    trade_first: dict[str, set[frozenset[str]]] = {}
    for r in _rows("cvx.tsv"):
        groups = frozenset(_split(r["vaccine_groups"]))
        groups_of_code[r["cvx"]] = groups
        short[r["cvx"]] = r["short_description"]
        if not groups:
            continue
        for trade in _split(r["trade_names"]):
            t = norm(trade)
            words.setdefault(t, groups)
            trade_first.setdefault(t.split(" ")[0].split(",")[0], set()).add(groups)
    for first, sets in trade_first.items():
        if len(first) >= 4 and len(sets) == 1:
            words.setdefault(first, next(iter(sets)))
    for r in _rows("vaccine_shorthand.tsv"):
        for w in _split(r["words"]):
            words[norm(w)] = frozenset(_split(r["groups"]))
    group_names = {g.lower(): g for gs in groups_of_code.values() for g in gs}
    return _Vaccines(groups_of_code, words, group_names, short)


def vaccine_groups(code_or_words: str) -> frozenset[str]:
    """CDC vaccine groups (as in cvx.tsv: "ZOSTER", "FLU", "TDAP", "PneumoPCV"...) of a CVX code
    ("187", "03") or of words ("shingles", "flu shot", "Prevnar 20", "tetanus" -> TDAP, Td, DTAP)."""
    v = _vaccines()
    text = norm(code_or_words)
    if re.fullmatch(r"\d{1,3}", text):
        return v.groups_of_code.get(text.zfill(2), v.groups_of_code.get(text, frozenset()))
    if text in v.group_names:
        return frozenset([v.group_names[text]])
    for form in _variants(text):
        if form in v.words:
            return v.words[form]
    return frozenset()


def vaccine_words() -> dict[str, frozenset[str]]:
    """Every vaccine word (shorthand, trade names) and the groups it names, for a phrase matcher."""
    return dict(_vaccines().words)


def vaccine_codes(group_or_words: str) -> frozenset[str]:
    """CVX codes (active and inactive) of a vaccine group, or of the groups some words name."""
    v = _vaccines()
    groups = vaccine_groups(group_or_words)
    return frozenset(code for code, gs in v.groups_of_code.items() if gs & groups)


def vaccine_name(cvx: str) -> str | None:
    """CDC's short description of a CVX code."""
    return _vaccines().short.get(norm(cvx).zfill(2)) or _vaccines().short.get(norm(cvx))


# ---------------------------------------------------------------------------------------------
# Labs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Labs:
    names: dict[str, frozenset[str]]                # clinician name -> codes
    first_name: dict[str, str]                      # code -> short display name
    groups_of: dict[str, frozenset[str]]            # code -> groups
    group_words: dict[str, str]                     # word -> group
    group_codes: dict[str, frozenset[str]]          # group -> its panels and member codes
    siblings: dict[str, frozenset[str]]             # code -> mass/molar siblings


@lru_cache(maxsize=1)
def _labs() -> _Labs:
    names: dict[str, set[str]] = {}
    first_name, groups_of = {}, {}
    group_codes: dict[str, set[str]] = {}
    for r in _rows("labs.tsv"):
        lab_names = _split(r["names"])
        first_name[r["loinc"]] = lab_names[0]
        for n in lab_names:
            names.setdefault(norm(n), set()).add(r["loinc"])
        groups_of[r["loinc"]] = frozenset(_split(r["groups"]))
        for g in groups_of[r["loinc"]]:
            group_codes.setdefault(g, set()).add(r["loinc"])
    group_words = {}
    for r in _rows("lab_groups.tsv"):
        group_codes.setdefault(r["group"], set()).update(_split(r["panels"]))
        for w in (r["group"], *_split(r["words"])):
            group_words.setdefault(norm(w), r["group"])
    siblings: dict[str, set[str]] = {}
    for r in _rows("loinc_conversion.tsv"):
        siblings.setdefault(r["from_loinc"], set()).add(r["to_loinc"])
        siblings.setdefault(r["to_loinc"], set()).add(r["from_loinc"])
    return _Labs({k: frozenset(v) for k, v in names.items()}, first_name, groups_of, group_words,
                 {k: frozenset(v) for k, v in group_codes.items()}, {k: frozenset(v) for k, v in siblings.items()})


def conversion_rows() -> list[dict[str, str]]:
    """The mass <-> molar rows (from_loinc, from_unit, to_loinc, to_unit, factor) for search.nlp.units."""
    return _rows("loinc_conversion.tsv")


def lab_codes(word: str) -> frozenset[str]:
    """LOINC codes a lab word means ("creatinine", "cr", "egfr", "a1c", "cd4", "viral load"), with
    their mass/molar siblings (creatinine: 2160-0, 38483-4, 14682-9...). A group word ("bmp",
    "lipid panel", "lfts") gives the group's panel codes and every lab of the group. A LOINC code
    gives itself and its siblings. Empty if unknown."""
    labs = _labs()
    text = norm(word)
    codes: set[str] = set()
    if re.fullmatch(r"\d{1,7}-\d", text):
        codes.add(text)
    else:
        for form in _variants(text):
            if form in labs.names:
                codes |= labs.names[form]
                break
        for form in _variants(text):
            if form in labs.group_words:
                codes |= labs.group_codes.get(labs.group_words[form], frozenset())
                break
    for code in list(codes):
        codes |= labs.siblings.get(code, frozenset())
    return frozenset(codes)


@lru_cache(maxsize=1)
def lab_analytes() -> dict[str, tuple[str, ...]]:
    """Each analyte of labs.tsv and every name clinicians use for it ("creatinine": creatinine, cr,
    creat, scr, serum creatinine, blood creatinine), for a phrase matcher."""
    out: dict[str, list[str]] = {}
    for r in _rows("labs.tsv"):
        names = out.setdefault(r["analyte"].lower(), [])
        names += [n for n in _split(r["names"]) if n not in names]
    return {analyte: tuple(names) for analyte, names in out.items()}


@lru_cache(maxsize=1)
def _analyte_of_code() -> dict[str, str]:
    found = {r["loinc"]: r["analyte"].lower() for r in _rows("labs.tsv")}
    for code, siblings in _labs().siblings.items():
        known = [found[s] for s in sorted(siblings) if s in found]
        if code not in found and known:
            found[code] = known[0]
    return found


def analyte_of(loinc: str) -> str | None:
    """The analyte a LOINC code measures ("2160-0" and its molar sibling "14682-9" -> creatinine)."""
    return _analyte_of_code().get(norm(loinc))


def lab_groups(code: str) -> frozenset[str]:
    """The lab groups of a LOINC code ("2160-0" -> renal function, bmp, cmp); a sibling code
    (14682-9) has the groups of the code it converts to."""
    labs = _labs()
    code = norm(code)
    if code in labs.groups_of:
        return labs.groups_of[code]
    return frozenset(g for s in labs.siblings.get(code, ()) for g in labs.groups_of.get(s, ()))


def lab_group(word: str) -> str | None:
    """The lab group a word names ("lfts" -> "liver function", "chem 7" -> "bmp"), or None."""
    labs = _labs()
    for form in _variants(word):
        if form in labs.group_words:
            return labs.group_words[form]
    return None


def panel_codes(word: str) -> frozenset[str]:
    """The LOINC codes of the panels a group word names ("bmps", "chem 7" -> 51990-0, 24321-2,
    24320-4): a panel counted as one, not as its analytes. Empty if the word names no group."""
    group = lab_group(word)
    if group is None:
        return frozenset()
    return frozenset(code for r in _rows("lab_groups.tsv") if r["group"] == group for code in _split(r["panels"]))


def lab_synonyms(word: str) -> frozenset[str]:
    """The names that mean the same test as a name holding this word, and that test only:
    "fingerstick" (in "fingerstick glucose") -> "poc glucose", "capillary glucose", "glucometer"...,
    never a bare "glucose", which other tests share. Empty when the word is in no test's name."""
    labs, text = _labs(), norm(word)
    same: set[str] = set()
    for r in _rows("labs.tsv"):
        names = [norm(n) for n in _split(r["names"])]
        if any(text in n.split() for n in names):
            own = {r["loinc"]} | labs.siblings.get(r["loinc"], frozenset())
            same |= {n for n in names if labs.names.get(n, frozenset()) <= own}
    return frozenset(same)


def lab_name(code: str) -> str | None:
    """The short name clinicians use for a LOINC code ("2160-0" -> "creatinine", "4548-4" -> "HbA1c")."""
    labs = _labs()
    code = norm(code)
    if code in labs.first_name:
        return labs.first_name[code]
    return next((labs.first_name[s] for s in sorted(labs.siblings.get(code, ())) if s in labs.first_name), None)


# ---------------------------------------------------------------------------------------------
# Abbreviations
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Abbreviations:
    source: dict[str, tuple[str, ...]]
    overrides: dict[tuple[str, str], tuple[str, ...]]
    by_lower: dict[str, tuple[str, ...]]            # lower-case -> spellings as written


@lru_cache(maxsize=1)
def _abbreviations() -> _Abbreviations:
    source = {r["abbreviation"]: tuple(_split(r["long_forms"])) for r in _rows("abbreviations.tsv")}
    overrides = {(r["abbreviation"], r["context"]): tuple(_split(r["long_forms"]))
                 for r in _rows("abbreviation_overrides.tsv")}
    by_lower: dict[str, list[str]] = {}
    for key in sorted(set(source) | {a for a, _ in overrides}):
        by_lower.setdefault(key.lower(), []).append(key)
    return _Abbreviations(source, overrides, {k: tuple(v) for k, v in by_lower.items()})


@lru_cache(maxsize=1)
def long_form_words() -> frozenset[str]:
    """Every word of the inventory's long forms ("amputation" of "below-knee amputation",
    "pathology" of "anatomic pathology"): words a clinical source writes out."""
    forms = [form for forms in _abbreviations().source.values() for form in forms]
    return frozenset(w for form in forms for w in re.findall(r"[a-z]+", form.lower()))


def has_reviewed_meaning(token: str) -> bool:
    """Whether the hand-reviewed overrides give the token a meaning ("chemo", "appy", "fx"):
    such a token is an abbreviation even where it looks like an ordinary word."""
    ab = _abbreviations()
    return any(spelling in {a for a, _ in ab.overrides} for spelling in ab.by_lower.get(token.lower(), ()))


def abbreviation(token: str, context: str | None = None) -> list[str]:
    """Long forms of a clinical abbreviation, most likely first ("BMP" -> basic metabolic panel,
    "K" with context "lab" -> potassium). context is one of CONTEXTS or None; the hand-reviewed
    overrides for that context win, then those for any context, then the source list. The token is
    matched as written, then regardless of case. Empty if unknown."""
    if context is not None and context not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS} or None, not {context!r}")
    ab = _abbreviations()
    token = token.strip()
    spellings = [token] + [s for s in ab.by_lower.get(token.lower(), ()) if s != token]
    for keys in ([(s, context) for s in spellings] if context else [], [(s, "*") for s in spellings]):
        for key in keys:
            if key in ab.overrides:
                return list(ab.overrides[key])
    for s in spellings:
        if s in ab.source:
            return list(ab.source[s])
    return []


# ---------------------------------------------------------------------------------------------
# Vocabulary and spelling
# ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"[a-z][a-z'-]*[a-z]")


@lru_cache(maxsize=1)
def _english() -> frozenset[str]:
    text = gzip.decompress((DATA / "english_words.txt.gz").read_bytes()).decode("utf-8")
    return frozenset(ln for ln in text.splitlines() if ln and not ln.startswith("#"))


def is_common_word(word: str) -> bool:
    """Whether a word is among the 40,000 most frequent English words (of three letters or more).
    An ordinary word is never spell-corrected. Some brand names are ordinary words or first names
    ("Heather", "React", "Rid", "Nix") and some famous brands count as ordinary ("Tylenol"), so a
    question reader should take a common-word brand for a drug only with other evidence (written
    with a capital in a drug context, or next to a dose)."""
    return norm(word) in _english()



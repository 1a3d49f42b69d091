"""Staged retrieval: each stage is a small function with typed input and output, timed and counted.

Pipelines:
  dense  — dense kNN over the patient's chunks (the baseline)
  hybrid — BM25 over concept-normalised text ∪ dense, fused with reciprocal rank fusion
  full   — analyse → filter (time, note type; recall guard) → recall with concept expansion →
           recovery of chunks sharing a question concept → deterministic feature rerank (plus an optional cross-encoder) → select
Stages of `full` can be switched off (`ablate`) to measure what each one earns.
"""
from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from typing import Callable

from fhir_ingest.record.contract import Chunk

from search.nlp.abbreviations import expansions
from search.nlp.annotate import RecordTerm, asserted_keys, default_annotator
from search.backends.base import Backend, Hit, Scope, Search
from search.models.crossrank import CrossEncoderRanker
from search.models.embed import Embedder
from search.nlp.lexicon import STOP_WORDS, content_tokens, tokens
from search.nlp.spelling import spelled
from search.nlp.terminology import is_common_word
from search.nlp.vocabulary import clinical_not_lay, is_clinical_word, is_phrasing, names_a_clinical_thing, presence_prefix
from search.retrieval.dates import MONTH_RE as _MONTH_RE, MONTHS, impossible_dates, valid_date
from search.retrieval.timeline import ANCHOR, anchor, last_n

PIPELINES = ("dense", "hybrid", "full")
ABLATABLE = ("filter", "recovery", "rerank", "series")
RECALL_N = 50
RECOVERY_N = 40
RRF_K = 60
FILTER_GUARD = 6          # a filter that leaves fewer chunks than this is widened, then dropped

LATEST = re.compile(r"\b(latest|last|most recent|recent|recently|current|currently|now|today|newest|right now)\b", re.I)
TREND = re.compile(r"\b(trend|trends|trended|trending|over time|changed|change|going up|going down|over the (?:last|past)|"
                   r"gain|gained|loss|lost|vs|versus|compared)\b", re.I)
FIRST = re.compile(r"\b(first|earliest|initial|oldest|original)\b", re.I)
EVER = re.compile(r"\b(ever|history|hx|any|previous|prior|past)\b", re.I)
LIST = re.compile(r"\b(what|which|list|all|any)\b.*\b(meds|medications|drugs|problems|diagnoses|allergies|procedures|"
                  r"vaccines|immunizations|visits|conditions|dx|blood thinners|antiplatelets|statins|pills)\b", re.I)
WHY = re.compile(r"\b(why|reason|what for|for what|indication)\b", re.I)
NOTE_TYPES = ("note",)

# Words of a question that say what kind of answer is wanted, not what it is about.
QUESTION_WORDS = frozenset("""
kind sort type which what when where why how many much ok okay give giving carry carrying using use used
getting going thinking ordering worked work-up workup brought bring happened happen show shows showed say says
said list lists listed document documented mention mentioned actually entries entry file on-file instead old
older new newer last few three two four five years year months month days day week weeks ago trend trended
trending changed change going up down draws draw checks check reading readings number numbers kid child adult
dx diagnosis diagnoses diagnosed problem problems any ever been has have had she he her his him they them
their per right now also again still next does did do done get got are was were be is it this that those these
the a an and or of for in on at to with from by as about into over under since until during while coming came
come seen see visit visits episode happened report reported reports
""".split())


@dataclass
class Analysis:
    question: str
    concepts: list[dict]             # {key, display, semantic_type, negated}
    terms: list[str]                 # content words of the question
    semantic_types: list[str]
    date_from: str = ""
    date_to: str = ""
    wants_latest: bool = False
    wants_first: bool = False        # "first rx on file", "earliest A1c": the oldest of what was asked
    wants_trend: bool = False
    wants_ever: bool = False
    wants_list: bool = False
    wants_why: bool = False
    kinds: tuple[str, ...] = ()      # kinds of record the question names ("procedures", "labs")
    expansions: list[str] = field(default_factory=list)   # long forms of the question's abbreviations
    last_n: int = 0                  # "last 3 A1c values": how many of the newest results are asked for
    visit_refs: set[str] = field(default_factory=set)   # encounters of the kind a note question names
    impossible_dates: list[str] = field(default_factory=list)   # "2023-02-30 is not a date: ..." for each
    unplaced: str = ""               # "this admission" with no stay in the record: said, never answered over all of it
    corrections: list[str] = field(default_factory=list)        # misspelt words read as ("fossamax → fosamax")
    target: int = 0                  # where the asked clause begins (after context such as "K+ was low —")
    abbreviations: dict[str, list[str]] = field(default_factory=dict)   # abbreviation → its long forms

    @property
    def keys(self) -> set[str]:
        """Concepts the evidence must carry. Note-section words ("chief complaint", "assessment")
        only steer the filter: a note never 'asserts' them. Context ("her potassium was low") is
        not what was asked."""
        return {c["key"] for c in self.concepts if c["semantic_type"] != "note" and c.get("role") != "context"}

    @property
    def context_keys(self) -> set[str]:
        """Concepts the question mentions on the way to what it asks."""
        return {c["key"] for c in self.concepts if c.get("role") == "context"}

    @property
    def required_keys(self) -> set[str]:
        """What the answer must rest on: named things, not the classes they were recognised through.
        For a question about a note's content, visit words ("at her Sept physical") only say which note."""
        skip = {"note", "encounter"} if self.wants_note_content else {"note"}
        return {c["key"] for c in self.concepts if c["semantic_type"] not in skip
                and c.get("role") not in ("class", "context", "record")}

    @property
    def names(self) -> list[str]:
        return sorted({c["display"] for c in self.concepts})

    @property
    def sections_asked(self) -> set[str]:
        """Note sections the question names ("social history"), by their canonical headings."""
        return {c["display"] for c in self.concepts if c["semantic_type"] == "note"} - {"clinical note"}

    @property
    def names_a_note(self) -> bool:
        """The question says "note" (or "documented") itself, not only a section name such as
        "insurance" that other kinds of record share."""
        return any(c["semantic_type"] == "note" and c["display"] not in self.sections_asked for c in self.concepts)

    @property
    def wants_note(self) -> bool:
        return "note" in self.semantic_types

    @property
    def wants_note_content(self) -> bool:
        """Asked for what a note says (its complaint, assessment, social history), not for a fact
        that notes merely mention ("notes say NKA — any allergy entries?")."""
        content_types = {c["semantic_type"] for c in self.concepts} - {"note", "encounter"}
        return self.wants_note and not content_types

    def modifiers(self, words: set[str]) -> set[str]:
        """Words that qualify a recognised concept right after them ("breast" in "breast cancer")."""
        q = self.question.lower()
        found = set()
        for c in self.concepts:
            before = q[: c.get("start", 0)].split()
            if before and before[-1].strip(",.;:?!") in words:
                found.add(before[-1].strip(",.;:?!"))
        return found

    @property
    def residual(self) -> list[str]:
        """Content words no recognised concept covers ("pacemaker", "breast"), less question words."""
        covered = {t for c in self.concepts for t in tokens(c.get("text", ""))}
        return [t for t in self.terms if t not in covered and t not in QUESTION_WORDS and len(t) > 2
                and not t.isdigit() and t not in MONTHS]

    def intents(self) -> list[str]:
        return [name for name in ("latest", "first", "trend", "ever", "list", "why") if getattr(self, f"wants_{name}")]

    @property
    def asks_every_medication(self) -> bool:
        """"What medications is she on?": the medication list itself, no drug or class named, so
        every order of the record may answer it, not only those that ranked."""
        return "medication" in self.kinds and not any(c["semantic_type"] == "medication" for c in self.concepts)


@dataclass
class Evidence:
    chunk: Chunk
    score: float
    dense: float | None = None       # cosine similarity to the question, when dense recall saw the chunk
    lexical_rank: int | None = None
    dense_rank: int | None = None
    recovered: bool = False
    features: dict = field(default_factory=dict)


@dataclass
class StageReport:
    name: str
    n_in: int
    n_out: int
    ms: float
    corpus_ratio: float
    note: str = ""

    def to_dict(self) -> dict:
        d = {"name": self.name, "in": self.n_in, "out": self.n_out, "ms": round(self.ms, 2),
             "corpus_ratio": round(self.corpus_ratio, 4)}
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class Retrieval:
    question: str
    pipeline: str
    analysis: Analysis
    evidence: list[Evidence]
    stages: list[StageReport]
    corpus_size: int
    scope: Scope                      # the scope after the filter stage
    candidates: list[Evidence] = field(default_factory=list)   # everything the rerank saw
    absent_terms: set[str] = field(default_factory=set)        # clinical words of the question this record never uses
    histories: list[Evidence] = field(default_factory=list)    # every order of the drugs the evidence names
    ranked_after: dict[str, list[list[str]]] = field(default_factory=dict)   # stage -> each evidence's refs, in order
    vectors_pending: int = 0          # chunks still waiting for their vector (a first sync under way)
    similarity: Callable[[list[str]], list[float]] | None = None   # texts' similarity to the question (the embedder's)


# --- stage 2: analyse ---------------------------------------------------------------------------

# Words that name a kind of record rather than a concept: "What procedures were done at the
# stroke visit?" asks for procedures, not for the visit's medications.
RECORD_KIND_WORDS = {
    "procedure": re.compile(r"\b(procedures?|surger(?:y|ies)|operations?|transplant(?:s|ed)?)\b", re.I),
    "medication": re.compile(r"\b(meds|medications?|drugs|prescriptions?|prescribed|taking|takes|pills|tablets|"
                             r"supplements?)\b|\b(?:what|which \w+) (?:was|were|is) (?:she|he|they|the patient|pt) given\b|"
                             r"\b(?:is|was|are|were) (?:she|he|they|the patient|pt) (?:still |currently |now |ever )?on\b", re.I),
    "lab": re.compile(r"\b(labs|lab results|bloodwork|blood work)\b", re.I),
    "vital": re.compile(r"\b(vitals|vital signs)\b", re.I),
    "coverage": re.compile(r"\b(insurance|insurer|insured|payer|payor|health plan|coverage)\b", re.I),
    "goal": re.compile(r"\b(goals?|targets?)\b", re.I),
    "order": re.compile(r"\b(orders?|ordered|referrals?|referred|pending)\b", re.I),
    "family-history": re.compile(r"\b(family (?:history|hx)|fhx|runs in the family)\b", re.I),
    "careplan": re.compile(r"\b(care ?plans?|plans? of care|tx plans?|treatment plans?|plan for (?:his|her|their|the))\b",
                           re.I),
}


# Where a clause ends and the next begins: a dash, a semicolon or colon, a full stop, or a comma
# before a question word ("K+ was 3.1, is she on a diuretic?").
_CLAUSE_BREAK = re.compile(r"\s[—–-]+\s|[;:.!]\s+|,\s+(?=(?:is|was|are|were|does|did|do|has|have|any|what|which|"
                           r"when|why|how|should|could|can)\b)", re.I)
_ASKING = re.compile(r"^\s*(?:is|was|are|were|does|did|do|has|have|had|any|what|which|when|why|how|should|could|can|"
                     r"who|where|list|show|tell)\b|\?\s*$", re.I)


_PURPOSE = re.compile(r"\bfor (?:the |her |his |their |a |an |my )?", re.I)


def purpose_as_context(question: str, target: int, concepts: list[dict]) -> None:
    """"Is he on a triptan for the migraines?" asks about a triptan; the migraines are why. What
    follows "for" is context when the asked clause names something else before it ("What is she
    taking for her BP?" names nothing else: there the BP is what is asked about)."""
    m = _PURPOSE.search(question, target)
    if not m:
        return
    named = {c["key"] for c in concepts if target <= c.get("start", 0) < m.start()
             and c.get("role") not in ("class", "context") and c["semantic_type"] != "note"}
    if not named:
        return
    for concept in concepts:
        if concept.get("start", 0) >= m.end() and concept["key"] not in named and concept["semantic_type"] != "note":
            concept["role"] = "context"


def event_as_context(question: str, concepts: list[dict], kinds: set[str]) -> None:
    """"How long was she in the SNF after the wrist fx?" asks about the SNF stay; the fracture
    only says when. Concepts inside the event a question anchors its time to are context, when
    the question asks about something else (another concept, or a kind of record it names)."""
    m = ANCHOR.search(question)
    if not m:
        return
    start, end = m.span(3)
    inside = [c for c in concepts if start <= c.get("start", -1) < end]
    asked = [c for c in concepts if c not in inside and c.get("role") not in ("class", "context")
             and c["semantic_type"] != "note"]
    if inside and (asked or kinds or asks_words_outside(question, m.span(0))):
        for concept in inside:
            concept["role"] = "context"


def asks_words_outside(question: str, span: tuple[int, int]) -> bool:
    """The question names something of its own outside the event it is anchored to ("any IM
    injections after the IUD went in?", "risky behaviors flagged at the well visit"), not only
    how it asks ("what happened at the ER visit?")."""
    rest = question[:span[0]] + " " + question[span[1]:]
    return any(t not in QUESTION_WORDS and t not in MONTHS and not t.isdigit() and not is_phrasing(t) and len(t) > 2
               for t in content_tokens(rest))


def target_offset(question: str) -> int:
    """Where the asked clause begins. "Her potassium was low — is she on a diuretic?" asks about a
    diuretic; the potassium is context. A question of several questions is asked whole."""
    for brk in reversed(list(_CLAUSE_BREAK.finditer(question))):
        head, tail = question[:brk.start()], question[brk.end():]
        if tail.strip() and _ASKING.search(tail) and not head.rstrip().endswith("?") and not _ASKING.match(head):
            return brk.end()
    return 0


def asks_for_the_first(question: str) -> bool:
    """"First rx on file?", "earliest A1c": the oldest is asked for. "At her first prenatal
    visit" only names an event the question is anchored to."""
    anchored = [m.span(2) for m in ANCHOR.finditer(question) if m.group(2)]
    return any(not any(a <= m.start() < b for a, b in anchored) for m in FIRST.finditer(question))


def analyse(question: str, terms: list[RecordTerm] | None = None) -> Analysis:
    typed = question
    question, corrections = spelled(question)
    concepts = default_annotator().annotate([question], terms or [], in_question=True)[0]
    concepts, abbreviations = with_abbreviations(question, concepts, terms or [])
    concepts += record_words(question, concepts, terms or [])
    target = target_offset(question)
    purpose_as_context(question, target, concepts)
    if target:
        asked = {c["key"] for c in default_annotator().annotate([question[target:]], terms or [], in_question=True)[0]}
        for concept in concepts:
            # Named before the asked clause and not again in it: context ("K+ was low — on a diuretic?").
            if concept.get("start", 0) < target and concept["key"] not in asked and concept["semantic_type"] != "note":
                concept["role"] = "context"
    date_from, date_to = time_window(question)
    kinds = {kind for kind, words in RECORD_KIND_WORDS.items() if words.search(question)}
    event_as_context(question, concepts, kinds)
    # Named only through the record's own words, the thing asked is what the answer must rest on.
    if not any(c.get("role") == "" and c["semantic_type"] != "note" for c in concepts):
        for concept in concepts:
            if concept.get("role") == "record":
                concept["role"] = ""
    return Analysis(
        question, concepts, content_tokens(question), sorted({c["semantic_type"] for c in concepts} | kinds),
        date_from, date_to, wants_latest=bool(LATEST.search(question)), wants_first=asks_for_the_first(question),
        wants_trend=bool(TREND.search(question)),
        wants_ever=bool(EVER.search(question)), wants_list=bool(LIST.search(question)),
        wants_why=bool(WHY.search(question)), kinds=tuple(sorted(kinds)),
        expansions=search_forms(concepts, abbreviations), target=target, abbreviations=abbreviations,
        last_n=last_n(question), impossible_dates=impossible_dates(typed),
        corrections=[f"{wrong} → {right}" for wrong, right in corrections])


# Words of the record's coded names that name no particular thing ("Retinopathy due to type 2
# diabetes mellitus (disorder)": "due", "type" and "disorder" say nothing a question could mean).
GENERIC_RECORD_WORDS = frozenset("""
disorder finding situation procedure substance product history record artifact regime therapy patient
education unspecified type due care plan service services encounter screening assessment test tests
level levels count finding body structure clinical general status total serum plasma blood urine mass
volume moles presence person family social management activity activities normal abnormal with without
""".split())
MOST_RECORD_TERMS = 12     # a word in more of the patient's coded names than this names no one thing


def record_words(question: str, concepts: list[dict], terms: list[RecordTerm]) -> list[dict]:
    """A word of the question that no concept covers but that the patient's own coded names use
    ("retinopathy" of "Moderate non-proliferative diabetic retinopathy", "milk" of "Allergy to
    cow's milk") names those records: the record's codings and displays are a vocabulary too."""
    covered = [(c.get("start", 0), c.get("start", 0) + len(c.get("text", ""))) for c in concepts]
    by_word: dict[str, list[RecordTerm]] = {}
    for term in terms:
        for word in set(tokens(term.phrase)):
            by_word.setdefault(word, []).append(term)
    found, seen = [], {c["key"] for c in concepts}
    for m in re.finditer(r"[a-z][a-z'-]+", question.lower()):
        word = m.group(0)
        if any(s <= m.start() < e for s, e in covered) or len(word) < 3 or word in STOP_WORDS \
                or word in QUESTION_WORDS or word in GENERIC_RECORD_WORDS or is_common_word(word) or names_a_kind(word):
            continue
        named = by_word.get(word) or by_word.get(word.rstrip("s")) or spelled_out(word, terms) \
            or by_word.get(same_word(word, by_word) or "")
        if not named or len(named) > MOST_RECORD_TERMS:
            continue
        for term in named:
            if term.key not in seen:
                seen.add(term.key)
                # Found through the record's own names, they steer recall and ranking; what the
                # answer must rest on stays what the question named (role "record" is not required).
                found.append({"key": term.key, "display": term.display, "semantic_type": term.semantic_type,
                              "negated": False, "text": m.group(0), "role": "record", "start": m.start()})
    return found


def same_word(word: str, vocabulary) -> str | None:
    """The record's word that is the question's with another ending ("risky" → risk,
    "transport" → transportation, "assess" → assessment): the shorter, of five letters or more,
    begins the longer, which has at most five more; or an adjective's "-y" on the record's noun."""
    for candidate in vocabulary:
        if word.endswith("y") and word[:-1] == candidate and len(candidate) >= 4:
            return candidate
        short, long = sorted((word, candidate), key=len)
        if len(short) >= 5 and long.startswith(short) and len(long) - len(short) <= 5:
            return candidate
    return None


SHORTEST_ACRONYM = 4     # three letters fall by chance among the initials of a long coded name


def spelled_out(word: str, terms: list[RecordTerm]) -> list[RecordTerm]:
    """The record's coded names whose words' initials spell an acronym of the question that no
    abbreviation list has ("CRAFFT": "Car, Relax, Alone, Forget, Friends, Trouble Screening Test")."""
    if len(word) < SHORTEST_ACRONYM or not word.isalpha() or is_common_word(word):
        return []
    return [term for term in terms if word in "".join(t[0] for t in tokens(term.phrase))]


def with_abbreviations(question: str, concepts: list[dict], terms: list[RecordTerm]) -> tuple[list[dict], dict[str, list[str]]]:
    """The question's concepts plus those its abbreviations' long forms name ("DOAC" → direct
    oral anticoagulant), each placed where the abbreviation stands; and each abbreviation's long
    forms, by the abbreviation."""
    covered = [(c.get("start", 0), c.get("start", 0) + len(c.get("text", ""))) for c in concepts]
    found = expansions(question, covered)
    if not found:
        return concepts, {}
    keys = {c["key"] for c in concepts}
    forms = [form for _, _, long_forms in found for form in long_forms]
    annotated = default_annotator().annotate(forms, terms, in_question=True)
    per_form = iter(annotated)
    for start, token, long_forms in found:
        for form in long_forms:
            from_record = named_in_record(form, terms) if not names_a_kind(form) else []
            for concept in next(per_form) or from_record:
                # "vaccine" of "inactivated poliovirus vaccine" says only what kind of record it is
                generic = concept["display"] == concept["semantic_type"] or names_a_kind(concept["display"])
                if concept["key"] not in keys and not generic:
                    keys.add(concept["key"])
                    concepts.append(concept | {"start": start, "text": token, "via": form})
    return concepts, {token.lower(): long_forms for _, token, long_forms in found}


def search_forms(analysis_concepts: list[dict], abbreviations: dict[str, list[str]]) -> list[str]:
    """Long forms worth adding to the search text: those of abbreviations no other vocabulary
    matched ("ED" of "ED visit" is already the emergency visit; adding "erectile dysfunction"
    would only blur the search)."""
    matched = {c.get("text", "").lower() for c in analysis_concepts if not c.get("via")}
    return [form for token, forms in abbreviations.items() if token not in matched for form in forms]


def named_in_record(form: str, terms: list[RecordTerm]) -> list[dict]:
    """The patient's coded names that say a long form no vocabulary knows in other words ("IPV":
    intimate partner violence, recorded as "Victim of intimate partner abuse"): at least two of
    its words (its one word, for a one-word form), as written or with another ending."""
    words = [w for w in content_tokens(form) if w not in GENERIC_RECORD_WORDS and len(w) > 2]
    if not words:
        return []
    found = []
    for term in terms:
        have = set(tokens(term.phrase))
        shared = [w for w in words if w in have or same_word(w, have)]
        if len(shared) >= min(2, len(words)):
            found.append({"key": term.key, "display": term.display, "semantic_type": term.semantic_type,
                          "negated": False, "role": "record"})
    return found if len(found) <= MOST_RECORD_TERMS else []


def time_window(question: str) -> tuple[str, str]:
    """Explicit dates in the question → an inclusive ISO window ('May 30, 2025', 'Oct 2022', 'since 2023').

    Questions are text: an impossible date ("2023-02-30", "since 0000-01-01") is a date the
    question does not have, never an error."""
    q = question.lower()
    m = re.search(r"\b(\d{4})-(\d{2})-(\d{2})\b", q)
    if m:
        d = valid_date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        return (d, d) if d else ("", "")
    m = re.search(r"\b(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})\b", q)
    if m:      # month/day/year, as US charts write it ("the 2/1/25 ED visit")
        year = int(m.group(3)) if len(m.group(3)) == 4 else 2000 + int(m.group(3))
        d = valid_date(year if year <= date.today().year else year - 100, int(m.group(1)), int(m.group(2)))
        return (d, d) if d else ("", "")
    m = re.search(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", q)
    if m:
        d = valid_date(int(m.group(3)), MONTHS[m.group(1)], int(m.group(2)))
        if d:
            return d, d
    m = re.search(rf"\b({_MONTH_RE})\.?\s+(\d{{4}})\b", q)
    if m and valid_date(int(m.group(2)), MONTHS[m.group(1)], 1):
        year, month = int(m.group(2)), MONTHS[m.group(1)]
        last = calendar.monthrange(year, month)[1]
        since = re.search(rf"\b(since|after|from)\s+{re.escape(m.group(0))}", q)
        return f"{year:04d}-{month:02d}-01", ("" if since else f"{year:04d}-{month:02d}-{last:02d}")
    m = re.search(r"\b(since|after)\s+(\d{4})\b", q) or (len(years_named(q)) < 2 and re.search(r"\b(from)\s+(\d{4})\b", q))
    if m and valid_date(int(m.group(2)), 1, 1):
        return f"{m.group(2)}-01-01", ""
    years = years_named(q)
    if len(years) >= 2:          # "wt gain from the 2023 to the 2024 physical": both, and between
        return f"{min(years)}-01-01", f"{max(years)}-12-31"
    m = re.search(r"\b(19[5-9]\d|20[0-4]\d)\b.*\b(?:vs\.?|versus|compared (?:to|with))\s+(?:the\s+)?"
                  r"(?:prior|previous|earlier|past|last)\b", q)
    if m:                        # "wt at the 2025 physical vs the prior years": up to that year
        return "", f"{m.group(1)}-12-31"
    if dated_on_one_side(q):
        return "", ""
    m = re.search(r"\b(?:in|during|of)\s+(\d{4})\b", q) or re.search(r"\b(19[5-9]\d|20[0-4]\d)\b", q)
    if m and valid_date(int(m.group(1)), 1, 1):
        return f"{m.group(1)}-01-01", f"{m.group(1)}-12-31"
    return "", ""


# Two things compared: "bp meds when she left after the pacemaker vs what she was taking in 2009".
COMPARED = re.compile(r"\b(?:vs\.?|versus|compared (?:to|with)|and then|then and now)\b")


def dated_on_one_side(q: str) -> bool:
    """A comparison whose year is on one side only: the other side is another time (the
    discharge of 2007), so the year does not window the whole question."""
    parts = COMPARED.split(q, maxsplit=1)
    return len(parts) == 2 and sum(bool(years_named(part)) for part in parts) == 1


def years_named(q: str) -> list[int]:
    return sorted({int(y) for y in re.findall(r"\b(19[5-9]\d|20[0-4]\d)\b", q) if valid_date(int(y), 1, 1)})


def expanded_query(analysis: Analysis) -> str:
    """The question's content words plus canonical names of its concepts (an LLM-free expansion)."""
    return " ".join(analysis.terms + analysis.names + analysis.expansions)


# --- stage 3: filter ----------------------------------------------------------------------------

def _widen(day_iso: str, days: int) -> str:
    return (date.fromisoformat(day_iso) + timedelta(days=days)).isoformat()


def filter_scope(backend: Backend, scope: Scope, analysis: Analysis) -> tuple[Scope, str]:
    """Narrow by the asked-for dates and, for note questions, to notes; widen when too little is left."""
    candidates = []
    if analysis.date_from or analysis.date_to:
        base = replace(scope, date_from=analysis.date_from, date_to=analysis.date_to)
        wide = replace(scope, date_from=_widen(analysis.date_from, -31) if analysis.date_from else "",
                       date_to=_widen(analysis.date_to, 31) if analysis.date_to else "")
        candidates += [(base, "dates"), (wide, "dates ±1 month")]
    # "Insurance per the social history?" asks a note, unless the record holds the kind of record
    # the question names (a Coverage): then the structured record must stay in reach.
    named_kind_held = (bool(analysis.kinds) and not analysis.names_a_note
                       and backend.count(replace(scope, semantic_types=analysis.kinds)) > 0)
    if analysis.wants_note_content and not named_kind_held:
        candidates = [(replace(s, semantic_types=NOTE_TYPES), f"notes, {why}") for s, why in candidates] + candidates
        candidates.append((replace(scope, semantic_types=NOTE_TYPES), "notes"))
    for narrowed, why in candidates:
        if backend.count(narrowed) >= (1 if narrowed.semantic_types and narrowed.date_from else FILTER_GUARD):
            return narrowed, why
    return scope, "none"


# --- stage 4: recall and fusion -------------------------------------------------------------------

def rrf(*rankings: list[Hit]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking):
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + 1.0 / (RRF_K + rank + 1)
    return scores


# --- stage 6: rerank ------------------------------------------------------------------------------

def in_window(chunk: Chunk, analysis: Analysis) -> bool:
    d = chunk.date[:10]
    if not d or not (analysis.date_from or analysis.date_to):
        return False
    return (not analysis.date_from or d >= analysis.date_from) and (not analysis.date_to or d <= analysis.date_to)


def concept_overlap(chunk: Chunk, analysis: Analysis) -> float:
    """Share of the question's concepts the chunk asserts."""
    if not analysis.keys:
        return 0.0
    return len(asserted_keys(chunk.concepts) & analysis.keys) / len(analysis.keys)


def negated_overlap(chunk: Chunk, analysis: Analysis) -> bool:
    """The chunk mentions a question concept only to deny it ("No Known Allergies.")."""
    keys = analysis.keys
    mentioned = {c["key"] for c in chunk.concepts if c["key"] in keys}
    return bool(mentioned) and not (mentioned & asserted_keys(chunk.concepts))


def visits_named(backend: Backend, scope: Scope, analysis: Analysis) -> set[str]:
    """"The chief complaint at the Jan 2025 ER visit": the encounters in scope of the kind the
    question names, so that of several notes near the date, the one written at that visit ranks."""
    kinds = sorted(c["key"] for c in analysis.concepts if c["semantic_type"] == "encounter")
    if not (analysis.wants_note and kinds):
        return set()
    hits = backend.search_concepts(replace(scope, semantic_types=("encounter",)), kinds, 200)
    return {chunk.ref for chunk in backend.get_chunks(scope.tenant, [h.chunk_id for h in hits])}


def newest_results(evidence: list[Evidence], analysis: Analysis) -> set[str]:
    """For "last 3 A1c values": the newest N single results asserting what was asked, one per day."""
    if not analysis.last_n:
        return set()
    results = sorted((ev.chunk for ev in evidence if ev.chunk.resource_type == "Observation"
                      and ev.chunk.category != "trend" and asserted_keys(ev.chunk.concepts) & analysis.keys),
                     key=lambda c: c.date, reverse=True)
    chosen, days = set(), set()
    for chunk in results:
        if chunk.date[:10] not in days and len(chosen) < analysis.last_n:
            days.add(chunk.date[:10])
            chosen.add(chunk.chunk_id)
    return chosen


def holds_asked_section(chunk: Chunk, analysis: Analysis) -> bool:
    """A note chunk that holds the section the question names ("presenting complaints" → Chief
    Complaint): of a note's pieces, that one answers."""
    asked = analysis.sections_asked
    return bool(asked) and chunk.semantic_type == "note" and any(
        heading.lower() in asked for heading in chunk.sections)


# The feature rerank's weights. The fused recall score (an RRF score, about 0.02-0.03 at the
# top) orders chunks the features cannot tell apart; each feature is 0 or 1 except `concepts`
# (the share of the question's concepts a chunk asserts), so a weight says how many places a
# feature is worth against the others. Tuned on the dev questions, checked on questions nobody
# tuned on (README, "Retrieval quality").
RERANK_WEIGHTS = {
    "fused": 1.0,         # recall's own order
    "concepts": 0.8,      # asserts what was asked about: the strongest single signal
    "negated": -0.6,      # only mentions it to deny it ("no history of asthma")
    "in_window": 0.6,     # dated inside the window the question names
    "latest": 0.4,        # the newest of its concept, for "latest" questions
    "earliest": 0.4,      # the oldest of its concept, for "first" questions
    "type": 0.2,          # of a record type the question's words point at
    "trend": 0.4,         # a trend summary, for "trend" questions
    "structured": 0.3,    # a structured fact over a templated note line saying the same
    "kind": 1.0,          # of the kind asked for by name ("what procedures...")
    "section": 0.5,       # the note section asked for ("the assessment")
    "newest_n": 1.0,      # among the last N results asked for ("the last three A1c")
    "visit": 0.5,         # a note of the visit the question names
    "unasked": -1.0,      # the patient's demographics, when the question asks nothing of them
}
# What the Patient's own demographics passage answers ("birth date?", "how is the gender
# documented?"); to any other question it would only take a place from the clinical evidence.
ABOUT_THE_PATIENT = re.compile(r"\b(?:gender|sex|born|birth\w*|dob|age|old|language\w*|interpreter|deceased|died|"
                               r"death|alive|race|ethnic\w*|marital|married|demographic\w*)\b", re.I)


def rerank(evidence: list[Evidence], analysis: Analysis, reranker: CrossEncoderRanker | None = None) -> list[Evidence]:
    """Deterministic features: concepts asserted (not negated), the asked-for dates, the newest
    for 'latest', trend summaries for trends, structured facts over templated note lines; plus,
    when a cross-encoder is configured, its reading of question and text together."""
    if not evidence:
        return evidence
    newest: dict[str, str] = {}
    oldest: dict[str, str] = {}
    for ev in evidence:
        for key in asserted_keys(ev.chunk.concepts) & analysis.keys:
            if ev.chunk.date > newest.get(key, ""):
                newest[key] = ev.chunk.date
            if ev.chunk.date and ev.chunk.date < oldest.get(key, "9999"):
                oldest[key] = ev.chunk.date
    newest_any = max((ev.chunk.date for ev in evidence), default="")
    asked_n = newest_results(evidence, analysis)
    top_fused = max(ev.score for ev in evidence) or 1.0
    for ev in evidence:
        chunk = ev.chunk
        overlap = concept_overlap(chunk, analysis)
        matched = asserted_keys(chunk.concepts) & analysis.keys
        f = {
            "fused": ev.score / top_fused,
            "concepts": overlap,
            "negated": 1.0 if negated_overlap(chunk, analysis) else 0.0,
            "in_window": 1.0 if in_window(chunk, analysis) else 0.0,
            # A concept whose every record is undated has no newest or oldest: none of them is it.
            "latest": 1.0 if analysis.wants_latest and (
                any(k in newest and chunk.date >= newest[k] for k in matched) if analysis.keys
                else chunk.date[:10] == newest_any[:10]) else 0.0,
            "earliest": 1.0 if analysis.wants_first and chunk.category != "trend" and any(
                k in oldest and chunk.date <= oldest[k] for k in matched) else 0.0,
            "type": 1.0 if chunk.semantic_type in analysis.semantic_types else 0.0,
            "trend": 1.0 if analysis.wants_trend and chunk.category == "trend" else 0.0,
            "structured": 1.0 if overlap and chunk.semantic_type != "note" else 0.0,
            "kind": 1.0 if chunk.semantic_type in analysis.kinds else 0.0,
            "section": 1.0 if holds_asked_section(chunk, analysis) else 0.0,
            "newest_n": 1.0 if chunk.chunk_id in asked_n else 0.0,
            "visit": 1.0 if chunk.semantic_type == "note" and set(chunk.refs[1:]) & analysis.visit_refs else 0.0,
            "unasked": 1.0 if chunk.semantic_type == "demographics" and not ABOUT_THE_PATIENT.search(analysis.question)
            else 0.0,
        }
        ev.features = f
        ev.score = 0.0
        for name, weight in RERANK_WEIGHTS.items():   # summed in this order (ties are broken by id)
            ev.score += weight * f[name]
    ranked = sorted(evidence, key=lambda e: (-e.score, e.chunk.chunk_id))
    if reranker is not None:
        ranked = cross_rerank(ranked, analysis.question, reranker)
    return ranked


CROSS_WEIGHT = 1.0


def cross_rerank(ranked: list[Evidence], question: str, reranker: CrossEncoderRanker) -> list[Evidence]:
    """Add the cross-encoder's relevance to the best candidates' feature scores. The tail it does
    not read gets the lowest score it gave, so reading a candidate never costs it rank."""
    head = ranked[:reranker.max_pairs]
    scores = reranker.scores(question, [ev.chunk.text for ev in head])
    floor = min(scores, default=0.0)
    for i, ev in enumerate(ranked):
        cross = scores[i] if i < len(scores) else floor
        ev.features["cross"] = cross
        ev.score += CROSS_WEIGHT * cross
    return sorted(ranked, key=lambda e: (-e.score, e.chunk.chunk_id))


# --- stage 7: select ------------------------------------------------------------------------------

def fact_key(chunk: Chunk) -> str:
    """What makes two chunks the same fact: identical text, or for orders and results the same
    code (yearly renewals of one drug, the same analyte repeated on one day)."""
    if chunk.semantic_type == "medication" and chunk.codes:
        return "med:" + chunk.codes[0]["code"]
    if chunk.resource_type == "Observation" and chunk.category != "trend" and chunk.codes:
        return f"obs:{chunk.codes[0]['code']}:{chunk.date[:10]}:{measured_value(chunk)}"
    return "text:" + " ".join(chunk.text.split()).lower()


def measured_value(chunk: Chunk) -> str:
    """A result's value and components as its typed fact states them."""
    fact = chunk.fact or {}
    parts = [(fact.get("value") or {}).get("text", "")]
    parts += [f"{c['name']}: {c['value'].get('text', '')}" for c in fact.get("components") or []]
    return "; ".join(p for p in parts if p)


def select(evidence: list[Evidence], k: int, by_fact: bool = True, diverse: bool = False,
           per_note: int = 0) -> list[Evidence]:
    """Top-k without twins: one chunk per fact (identical text, a drug's renewals, repeated results).
    For lists and histories, a chunk that only repeats codes already chosen (the visit for a
    condition already listed) waits until the distinct facts are in. With `per_note`, a note's
    chunks beyond that many wait too, so one long note cannot fill the evidence of a question
    that spans notes."""
    chosen, deferred, seen, covered, of_note = [], [], set(), set(), {}
    for ev in evidence:
        key = fact_key(ev.chunk) if by_fact else "text:" + " ".join(ev.chunk.text.split()).lower()
        if key in seen:
            continue
        seen.add(key)
        codes = {f"{c['system']}|{c['code']}" for c in ev.chunk.codes} if diverse else set()
        note = ev.chunk.ref if ev.chunk.resource_type == "DocumentReference" else ""
        if (diverse and codes and codes <= covered) or (per_note and note and of_note.get(note, 0) >= per_note):
            deferred.append(ev)
            continue
        covered |= codes
        of_note[note] = of_note.get(note, 0) + 1
        chosen.append(ev)
        if len(chosen) == k:
            return chosen
    return (chosen + deferred)[:k]


# --- the pipeline -----------------------------------------------------------------------------------

@dataclass
class Tools:
    """What the stages search with."""
    backend: Backend
    embedder: Embedder
    reranker: CrossEncoderRanker | None = None


@dataclass
class RetrievalState:
    """What flows from stage to stage: each stage reads what earlier ones left and adds its part."""
    question: str
    tenant: str
    patient_id: str
    k: int
    scope: Scope
    corpus: int = 0
    vectors_pending: int = 0           # chunks written before their vector: dense recall cannot see them yet
    terms: list[RecordTerm] = field(default_factory=list)
    analysis: Analysis | None = None
    absent: set[str] = field(default_factory=set)
    dense_hits: list[Hit] = field(default_factory=list)
    lexical_hits: list[Hit] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    candidates: list[Evidence] = field(default_factory=list)
    histories: list[Evidence] = field(default_factory=list)
    ranked_after: dict[str, list[list[str]]] = field(default_factory=dict)
    # Asked for with recall, in the same round trip, for the recovery stage (None: not asked).
    recovery_hits: list[Hit] | None = None
    chunk_cache: dict[str, Chunk] = field(default_factory=dict)


@dataclass(frozen=True)
class Stage:
    """A named step: `run` changes the state and returns (chunks out, note). A `whole_record` stage
    looks at the patient's whole record (its input is the corpus); the others take what the stage
    before them passed on. An unreported step is bookkeeping, not a stage of the table."""
    name: str
    run: Callable[[RetrievalState, Tools], tuple[int, str]]
    whole_record: bool = False
    reported: bool = True


def run_stages(stages: list[Stage], state: RetrievalState, tools: Tools) -> list[StageReport]:
    """The one runner: every stage timed and counted the same way."""
    reports: list[StageReport] = []
    for stage in stages:
        started = time.perf_counter()
        n_out, note = stage.run(state, tools)
        ms = (time.perf_counter() - started) * 1000
        if stage.reported:
            n_in = state.corpus if stage.whole_record or not reports else reports[-1].n_out
            reports.append(StageReport(stage.name, n_in, n_out, ms, n_out / state.corpus if state.corpus else 0.0, note))
            if state.evidence:      # what the ranking looks like after it: recall@k per stage (chartcite eval)
                state.ranked_after[stage.name] = [ev.chunk.refs or [ev.chunk.ref] for ev in state.evidence]
    return reports


def patient_terms(backend: Backend, tenant: str, patient_id: str) -> list[RecordTerm]:
    return terms_of(backend.get_patient(tenant, patient_id) or {})


def terms_of(summary: dict) -> list[RecordTerm]:
    return [RecordTerm(*t) for t in summary.get("terms", [])]


# --- the stages -----------------------------------------------------------------------------------------

def count_scope(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.corpus = tools.backend.count(state.scope)
    return state.corpus, ""


def analyse_question(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    backend, tenant = tools.backend, state.tenant
    analysis = analyse(state.question, state.terms)
    if state.corpus:
        read_ambiguous_words_by_the_record(analysis, backend, tenant, state.patient_id)
        read_abbreviations_by_the_record(analysis, backend, tenant, state.patient_id)
    # A clinical word that this patient's record never uses is something the record cannot
    # answer: "breast" for a patient with prostate cancer, "monofilament" for a patient never
    # tested. Clinical by the general vocabulary, never by other patients' records
    # (search/nlp/vocabulary.py).
    absent = absent_words(backend, tenant, state.patient_id, analysis) if state.corpus else set()
    state.analysis, state.absent = analysis, absent
    return state.corpus, ", ".join(analysis.names + analysis.intents() + [f"absent: {t}" for t in sorted(absent)])


def read_abbreviations_by_the_record(analysis: Analysis, backend: Backend, tenant: str, patient_id: str) -> None:
    """An abbreviation with several long forms means the ones this patient's record spells out
    ("CEA" is a carotid endarterectomy in a vascular patient's notes, carcinoembryonic antigen in
    an oncology workup): forms whose every word the record has are kept, the others dropped from
    the words searched; when the record spells out none, or all, all stay."""
    ambiguous = {token: forms for token, forms in analysis.abbreviations.items() if len(forms) > 1}
    if not ambiguous:
        return
    probes = {form: [presence_prefix(t) for t in re.findall(r"[a-z0-9]{2,}", form.lower()) if t not in STOP_WORDS]
              for forms in ambiguous.values() for form in forms}
    present = backend.has_terms(tenant, patient_id, sorted({t for ts in probes.values() for t in ts if t}), prefix=True)
    dropped, narrowed = set(), set()
    for token, forms in ambiguous.items():
        spelt = [form for form in forms if probes[form] and all(t in present for t in probes[form])]
        if spelt and len(spelt) < len(forms):
            analysis.abbreviations[token] = spelt
            dropped |= set(forms) - set(spelt)
            narrowed.add(token)
    if dropped:
        # The words searched and the sentences read are the record's own reading.
        analysis.expansions = [e for e in analysis.expansions if e not in dropped]
        drop_concepts_of_unspelt_forms(analysis, dropped, narrowed, backend, tenant, patient_id)


def drop_concepts_of_unspelt_forms(analysis: Analysis, dropped: set[str], narrowed: set[str], backend: Backend,
                                   tenant: str, patient_id: str) -> None:
    """A concept read from an abbreviation through a long form the record never spells ("CEA" as
    carcinoembryonic antigen in a vascular patient's record) is not what the question asks: kept,
    it is required of the record and the question is declared unanswered although the record's
    own reading (the carotid endarterectomy) answers it. It stays when the record holds it coded
    (a coded name may word it otherwise)."""
    unspelt = {" ".join(content_tokens(form)) for form in dropped}
    candidates = [c for c in analysis.concepts if (c.get("text") or "").lower() in narrowed
                  and (" ".join(content_tokens(c.get("via") or c["display"])) in unspelt)]
    if not candidates:
        return
    present = backend.concepts_present(tenant, patient_id, sorted({c["key"] for c in candidates}))
    gone = {id(c) for c in candidates if c["key"] not in present}
    if not gone:
        return
    analysis.concepts = [c for c in analysis.concepts if id(c) not in gone]
    # The word was read as that concept, so its long forms were never searched: the record's are now.
    kept = [form for token in narrowed for form in analysis.abbreviations.get(token, [])]
    analysis.expansions = list(dict.fromkeys([*analysis.expansions, *kept]))


def read_ambiguous_words_by_the_record(analysis: Analysis, backend: Backend, tenant: str, patient_id: str) -> None:
    """One word with several clinical readings ("PT": physical therapy or prothrombin time; "OD":
    overdose or right eye) means what this patient's record holds: readings the record asserts
    are kept and the others dropped; when the record holds none of them, all stay."""
    # One word read several ways: concepts whose spans overlap ("ED" of "ED visit").
    spans: list[tuple[int, int, list[dict]]] = []
    for concept in sorted(analysis.concepts, key=lambda c: c.get("start", 0)):
        start = concept.get("start", 0)
        end = start + max(len(concept.get("text", "")), 1)
        if spans and start < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]), spans[-1][2] + [concept])
        else:
            spans.append((start, end, [concept]))
    ambiguous = [group for _, _, group in spans
                 if len({c["semantic_type"] for c in group if c.get("role") not in ("class", "context")}) > 1]
    if not ambiguous:
        return
    present = backend.concepts_present(tenant, patient_id, sorted({c["key"] for g in ambiguous for c in g}))
    dropped = set()
    for group in ambiguous:
        if any(c["key"] in present for c in group):
            dropped |= {id(c) for c in group if c["key"] not in present}
    analysis.concepts = [c for c in analysis.concepts if id(c) not in dropped]


def clinical_residual(analysis: Analysis) -> set[str]:
    """The question's clinical words no concept covers. With a concept asked about, only its
    qualifiers count ("breast" of breast cancer), by the wider vocabulary qualifiers have."""
    if analysis.required_keys:
        found = {t for t in analysis.modifiers(set(analysis.residual)) if is_clinical_word(t, qualifier=True)}
    else:
        found = {t for t in analysis.residual if is_clinical_word(t)}
    return {t for t in found if not is_phrasing(t)}


def names_a_kind(word: str) -> bool:
    """"Surgery", "meds", "labs": a kind of record the question asks within, not a thing to find."""
    return any(words.fullmatch(word) for words in RECORD_KIND_WORDS.values())


def asked_span(analysis: Analysis) -> tuple[int, int, list[tuple[int, int]]]:
    """Where the asked clause is, less what only places it in time ("after the wrist fx") or says
    what it is for ("... for the colon ca", when the clause names something before "for")."""
    q = analysis.question
    start, end, skip = analysis.target, len(q), []
    anchored = ANCHOR.search(q, start)
    if anchored:
        skip.append(anchored.span(3))
    purpose = _PURPOSE.search(q, start)
    if purpose and any(t not in QUESTION_WORDS for t in content_tokens(q[start:purpose.start()])):
        end = purpose.start()
    return start, end, skip


def asked_words(analysis: Analysis) -> dict[str, list[str]]:
    """The words of the asked clause no concept covers that can only name a clinical thing, each
    with what would show it in the record: the word, and an abbreviation's long forms."""
    start, end, skip = asked_span(analysis)
    skip += [(c.get("start", 0), c.get("start", 0) + len(c.get("text", ""))) for c in analysis.concepts]
    residual = set(analysis.residual)
    found: dict[str, list[str]] = {}
    previous = ""
    for m in re.finditer(r"[a-z][a-z0-9'/-]*", analysis.question.lower()):
        word, before = m.group(0).strip("'-/"), previous
        previous = m.group(0)
        if not (start <= m.start() < end) or any(a <= m.start() < b for a, b in skip) \
                or not (word in residual or word in analysis.abbreviations) or set(word.split("-")) <= set(MONTHS):
            continue
        long_forms = analysis.abbreviations.get(word, [])
        if names_a_clinical_thing(word, abbreviation=bool(long_forms)):
            if before in residual and not is_phrasing(before) and is_clinical_word(before, qualifier=True):
                found[before] = [before]       # which one: a *renal* ultrasound
            spaced = re.sub(r"(?<=[a-z])(?=\d)", " ", word)
            written = [word, spaced] if not long_forms or re.fullmatch(r"[a-z0-9]+", word) else []   # "u/s": its long form
            # "right eye (oculus dexter)": the record may say either
            glossed = [part for form in long_forms for part in re.split(r"\s*[()]\s*", form) if part.strip()]
            found[word] = list(dict.fromkeys([*written, *glossed]))
    return found


# What about the thing a question wants ("which *side* was the CEA", "*size* and location of the
# stone"): the thing comes after these words, and a record may never write them.
ASKED_ABOUT = frozenset("side sides laterality location size extent".split())


def asked_head(analysis: Analysis) -> list[str]:
    """The thing asked, when no concept names anything the question asks: the first content word
    of the asked clause ("what did *pathology* say about the appendix", "is an *amputation*
    planned"), when clinical sources write it and it is no lay word (clinical_not_lay). The
    record never using it means the record cannot answer, however close a passage about the
    appendix or the foot comes."""
    if analysis.required_keys:
        return []
    start, end, skip = asked_span(analysis)
    residual = set(analysis.residual)
    for m in re.finditer(r"[a-z][a-z0-9'/-]*", analysis.question.lower()):
        word = m.group(0).strip("'-/")
        if not (start <= m.start() < end) or any(a <= m.start() < b for a, b in skip):
            continue
        if word in STOP_WORDS or word in QUESTION_WORDS or word in ASKED_ABOUT or is_phrasing(word) or len(word) < 4:
            continue
        # The first content word is the head; only one no concept covers can be required.
        return [word] if word in residual and word.isalpha() and clinical_not_lay(word) else []
    return []


def absent_words(backend: Backend, tenant: str, patient_id: str, analysis: Analysis) -> set[str]:
    """The question's clinical words this patient's record never uses, in any of their forms (a
    long form counts when each of its words is in the record)."""
    words = {w: forms for w, forms in ({w: [w] for w in clinical_residual(analysis)} | asked_words(analysis)
                                       | {w: [w] for w in asked_head(analysis)}).items()
             if not names_a_kind(w)}
    if not words:
        return set()
    probes = {w: [probe for probe in ([presence_prefix(t) for t in re.findall(r"[a-z0-9]{2,}", form.lower())
                                       if t not in STOP_WORDS] for form in forms) if probe]
              for w, forms in words.items()}
    wanted = sorted({t for forms in probes.values() for form in forms for t in form})
    present = backend.has_terms(tenant, patient_id, wanted, prefix=True)
    return {w for w, forms in probes.items() if not any(all(t in present for t in form) for form in forms)}


def analyse_with_record(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """The question read against the record's own terms (read once: the anchor stage uses them too),
    and how much of the record is still searchable by its words only."""
    summary = tools.backend.get_patient(state.tenant, state.patient_id) or {}
    state.terms, state.vectors_pending = terms_of(summary), int(summary.get("vectors_pending") or 0)
    return analyse_question(state, tools)


def anchor_in_time(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """"At the sore-throat visit", "the last three": the window and the count the question means."""
    analysis = state.analysis
    found = anchor(tools.backend, state.scope, state.question, state.terms,
                   explicit=bool(analysis.date_from or analysis.date_to)) if state.corpus else None
    if found and found.missing:
        analysis.unplaced = found.missing
    elif found:
        analysis.date_from, analysis.date_to = found.date_from, found.date_to
    state.k = max(state.k, analysis.last_n)
    return state.corpus, found.note if found else ""


def narrow_scope(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.scope, why = filter_scope(tools.backend, state.scope, state.analysis)
    return (tools.backend.count(state.scope) if why != "none" else state.corpus), why


def _recalled(state: RetrievalState) -> int:
    return len({h.chunk_id for h in state.dense_hits} | {h.chunk_id for h in state.lexical_hits})


def recall_dense(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.dense_hits = tools.backend.search_vector(state.scope, tools.embedder.encode_query(state.question), RECALL_N)
    return _recalled(state), ""


def recall_hybrid(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    recall_dense(state, tools)
    state.lexical_hits = tools.backend.search_text(state.scope, " ".join(state.analysis.terms), RECALL_N)
    return _recalled(state), ""


def recall_expanded(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Both recalls with the question's concepts and their synonyms added, and the recovery
    stage's searches with them: one round trip to a networked backend instead of four."""
    analysis = state.analysis
    dense_text = f"{state.question} {' '.join(analysis.names + analysis.expansions)}".strip()
    searches = [Search("vector", state.scope, tools.embedder.encode_query(dense_text), RECALL_N),
                Search("text", state.scope, expanded_query(analysis), RECALL_N)] + recovery_searches(state)
    results = tools.backend.search_many(searches)
    state.dense_hits, state.lexical_hits = results[0], results[1]
    state.recovery_hits = [h for hits in results[2:] for h in hits]
    return _recalled(state), ""


def recovery_searches(state: RetrievalState) -> list[Search]:
    """Chunks asserting the question's concepts; for "her most recent note" without one, the newest."""
    analysis = state.analysis
    searches = [Search("concepts", state.scope, sorted(analysis.keys), RECOVERY_N)]
    if analysis.wants_latest and not analysis.keys:
        searches.append(Search("latest", state.scope, None, 10))
    return searches


def chunks_of(state: RetrievalState, tools: Tools, ids: list[str]) -> dict[str, Chunk]:
    """Chunks by id, read once per question."""
    missing = [c for c in ids if c not in state.chunk_cache]
    state.chunk_cache.update({c.chunk_id: c for c in tools.backend.get_chunks(state.tenant, missing)})
    return {c: state.chunk_cache[c] for c in ids if c in state.chunk_cache}


def _evidence(state: RetrievalState, tools: Tools, fused: dict[str, float]) -> tuple[int, str]:
    dense_scores = {h.chunk_id: h.score for h in state.dense_hits}
    dense_rank = {h.chunk_id: i for i, h in enumerate(state.dense_hits)}
    lexical_rank = {h.chunk_id: i for i, h in enumerate(state.lexical_hits)}
    ids = sorted(fused, key=lambda c: (-fused[c], c))
    # The recovery stage's chunks come in the same read (one mget, not two).
    prefetch = [h.chunk_id for h in state.recovery_hits or [] if h.chunk_id not in fused]
    chunks = chunks_of(state, tools, ids + list(dict.fromkeys(prefetch)))
    state.evidence = [Evidence(chunks[c], fused[c], dense_scores.get(c), lexical_rank.get(c), dense_rank.get(c))
                      for c in ids if c in chunks]
    return len(state.evidence), ""


def fuse_dense(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    return _evidence(state, tools, {h.chunk_id: h.score for h in state.dense_hits})


def fuse_rrf(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    return _evidence(state, tools, rrf(state.lexical_hits, state.dense_hits))


def recover_concepts(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Chunks that assert a concept of the question but neither recall found."""
    have = {ev.chunk.chunk_id for ev in state.evidence}
    hits = state.recovery_hits
    if hits is None:
        hits = [h for found in tools.backend.search_many(recovery_searches(state)) for h in found]
    missed = list(dict.fromkeys(h.chunk_id for h in hits if h.chunk_id not in have))
    floor = min((ev.score for ev in state.evidence), default=0.0)
    chunks = chunks_of(state, tools, missed)
    state.evidence += [Evidence(chunks[c], floor, recovered=True) for c in missed if c in chunks]
    return len(state.evidence), f"+{len(missed)}"


def keep_candidates(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.candidates = list(state.evidence)
    return len(state.evidence), ""


def name_visits(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """The encounters the question names ("the sore-throat visit"), for the rerank and the answer."""
    state.analysis.visit_refs = visits_named(tools.backend, state.scope, state.analysis)
    return len(state.evidence), ""


def rerank_features(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.evidence = rerank(state.evidence, state.analysis, tools.reranker)
    return len(state.evidence), f"cross-encoder {tools.reranker.name}" if tools.reranker else "features"


def select_top_k(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    state.evidence = select(state.evidence, state.k, by_fact=False)
    return len(state.evidence), ""


def select_facts(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Top-k by fact; lists and histories prefer facts not yet covered."""
    analysis = state.analysis
    per_note = NOTE_SHARE if spans_notes(analysis) else 0
    state.evidence = select(state.evidence, state.k, diverse=analysis.wants_list or analysis.wants_ever,
                            per_note=per_note)
    return len(state.evidence), f"at most {per_note} chunks a note" if per_note else ""


# A question that compares across notes ("the 2008 duplex vs at surgery") keeps room in its evidence for other notes: a long note is cut into many chunks
# that all rank well for its topic, and the other note's answering chunk fell below the top k.
NOTE_SHARE = 2
ACROSS = re.compile(r"\b(and then|then and now|at follow-?up|second|both|each time|,? and (?:what|which|how|when|where|why))\b",
                    re.I)


def spans_notes(analysis: Analysis) -> bool:
    """The question asks across several notes: it compares (two years, "vs", "then and now",
    "first ... second") or asks two things at once. A list ("what meds did she go home on") is
    often one note's section, and cutting that note cut the list."""
    q = analysis.question
    return analysis.wants_trend or len(years_named(q)) > 1 or bool(ACROSS.search(q))


HISTORY_N = 200       # orders of one drug read to fold its history (decades of monthly refills)


def gather_histories(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """Every order, in the whole record, of the drugs the selected evidence names (by the record's
    own drug codes and ingredients), so "still on", "first rx" and "latest" are answered over the drug's whole
    history and not over the few orders that ranked well."""
    codes = sorted({c["key"] for ev in state.evidence if ev.chunk.semantic_type == "medication"
                    for c in ev.chunk.concepts
                    if c.get("semantic_type") == "medication" and not c.get("negated")
                    and (c.get("role") == "member" or not c["key"].startswith("lex:"))})
    every = state.analysis.asks_every_medication
    if not codes and not every:
        return len(state.evidence), ""
    scope = Scope(state.tenant, state.patient_id, semantic_types=("medication",))
    # Asked for the medication list, the newest orders of the whole record too: an active order
    # that did not rank still answers "what is she on?".
    searches = ([Search("concepts", scope, codes, HISTORY_N)] if codes else []) + (
        [Search("latest", scope, None, HISTORY_N)] if every else [])
    hits = list({h.chunk_id: h for found in tools.backend.search_many(searches) for h in found}.values())
    chunks = chunks_of(state, tools, [h.chunk_id for h in hits])
    state.histories = [Evidence(chunks[h.chunk_id], 0.0) for h in hits if h.chunk_id in chunks]
    several = bool(SEVERAL_TIMES.search(state.question)) or state.analysis.wants_ever or state.analysis.wants_list
    state.evidence = with_defining_orders(state.evidence, state.histories, state.analysis.wants_first, keep=several)
    return len(state.evidence), f"{len(state.histories)} orders of {len(codes)} drug codes" + (
        " and the newest of the record" if every else "")


SERIES_N = 500        # results of one asked test read to find its end (decades of monthly weights)
RESULT_TYPES = ("lab", "vital", "social", "survey", "exam", "observation")


def is_result_of(chunk: Chunk, key: str) -> bool:
    """A single result (not a trend summary) asserting the concept."""
    return chunk.resource_type == "Observation" and chunk.category != "trend" and key in asserted_keys(chunk.concepts)


def gather_series(state: RetrievalState, tools: Tools) -> tuple[int, str]:
    """For "latest" (or "first") of a test the selected evidence answers with results: the ends of
    that test's series over the whole record, in the place of the results that ranked. A long
    series of equal values ranks its dates at random; the answer must rest on its newest (and the
    one before it, which it states beside it) or its oldest, however many results there are."""
    analysis = state.analysis
    if not (analysis.wants_latest or analysis.wants_first) or analysis.wants_trend or analysis.last_n:
        return len(state.evidence), ""
    # The test the answer rests on: the first ranked result asserting an asked concept. One asked
    # word may be a broader concept several tests assert ("K+" is an electrolyte, as sodium is).
    top = next((ev.chunk for ev in state.evidence if any(is_result_of(ev.chunk, k) for k in analysis.keys)), None)
    if top is None:
        return len(state.evidence), ""
    asked = [key for key in sorted(analysis.keys) if is_result_of(top, key)][:1]
    wanted = state.scope.semantic_types
    scope = replace(state.scope, semantic_types=tuple(t for t in RESULT_TYPES if not wanted or t in wanted))
    found = tools.backend.search_many([Search("concepts", scope, [key], SERIES_N) for key in asked])
    chunks = chunks_of(state, tools, list(dict.fromkeys(h.chunk_id for hits in found for h in hits)))
    read = 0
    for key, hits in zip(asked, found):
        results = [chunks[h.chunk_id] for h in hits if h.chunk_id in chunks]
        # Within the window the question names ("latest A1c in 2022"), when the filter was widened.
        windowed = analysis.date_from or analysis.date_to
        series = sorted((c for c in results if is_result_of(c, key) and same_test(c, top)
                         and (not windowed or in_window(c, analysis))),
                        key=lambda c: (c.date, c.chunk_id))
        read += len(series)
        state.evidence = with_series_ends(state.evidence, key, series_ends(series, analysis.wants_first))
    return len(state.evidence), f"{read} results of {len(asked)} asked tests"


def same_test(chunk: Chunk, top: Chunk) -> bool:
    """A result of the top result's own test: a coding in common, or (where neither is coded) its name."""
    codes = {(c.get("system"), c.get("code")) for c in top.codes if c.get("code")}
    if codes:
        return any((c.get("system"), c.get("code")) in codes for c in chunk.codes)
    return not any(c.get("code") for c in chunk.codes) and chunk.label.partition(" on ")[0] == top.label.partition(" on ")[0]


def series_ends(series: list[Chunk], first: bool) -> list[Chunk]:
    """The newest result and the newest of an earlier day; for "first", the oldest and the newest."""
    if not series:
        return []
    newest = series[-1]
    if first:
        return [series[0]] + ([newest] if newest.chunk_id != series[0].chunk_id else [])
    before = [c for c in series if c.date[:10] < newest.date[:10]]
    return [newest] + before[-1:]


def with_series_ends(evidence: list[Evidence], key: str, ends: list[Chunk]) -> list[Evidence]:
    """`ends` where the first result of the test stood, taking its score; results of the test that
    are not an end give up their places, from the last, so that the evidence grows only when it
    held too few of them (the k passages an answer may rest on stay k)."""
    ends_ids = {c.chunk_id for c in ends}
    at = next(i for i, ev in enumerate(evidence) if is_result_of(ev.chunk, key))
    if [ev.chunk.chunk_id for ev in evidence[at:at + len(ends)]] == [c.chunk_id for c in ends]:
        return evidence
    # The ends in their order (newest, then the one before it) where the first result stood,
    # moved from wherever they ranked.
    before = [ev for ev in evidence[:at] if ev.chunk.chunk_id not in ends_ids]
    after = [ev for ev in evidence[at:] if ev.chunk.chunk_id not in ends_ids]
    out = before + [Evidence(c, evidence[at].score) for c in ends] + after
    for i in range(len(out) - 1, -1, -1):
        if len(out) <= len(evidence):
            break
        if is_result_of(out[i].chunk, key) and out[i].chunk.chunk_id not in ends_ids:
            del out[i]
    return out


SEVERAL_TIMES = re.compile(r"\b(both|each|every|times|all the)\b", re.I)


def with_defining_orders(evidence: list[Evidence], histories: list[Evidence], first: bool,
                         keep: bool = False) -> list[Evidence]:
    """Each drug's newest order (its oldest, for "first rx") in the place of the order of it that
    ranked: that is the order the answer rests on. The one it replaces goes to the end, unless the
    question asks about several of them ("same drug both times?"): then it stays after it."""
    have = {ev.chunk.chunk_id for ev in evidence}
    out, replaced = [], []
    for ev in evidence:
        if ev.chunk.semantic_type == "medication":
            codes = {c["key"] for c in ev.chunk.concepts if c.get("semantic_type") == "medication"
                     and not c["key"].startswith("lex:")}
            same = [h for h in histories if codes & {c["key"] for c in h.chunk.concepts}]
            pick = (min if first else max)(same, key=lambda h: h.chunk.date) if same else ev
            if pick.chunk.chunk_id not in have:
                have.add(pick.chunk.chunk_id)
                out.append(replace(pick, score=ev.score))
                if not keep:
                    replaced.append(ev)
                    continue
        out.append(ev)
    return out + replaced


# --- the pipelines: lists of stages -----------------------------------------------------------------------

SCOPE = Stage("scope", count_scope, whole_record=True)
CANDIDATES = Stage("candidates", keep_candidates, reported=False)
STAGES = {
    "dense": [SCOPE, Stage("analyse", analyse_question, whole_record=True), Stage("recall", recall_dense),
              Stage("fuse", fuse_dense), CANDIDATES, Stage("select", select_top_k)],
    "hybrid": [SCOPE, Stage("analyse", analyse_question, whole_record=True), Stage("recall", recall_hybrid),
               Stage("fuse", fuse_rrf), CANDIDATES, Stage("select", select_top_k)],
    "full": [SCOPE, Stage("analyse", analyse_with_record, whole_record=True),
             Stage("anchor", anchor_in_time, whole_record=True), Stage("filter", narrow_scope, whole_record=True),
             Stage("recall", recall_expanded), Stage("fuse", fuse_rrf), Stage("recovery", recover_concepts),
             CANDIDATES, Stage("visits", name_visits, reported=False), Stage("rerank", rerank_features),
             Stage("select", select_facts), Stage("series", gather_series),
             Stage("histories", gather_histories)],
}


def pipeline_stages(pipeline: str, ablate: tuple[str, ...] = ()) -> list[Stage]:
    """The stages of a pipeline; ablating removes stages by name."""
    if pipeline not in STAGES:
        raise ValueError(f"unknown pipeline {pipeline!r}; choose one of {', '.join(PIPELINES)}")
    unknown = set(ablate) - set(ABLATABLE)
    if unknown:
        raise ValueError(f"cannot ablate {', '.join(sorted(unknown))}; choose from {', '.join(ABLATABLE)}")
    return [stage for stage in STAGES[pipeline] if stage.name not in ablate]


def retrieve(backend: Backend, embedder: Embedder, question: str, tenant: str, patient_id: str,
             k: int = 5, pipeline: str = "full", ablate: tuple[str, ...] = (),
             reranker: CrossEncoderRanker | None = None) -> Retrieval:
    stages = pipeline_stages(pipeline, ablate)
    state = RetrievalState(question, tenant, patient_id, k, Scope(tenant, patient_id))
    reports = run_stages(stages, state, Tools(backend, embedder, reranker))
    return Retrieval(question, pipeline, state.analysis, state.evidence, reports, state.corpus, state.scope,
                     state.candidates, state.absent, state.histories, state.ranked_after, state.vectors_pending)

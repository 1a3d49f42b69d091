"""The types retrieval passes along: the question's analysis, a piece of evidence, a stage's report,
the retrieval's result, and what flows between stages (the state, the tools, a stage). Answering
imports them from here, not from the pipeline."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from fhir_ingest.record.contract import Chunk
from search.nlp.annotate import RecordTerm
from search.backends.base import Backend, Hit, Scope
from search.models.crossrank import CrossEncoderRanker
from search.models.embed import Embedder
from search.nlp.lexicon import tokens
from search.retrieval.dates import MONTHS


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


# --- what flows between stages -----------------------------------------------------------------------------------

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


def state_fields(names: str) -> frozenset[str]:
    """"analysis evidence k" -> the RetrievalState fields so named (a stage's reads or writes)."""
    fields = frozenset(names.split())
    unknown = fields - set(RetrievalState.__dataclass_fields__)
    if unknown:
        raise ValueError(f"not fields of the retrieval state: {sorted(unknown)}")
    return fields


@dataclass(frozen=True)
class Stage:
    """A named step: `run` changes the state and returns (chunks out, note). A `whole_record` stage
    looks at the patient's whole record (its input is the corpus); the others take what the stage
    before them passed on. An unreported step is bookkeeping, not a stage of the table.

    `reads` and `writes` declare which fields of the state the step reads and which it sets or
    changes (a list appended to, the analysis amended), so the wiring of a pipeline is read from its
    stage list; tests/test_stages.py reads each step's source and fails when it touches a field it
    does not declare, or declares one it never touches."""
    name: str
    run: Callable[[RetrievalState, Tools], tuple[int, str]]
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    whole_record: bool = False
    reported: bool = True

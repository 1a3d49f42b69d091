"""The question plan: what each question asks for, over which stretch of time, and what to do
with what the record holds of it.

"how many bmps since dec 2023", "# of ED visits in the last year", "how long was she in for the
transplant", "dose change on lisinopril?" ask for arithmetic over the record, not for the few
passages that ranked best. The plan names, for the question:

- the *target*: the concepts asked about, a class of record ("prescriptions"), or a class of
  visit (emergency, inpatient, ambulatory, home health) from Encounter.class;
- the *window*: absolute ("since dec 2023", "in 2024"), relative to today ("since last month",
  "in the last year", "this yr", "until 12 months ago") or anchored on one of the patient's
  events ("after the acl surgery", found by the retrieval's anchor stage);
- the *operation*: list, latest, first, count, exists, duration, change or compare.

`today` is always passed in: production passes the clock's date, tests and evaluation sets a
fixed one, so "the last year" means the same year on every run.
"""
from __future__ import annotations

import calendar
import re
from dataclasses import asdict, dataclass, field
from datetime import date, timedelta

from search.nlp import terminology
from search.retrieval.analysis import TREND
from search.retrieval.timeline import NUMBERS, back_from, number

OPERATIONS = ("list", "latest", "first", "count", "exists", "duration", "change", "compare")
# The operations that need every item of the target in the window, not the passages that ranked.
ARITHMETIC = frozenset({"count", "duration", "change", "compare"})

# Encounter.class codes a clinician names in words, and how the answer says each.
VISIT_CLASSES = {
    "emergency": (("EMER",), re.compile(r"\b(ed|er|a&e|emergency(?: room| department| dept)?|emerg)\b", re.I)),
    "inpatient": (("IMP", "ACUTE", "NONAC"), re.compile(
        r"\b(inpatient|inpt|admissions?|admitted|hospitali[sz]ations?|hospital stays?|in-?hospital)\b", re.I)),
    "home health": (("HH",), re.compile(r"\b(home health|home visits?|home care|home nursing)\b", re.I)),
    "virtual": (("VR",), re.compile(r"\b(virtual|telehealth|telemedicine|video visits?)\b", re.I)),
    "ambulatory": (("AMB",), re.compile(r"\b(ambulatory|outpatient|office visits?|clinic visits?|wellness visits?)\b",
                                        re.I)),
}
VISIT_WORDS = re.compile(r"\b(visits?|encounters?|admissions?|admitted|stays?|hospitali[sz]ations?|appointments?|"
                         r"appts?|trips?|seen|went|been)\b", re.I)

COUNT = re.compile(r"\b(how many|how often|number of|no\. of|count of|times)\b|#\s*(?:of\s+)?\w|\bhow much\b(?= \w+ visits)",
                   re.I)
DURATION = re.compile(r"\b(how long (?:was|were|did) (?:she|he|they|the patient|pt)\b(?! on\b)|"
                      r"how long (?:was|were) (?:the|her|his|their) (?:\w+ ){0,3}(?:stays?|admissions?|"
                      r"hospitali[sz]ations?|visits?)\b|length of stay|\blos\b|"
                      r"how many days\b(?! (?:of|did|has|had|does|was (?:she|he|they) (?:on|taking)))|when did (?:she|he|they|the patient|pt) (?:get|go|come) home|"
                      r"discharged? (?:date|when)|when (?:was|were) (?:she|he|they|the patient|pt) discharged)", re.I)
CHANGE = re.compile(r"\b(dose changes?|dosing changes?|changed? (?:the |her |his |their )?dose|dose (?:went|was) "
                    r"(?:up|down)|titrat\w*|increased|decreased|uptitrat\w*|downtitrat\w*|reduced|tapered|"
                    r"changes? (?:to|in|on) (?:the |her |his |their )?(?:dose|dosing|\w+ dose))\b", re.I)
COMPARE = re.compile(r"\b(better or worse|worse or better|better|worse|compared? (?:to|with)|vs\.?|versus|"
                     r"than (?:in|last|the)?\s*(?:19|20)\d\d)\b", re.I)
# "a1c now vs last year": the period compared with is the last calendar year (a window phrase,
# taken off before the operation is read, so looked for in the question as asked).
LAST_YEAR = re.compile(r"\b(?:last|previous)\s+(?:year|yr)\b", re.I)
LATEST = re.compile(r"\b(latest|last|most recent|newest|recent)\b", re.I)
FIRST = re.compile(r"\b(first|earliest|initial|oldest)\b", re.I)
EXISTS = re.compile(r"^\s*(?:any|is|was|are|were|does|did|do|has|have|had|ever)\b", re.I)
WHERE = re.compile(r"\b(which|what) (hospital|facility|clinic|organi[sz]ation|provider|place|location|site)\b|\bwhere\b",
                   re.I)

# How a count names the items of a class of record.
CLASS_ITEMS = {"medication": "medication records", "procedure": "procedures", "lab": "lab results",
               "vital": "vital signs", "order": "orders", "careplan": "care plans", "goal": "goals",
               "coverage": "coverage records", "family-history": "family history entries"}

_N = r"(\d{1,3}|" + "|".join(NUMBERS) + r"|a|an|one)"
_UNIT = r"(day|week|month|year|yr|mo|wk)s?"


@dataclass(frozen=True)
class Window:
    """An inclusive ISO window ('' = open) and how the answer names it ("since 2023-12-01")."""
    start: str = ""
    end: str = ""
    words: str = ""
    source: str = ""          # absolute | today | event | record

    def holds(self, day: str) -> bool:
        day = (day or "")[:10]
        if not day:
            return False
        return (not self.start or day >= self.start) and (not self.end or day <= self.end)

    @property
    def open(self) -> bool:
        return not (self.start or self.end)


ALL_TIME = Window()


@dataclass(frozen=True)
class Target:
    """What a part asks about: concept keys, a class of record, or a class of visit."""
    kind: str                                  # concept | class | visit
    words: str                                 # how the answer names it ("basic metabolic panels")
    keys: tuple[str, ...] = ()                 # concept keys the items must assert
    semantic_types: tuple[str, ...] = ()       # kinds of record the items may be
    visit_class: str = ""                      # emergency | inpatient | home health | virtual | ambulatory
    visit_codes: tuple[str, ...] = ()          # its Encounter.class codes
    event_word: str = ""                       # a class named by an event one is admitted for ("the transplant")


@dataclass(frozen=True)
class PlanPart:
    operation: str
    target: Target
    window: Window = ALL_TIME
    compare_with: Window | None = None         # compare: the other period
    where: bool = False                        # the question asks where (hospital, organisation)
    trend: bool = False                        # it asks how something moved ("changed over the last 3 years"):
                                               # the trend answer states every value, the window its span

    @property
    def arithmetic(self) -> bool:
        """Answered by the operation rather than by the passages that ranked: a count, a stay, a
        change, two periods, a window counted from today, where a visit was, or the latest or
        first visit of a class ("reason for the last ED visit": that one visit, not every
        admission the ranking found). A plain list, latest or first of a concept within written
        dates is what the retrieval's answer already states."""
        return self.operation in ARITHMETIC or (self.window.source == "today" and not self.trend) or self.where or (
            self.target.visit_codes != () and self.operation in ("latest", "first"))


@dataclass(frozen=True)
class QuestionPlan:
    question: str
    today: str
    parts: tuple[PlanPart, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


# --- windows relative to today ---------------------------------------------------------------------

def _count(word: str) -> int:
    word = word.lower()
    return 1 if word in ("a", "an", "one") else number(word)


def _unit(word: str) -> str:
    word = word.lower().rstrip("s")
    return {"yr": "year", "mo": "month", "wk": "week"}.get(word, word)


def month_start(day: date, back: int = 0) -> date:
    months = day.year * 12 + day.month - 1 - back
    return date(months // 12, months % 12 + 1, 1)


def month_end(day: date) -> date:
    return date(day.year, day.month, calendar.monthrange(day.year, day.month)[1])


# Each phrase, in the order tried, with the window it means counted from `today`.
def _until_ago(m, today):
    end = back_from(today, _count(m.group(1)), _unit(m.group(2)))
    return "", end.isoformat(), f"until {end.isoformat()}"


def _last_n(m, today):
    start = back_from(today, _count(m.group(1)), _unit(m.group(2)))
    return start.isoformat(), today.isoformat(), f"since {start.isoformat()}"


def _since_last(m, today):
    unit = _unit(m.group(1))
    start = month_start(today, 1) if unit == "month" else date(today.year - 1, 1, 1) if unit == "year" \
        else today - timedelta(days=today.weekday() + 7)
    return start.isoformat(), today.isoformat(), f"since {start.isoformat()}"


def _this(m, today):
    unit = _unit(m.group(1))
    start = date(today.year, 1, 1) if unit == "year" else month_start(today) if unit == "month" \
        else today - timedelta(days=today.weekday())
    return start.isoformat(), today.isoformat(), f"since {start.isoformat()}"


def _previous(m, today):
    unit = _unit(m.group(1))
    if unit == "year":
        return f"{today.year - 1}-01-01", f"{today.year - 1}-12-31", f"in {today.year - 1}"
    if unit == "month":
        start = month_start(today, 1)
        return start.isoformat(), month_end(start).isoformat(), f"in {calendar.month_name[start.month]} {start.year}"
    start = today - timedelta(days=today.weekday() + 7)
    return start.isoformat(), (start + timedelta(days=6)).isoformat(), f"the week of {start.isoformat()}"


def _ago(m, today):
    start = back_from(today, _count(m.group(1)), _unit(m.group(2)))
    return start.isoformat(), today.isoformat(), f"since {start.isoformat()}"


RELATIVE_TO_TODAY = (
    (re.compile(rf"\b(?:until|till|up to|before|prior to)\s+{_N}\s+{_UNIT}\s+ago\b", re.I), _until_ago),
    (re.compile(rf"\b(?:in|over|during|within|for)?\s*(?:the\s+)?(?:last|past|previous|prior)\s+{_N}\s+{_UNIT}\b", re.I),
     _last_n),
    (re.compile(rf"\b(?:in|over|during|within)\s+the\s+(?:last|past)\s+{_UNIT}\b", re.I),
     lambda m, t: _last_n(_Fixed("1", m.group(1)), t)),
    (re.compile(r"\bsince\s+last\s+(month|year|yr|week|wk)\b", re.I), _since_last),
    (re.compile(r"\bthis\s+(year|yr|month|week)\b", re.I), _this),
    (re.compile(r"\b(?:last|previous)\s+(year|yr|month|week)\b", re.I), _previous),
    (re.compile(rf"\b(?:since|from)\s+{_N}\s+{_UNIT}\s+ago\b", re.I), _ago),
)


class _Fixed:
    """A match stand-in for a phrase that leaves its count unsaid ("in the last year" is one year)."""
    def __init__(self, *groups: str):
        self.groups = groups

    def group(self, i: int) -> str:
        return self.groups[i - 1]


def window_from_today(question: str, today: date) -> Window | None:
    """"since last month", "in the last year", "this yr", "until 12 months ago", "last 6 months"."""
    for pattern, meaning in RELATIVE_TO_TODAY:
        m = pattern.search(question)
        if m:
            start, end, words = meaning(m, today)
            return Window(start, end, words, "today")
    return None


def window_of(question: str, today: date, analysis_from: str = "", analysis_to: str = "",
              anchored: bool = False) -> Window:
    """The part's window: relative to today when the question says so; else the dates the
    question writes or the event it is anchored on (read by the retrieval's analysis and anchor)."""
    relative = window_from_today(question, today)
    if relative is not None:
        return relative
    if analysis_from or analysis_to:
        words = (f"between {analysis_from} and {analysis_to}" if analysis_from and analysis_to and analysis_from != analysis_to
                 else f"on {analysis_from}" if analysis_from and analysis_from == analysis_to
                 else f"since {analysis_from}" if analysis_from else f"until {analysis_to}")
        return Window(analysis_from, analysis_to, words, "event" if anchored else "absolute")
    return ALL_TIME


# --- the operation and the target ------------------------------------------------------------------

def without_window(question: str) -> str:
    """The question less its window relative to today: "since last month" asks for no latest."""
    for pattern, _ in RELATIVE_TO_TODAY:
        question = pattern.sub(" ", question)
    return question


def sig_asked(question: str, target: Target) -> bool:
    """"How often is albuterol given?": of a drug, "how often" asks the order's frequency, which the
    order's sentence states, not how many records there are ("how many times" still counts)."""
    counted = {m.group(0).lower() for m in COUNT.finditer(question)}
    return counted == {"how often"} and target.semantic_types == ("medication",)


def operation_of(question: str, target: Target) -> str:
    """What to do with the target's items, from the question's words; the arithmetic first, as
    "how many times since the first one" is a count."""
    asked, question = question, without_window(question).strip(" ,;")
    if DURATION.search(question) and (target.kind == "visit" or target.keys or target.event_word):
        return "duration"      # a stay of a class of visit, or the stay that holds a named event
    if COUNT.search(question) and not sig_asked(question, target):
        return "count"
    if CHANGE.search(question) and target.kind == "concept":
        return "change"
    if COMPARE.search(question) and (re.search(r"\b(?:19|20)\d\d\b", question) or LAST_YEAR.search(asked)) \
            and target.kind == "concept" and not re.search(r"\b(prior|previous|earlier|past|before)\b", question, re.I):
        return "compare"
    if FIRST.search(question):
        return "first"
    if LATEST.search(question):
        return "latest"
    if EXISTS.search(question):
        return "exists"
    return "list"


def visit_class_of(question: str) -> tuple[str, tuple[str, ...]]:
    for name, (codes, words) in VISIT_CLASSES.items():
        if words.search(question):
            return name, codes
    return "", ()


# Kinds of record that are also events a stay is for: "how long was she in for the transplant"
# names no coded procedure, only the kind; the stay is the visit that says it or holds one.
EVENT_KIND = re.compile(r"\b(transplant|surgery|operation)(?:s|ed)?\b", re.I)
NOTE_WORDS = re.compile(r"\b(notes?|documented|says?|said|presented with|complaints?|hpi|chief complaint)\b", re.I)


def target_of(question: str, concepts: list[dict], kinds: tuple[str, ...]) -> Target | None:
    """The concepts asked about (not context, not a class they were recognised through: "labs from
    the ED visit" asks for labs, the visit only says when); else a class of visit named with a
    visit word ("ED visits", "home health visits", "admissions") or the kinds of visit the
    question names; else a kind of record it names ("prescriptions"). None: nothing to operate on
    (a note's words, a drug class counted by its members, which the listing names)."""
    if NOTE_WORDS.search(question):
        return None
    asked = [c for c in concepts if c.get("role") not in ("context",) and c["semantic_type"] not in ("note",)]
    things = one_reading_each([c for c in asked if c["semantic_type"] != "encounter"
                               and c.get("role") not in ("class", "record")])
    if not things and any(c.get("role") == "class" for c in asked):
        return None
    if any(c["semantic_type"] == "medication" and terminology.members_of(c["display"]) for c in things):
        return None       # "how many beta blockers is he on": the class listing names each member, old orders flagged
    visits = [c for c in asked if c["semantic_type"] == "encounter"]
    named_class, codes = visit_class_of(question)
    if things and VISIT_WORDS.search(question) and not named_class:
        # "substance use f/u visits": visits for a problem, counted by the visits that name it.
        return Target("visit", f"visits for {', '.join(c['display'] for c in things)}",
                      keys=tuple(k for c in things for k in keys_of(c)), semantic_types=("encounter",))
    if things:
        words = ", ".join(dict.fromkeys(c["display"] for c in things))
        keys = [key for c in things for key in keys_of(c)]
        return Target("concept", plural_words(words), keys=tuple(dict.fromkeys(keys)),
                      semantic_types=tuple(dict.fromkeys(c["semantic_type"] for c in things)))
    if named_class and (VISIT_WORDS.search(question) or named_class in ("emergency", "inpatient", "home health")):
        return Target("visit", f"{named_class} visits", visit_class=named_class, visit_codes=codes,
                      semantic_types=("encounter",))
    if visits or (VISIT_WORDS.search(question) and COUNT.search(question)):
        named = ", ".join(c["display"] for c in visits)
        return Target("visit", (named if re.search(r"visits?$", named) else f"{named} visits") if named else "visits",
                      keys=tuple(c["key"] for c in visits), semantic_types=("encounter",))
    if kinds:
        event = EVENT_KIND.search(question)
        return Target("class", " and ".join(CLASS_ITEMS.get(k, k) for k in kinds), semantic_types=tuple(kinds),
                      event_word=event.group(1).lower() if event else "")
    return None


def keys_of(concept: dict) -> list[str]:
    """The keys an item of the concept asserts: a panel named by its group ("bmp") is each of the
    group's panel codes, as the panel reports are coded; anything else its own key."""
    panels = terminology.panel_codes(concept["display"]) if concept["semantic_type"] == "lab" else frozenset()
    return [f"http://loinc.org|{code}" for code in sorted(panels)] or [concept["key"]]


TAG = re.compile(r"\s*\((?:disorder|finding|procedure|situation|regime/therapy|qualifier value|observable entity)\)", re.I)


def plural_words(words: str) -> str:
    """How a count names its items: "basic metabolic panels", "HbA1c results"; a coded name's
    semantic tag ("(regime/therapy)") is the code system's, not the clinician's."""
    words = TAG.sub("", words)
    if words.endswith("panel"):
        return words + "s"
    return words


def one_reading_each(concepts: list[dict]) -> list[dict]:
    """Of the readings of one abbreviation ("bmps": basic metabolic panel, or bone morphogenetic
    protein read as protein), those that name the long form itself; a count over both would count
    another test's results."""
    by_word: dict[str, list[dict]] = {}
    for c in concepts:
        by_word.setdefault((c.get("text") or c["key"]).lower(), []).append(c)
    kept = []
    for readings in by_word.values():
        exact = [c for c in readings if c.get("via") and c["display"].lower() == c["via"].lower()]
        kept += exact if exact and len(exact) < len(readings) else readings
    return kept


def plan_question(question: str, today: date, concepts: list[dict], kinds: tuple[str, ...] = (),
                  date_from: str = "", date_to: str = "", anchored: bool = False) -> QuestionPlan:
    """The plan of one question part from what the retrieval's analysis read of it."""
    target = target_of(question, concepts, kinds)
    if target is None:
        return QuestionPlan(question, today.isoformat())
    operation = operation_of(question, target)
    window = window_of(question, today, date_from, date_to, anchored)
    compare_with = None
    if operation == "compare":
        window, compare_with = compared_windows(question, today)
    return QuestionPlan(question, today.isoformat(),
                        (PlanPart(operation, target, window, compare_with, bool(WHERE.search(question)),
                                  bool(TREND.search(question))),))


def compared_windows(question: str, today: date) -> tuple[Window, Window]:
    """"better or worse than 2024?": since the end of the named year against that year; two years
    named ("2023 vs 2024"): the later against the earlier; "now vs last year": this year against
    the last."""
    years = sorted({int(y) for y in re.findall(r"\b((?:19|20)\d\d)\b", question)}) or [today.year - 1]
    earlier = years[0]
    before = Window(f"{earlier}-01-01", f"{earlier}-12-31", f"in {earlier}", "absolute")
    if len(years) > 1:
        later = years[-1]
        return Window(f"{later}-01-01", f"{later}-12-31", f"in {later}", "absolute"), before
    return Window(f"{earlier + 1}-01-01", today.isoformat(), f"since {earlier + 1}-01-01", "absolute"), before

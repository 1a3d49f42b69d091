"""The plan's operations, executed over the typed facts of every item of the target.

One mechanism reads the items: every chunk of the record that asserts the target's concepts (or is
of its class, or a visit of its Encounter.class), read to `READ_ALL` like the class listing and
the order histories, one item per resource, trends and panels' summaries left out. The window is
applied to them before anything is stated, so an item outside it is never said to be inside; a
count is stated in the first sentence with every counted item cited ([1]–[11]), the evidence
list holding them all however long the list.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date

from search.answering.plan import PlanPart, Target, Window, plan_question
from search.answering.types import Answer, Citation, EvidenceItem, Statement
from search.backends.base import Backend, Scope
from search.nlp.annotate import asserted_keys
from search.retrieval.types import Evidence

READ_ALL = 500           # items of one target read (decades of monthly visits or refills)
LISTED = 8               # items a sentence names; the evidence list holds the rest, counted
CLASS_WORDS = {"EMER": "emergency", "IMP": "inpatient", "ACUTE": "inpatient", "NONAC": "inpatient",
               "AMB": "ambulatory", "HH": "home health", "VR": "virtual", "OBSENC": "observation"}


@dataclass(frozen=True)
class Item:
    """One item of the target: its chunk (for the citation) and its typed fact."""
    evidence: Evidence

    @property
    def chunk(self):
        return self.evidence.chunk

    @property
    def day(self) -> str:
        return (self.chunk.date or "")[:10]

    @property
    def fact(self) -> dict:
        return self.chunk.fact or {}


# --- reading the items --------------------------------------------------------------------------------

def read_items(backend: Backend, tenant: str, patient_id: str, target: Target) -> list[Item]:
    """Every item of the target in the whole record, newest first, one per resource."""
    scope = Scope(tenant, patient_id, semantic_types=target.semantic_types)
    hits = backend.search_concepts(scope, list(target.keys), READ_ALL) if target.keys else backend.latest(scope, READ_ALL)
    chunks = backend.get_chunks(tenant, [h.chunk_id for h in hits])
    items, seen = [], set()
    for chunk in sorted(chunks, key=lambda c: (c.date or "", c.ref), reverse=True):
        if chunk.ref in seen or not is_item(chunk, target):
            continue
        seen.add(chunk.ref)
        items.append(Item(Evidence(chunk, 0.0)))
    return items


def is_item(chunk, target: Target) -> bool:
    """A record of the target itself: not a trend or a panel's summary of several, not a
    mention that denies it, and for a class of visit, a visit of that class."""
    fact = chunk.fact or {}
    if chunk.category == "trend" or (fact.get("kind") == "series" and fact.get("window")):
        return False      # a trend restates results counted by themselves; a panel (no window) is one item
    if target.keys and not asserted_keys(chunk.concepts) & set(target.keys):
        return False
    if target.visit_codes:
        return chunk.resource_type == "Encounter" and fact.get("encounter_class", "") in target.visit_codes
    return True


def in_window(items: list[Item], window: Window) -> list[Item]:
    return items if window.open else [i for i in items if window.holds(i.day)]


# --- how an item is said ----------------------------------------------------------------------------

def what(item: Item) -> str:
    """The item in a few words: a drug with its dose, a result with its value, else its name as
    the record gives it (the chip's words when it has none)."""
    kind = item.fact.get("kind")
    if kind == "medication":
        return dose_words(item)
    if kind == "measurement" and item.fact.get("name"):
        return f"{item.fact['name']} {value_words(item)}"
    if item.fact.get("name"):
        return item.fact["name"]
    label = item.chunk.label or ""
    return label.split(" · ")[-1] if " · " in label else label


def visit_words(item: Item, organisation: str = "", dated: bool = True) -> str:
    """"emergency visit (Emergency room admission) on 2024-03-02 for Fracture of clavicle, at
    HOSPITAL" from the encounter's class, type, reason, period and location."""
    fact = item.fact
    klass = CLASS_WORDS.get(fact.get("encounter_class", ""), "")
    kind = ", ".join(t for t in fact.get("types") or [] if t)
    words = f"{klass + ' ' if klass else ''}visit" + (f" ({kind})" if kind else "") + (f" on {item.day}" if dated else "")
    end = (fact.get("end") or "")[:10]
    if end and end != item.day and dated:
        words += f" to {end} ({stay_days(item.day, end)} days)"
    if fact.get("reasons"):
        words += f" for {', '.join(fact['reasons'])}"
    places = [p for p in [organisation, *(fact.get("locations") or [])] if p]
    if places:
        words += f", at {' / '.join(dict.fromkeys(places))}"
    return words


def stay_days(start: str, end: str) -> int:
    return (date.fromisoformat(end[:10]) - date.fromisoformat(start[:10])).days


def marks(first: int, last: int) -> str:
    return f"[{first}]" if first == last else f"[{first}]–[{last}]"


def plural(n: int, words: str) -> str:
    """"1 emergency visit", "3 emergency visits": the target's words name the plural."""
    if n == 1 and words.endswith("visits"):
        return f"1 {words[:-1]}"
    return f"{n} {words}"


def window_words(window: Window) -> str:
    return f" {window.words}" if window.words else ""


# --- the operations -----------------------------------------------------------------------------------

@dataclass
class Outcome:
    """What an operation states: its sentences (each with its citations), the items cited, in order."""
    statements: list[Statement]
    cited: list[Item]


def count(part: PlanPart, items: list[Item], organisation=lambda item: "") -> Outcome:
    n = len(items)
    words = part.target.words
    if not n:
        return Outcome([Statement(f"No {words} are recorded{window_words(part.window)}.", [], lead=True)], [])
    lead = f"{plural(n, words)}{window_words(part.window)} {marks(1, n)}; the latest on {items[0].day} [1]"
    if n > 1:
        lead += f", the first on {items[-1].day} [{n}]"
    statements = [Statement(lead + ".", list(range(1, n + 1)), lead=True)]
    statements += listing(part, items, organisation)
    return Outcome(statements, items)


def listing(part: PlanPart, items: list[Item], organisation=lambda item: "") -> list[Statement]:
    """The items named, newest first, up to `LISTED`; the rest counted and left to the evidence list."""
    groups: dict[str, list[str]] = {}
    for i, item in enumerate(items[:LISTED], start=1):
        groups.setdefault(describe(part, item, organisation, dated=False), []).append(f"{item.day} [{i}]")
    said = [f"{words}: {', '.join(days)}" for words, days in groups.items()]
    more = len(items) - LISTED
    # The rest are cited too, in one range, and left to the evidence list to show.
    tail = f", and {more} more in the evidence list {marks(LISTED + 1, len(items))}" if more > 0 else ""
    if not said:
        return []
    text = "; ".join(said) + tail + "."
    return [Statement(text[0].upper() + text[1:], list(range(1, len(items) + 1)))]


def describe(part: PlanPart, item: Item, organisation=lambda item: "", dated: bool = True) -> str:
    if item.chunk.resource_type == "Encounter":
        return visit_words(item, organisation(item), dated)
    return f"{what(item)} on {item.day}" if dated else what(item)


def pick(part: PlanPart, items: list[Item], organisation=lambda item: "") -> Outcome:
    """latest / first: the one item, described, with how many there are."""
    words = part.target.words
    if not items:
        return Outcome([Statement(f"No {words} are recorded{window_words(part.window)}.", [], lead=True)], [])
    chosen = items[-1] if part.operation == "first" else items[0]
    which = "first" if part.operation == "first" else "latest"
    lead = f"The {which} of {plural(len(items), words)}{window_words(part.window)}: {describe(part, chosen, organisation)} [1]."
    return Outcome([Statement(lead, [1], lead=True)], [chosen])


def exists(part: PlanPart, items: list[Item], organisation=lambda item: "") -> Outcome:
    words = part.target.words
    if not items:
        return Outcome([Statement(f"No {words} are recorded{window_words(part.window)}.", [], lead=True)], [])
    n = len(items)
    lead = f"Yes: {plural(n, words)}{window_words(part.window)} {marks(1, n)}; the latest on {items[0].day} [1]."
    return Outcome([Statement(lead, list(range(1, n + 1)), lead=True)] + listing(part, items, organisation), items)


def duration(part: PlanPart, stays: list[Item], organisation=lambda item: "") -> Outcome:
    """Admission to discharge of each stay, from Encounter.period, the newest first."""
    if not stays:
        return Outcome([Statement(f"No visit with a recorded end is found for {part.target.words}"
                                  f"{window_words(part.window)}.", [], lead=True)], [])
    shown = stays[:LISTED]
    said = []
    for i, stay in enumerate(shown, start=1):
        end = (stay.fact.get("end") or stay.day)[:10]
        days = stay_days(stay.day, end)
        length = "the same day" if days == 0 else f"{days} day{'s' if days != 1 else ''}"
        said.append(f"{length}: admitted {stay.day}, discharged {end}, the {visit_words(stay, organisation(stay))} [{i}]")
    lead = Statement(said[0][0].upper() + said[0][1:] + ".", [1], lead=True)
    rest = [Statement("Also " + "; ".join(said[1:]) + ".", list(range(2, len(shown) + 1)))] if len(said) > 1 else []
    return Outcome([lead] + rest, shown)


def dose_words(item: Item) -> str:
    """The drug as ordered and its dose: 'lisinopril 10 MG Oral Tablet, 1 tablet once daily'."""
    fact = item.fact
    drug = fact.get("medication") or fact.get("name") or item.chunk.label.split(" · ")[-1]
    doses = [d.get("text") or " ".join(w for w in (unit_amount(d), d.get("frequency", "")) if w)
             for d in fact.get("doses") or []]
    doses = [d for d in doses if d and not d.isdigit()]      # a bare "1" says nothing of the dose
    return f"{drug}{', ' + doses[0] if doses else ''}"


def unit_amount(dose: dict) -> str:
    """A dose's amount when it says what of ("2 puffs"); a bare count ("1") says nothing."""
    amount = (dose.get("amount") or {}).get("text", "")
    return "" if amount.replace(".", "").isdigit() else amount


def value_words(item: Item) -> str:
    value = (item.fact.get("value") or {}).get("text", "")
    components = [f"{c['name']} {c['value'].get('text', '')}" for c in item.fact.get("components") or []]
    return value or ", ".join(components) or item.chunk.label.split(" · ")[-1]


def change(part: PlanPart, items: list[Item], organisation=lambda item: "") -> Outcome:
    """Each step of a drug's dose (a new drug form or dose against the order before it) or of a
    value over time, oldest to newest; no step at all is said as such, with the span."""
    oldest_first = list(reversed(items))
    if not oldest_first:
        return Outcome([Statement(f"No {part.target.words} are recorded{window_words(part.window)}.", [], lead=True)], [])
    medication = all(i.chunk.semantic_type == "medication" for i in oldest_first)
    say = dose_words if medication else value_words
    steps = [oldest_first[0]]
    for item in oldest_first[1:]:
        if say(item) != say(steps[-1]):
            steps.append(item)
    if medication and len(steps) == 1:
        first, last = oldest_first[0], oldest_first[-1]
        cited = [first] + ([last] if last is not first else [])
        lead = (f"No dose change recorded: {len(oldest_first)} orders of {say(first)}, from {first.day} [1]"
                + (f" to {last.day} [2]." if len(cited) > 1 else "."))
        return Outcome([Statement(lead, list(range(1, len(cited) + 1)), lead=True)], cited)
    shown = steps[-LISTED:]
    said = [f"{say(s)} on {s.day} [{i}]" for i, s in enumerate(shown, start=1)]
    skipped = f" ({len(steps) - len(shown)} earlier changes in the evidence list)" if len(steps) > len(shown) else ""
    n = len(steps) - 1 if medication else len(shown)
    kind = ("dose change" if n == 1 else "dose changes") if medication else ("value" if n == 1 else "values")
    lead = f"{part.target.words[0].upper() + part.target.words[1:]}, {n} {kind}{window_words(part.window)}: " \
           + " → ".join(said) + skipped + "."
    return Outcome([Statement(lead, list(range(1, len(shown) + 1)), lead=True)], shown)


def compare(part: PlanPart, items: list[Item], organisation=lambda item: "") -> Outcome:
    """This period against that one: the latest value of each, and which way it moved."""
    items = one_measurement(items, part.target.words)
    now = in_window(items, part.window)
    then = in_window(items, part.compare_with) if part.compare_with else []
    words = part.target.words
    if not now or not then:
        missing = part.window if not now else part.compare_with
        known = now or then
        lead = f"No {words} are recorded{window_words(missing)}, so the two periods cannot be compared"
        if known:
            return Outcome([Statement(f"{lead}; the latest {window_words(part.window if now else part.compare_with).strip()}"
                                      f" is {value_words(known[0])} on {known[0].day} [1].", [1], lead=True)], [known[0]])
        return Outcome([Statement(lead + ".", [], lead=True)], [])
    a, b = now[0], then[0]
    direction = movement(a, b)
    lead = (f"{words[0].upper() + words[1:]}{window_words(part.window)}: {value_words(a)} on {a.day} [1]; "
            f"{part.compare_with.words}: {value_words(b)} on {b.day} [2]" + (f" ({direction})" if direction else "") + ".")
    return Outcome([Statement(lead, [1, 2], lead=True)], [a, b])


def one_measurement(items: list[Item], words: str) -> list[Item]:
    """Of the codes that assert the asked concept, the one that measures it plainest: a BMI is
    compared with a BMI, not with a BMI-for-age percentile of the same visit (its name holds the
    fewest words beyond the asked ones; the most items break a tie)."""
    groups: dict[str, list[Item]] = {}
    for item in items:
        code = next(iter(item.fact.get("codes") or []), {})
        groups.setdefault(f"{code.get('system', '')}|{code.get('code', '')}", []).append(item)
    if len(groups) < 2:
        return items
    asked = set(re.findall(r"[a-z0-9]+", words.lower()))

    def extra_words(group: list[Item]) -> tuple[int, int]:
        name = str(group[0].fact.get("name") or group[0].chunk.label)
        return len(set(re.findall(r"[a-z0-9]+", name.lower())) - asked), -len(group)
    return min(groups.values(), key=extra_words)


def movement(a: Item, b: Item) -> str:
    """'higher than then' / 'lower than then' / 'the same', from the values' numbers."""
    x, y = number_of(a), number_of(b)
    if x is None or y is None:
        return ""
    return "the same" if x == y else "higher than then" if x > y else "lower than then"


def number_of(item: Item) -> float | None:
    quantity = (item.fact.get("value") or {}).get("quantity") or {}
    value = quantity.get("value")
    return float(value) if isinstance(value, (int, float)) else None


OPERATIONS = {"count": count, "latest": pick, "first": pick, "exists": exists, "list": count, "duration": duration,
              "change": change, "compare": compare}


# --- the answer --------------------------------------------------------------------------------------

def answer_with(result: Answer, outcome: Outcome) -> Answer:
    """The answer the operation states, its cited items first in the evidence list and then what
    the retrieval found, so every [n] opens an item of the list."""
    citations = [Citation.of(item.evidence, n) for n, item in enumerate(outcome.cited, start=1)]
    evidence = [EvidenceItem.of(item.evidence, n) for n, item in enumerate(outcome.cited, start=1)]
    have = {e.chunk_id for e in evidence}
    for item in result.evidence:
        if item.chunk_id not in have:
            evidence.append(replace(item, rank=len(evidence) + 1))
    text = " ".join(said(s) for s in outcome.statements)
    result.diagnostics["operation"] = {"cited": len(outcome.cited)}
    # Nothing of the target at all: an empty class, said as such and, like "No allergies are
    # recorded", an answer that cites nothing.
    return replace(result, answer=text, statements=outcome.statements, citations=citations, evidence=evidence,
                   abstained=not outcome.cited, lead=outcome.statements[0].text if outcome.statements else None,
                   confidence="high" if outcome.cited else "medium", class_entries=None)


def none_in_window(part: PlanPart, items: list[Item]) -> Outcome:
    """Nothing of the target in the window, though the record holds it: said so, with the nearest
    item outside the window cited as such, never as inside it."""
    nearest = min(items, key=lambda i: abs(date.fromisoformat(i.day) - window_middle(part.window)).days
                  if i.day else 10 ** 6)
    lead = (f"No {part.target.words} are recorded{window_words(part.window)}, the nearest outside that window "
            f"{describe(part, nearest)} [1].")
    return Outcome([Statement(lead, [1], lead=True)], [nearest])


def window_middle(window: Window) -> date:
    ends = [date.fromisoformat(d) for d in (window.start, window.end) if d]
    return ends[0] + (ends[-1] - ends[0]) / 2 if ends else date.today()


def said(statement: Statement) -> str:
    return statement.cited_text() if statement.citations else statement.text


def stays_for(backend: Backend, tenant: str, patient_id: str, part: PlanPart, items: list[Item]) -> list[Item]:
    """The stays a duration is asked of: the visits of the class asked ("how long was the last
    admission"), or the visits whose period holds the asked event ("how long was she in for the
    transplant"), the longest first among those of one day; only visits with an end."""
    if part.target.kind == "visit":
        visits = items
    else:
        word = part.target.event_word
        if word:
            items = [i for i in items if says_word(i, word)]
        every = read_items(backend, tenant, patient_id, Target("visit", "visits", semantic_types=("encounter",)))
        visits = holding(every, event_days(part, items)) if items or not word else []
        # "Admission to surgical transplant department": the visit may say the event itself.
        visits += [v for v in every if word and says_word(v, word) and v not in visits]
        visits.sort(key=lambda v: (v.day, stay_days(v.day, (v.fact.get("end") or v.day)[:10])), reverse=True)
    return [v for v in visits if (v.fact.get("end") or "")[:10]]


def event_days(part: PlanPart, items: list[Item]) -> set[str]:
    """The days of the asked event: the anchor's ("after the acl surgery": its day, found by the
    retrieval's anchor stage), else the target items' own."""
    if part.window.source == "event" and part.window.start:
        return {part.window.start}
    return {i.day for i in items if i.day}


def visits_on(backend: Backend, tenant: str, patient_id: str, days: set[str]) -> list[Item]:
    """The visits whose period holds any of these days."""
    every = read_items(backend, tenant, patient_id, Target("visit", "visits", semantic_types=("encounter",)))
    return holding(every, days)


def holding(visits: list[Item], days: set[str]) -> list[Item]:
    return [v for v in visits if any(v.day <= d <= (v.fact.get("end") or v.day)[:10] for d in days)]


def says_word(item: Item, word: str) -> bool:
    """The item's name names the event ("transplant" in "kidney transplant"); of a visit, its type
    ("Admission to surgical transplant department"), not its reason: a dialysis visit for
    "awaiting transplantation" is not the stay of the transplant."""
    names = [*item.fact.get("types", []), item.fact.get("name", "")]
    if item.chunk.resource_type != "Encounter":
        names.append(item.chunk.label)
    return any(re.search(rf"\b{re.escape(word)}", str(name), re.I) for name in names)


def organisations(backend: Backend, tenant: str, patient_id: str):
    """The organisation an encounter names (Encounter.serviceProvider's display), read from the
    stored resource when a visit is stated."""
    def organisation(item: Item) -> str:
        if item.chunk.resource_type != "Encounter":
            return ""
        resource = backend.get_resource(tenant, patient_id, item.chunk.ref) or {}
        provider = resource.get("serviceProvider") or {}
        return str(provider.get("display") or "") if isinstance(provider, dict) else ""
    return organisation


def execute(part: PlanPart, backend: Backend, tenant: str, patient_id: str) -> Outcome | None:
    """The part's operation over every item of its target in its window; None when the record
    holds nothing of a concept target at all (the concept may be written otherwise: the
    retrieval's answer stands)."""
    items = read_items(backend, tenant, patient_id, part.target)
    if not items and part.target.keys:
        return None       # the concept may be written otherwise: the retrieval's answer stands
    organisation = organisations(backend, tenant, patient_id)
    if part.operation == "compare":
        return compare(part, items, organisation)
    windowed = in_window(items, part.window)
    if items and not windowed and part.operation in ("count", "exists", "latest", "first", "list"):
        return none_in_window(part, items)
    if part.operation == "duration":
        stays = stays_for(backend, tenant, patient_id, part, windowed)
        return duration(part, stays, organisation) if stays else None
    if part.where and part.target.kind == "concept" and windowed:
        # "which hospital for the clavicle fracture": the visits of the event's first day (the ED
        # visit, then the admission it led to), each with its place.
        first_day = min(i.day for i in windowed if i.day) if any(i.day for i in windowed) else ""
        visits = sorted(visits_on(backend, tenant, patient_id, {first_day}),
                        key=lambda v: (v.day, stay_days(v.day, (v.fact.get("end") or v.day)[:10])))[:3] if first_day else []
        if visits:
            said = "; ".join(f"{visit_words(v, organisation(v))} [{n}]" for n, v in enumerate(visits, start=1))
            lead = f"{part.target.words[0].upper() + part.target.words[1:]} ({first_day}): {said}."
            return Outcome([Statement(lead, list(range(1, len(visits) + 1)), lead=True)], visits)
    return OPERATIONS[part.operation](part, windowed, organisation)


def planned_operation(result: Answer, ctx) -> Answer:
    """The answer step: the question's plan, shown in the diagnostics (`ask --explain`), and for a
    part that needs arithmetic over the record (a count, a duration, a change, a comparison, a
    window relative to today, a class of visit), the answer its operation states."""
    retrieval = ctx.retrieval
    if retrieval.pipeline != "full" or "record" in result.diagnostics:
        return result
    analysis = retrieval.analysis
    anchored = any(s.name == "anchor" and s.note for s in retrieval.stages)
    plan = plan_question(analysis.question, ctx.today or date.today(), analysis.concepts, analysis.kinds,
                         analysis.date_from, analysis.date_to, anchored)
    result.diagnostics["question_plan"] = plan.to_dict()
    part = plan.parts[0] if plan.parts else None
    if part is None or not (part.arithmetic or part.where):
        return result
    outcome = execute(part, ctx.backend, ctx.tenant, ctx.patient_id)
    return answer_with(result, outcome) if outcome is not None else result

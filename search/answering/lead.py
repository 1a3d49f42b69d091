"""The answer first: one sentence that answers the question in clinical words, every clause citing
the record it came from; then a few short supporting sentences.

The sentence is chosen by what the best evidence is (a measurement, an order, a problem, an
allergy, a procedure, a visit, a note) and by what the question wants (the latest value, a trend,
a list, a reason). It says only what the cited resources say: values as recorded, their dates,
statuses. "Yes —" leads only a question that asks whether the record has something; "No —" only
when the record itself states the negative (a refuted allergy, a stopped order, a vaccine not given).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from search.answering.facts import Fact, fact_of, series_facts
from search.nlp.annotate import asserted_keys, default_annotator
from search.nlp.terminology import analyte_of
from search.nlp.units import Measured, celsius_change, factor
from search.retrieval.types import Analysis, Evidence

ASKS_IF_RECORDED = re.compile(
    r"^\s*(?:(?:is|are|was|were)\s+(?:he|she|they|the patient|pt)\s+(?:ever\s+|currently\s+|still\s+|now\s+)?"
    r"(?:on|taking|allergic|anemic|diabetic|hypertensive|pregnant|immunized|vaccinated)\b"
    r"|(?:does|do|did)\s+(?:he|she|they|the patient|pt)\s+(?:ever\s+|still\s+)?(?:have|take|carry|use|get|receive|had)\b"
    r"|(?:has|have|had)\s+(?:he|she|they|the patient|pt)\s+(?:ever\s+)?(?:had|been|got|gotten|received|taken)\b"
    r"|(?:still|currently|now|ever)\s+(?:on|taking|using|getting|receiving)\b"
    r"|any\b)", re.I)
# "How have his BPs been?", "Is her weight going up?": several values asked for, whatever the
# retrieval analysis made of the wording.
SEVERAL_VALUES = re.compile(r"\b(?:trend\w*|changed?|going (?:up|down)|over time|rising|falling|improv\w*|worse\w*|"
                            r"how (?:has|have|is|are) (?:his|her|their|the)\b.*\b(?:been|doing|changed|going)|"
                            r"BPs|readings|values|results|levels|draws)\b", re.I)
# The lexicon's entry for the words "allergy", "allergic", "intolerance"...: every other concept of
# an allergy question (latex, peanuts, a drug class) is the allergen asked about.
ALLERGY_WORDS = "lex:allergy"
# "why was the flu vaccine not given?", "did she refuse it?": what was not done is what is asked
# ("declining kidney function" asks no such thing).
ASKS_THE_NEGATIVE = re.compile(r"\b(?:refus\w*|declined?|declines|withh[oe]ld\w*|defer(?:red|ral)|"
                               r"not\s+(?:given|done|administered|performed|received|taken))\b", re.I)
# "Is she pregnant?", "does he have asthma?", "still on warfarin?": asked of now, not of ever.
PRESENT_TENSE = re.compile(r"^\s*(?:is|are|does|do)\b(?!.*\bever\b)|\b(?:currently|still|now)\b", re.I)
FAMILY = {"immunization": ("immunization", "procedure"), "procedure": ("procedure", "immunization")}
ASKED_KINDS = ("medication", "allergy", "problem", "procedure", "immunization", "encounter")
MAX_CLAUSES = 4
MAX_LISTED = 12           # the medication list asked for as such: every current drug, up to this many
SUPPORTING = 3            # short sentences after the first in the answer text; the frame lists the rest
LIST_ALL_VALUES = 6       # a trend of at most this many results lists every value
STABLE = 0.03             # first and last within 3%: "stable"
STABLE_DEGREES_CELSIUS = 0.3   # a temperature within 0.3 °C (about 0.5 °F): "stable"


@dataclass
class Lead:
    draft: Draft | None
    facts: list[Fact]
    series: list[Series] = field(default_factory=list)     # the measurements the sentence states


@dataclass
class Draft:
    """A sentence before numbering: clauses, each with the evidence it cites."""
    clauses: list[tuple[str, list[Evidence]]]
    prefix: str = ""
    lead: bool = False
    sep: str = "; "

    def text(self, number) -> str:
        parts = [f"{words.rstrip(' ,;:')} " + " ".join(f"[{number(ev)}]" for ev in _unique(sources))
                 for words, sources in self.clauses]
        body = self.prefix + self.sep.join(parts)
        if not body[1:2].isupper():          # "eGFR", "K+" keep their case
            body = body[:1].upper() + body[1:]
        return body + ("" if body.endswith((".", "?", "!")) else ".")

    def sources(self) -> list[Evidence]:
        return _unique([ev for _, sources in self.clauses for ev in sources])


def _unique(evidence: list[Evidence]) -> list[Evidence]:
    seen, out = set(), []
    for ev in evidence:
        if ev.chunk.chunk_id not in seen:
            seen.add(ev.chunk.chunk_id)
            out.append(ev)
    return out


@dataclass
class Series:
    name: str
    points: list = field(default_factory=list)     # (Point, Evidence)
    coded: str = ""                                # the full coded name, for the chart's title
    range: tuple | None = None                     # the newest result's reference range...
    range_unit: Measured | None = None             # ...in that result's unit

    def add(self, fact: Fact) -> None:
        self.coded = self.coded or fact.coded
        if fact.range and (not self.points or fact.date >= self.points[-1][0].date):
            self.range = fact.range
            self.range_unit = Measured(fact.points[0].ucum, fact.points[0].loinc) if fact.points else None
        known = {(p.date, p.text) for p, _ in self.points}
        for point in fact.points:
            if (point.date, point.text) not in known:
                self.points.append((point, fact.ev))
                known.add((point.date, point.text))
        self.points.sort(key=lambda pe: pe[0].date)


def affirms(question: str) -> bool:
    return bool(ASKS_IF_RECORDED.search(question))


def first_sentence(analysis: Analysis, relevant: list[Evidence], note_passage, history: list[Evidence] = ()) -> Lead:
    """The lead sentence and the facts of the relevant evidence; no sentence when none can be
    written in clinical words (the caller keeps the evidence's own words). `history`: every order
    of the drugs the evidence names, to fold."""
    facts = [f for f in (fact_of(ev) for ev in relevant) if f is not None]
    top = relevant[0]
    kind = asked_kind(analysis, facts, top)
    if kind == "measurement":
        measured = measurement_series(analysis, relevant, facts)
        if measured:
            sentence, shown = measurement_sentence(analysis, measured)
            return Lead(sentence, facts, shown)
        kind = next((f.kind for f in facts if f.ev is top), "")
    if kind == "note" or (not kind and top.chunk.semantic_type == "note"):
        passage = note_passage(top)
        return Lead(Draft([(note_words(top, passage), [top])], lead=True) if passage else None, facts)
    same = on_point(analysis, [f for f in facts if f.kind == kind])
    if not same:
        return Lead(None, facts)
    if kind == "medication":
        orders = [f for f in (fact_of(ev) for ev in history) if f is not None and f.kind == "medication"]
        return Lead(medication_sentence(analysis, same, orders), facts)
    if kind == "encounter":
        return Lead(encounter_sentence(analysis, same), facts)
    return Lead(listing_sentence(analysis, same), facts)


def wants_several(analysis: Analysis) -> bool:
    return analysis.wants_trend or analysis.last_n > 1 or bool(SEVERAL_VALUES.search(analysis.question))


def asked_kind(analysis: Analysis, facts: list[Fact], top: Evidence) -> str:
    """What the first sentence is about: the kind of record the question names ("meds",
    "procedures"), else the kind of the first thing it asks about (a test, a drug, an allergy),
    else the best evidence's kind — always one the relevant evidence has."""
    on_point = [f for f in facts if asserts_asked(analysis, f)] or facts
    have = {f.kind for f in on_point} | ({"measurement"} if any(
        ev.chunk.semantic_type in ("lab", "vital") for ev in [f.ev for f in facts] + [top]) else set())
    if top.chunk.semantic_type == "note":
        have.add("note")
    named = [k for k in analysis.kinds if k in ASKED_KINDS]
    asked = [("measurement" if c["semantic_type"] in ("lab", "vital") else c["semantic_type"])
             for c in sorted(analysis.concepts, key=lambda c: c.get("start", 0)) if c.get("role") != "context"]
    if analysis.wants_note_content:
        asked.insert(0, "note")
    for kind in named + asked + (["measurement"] if wants_several(analysis) else []):
        # A vaccine may be recorded as a Procedure ("injection of tetanus antitoxin"), and back.
        for candidate in FAMILY.get(kind, (kind,)):
            if candidate in have:
                return candidate
    if top.chunk.semantic_type in ("lab", "vital"):
        return "measurement"
    return next((f.kind for f in facts if f.ev is top), "note" if top.chunk.semantic_type == "note" else "")


def note_words(ev: Evidence, passage: str) -> str:
    return f'the note of {ev.chunk.date[:10]} says: "{passage}"'


def asked_keys(analysis: Analysis) -> set[str]:
    """What the question asks about (not its context); of an allergy question, the allergen."""
    asked = analysis.required_keys or analysis.keys
    return asked - {ALLERGY_WORDS} or asked


def asserts_asked(analysis: Analysis, fact: Fact) -> bool:
    """The fact's record asserts what the question asks about."""
    return bool(asserted_keys(fact.ev.chunk.concepts) & asked_keys(analysis))


def on_point(analysis: Analysis, facts: list[Fact]) -> list[Fact]:
    """The facts that assert the most of what was asked ("hep B vaccine": the hepatitis B
    vaccine, not every vaccine), else all of them."""
    asked = asked_keys(analysis)
    # One concept may be matched twice (the lexicon's key and the record's own code for the same
    # words): count the lexicon's concepts when there are any.
    asked = {k for k in asked if k.startswith("lex:")} or asked
    hits = {id(f): len(asserted_keys(f.ev.chunk.concepts) & asked) for f in facts}
    best = max(hits.values(), default=0)
    return [f for f in facts if hits[id(f)] == best] if best else facts


def prefix_for(analysis: Analysis, facts: list[Fact]) -> str:
    """"Yes —" only when the question asks whether the record has something and what the sentence
    lists is that thing; "No —" only when every entry is the record's own negative."""
    if not affirms(analysis.question) or not facts or not all(asserts_asked(analysis, f) for f in facts[:1]):
        return ""
    if facts and all(f.negative for f in facts):
        return "No — "
    if PRESENT_TENSE.search(analysis.question) and not any(f.current for f in facts if not f.negative):
        return "Not now — "      # resolved, inactive, stopped, completed: its status comes first
    return "Yes — " if any(not f.negative for f in facts) else ""


def listing_sentence(analysis: Analysis, facts: list[Fact]) -> Draft:
    """Problems, allergies, procedures, vaccines: current entries first, one clause each; one
    thing done on several dates is one clause, newest first (only the newest when asked for the last)."""
    ordered = [f for f in facts if f.current and not f.negative] + [f for f in facts if not (f.current and not f.negative)]
    if ASKS_THE_NEGATIVE.search(analysis.question):
        ordered.sort(key=lambda f: not f.negative)
    by_name: dict[str, list[Fact]] = {}
    for f in _distinct(ordered, lambda f: f.words):
        by_name.setdefault(f.name.lower(), []).append(f)
    clauses, firsts = [], []
    for group in list(by_name.values())[:MAX_CLAUSES]:
        # Newest first, what was done before what was not (a flu shot given before a newer
        # refusal); the last or first one asked for is one that was done, when one was.
        group.sort(key=lambda f: f.date, reverse=True)
        negative_asked = bool(ASKS_THE_NEGATIVE.search(analysis.question))
        group.sort(key=lambda f: f.negative, reverse=negative_asked)
        done = [f for f in group if not f.negative]
        if negative_asked and any(f.negative for f in group):
            clauses += [(f.words, [f.ev]) for f in group]
        elif analysis.wants_latest or analysis.wants_first or len(done) < 2 or f"on {done[0].date}" not in done[0].words:
            pool = done or group
            group = pool[:1] if analysis.wants_latest else pool[-1:] if analysis.wants_first else group
            clauses += [(f.words, [f.ev]) for f in group]
        else:
            # Only what was done is folded into dates; what was not is said as such.
            dates = [f.date for f in done]
            clauses.append((f"{done[0].name} on {', '.join(dates[:-1])} and {dates[-1]}", [f.ev for f in done]))
            clauses += [(f.words, [f.ev]) for f in group if f.negative]
        firsts.append(group[0])
    return Draft(clauses[:MAX_CLAUSES], prefix_for(analysis, firsts), lead=True)


def _distinct(facts: list[Fact], key) -> list[Fact]:
    seen, out = set(), []
    for f in facts:
        if key(f) not in seen:
            seen.add(key(f))
            out.append(f)
    return out


def medication_sentence(analysis: Analysis, facts: list[Fact], history: list[Fact] = ()) -> Draft:
    """One clause per drug, its orders folded: the newest order says whether it is current (a
    refill history of years is one drug, not years of clauses), with how many orders there were
    and when the first was; current drugs first, older ones only when nothing is current or the
    question asks about ever or the first; a reason when asked why."""
    orders: dict[str, list[Fact]] = {}
    for f in {f.ev.chunk.chunk_id: f for f in [*facts, *history]}.values():
        orders.setdefault(f.series or f.name, []).append(f)
    drugs = list(dict.fromkeys(f.series or f.name for f in facts))
    if analysis.asks_every_medication:
        # The medication list: every drug of the record's orders answers it, not only those that ranked.
        drugs += [name for name in orders if name not in drugs]
    for name in drugs:
        orders[name].sort(key=lambda f: (f.date, f.current))
    newest = {name: orders[name][-1] for name in drugs}
    if analysis.wants_why:
        f = next((f for f in facts if f.reason), facts[0])
        return Draft([(f.words + (f", for {f.reason}" if f.reason else ""), [f.ev])], lead=True)
    current = [name for name in drugs if newest[name].current]
    cap = MAX_LISTED if analysis.asks_every_medication else MAX_CLAUSES
    shown = (current if current and not (analysis.wants_ever or analysis.wants_first) else drugs)[:cap]
    clauses = [clause for name in shown for clause in folded_orders(orders[name], analysis)]
    last = [newest[name] for name in shown]
    prefix = prefix_for(analysis, last) if current or any(f.negative for f in last) else ""
    return Draft(clauses, prefix, lead=True)


def folded_orders(orders: list[Fact], analysis: Analysis) -> list[tuple[str, list[Evidence]]]:
    """A drug's orders as one clause: the newest (its status), how many, and the first; asked for
    the first, the first order and the newest are two clauses, each citing its own record."""
    first, newest = orders[0], orders[-1]
    if first.date == newest.date:
        return [(newest.words, [newest.ev])]
    count = f"{len(orders)} orders, the first on {first.date}"
    if analysis.wants_first:
        return [(f"{first.name} first ordered on {first.date}", [first.ev]),
                (f"the latest of {len(orders)} orders: {newest.words}", [newest.ev])]
    return [(f"{newest.words} (the latest of {count})", [newest.ev, first.ev])]


def encounter_sentence(analysis: Analysis, facts: list[Fact]) -> Draft:
    """Visits, newest first by relevance; several of one kind are counted."""
    groups: dict[str, list[Fact]] = {}
    for f in _distinct(facts, lambda f: f.words):
        groups.setdefault(f.name, []).append(f)
    clauses = []
    for name, group in list(groups.items())[:MAX_CLAUSES]:
        if len(group) > 2:
            dated = sorted(group, key=lambda f: f.date)
            clauses.append((f"{name} on {len(group)} dates: " + ", ".join(f.date for f in dated)
                            + (f" (for {dated[-1].reason})" if dated[-1].reason else ""), [f.ev for f in dated]))
        else:
            clauses += [(f.words, [f.ev]) for f in group]
    return Draft(clauses[:MAX_CLAUSES], prefix_for(analysis, facts[:1]), lead=True)


# --- measurements ----------------------------------------------------------------------------

def measurement_series(analysis: Analysis, relevant: list[Evidence], facts: list[Fact]) -> list[Series]:
    """The asked tests' values, one series per test: from single results, trend chunks and
    panels (only the panel's results the question asks about, unless it asks for the panel)."""
    found: list[Fact] = [f for f in facts if f.kind == "measurement"]
    for ev in relevant:
        if ev.chunk.category == "trend" or (ev.chunk.semantic_type == "lab" and ev.chunk.category == "panel"):
            found += series_facts(ev)
    if not found:
        return []
    asked = asked_tests(analysis, found)
    series: dict[str, Series] = {}
    named = one_name_per_analyte(found)
    for f in found:
        if f.series in asked or not asked:
            series.setdefault(named[f.series], Series(named[f.series])).add(f)
    return [s for s in series.values() if s.points]


def one_name_per_analyte(facts: list[Fact]) -> dict[str, str]:
    """Each series name, mapped to the first name of its analyte: a mass code and its molar
    sibling (glucose 2345-7 in mg/dL, 14749-6 in mmol/L) are one test, in one series."""
    first_name: dict[str, str] = {}
    named = {}
    for f in facts:
        loinc = next((p.loinc for p in f.points if p.loinc), "")
        analyte = analyte_of(loinc) if loinc else None
        named.setdefault(f.series, first_name.setdefault(analyte, f.series) if analyte else f.series)
    return named


def asked_tests(analysis: Analysis, facts: list[Fact]) -> set[str]:
    """The tests among the facts that the question names (its concepts against each test's coded
    name); empty when it names none of them (then every test found is shown)."""
    keys = analysis.required_keys or analysis.keys
    if not keys:
        return set()
    coded = {f.series: f.coded or f.series for f in facts}
    annotated = default_annotator().annotate(list(coded.values()))
    asked = {name for name, concepts in zip(coded, annotated) if asserted_keys(concepts) & keys}
    for name, chunk in {f.series: f.ev.chunk for f in facts}.items():
        if chunk.category != "panel" and chunk.category != "trend" and asserted_keys(chunk.concepts) & keys:
            asked.add(name)
    return asked


def in_window(analysis: Analysis, points: list) -> list:
    kept = [(p, ev) for p, ev in points if (not analysis.date_from or p.date >= analysis.date_from[:10])
            and (not analysis.date_to or p.date <= analysis.date_to[:10])]
    if analysis.last_n:
        kept = kept[-analysis.last_n:]
    return kept


def measurement_sentence(analysis: Analysis, series: list[Series]) -> tuple[Draft, list[Series]]:
    """The sentence and, for the chart, each stated series as the sentence states it (a trend's
    window; a latest value beside its history)."""
    clauses, shown = [], []
    for s in series[:3]:
        points = in_window(analysis, s.points) or s.points[-1:]
        if wants_several(analysis) and len(points) > 1:
            points, apart = in_one_unit(points)
            clauses.append(trend_clause(s.name, points))
            if apart:
                clauses.append(apart_clause(s.name, apart, points[-1][0].unit))
            shown.append(Series(s.name, points, s.coded, s.range, s.range_unit))
        elif analysis.wants_first:
            clauses += first_clauses(s.name, points)
            shown.append(s)
        else:
            clauses += latest_clauses(s.name, points, s.points, windowed=bool(analysis.date_from or analysis.date_to))
            shown.append(s)
    return Draft(clauses, lead=True), shown


def reading_words(point) -> str:
    """A value as a chart states it: with its flag and the result's other components."""
    return point.text + (f" ({point.flag})" if point.flag else "") + (f" with {point.also}" if point.also else "")


def latest_clauses(name: str, points: list, history: list, windowed: bool) -> list[tuple[str, list[Evidence]]]:
    point, ev = points[-1]
    clauses = [(f"{name} {reading_words(point)} on {point.date}", [ev])]
    earlier = [(p, e) for p, e in history if p.date < point.date]
    if earlier and not windowed:
        before, before_ev = earlier[-1]
        clauses.append((f"previous {before.text} on {before.date}", [before_ev]))
    return clauses


def first_clauses(name: str, points: list) -> list[tuple[str, list[Evidence]]]:
    """The first result on file (of the window asked), and the latest beside it."""
    (first, first_ev), (last, last_ev) = points[0], points[-1]
    clauses = [(f"first {name} on file {reading_words(first)} on {first.date}", [first_ev])]
    if last.date != first.date:
        clauses.append((f"latest {last.text} on {last.date}", [last_ev]))
    return clauses


def point_number(point) -> str:
    """The number a list of one series' values shows: as recorded ('<6'), or, for a value
    converted into the series' unit, the converted number."""
    if point.text.endswith(f" {point.unit})") and "(" in point.text:
        return point.text.rsplit("(", 1)[1].split(" ")[0]
    return point.text.split(" ")[0]


def in_one_unit(points: list) -> tuple[list, list]:
    """The largest group of comparable points (the newest group on a tie) in the unit of its
    newest point, and the points that cannot be put in it. A converted point keeps its value as
    recorded and adds the converted one ('80 kg (176 lb)'), so each [n] still opens what the record
    says; a direction is drawn only across comparable values."""
    groups: list[list] = []                     # each: [(point, ev, convert to the group's unit)]
    for point, ev in reversed(points):          # newest first: it sets its group's unit
        for group in groups:
            convert = factor(Measured(point.ucum, point.loinc), Measured(group[0][0].ucum, group[0][0].loinc))
            if convert is not None:
                group.append((point, ev, convert))
                break
        else:
            groups.append([(point, ev, lambda value: value)])
    main = max(groups, key=len)
    unit_of = main[0][0]
    same = [(point if point.ucum == unit_of.ucum else converted(point, convert, unit_of), ev)
            for point, ev, convert in reversed(main)]
    apart = sorted(((p, e) for group in groups if group is not main for p, e, _ in group), key=lambda pe: pe[0].date)
    return same, apart


def converted(point, convert, unit_of):
    values = [convert(v) for v in point.values]
    shown = "/".join(f"{v:.3g}" for v in values)
    return replace(point, values=values, text=f"{point.text} ({shown} {unit_of.unit})", unit=unit_of.unit,
                   ucum=unit_of.ucum, loinc=unit_of.loinc)


def apart_clause(name: str, apart: list, unit: str) -> tuple[str, list[Evidence]]:
    """Readings in a unit that cannot be compared with the trend's: said, cited, never joined."""
    units = sorted({p.unit or "no unit" for p, _ in apart})
    return (f"{len(apart)} more {name} result{'s' if len(apart) > 1 else ''} in {', '.join(units)} cannot be "
            f"compared with results in {unit or 'no unit'} and {'are' if len(apart) > 1 else 'is'} not in this "
            f"trend ({'; '.join(f'{p.text} on {p.date}' for p, _ in apart)})", [ev for _, ev in apart])


def trend_clause(name: str, points: list) -> tuple[str, list[Evidence]]:
    (first, _), (last, _) = points[0], points[-1]
    a, b = first.values[0], last.values[0]
    change = (b - a) / abs(a) if a else 0.0
    degrees = celsius_change(a, b, last.ucum)
    steady = abs(degrees) < STABLE_DEGREES_CELSIUS if degrees is not None else abs(change) < STABLE
    verb = "was stable" if steady else "rose" if b > a else "fell"
    values = [point_number(p) for p, _ in points]
    if len(points) <= LIST_ALL_VALUES:
        detail = f"{len(points)} results: {' → '.join(values)}"
    else:
        low = min(points, key=lambda pe: pe[0].values[0])[0]
        high = max(points, key=lambda pe: pe[0].values[0])[0]
        detail = (f"{len(points)} results, lowest {point_number(low)} on {low.date}, highest "
                  f"{point_number(high)} on {high.date}, last three {' → '.join(values[-3:])}")
    words = f"{name} {verb} from {first.text} on {first.date} to {last.text} on {last.date} ({detail})"
    return words, [ev for _, ev in points]

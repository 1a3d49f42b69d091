"""The typed clinical fact a chunk carries: what its resource states, read once at index time by
the resource's kind, so the answer, the context lists and the side panel word fields and never
read FHIR JSON again.

A value keeps its comparator, unit, range and interpretation ("<6 ng/mL, low"); a dose its range,
timing and as-needed; a problem its onset of any type ("childhood", "at age 12", a date); an order
its drug's name however it was given (a code, a referenced or contained Medication). Facts are
plain dataclasses that round-trip through JSON (`to_dict` / `fact_from_dict`), so every backend
stores them beside the chunk.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

from .datatypes import comparator_quantity, range_text, ratio_text
from .normalize import codings, concept_text, quantity_text


def plain(value):
    """A fact as plain dicts and lists, as `dataclasses.asdict` gives it, without its deep copy of
    every leaf (a fact's leaves are strings and numbers; the copy was most of chunking's time on a
    large record)."""
    if is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@dataclass
class Coding:
    system: str = ""
    code: str = ""
    display: str = ""


@dataclass
class Quantity:
    value: float | None = None
    comparator: str = ""          # <, <=, >=, > or "": part of the value ("<6 ng/mL")
    unit: str = ""                # as recorded: the unit, else its code
    code: str = ""                # the UCUM code

    @property
    def text(self) -> str:
        return comparator_quantity({"value": self.value, "comparator": self.comparator or None, "unit": self.unit})


@dataclass
class Value:
    """An element's `value[x]` (or a dose, or a component's value) as typed as the record typed it."""
    kind: str = ""                # quantity | range | ratio | coded | string | boolean | integer | datetime | period | sampled | absent
    text: str = ""                # in words, as recorded: "<6 ng/mL", "1-2 tablet", "positive", "no value (not performed)"
    quantity: Quantity | None = None     # a quantity (or integer): the number a chart plots
    low: Quantity | None = None          # a range's ends
    high: Quantity | None = None

    @property
    def number(self) -> float | None:
        """The plain number, only when the value is one (a comparator makes it a bound, not a reading)."""
        q = self.quantity
        return float(q.value) if q is not None and q.value is not None and not q.comparator else None


@dataclass
class Component:
    name: str
    codes: list[Coding]
    value: Value


@dataclass
class ReferenceRange:
    low: Quantity | None = None
    high: Quantity | None = None
    text: str = ""                # the range in words with its own text and whom it applies to


@dataclass
class Dose:
    text: str = ""                # the prescriber's own words
    amount: Value | None = None   # doseQuantity or doseRange
    timing: str = ""              # the timing in full: '1 time(s) per 1 d; at 08:00'
    frequency: str = ""           # how often, as a prescriber says it: 'twice daily', 'every 6 hours'
    as_needed: str = ""           # '', 'as needed', 'as needed for pain'
    route: str = ""
    maximum: str = ""             # 'max 4 g per 1 d'
    rate: str = ""


@dataclass
class Point:
    """One result in a series (a trend's readings, a panel's results)."""
    ref: str
    date: str
    name: str
    codes: list[Coding]
    value: Value | None = None
    components: list[Component] = field(default_factory=list)
    interpretation: str = ""
    ranges: list[ReferenceRange] = field(default_factory=list)
    status: str = ""


@dataclass
class Fact:
    """What every kind of record states: its name (the coded name as recorded), codes, date and status."""
    kind: str = "record"
    name: str = ""
    codes: list[Coding] = field(default_factory=list)
    date: str = ""                # the clinically relevant date (ISO)
    status: str = ""
    notes: str = ""               # the record's own notes (Annotation.text)

    def to_dict(self) -> dict:
        return plain(self)


@dataclass
class MedicationFact(Fact):
    kind: str = "medication"
    medication: str = ""          # the drug however given: a code, a referenced or contained Medication
    form: str = ""                # order | statement | dispense | administration
    doses: list[Dose] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    visit_reasons: list[str] = field(default_factory=list)    # the ordering visit's, for an order without its own
    status_reason: str = ""
    intent: str = ""
    period: str = ""              # validity, effective or dispensed period in words
    quantity: str = ""            # dispensed quantity, days supply


@dataclass
class MeasurementFact(Fact):
    kind: str = "measurement"
    category: str = ""            # laboratory, vital-signs, social-history, survey, exam...
    value: Value | None = None
    components: list[Component] = field(default_factory=list)
    ranges: list[ReferenceRange] = field(default_factory=list)
    interpretation: str = ""
    specimen: str = ""            # what it was measured on and its condition ('Serum, hemolyzed')
    method: str = ""
    body_site: str = ""


@dataclass
class ProblemFact(Fact):
    kind: str = "problem"
    verification: str = ""
    onset: str = ""               # any onset[x] in words: a date, 'at age 12', 'childhood'
    onset_date: str = ""          # the onset as a date, when it is one
    abatement: str = ""
    recorded: str = ""
    severity: str = ""
    body_site: str = ""
    categories: list[str] = field(default_factory=list)


@dataclass
class Reaction:
    manifestations: list[str] = field(default_factory=list)
    severity: str = ""
    substance: str = ""


@dataclass
class AllergyFact(Fact):
    kind: str = "allergy"
    verification: str = ""
    criticality: str = ""
    allergy_type: str = ""
    categories: list[str] = field(default_factory=list)
    reactions: list[Reaction] = field(default_factory=list)
    onset: str = ""
    recorded: str = ""


@dataclass
class ProcedureFact(Fact):
    """A procedure, an immunization (and one not given), an imaging study."""
    kind: str = "procedure"
    status_reason: str = ""
    reasons: list[str] = field(default_factory=list)
    body_site: str = ""
    performed: str = ""           # the performed[x] / occurrence[x] in words


@dataclass
class EncounterFact(Fact):
    kind: str = "encounter"
    encounter_class: str = ""     # the class code (AMB, EMER, IMP...)
    types: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    diagnoses: list[str] = field(default_factory=list)
    end: str = ""
    locations: list[str] = field(default_factory=list)
    part_of: str = ""             # the encounter it is part of, in words (an ICU stay's admission)


@dataclass
class SeriesFact(Fact):
    """Several results of one test (a trend) or of one panel, each as recorded."""
    kind: str = "series"
    window: str = ""              # a trend's window ('last 90 days', 'all recorded values'); '' for a panel
    points: list[Point] = field(default_factory=list)


@dataclass
class NoteFact(Fact):
    kind: str = "note"
    note_type: str = ""
    sections: list[str] = field(default_factory=list)
    section_kinds: list[str] = field(default_factory=list)   # what each section is (notes.section_kind)


@dataclass
class DetailFact(Fact):
    """Care plans, goals, orders, devices, family history, surveys, coverage, care teams: a name, a
    status and the record's details as (label, words) pairs."""
    kind: str = "record"
    details: list[list[str]] = field(default_factory=list)     # [label, words]


FACT_TYPES = {cls.kind: cls for cls in (MedicationFact, MeasurementFact, ProblemFact, AllergyFact, ProcedureFact,
                                        EncounterFact, SeriesFact, NoteFact)}
NESTED = {"codes": Coding, "components": Component, "ranges": ReferenceRange, "doses": Dose, "points": Point,
          "reactions": Reaction, "value": Value, "quantity": Quantity, "low": Quantity, "high": Quantity,
          "amount": Value}


def _rebuild(cls, data: dict):
    """A dataclass from its dict, nested dataclasses included (as `asdict` wrote them)."""
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value, inner = data[f.name], NESTED.get(f.name)
        if inner is not None and isinstance(value, list):
            value = [_rebuild(inner, v) if isinstance(v, dict) else v for v in value]
        elif inner is not None and isinstance(value, dict):
            value = _rebuild(inner, value)
        kwargs[f.name] = value
    return cls(**kwargs)


def fact_from_dict(data: dict | None) -> Fact | None:
    """The typed fact a chunk stored; the procedure family's kinds (immunization, imaging) share one
    class, records of the care family share DetailFact."""
    if not data:
        return None
    kind = data.get("kind", "record")
    cls = FACT_TYPES.get(kind) or (ProcedureFact if kind in ("immunization", "imaging") else DetailFact)
    return _rebuild(cls, data)


# --- FHIR datatypes as typed values --------------------------------------------------------------

def codings_of(concept: dict | None) -> list[Coding]:
    return [Coding(str(c.get("system") or ""), str(c.get("code") or ""), str(c.get("display") or ""))
            for c in codings(concept)]


def quantity_of(q) -> Quantity | None:
    if not isinstance(q, dict) or not isinstance(q.get("value"), (int, float)) or isinstance(q.get("value"), bool):
        return None
    comparator = q.get("comparator") if isinstance(q.get("comparator"), str) else ""
    unit = q.get("unit") or q.get("code") or ""
    return Quantity(q["value"], comparator, unit if isinstance(unit, str) else "",
                    q.get("code") if isinstance(q.get("code"), str) else "")


def range_of(r) -> Value | None:
    if not isinstance(r, dict):
        return None
    low, high = quantity_of(r.get("low")), quantity_of(r.get("high"))
    return Value("range", range_text(r), low=low, high=high) if low or high else None


def value_of(element: dict, prefix: str = "value") -> Value | None:
    """An element's `<prefix>[x]` as recorded, or its dataAbsentReason; None when it has neither."""
    if not isinstance(element, dict):
        return None
    for kind, reader in VALUE_READERS:
        raw = element.get(f"{prefix}{kind}")
        if raw is not None:
            return reader(raw)
    reason = element.get("dataAbsentReason")
    if isinstance(reason, dict):
        words = concept_text(reason)
        return Value("absent", f"no value ({words.replace('-', ' ')})" if words else "no value")
    return None


def _quantity_value(raw) -> Value | None:
    q = quantity_of(raw)
    return Value("quantity", q.text, quantity=q) if q else None


def _integer_value(raw) -> Value:
    return Value("integer", str(raw), quantity=Quantity(raw) if isinstance(raw, int) and not isinstance(raw, bool) else None)


def _period_value(raw) -> Value:
    from .datatypes import period_text

    return Value("period", period_text(raw))


VALUE_READERS = (
    ("Quantity", _quantity_value),
    ("CodeableConcept", lambda raw: Value("coded", concept_text(raw))),
    ("String", lambda raw: Value("string", str(raw))),
    ("Boolean", lambda raw: Value("boolean", "yes" if raw is True else "no" if raw is False else "")),
    ("Integer", _integer_value),
    ("Range", range_of),
    ("Ratio", lambda raw: Value("ratio", ratio_text(raw))),
    ("SampledData", lambda raw: Value("sampled", "sampled data (waveform)")),
    ("Time", lambda raw: Value("time", str(raw))),
    ("DateTime", lambda raw: Value("datetime", str(raw))),
    ("Period", _period_value),
)


def reference_ranges_of(ranges) -> list[ReferenceRange]:
    from .datatypes import reference_range_text

    out = []
    for rr in ranges or []:
        if isinstance(rr, dict):
            out.append(ReferenceRange(quantity_of(rr.get("low")), quantity_of(rr.get("high")),
                                      reference_range_text([rr])))
    return out


def plain_quantity_text(q) -> str:
    return quantity_text(q) if isinstance(q, dict) else ""

"""Renderers for FHIR R4 datatypes, by the specification rather than by what one generator emits.

Each takes the JSON of one element and returns the words a clinician would read: a Quantity with
its comparator ("<0.01 ng/mL"), a Range ("1-2 tablet"), a Ratio ("1 mg / 5 mL"), a Period, every
`value[x]` an Observation or component may carry, `dataAbsentReason` as words, and a
`referenceRange` with both its numbers and its text.
"""
from __future__ import annotations

from .normalize import codings, concept_text, quantity_text

VALUE_TYPES = ("Quantity", "CodeableConcept", "String", "Boolean", "Integer", "Range", "Ratio", "SampledData",
               "Time", "DateTime", "Period")


def comparator_quantity(q: dict | None) -> str:
    """'<0.01 ng/mL', '>60 mL/min/1.73m2': the comparator is part of the value."""
    text = quantity_text(q)
    comparator = (q or {}).get("comparator") if isinstance(q, dict) else None
    return f"{comparator}{text}" if text and isinstance(comparator, str) else text


def range_text(r: dict | None) -> str:
    if not isinstance(r, dict):
        return ""
    low, high = comparator_quantity(r.get("low")), comparator_quantity(r.get("high"))
    if low and high:
        low_value, high_unit = low, high
        if (r["low"].get("unit") or "") == (r["high"].get("unit") or ""):
            low_value = low.removesuffix(f" {r['low'].get('unit')}").strip() if r["low"].get("unit") else low
        return f"{low_value}-{high_unit}"
    if low:
        return f"at least {low}"
    if high:
        return f"at most {high}"
    return ""


def ratio_text(r: dict | None) -> str:
    if not isinstance(r, dict):
        return ""
    numerator, denominator = comparator_quantity(r.get("numerator")), comparator_quantity(r.get("denominator"))
    return f"{numerator} / {denominator}" if numerator and denominator else numerator


def period_text(p: dict | None) -> str:
    if not isinstance(p, dict):
        return ""
    start, end = str(p.get("start") or "")[:10], str(p.get("end") or "")[:10]
    if start and end:
        return start if start == end else f"{start} to {end}"
    return f"from {start}" if start else f"until {end}" if end else ""


def absent_reason(element: dict) -> str:
    """'no value (not performed)' for a dataAbsentReason, '' when there is none."""
    reason = element.get("dataAbsentReason")
    if not isinstance(reason, dict):
        return ""
    words = concept_text(reason)
    return f"no value ({words.replace('-', ' ')})" if words else "no value"


def yes_no(value) -> str:
    return "yes" if value is True else "no" if value is False else ""


# One renderer per FHIR datatype; a type not listed here (string, integer, time, dateTime, uri)
# reads as written.
DATATYPE_WORDS = {
    "Quantity": comparator_quantity, "CodeableConcept": concept_text, "Boolean": yes_no, "Range": range_text,
    "Ratio": ratio_text, "Period": period_text, "SampledData": lambda _: "sampled data (waveform)",
    "Timing": lambda v: timing_text(v),
}


def value_text(element: dict) -> str:
    """The `value[x]` of an Observation or component in words; a missing value with a reason says so."""
    for kind in VALUE_TYPES:
        if f"value{kind}" in element:
            return DATATYPE_WORDS.get(kind, str)(element[f"value{kind}"])
    return absent_reason(element)


def reference_range_text(ranges: list | None) -> str:
    """Each range with its numbers and its text ('3.5-5.1 mmol/L (adult)'), and whom it applies to."""
    out = []
    for rr in ranges or []:
        if not isinstance(rr, dict):
            continue
        numbers = range_text(rr)
        text = rr.get("text") if isinstance(rr.get("text"), str) else ""
        applies = ", ".join(concept_text(a) for a in rr.get("appliesTo") or [] if concept_text(a))
        words = " ".join(filter(None, [numbers, f"({text})" if text and numbers else text]))
        if applies:
            words += f" for {applies}"
        if words:
            out.append(words)
    return "; ".join(out)


def concept_words(concept: dict | None) -> str:
    """A CodeableConcept as a clinician reads it: its text, with the coded display beside it when
    the two differ ('Knee OA (Osteoarthritis of knee)'), so both names are searched."""
    text = concept_text(concept)
    if not isinstance(concept, dict) or not concept.get("text"):
        return text
    seen = {text.lower()}
    others = []
    for coding in codings(concept):
        display = coding.get("display")
        if isinstance(display, str) and display and display.lower() not in seen:
            seen.add(display.lower())
            others.append(display)
    return f"{text} ({'; '.join(others)})" if others else text


# onset[x] / abatement[x]: an Age or an age Range, and dates read as the day.
CHOICE_WORDS = DATATYPE_WORDS | {
    "Age": lambda v: f"at age {quantity_text(v)}",
    "Range": lambda v: f"at age {range_text(v)}" if range_text(v) else "",
    "DateTime": lambda v: str(v)[:10], "Date": lambda v: str(v)[:10],
}
CHOICE_TYPES = ("DateTime", "Date", "String", "Age", "Period", "Range", "Boolean", "Quantity", "Timing")


def choice_text(element: dict, name: str) -> str:
    """Any `name[x]` of the specification (onset, abatement, occurrence, performed, effective) in words."""
    for kind in CHOICE_TYPES:
        value = element.get(f"{name}{kind}")
        if value is not None:
            return (CHOICE_WORDS.get(kind) or DATATYPE_WORDS.get(kind, str))(value)
    return ""


UNITS = {"s": "second", "min": "minute", "h": "hour", "d": "day", "wk": "week", "mo": "month", "a": "year"}


def timing_text(timing: dict | None) -> str:
    """'BID', 'every 4-6 hours', '1 time(s) per 1 d' (as Synthea's records have always read), with
    the times of day and the bounds when given."""
    if not isinstance(timing, dict):
        return ""
    bits = []
    code = timing.get("code")
    if isinstance(code, dict):
        bits.append(concept_text(code))
    repeat = timing.get("repeat") if isinstance(timing.get("repeat"), dict) else {}
    frequency, period = repeat.get("frequency"), repeat.get("period")
    unit = repeat.get("periodUnit", "")
    if repeat.get("periodMax") and period:
        bits.append(f"every {period}-{repeat['periodMax']} {UNITS.get(unit, unit)}s")
    elif frequency and period:
        most = f"-{repeat['frequencyMax']}" if repeat.get("frequencyMax") else ""
        bits.append(f"{frequency}{most} time(s) per {period} {unit}".strip())
    if repeat.get("when"):
        bits.append("at " + ", ".join(str(w) for w in repeat["when"]))
    if repeat.get("timeOfDay"):
        bits.append("at " + ", ".join(str(t)[:5] for t in repeat["timeOfDay"]))
    if repeat.get("boundsDuration"):
        bits.append(f"for {quantity_text(repeat['boundsDuration'])}")
    if repeat.get("boundsPeriod"):
        bits.append(period_text(repeat["boundsPeriod"]))
    return "; ".join(b for b in bits if b)


FREQUENCY = {1: "once", 2: "twice", 3: "three times", 4: "four times"}
PERIOD_NAMES = {"h": "hour", "d": "day", "wk": "week", "mo": "month"}
PERIODS = {"d": "daily", "wk": "weekly", "mo": "monthly", "a": "yearly"}


def frequency_text(timing: dict | None) -> str:
    """How often, as a prescriber says it: 'once daily', 'twice daily', 'every 6 hours'; other
    timings in full (timing_text)."""
    repeat = (timing or {}).get("repeat") if isinstance((timing or {}).get("repeat"), dict) else {}
    frequency, period, period_unit = repeat.get("frequency"), repeat.get("period"), repeat.get("periodUnit", "")
    if frequency in FREQUENCY and period in (1, 1.0) and period_unit in PERIODS and not repeat.get("frequencyMax"):
        return f"{FREQUENCY[frequency]} {PERIODS[period_unit]}"
    if frequency in (1, None) and isinstance(period, (int, float)) and period and period_unit in PERIOD_NAMES \
            and not repeat.get("periodMax"):
        count = int(period) if float(period).is_integer() else period
        return f"every {count} {PERIOD_NAMES[period_unit]}s"
    return timing_text(timing)


def dosage_text(dosage: dict) -> str:
    """One Dosage by the specification: its text, dose (quantity or range) and rate, timing, as
    needed (and for what), route, and the maximum doses."""
    bits = [dosage.get("text", "") if isinstance(dosage.get("text"), str) else ""]
    for dose_rate in dosage.get("doseAndRate") or []:
        if not isinstance(dose_rate, dict):
            continue
        bits.append(quantity_text(dose_rate.get("doseQuantity")) or range_text(dose_rate.get("doseRange")))
        rate = (comparator_quantity(dose_rate.get("rateQuantity")) or range_text(dose_rate.get("rateRange"))
                or ratio_text(dose_rate.get("rateRatio")))
        if rate:
            bits.append(f"rate {rate}")
    bits.append(timing_text(dosage.get("timing")))
    if dosage.get("route"):
        bits.append(f"route {concept_text(dosage['route'])}")
    if dosage.get("asNeededBoolean"):
        bits.append("as needed")
    if isinstance(dosage.get("asNeededCodeableConcept"), dict):
        bits.append(f"as needed for {concept_text(dosage['asNeededCodeableConcept'])}")
    most = dosage.get("maxDosePerPeriod")      # one Ratio in R4, a list in R5
    for ratio in most if isinstance(most, list) else [most] if isinstance(most, dict) else []:
        bits.append("max " + ratio_text(ratio).replace(" / ", " per "))
    if dosage.get("maxDosePerAdministration"):
        bits.append(f"max {quantity_text(dosage['maxDosePerAdministration'])} per dose")
    if isinstance(dosage.get("patientInstruction"), str):
        bits.append(dosage["patientInstruction"])
    seen, out = set(), []
    for bit in bits:
        if bit and bit not in seen:
            seen.add(bit)
            out.append(bit)
    return "; ".join(out)

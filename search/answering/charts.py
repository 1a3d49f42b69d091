"""The frame's trend chart: the series a first sentence states, or the readings a cited trend
chunk's typed fact holds (search/answering/facts.py)."""
from __future__ import annotations

from fhir_ingest.record.contract import Chunk

from search.answering.facts import series_facts
from search.answering.lead import Series, in_one_unit
from search.nlp.units import Measured, factor
from search.retrieval.types import Evidence


def series_chart(series) -> dict | None:
    """A chart a clinician can read: dates on x, values with the unit on y, each point's value,
    the reference range as a band when the record gives one, systolic and diastolic together."""
    comparable, _ = in_one_unit(series.points) if series.points else ([], [])
    points = [{"date": p.date, "values": p.values, "ref": p.ref, "text": p.text} for p, _ in comparable]
    if len(points) < 2 or len({len(p["values"]) for p in points}) != 1:
        return None
    unit = comparable[-1][0].unit
    names = ["systolic", "diastolic"] if len(points[0]["values"]) == 2 else [series.name]
    band = range_in(series, comparable[-1][0])
    return {"title": series.name, "full_title": series.coded or series.name, "unit": unit, "points": points,
            "series": names, "range": {"low": band[0], "high": band[1]} if band else None}


def range_in(series, unit_of) -> tuple | None:
    """The reference range in the chart's unit; none rather than a band in another unit."""
    if not series.range:
        return None
    convert = factor(series.range_unit, Measured(unit_of.ucum, unit_of.loinc)) if series.range_unit else None
    if convert is None:
        return series.range if series.range_unit is None else None
    return tuple(None if end is None else convert(end) for end in series.range)


def trend_chart(chunk: Chunk) -> dict | None:
    """The chart of a trend chunk an answer cites (a model-written answer, or one whose first
    sentence is not about a measurement)."""
    facts = series_facts(Evidence(chunk, 0.0))
    if not facts:
        return None
    series = Series(facts[0].series)
    for fact in facts:
        series.add(fact)
    return series_chart(series)

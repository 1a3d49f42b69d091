"""Dates written in a question, and the ones that do not exist.

A question about "labs on 2023-02-30" or "since 31/04/2024" names no day at all. Read as text it
would be answered with other dates' labs, as if the day existed; the answer says instead that the
date does not exist, so the clinician can ask again with the one meant.
"""
from __future__ import annotations

import calendar
import re
from datetime import date

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
MONTHS["sept"] = 9
MONTH_RE = "|".join(sorted(MONTHS, key=len, reverse=True))

# Each way a question writes a whole date, with how its groups read as (year, month, day).
_ISO = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_YEAR_FIRST = re.compile(r"\b(\d{4})[/.](\d{1,2})[/.](\d{1,2})\b")
_NAMED_MONTH = re.compile(rf"\b({MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)
_DAY_NAMED_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({MONTH_RE})\.?,?\s+(\d{{4}})\b", re.I)
# 31/04/2024 or 04/31/2024: day and month either way round; impossible only if neither exists.
_NUMERIC = re.compile(r"\b(\d{1,2})[/.](\d{1,2})[/.](\d{4})\b")


def valid_date(year: int, month: int, day: int) -> str:
    """ISO date, or "" when no such day exists (or the year is outside what a record can hold)."""
    if not 1 <= year <= 9998:      # leaves room to widen the window by a month either way
        return ""
    try:
        return date(year, month, day).isoformat()
    except ValueError:
        return ""


def impossible_dates(question: str) -> list[str]:
    """A sentence for each date in the question that does not exist: "2023-02-30 is not a date:
    February 2023 has 28 days"."""
    found = []
    for written, readings in _written_dates(question):
        if not any(valid_date(*reading) for reading in readings):
            found.append(f"{written} is not a date: {why_not(readings)}")
    return found


def _written_dates(question: str):
    """(the date as written, its possible (year, month, day) readings) for every date in the question."""
    for m in _ISO.finditer(question):
        yield m.group(0), [(int(m.group(1)), int(m.group(2)), int(m.group(3)))]
    for m in _YEAR_FIRST.finditer(question):
        yield m.group(0), [(int(m.group(1)), int(m.group(2)), int(m.group(3)))]
    for m in _NAMED_MONTH.finditer(question):
        yield m.group(0), [(int(m.group(3)), MONTHS[m.group(1).lower()], int(m.group(2)))]
    for m in _DAY_NAMED_MONTH.finditer(question):
        yield m.group(0), [(int(m.group(3)), MONTHS[m.group(2).lower()], int(m.group(1)))]
    for m in _NUMERIC.finditer(question):
        first, second, year = int(m.group(1)), int(m.group(2)), int(m.group(3))
        yield m.group(0), [(year, second, first), (year, first, second)]


def why_not(readings: list[tuple[int, int, int]]) -> str:
    if len(readings) > 1:
        return "read day first or month first, no such day exists"
    year, month, day = readings[0]
    if not 1 <= year <= 9998:
        return f"there is no year {year}"
    if not 1 <= month <= 12:
        return f"there is no month {month}"
    return f"{calendar.month_name[month]} {year} has {calendar.monthrange(year, month)[1]} days"

"""Values of one test in one unit, so a trend never compares 80 kg with 170 lb.

UCUM codes are read by ucumvert (the whole UCUM grammar, mapped onto pint's units) and converted by
pint; a mass concentration and a molar one of the same analyte (glucose in mg/dL and mmol/L) are
converted with the analyte's factor from the shipped LOINC mass <-> molar table
(search/nlp/data/terminology/loinc_conversion.tsv). What cannot be reconciled — an arbitrary unit
such as [IU] against a mass, two different annotations, a missing unit beside a present one — is
not converted: the caller keeps those points apart and says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

ANNOTATION = re.compile(r"\{[^}]*\}")
# Temperatures are on interval scales: a change relative to the value means nothing there (37 ->
# 38.5 is 4% in Celsius, 2.7% in Fahrenheit), so their steadiness is judged in degrees Celsius.
INTERVAL_SCALES = {"Cel", "[degF]", "[degRe]"}


@dataclass(frozen=True)
class Measured:
    """What a conversion needs of a reading's unit: its UCUM code (else the unit as recorded) and
    the LOINC code of what was measured."""
    unit: str
    loinc: str = ""


@lru_cache(maxsize=1)
def _registry():
    from ucumvert import PintUcumRegistry

    return PintUcumRegistry()


@lru_cache(maxsize=512)
def _parsed(code: str):
    """A pint unit for a UCUM code, or None where the code is not UCUM."""
    try:
        quantity = _registry().from_ucum(code)
    except Exception:        # ucumvert raises its own InvalidUcumError and lark's parse errors
        return None
    return getattr(quantity, "units", quantity) if quantity is not None else None


def _annotations(code: str) -> tuple[str, ...]:
    return tuple(sorted(a.lower() for a in ANNOTATION.findall(code)))


def factor(source: Measured, target: Measured):
    """A function turning a value in `source`'s unit into `target`'s, or None when they cannot be
    reconciled. The same unit needs no registry at all."""
    if source.unit == target.unit:
        return lambda value: value
    if not source.unit or not target.unit or _annotations(source.unit) != _annotations(target.unit):
        return None
    a, b = _parsed(source.unit), _parsed(target.unit)
    if a is None or b is None:
        return None
    if _ratio_of_amounts_against_a_percentage(source.unit, target.unit, a, b):
        return None
    direct = _pint_conversion(a, b)
    if direct is not None:
        return direct
    return _molar_conversion(source, target, a, b)


def celsius_change(first: float, last: float, unit: str) -> float | None:
    """last - first in degrees Celsius for a temperature; None for any other unit."""
    if unit not in INTERVAL_SCALES:
        return None
    to_celsius = factor(Measured(unit), Measured("Cel"))
    return None if to_celsius is None else to_celsius(last) - to_celsius(first)


def _ratio_of_amounts_against_a_percentage(source: str, target: str, a, b) -> bool:
    """mmol/mol against %: both dimensionless, so pint would divide by ten, but HbA1c's IFCC
    mmol/mol and its NGSP % are two scales joined by a regression (NGSP = 0.0915 IFCC + 2.15), not a
    unit: 53 mmol/mol is 7.0%, not 5.3%. A ratio of amounts is never converted to a percentage."""
    if not (a.dimensionless and b.dimensionless):
        return False
    return ("mol" in source) != ("mol" in target)


def _pint_conversion(a, b):
    from pint.errors import DimensionalityError, OffsetUnitCalculusError

    quantity = _registry().Quantity
    try:
        quantity(1.0, a).to(b)
    except (DimensionalityError, OffsetUnitCalculusError):
        return None
    return lambda value: float(quantity(value, a).to(b).magnitude)


def _molar_conversion(source: Measured, target: Measured, a, b):
    """Mass <-> molar through the analyte's factor: into the table row's unit, times the factor,
    then into the target's unit."""
    for from_unit, to_unit, row_factor in _conversion_rows_between(source.loinc, target.loinc):
        into_row, out_of_row = _pint_conversion(a, _parsed(from_unit)), _pint_conversion(_parsed(to_unit), b)
        if into_row is not None and out_of_row is not None:
            return lambda value: out_of_row(into_row(value) * row_factor)
    return None


def _conversion_rows_between(source_loinc: str, target_loinc: str) -> list[tuple[str, str, float]]:
    """The analyte's mass <-> molar rows leading from the source code to the target code; both
    codes alike (a vendor sending mmol/L under the mass code) use the analyte's own pair, either way."""
    rows = _conversion_rows()
    if not source_loinc or not target_loinc:
        return []
    if source_loinc == target_loinc:
        return [row for (a, b), row in rows.items() if source_loinc in (a, b)]
    return [rows[(source_loinc, target_loinc)]] if (source_loinc, target_loinc) in rows else []


@lru_cache(maxsize=1)
def _conversion_rows() -> dict[tuple[str, str], tuple[str, str, float]]:
    from search.nlp.terminology import conversion_rows

    rows: dict[tuple[str, str], tuple[str, str, float]] = {}
    # The table repeats some pairs with the factor rounded (creatinine: 0.011 and 0.01131): the
    # most precise one is kept.
    by_precision = sorted(conversion_rows(), key=lambda r: -len(r["factor"].strip("0").replace(".", "")))
    for r in by_precision:
        forward = float(r["factor"])
        if not forward:
            continue
        rows.setdefault((r["from_loinc"], r["to_loinc"]), (r["from_unit"], r["to_unit"], forward))
        rows.setdefault((r["to_loinc"], r["from_loinc"]), (r["to_unit"], r["from_unit"], 1 / forward))
    return rows

"""Clinical words for coded names: the short names clinicians use for labs, vitals and drugs
("eGFR", "K+", "clopidogrel 75 mg oral tablet"), units as written on a chart ("mmHg", "°C"), and
a dosage in a few words ("once daily, as needed"). The full coded name stays one click away in
the side panel; nothing here changes a value.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from fhir_ingest.record.normalize import codings, concept_text, quantity_text
from fhir_ingest.record.words import _strip_tag

SHORT_NAMES = Path(__file__).with_name("data") / "short_names.tsv"
UNITS = {"Cel": "°C", "[degF]": "°F", "mm[Hg]": "mmHg", "kg/m2": "kg/m²", "mL/min/{1.73_m2}": "mL/min/1.73 m²",
         "10*3/uL": "×10³/µL", "10*6/uL": "×10⁶/µL", "10*9/L": "×10⁹/L", "10*12/L": "×10¹²/L", "{score}": "",
         "[lb_av]": "lb", "[in_i]": "in", "/min": "/min", "{beats}/min": "/min", "{breaths}/min": "/min", "ug/L": "µg/L",
         "uIU/mL": "µIU/mL", "umol/L": "µmol/L", "mg/dL": "mg/dL"}
DOSE_FORM_WORDS = re.compile(
    r"\b(Oral|Tablet|Tablets|Capsule|Capsules|Injectable|Injection|Solution|Suspension|Extended|Release|Delayed|"
    r"Topical|Cream|Ointment|Gel|Lotion|Inhaler|Inhalation|Powder|Patch|Transdermal|Spray|Nasal|Ophthalmic|Day|Pack|"
    r"Intrauterine|System|Drug|Implant|Auto-Injector|Prefilled|Syringe|Chewable|Disintegrating|Metered|Dose|Vaginal|"
    r"Rectal|Suppository|Film|Coated|Enteric|Sublingual|Otic|Pen|Injector|Cartridge|Actuation|Dry|Liquid|Elixir|Syrup|"
    r"Product|Kit|Medicated|Pad|Shampoo|Foam|Mouthwash|Lozenge|Granules|Buccal)\b")
APPLICATION_NUMBER = re.compile(r"^\s*(?:N?DA|ANDA|BLA)\d+\s+")
BOILERPLATE_DOSE = re.compile(r"^(take as needed|as needed)\.?$", re.I)


@lru_cache(maxsize=1)
def short_names() -> dict[str, str]:
    rows = (line.split("\t") for line in SHORT_NAMES.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#"))
    return {code.strip(): name.strip() for code, name in rows}


def observation_name(code: dict | None) -> str:
    """'eGFR' for any of its LOINC codes; else the coded name without its LOINC axes
    ('Platelets [#/volume] in Blood by Automated count' → 'Platelets')."""
    for coding in codings(code):
        if "loinc" in str(coding.get("system", "")) and coding.get("code") in short_names():
            return short_names()[coding["code"]]
    return plain_observation_name(concept_text(code))


def plain_observation_name(name: str) -> str:
    name = re.split(r"\s+\[|\s+in (?:Blood|Serum|Plasma|Urine|Arterial|Venous|Capillary)\b|\s+by\s+|/Hemoglobin\.total",
                    name, maxsplit=1)[0]
    return _strip_tag(name).strip() or name


def unit(code: str) -> str:
    """A UCUM annotation alone ('{#}', '{score}') is no unit a chart prints."""
    return "" if re.fullmatch(r"\{[^}]*\}", code or "") else UNITS.get(code, code)


def value_words(quantity: dict | None) -> str:
    """'4.68 mmol/L', the value exactly as recorded, the unit as a chart writes it."""
    if not quantity or quantity.get("value") is None:
        return ""
    number = quantity_text({"value": quantity["value"]})
    shown = unit(quantity.get("unit") or quantity.get("code") or "")
    return f"{number}{shown}" if shown == "%" or shown.startswith("/") else f"{number} {shown}".strip()


def drug_name(name: str) -> str:
    """'NDA020800 0.3 ML Epinephrine 1 MG/ML Auto-Injector' → '0.3 mL Epinephrine 1 mg/mL auto-injector'."""
    name = APPLICATION_NUMBER.sub("", name)
    name = re.sub(r"\bMG\b", "mg", name)
    name = re.sub(r"\bMCG\b", "mcg", name)
    name = re.sub(r"\bML\b", "mL", name)
    name = re.sub(r"\bUNT\b", "units", name)
    name = re.sub(r"\bHR\b", "hr", name)
    name = name.replace("Extended Release", "ER").replace("Delayed Release", "DR")
    return DOSE_FORM_WORDS.sub(lambda m: m.group(0).lower(), name).strip()


def dosage_words(doses: list) -> str:
    """'once daily', 'twice daily, as needed', '1-2 tablet every 6 hours', or the prescriber's own
    text when the EHR sends it (the typed doses of a medication fact)."""
    out = []
    for dose in doses or []:
        bits = [dose.text] if dose.text and not BOILERPLATE_DOSE.match(dose.text.strip()) else []
        if not bits:
            amount = dose.amount.text if dose.amount is not None and (dose.amount.kind == "range" or (
                dose.amount.quantity is not None and dose.amount.quantity.unit)) else ""
            bits += [b for b in (amount, dose.frequency) if b]
        if dose.as_needed and "as needed" not in " ".join(bits).lower():
            bits.append(dose.as_needed)
        words = ", ".join(b for b in bits if b)
        if words and words not in out:
            out.append(words)
    return "; ".join(out)


def condition_name(code: dict | None) -> str:
    """'Chronic kidney disease stage 1 (disorder)' → 'chronic kidney disease stage 1'."""
    name = _strip_tag(concept_text(code))
    return name[:1].lower() + name[1:] if name[1:2].islower() else name

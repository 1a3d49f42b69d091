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


def dosage_words(doses: list, medication: str = "") -> str:
    """'1 tablet twice daily', 'every six hours, as needed', '1-2 tablet every 6 hours', or the
    prescriber's own text when the EHR sends it (the typed doses of a medication fact). A dose of
    no unit ("1") is counted in the drug's form when its name gives one ("1 tablet")."""
    out = []
    for dose in doses or []:
        text = _strip_tag(dose.text).strip()          # a coded instruction's '(qualifier value)'
        if text != dose.text.strip() and text[1:2].islower():
            text = text[:1].lower() + text[1:]
        bits = [text] if text and not BOILERPLATE_DOSE.match(text) else []
        if not any(ch.isdigit() for ch in "".join(bits)):
            bits = [amount_words(dose, medication)] + (bits or [dose.frequency])
        words = " ".join(b for b in bits if b)
        if dose.as_needed and "as needed" not in words.lower():
            words = ", ".join(b for b in (words, dose.as_needed) if b)
        if words and words not in out:
            out.append(words)
    return "; ".join(out)


# The unit a dose of no unit is counted in, by the words of the drug's dose form.
FORM_UNITS = (("transdermal system", "patch", "patches"), ("patch", "patch", "patches"), ("tablet", "tablet", "tablets"),
              ("capsule", "capsule", "capsules"), ("suppository", "suppository", "suppositories"),
              ("lozenge", "lozenge", "lozenges"), ("metered dose", "puff", "puffs"), ("inhaler", "puff", "puffs"),
              ("auto-injector", "injection", "injections"), ("prefilled syringe", "injection", "injections"))


def amount_words(dose, medication: str) -> str:
    """'1-2 tablet', '5 mL', or a count in the drug's form ('1 tablet', '2 capsules'); '' when
    the count has no unit and the drug's name gives no form to count it in."""
    amount = dose.amount
    if amount is None:
        return ""
    if amount.kind == "range" or (amount.quantity is not None and amount.quantity.unit):
        return amount.text
    number = amount.quantity.value if amount.quantity is not None else None
    name = (medication or "").lower()
    form = next(((one, many) for words, one, many in FORM_UNITS if words in name), None)
    if number is None or form is None:
        return ""
    count = int(number) if float(number).is_integer() else number
    return f"{count} {form[0] if count == 1 else form[1]}"


def condition_name(code: dict | None) -> str:
    """'Chronic kidney disease stage 1 (disorder)' → 'chronic kidney disease stage 1'."""
    name = _strip_tag(concept_text(code))
    return name[:1].lower() + name[1:] if name[1:2].islower() else name

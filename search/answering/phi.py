"""Removing identifiers before text leaves the process (for an LLM): the patient's names, MRNs and
other identifiers, birth date, address and phone numbers from their Patient resource, plus
patterns that identify anyone (phone numbers, e-mail, SSNs, Synthea-style numbered names).

Clinical dates stay: "the A1c of 2024-03-01" is evidence, not an identifier. The birth date is
removed in every spelling the notes use.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date

PHONE = re.compile(r"(?<!\d)(?:\+?1[\s.-]?)?\(?\d{3}\)?[\s.-]\d{3}[\s.-]\d{4}(?!\d)")
EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b")
SSN = re.compile(r"\b\d{3}-\d{2}-\d{4}\b")
# Synthea appends digits to every generated name ("Kerry175 Kuhn96"); real names have none.
NUMBERED_NAME = re.compile(r"\b(?:Mr\.|Mrs\.|Ms\.|Dr\.)?\s*[A-Z][a-z'’-]+\d{1,4}(?:\s+[A-Z][a-z'’-]+\d{1,4})*\b")
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


@dataclass
class Identifiers:
    phrases: list[str] = field(default_factory=list)     # exact strings to remove (names, MRNs, address parts)
    birth_date: date | None = None

    @classmethod
    def from_patient(cls, patient: dict | None) -> "Identifiers":
        if not patient:
            return cls()
        phrases: set[str] = set()
        for name in patient.get("name") or []:
            parts = list(name.get("given") or []) + [name.get("family") or ""] + list(name.get("prefix") or [])
            for part in parts:
                if part and len(part) > 1:
                    phrases.add(part)
                    phrases.add(re.sub(r"\d+$", "", part))        # "Kuhn96" is also written "Kuhn"
            if name.get("text"):
                phrases.add(name["text"])
        for ident in patient.get("identifier") or []:
            if ident.get("value"):
                phrases.add(str(ident["value"]))
        for address in patient.get("address") or []:
            phrases.update(address.get("line") or [])
            for key in ("city", "postalCode", "district"):
                if address.get(key):
                    phrases.add(address[key])
        for telecom in patient.get("telecom") or []:
            if telecom.get("value"):
                phrases.add(telecom["value"])
        born = None
        try:
            born = date.fromisoformat(str(patient.get("birthDate", ""))[:10])
        except ValueError:
            pass
        return cls(sorted((p for p in phrases if len(p) > 1), key=len, reverse=True), born)

    def birth_date_spellings(self) -> list[str]:
        if self.birth_date is None:
            return []
        d = self.birth_date
        month = MONTHS[d.month - 1]
        return [d.isoformat(), f"{d.month}/{d.day}/{d.year}", f"{d.month:02d}/{d.day:02d}/{d.year}",
                f"{month} {d.day}, {d.year}", f"{d.day} {month} {d.year}", f"{month[:3]} {d.day}, {d.year}"]


def scrub(text: str, ids: Identifiers) -> str:
    for spelling in ids.birth_date_spellings():
        text = text.replace(spelling, "[birth date]")
    for phrase in ids.phrases:
        text = re.sub(rf"(?<![\w]){re.escape(phrase)}(?![\w])", "[redacted]", text, flags=re.IGNORECASE)
    text = SSN.sub("[redacted]", text)
    text = PHONE.sub("[phone]", text)
    text = EMAIL.sub("[email]", text)
    text = NUMBERED_NAME.sub(" [name]", text)
    return re.sub(r"\s{2,}", " ", text).strip()

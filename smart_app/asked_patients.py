"""Which patients a request names, by rule rather than by a list of spellings.

The patient always comes from the launch; a request that names another one is refused, never
quietly ignored. A list of keys (`patient`, `patient_id`, ...) missed `patient_ids`, `subjectId`,
`subject_id` and `beneficiary`, so a request names a patient wherever
- a key (query or JSON body, at any depth) reads, split into words and made singular, as a word
  for a patient (patient, subject, beneficiary, person, member, individual, ...): every value
  under it names one; or
- any value is shaped `Patient/<id>` (bare or at the end of a FHIR URL, with or without a
  version): it names that patient, whatever its key.
The text of a question is a value, not a key: "which patient ..." names nobody.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

PATIENT_WORDS = frozenset({"patient", "pt", "subject", "beneficiary", "person", "people", "member", "individual",
                           "resident", "enrollee", "insured", "mrn"})
# A FHIR reference to a Patient: `Patient/x`, `https://ehr/fhir/Patient/x`, `Patient/x/_history/2`.
PATIENT_REFERENCE = re.compile(r"(?:[^\s]*/)?Patient/([A-Za-z0-9\-.]{1,64})(?:/_history/[A-Za-z0-9\-.]{1,64})?/?")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def asked_patients(pairs: Iterable[tuple[str, object]]) -> list[str]:
    """Every patient id named by these (key, value) pairs, looked through at any depth."""
    asked = []
    for value, under_patient_key in _leaves(pairs):
        named = _named_patient(value, under_patient_key)
        if named is not None:
            asked.append(named)
    return asked


def names_a_patient(key: str) -> bool:
    """`patient_ids`, `subjectId`, `Beneficiary`, `patient.reference`, `thePatients`: a key that,
    split into words (separators and camel case) and made singular, has a word for a patient."""
    words = [w.lower() for w in _WORDS.findall(key)]
    return any(_singular(w) in PATIENT_WORDS or _starts_with_patient_word(w) for w in words)


def _starts_with_patient_word(word: str) -> bool:
    """A key written as one lower-case word: `patientid`, `subjectref`, `patientids`."""
    return any(word.startswith(p) and word[len(p):] in ("id", "ids", "ref", "refs", "reference", "references")
               for p in PATIENT_WORDS)


def _singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _named_patient(value: object, under_patient_key: bool) -> str | None:
    if value is None or isinstance(value, bool) or value == "":
        return None
    text = value if isinstance(value, str) else str(value)
    reference = PATIENT_REFERENCE.fullmatch(text.strip())
    if reference:
        return reference.group(1)
    return text if under_patient_key else None


def _leaves(pairs: Iterable[tuple[str, object]]) -> Iterator[tuple[object, bool]]:
    """(scalar value, whether a patient key lies above it), without recursion: a body may nest
    deeper than Python's stack."""
    stack = [(value, isinstance(key, str) and names_a_patient(key)) for key, value in pairs]
    while stack:
        value, under = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, under or (isinstance(k, str) and names_a_patient(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, under) for v in value)
        else:
            yield value, under

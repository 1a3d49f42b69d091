"""Concepts a record's codings name through the maintained terminologies, whatever words the
record uses: a LOINC code is its analyte ("Prostate specific Ag [Mass/volume]..." is PSA), a CVX
code its vaccine group ("zoster vaccine recombinant" is a shingles vaccine), an RxNorm drug its
ingredients and their classes ("[Percocet]" is oxycodone, an opioid). Questions reach the same
concepts through the lexicon's words (search/nlp/lexicon.py), so a clinician's shorthand meets the
record's codes."""
from __future__ import annotations

from search.nlp import terminology
from search.nlp.lexicon import lexicon_key, vaccine_concept

LOINC = "http://loinc.org"
CVX = "http://hl7.org/fhir/sid/cvx"


def concept(canonical: str, semantic_type: str) -> dict:
    return {"key": lexicon_key(canonical), "display": canonical, "semantic_type": semantic_type, "negated": False}


def coded_concepts(coding: dict, semantic_type: str) -> list[dict]:
    """The lexicon concepts one coding of a chunk names (asserted: a coding is the record's own)."""
    system, code, display = coding.get("system", ""), coding.get("code", ""), coding.get("display", "")
    if system == LOINC and code:
        analyte = terminology.analyte_of(code)
        return [concept(analyte, "lab")] if analyte else []
    if system == CVX and code:
        return [concept(vaccine_concept(group), "immunization") for group in sorted(terminology.vaccine_groups(code))]
    if semantic_type in ("medication", "allergy") and display:
        found = []
        for ingredient in sorted(terminology.ingredients_in(display)):
            found.append(concept(ingredient, semantic_type))
            found += [concept(name, semantic_type) for name in sorted(terminology.classes_of(ingredient, epc=False))]
        return found
    return []

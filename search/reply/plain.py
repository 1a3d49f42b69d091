"""Plain-language names beside clinical terms: "osteomyelitis (a bone infection)".

The table is `data/plain_terms.tsv`, the project's own (CC0), small on purpose: a term is glossed
only where the table has it, and a draft glosses at most a few terms so it stays short. No
consumer-health vocabulary with a licence that allows shipping is installable here.

The same table is read in reverse (`clinical_reading`): a patient writes "so his body doesn't
reject it" where the record says "tacrolimus", a member of the immunosuppressants; the question is
read with the clinical term beside the patient's words before retrieval, as a clinician would.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).parent / "data" / "plain_terms.tsv"


@lru_cache(maxsize=1)
def _rows() -> list[tuple[str, str, list[str]]]:
    """(clinical term, plain name, the words patients write for it) for each row of the table."""
    rows = []
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            term, plain, *lay = line.split("\t") + [""]
            rows.append((term.strip().lower(), plain.strip(), [w.strip() for w in lay[0].split("|") if w.strip()]))
    return rows


@lru_cache(maxsize=1)
def plain_terms() -> dict[str, str]:
    return {term: plain for term, plain, _ in _rows()}


@lru_cache(maxsize=1)
def _lay_forms() -> list[tuple[re.Pattern, str]]:
    """What a patient may write for each term: its plain name without its article, when it has two
    words or more (one word, "swelling", "open", "kidney", is too common to stand for a term), and
    the patients' words of its row."""
    forms = []
    for term, plain, lay in _rows():
        name = re.sub(r"^(?:an?|the)\s+", "", plain, flags=re.I)
        for form in ([name] if len(name.split()) >= 2 else []) + lay:
            forms.append((re.compile(rf"\b{re.escape(form)}\b", re.I), term))
    return forms


def clinical_reading(question: str) -> str:
    """The question with the clinical term in brackets after the patient's words for it ("his body
    doesn't reject (immunosuppressant) it"), once a term, unless the question names the term already.
    Added, never replacing: the patient's own words still count in retrieval."""
    question = question.replace("\u2019", "'")     # "doesn’t" typed on a phone
    for pattern, term in _lay_forms():
        if re.search(rf"\b{re.escape(term)}\b", question, re.I):
            continue
        m = pattern.search(question)
        if m:
            question = f"{question[:m.end()]} ({term}){question[m.end():]}"
    return question


def glosses(text: str, already: set[str], most: int) -> list[str]:
    """"term: plain name" for the table's terms the text uses, not yet glossed in the draft
    (`already`), longest terms first, at most `most`. Said beside the quote, never inside it."""
    done: list[str] = []
    for term in sorted(plain_terms(), key=len, reverse=True):
        if len(done) >= most or term in already:
            continue
        # A term inside a longer one glossed ("stenosis" in "carotid stenosis") is left alone.
        if re.search(rf"\b{re.escape(term)}(?:e?s)?\b", text, re.I) and not any(term in longer for longer in done):
            done.append(term)
    already.update(done)
    return [f"{term}: {plain_terms()[term]}" for term in done]

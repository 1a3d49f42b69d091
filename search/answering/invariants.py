"""What every answer must hold, checked on the answer as it leaves the service: each [n] of its
text opens a citation, and each citation opens an item of the answer's evidence list (the
clinician's panel), so no mark points at a record the clinician cannot see beside the answer."""
from __future__ import annotations

import logging
import re
from dataclasses import replace

from search.answering.types import Answer

log = logging.getLogger(__name__)
MARK = re.compile(r"\[(\d+)\]")


def citations_outside_evidence(answer: dict) -> list[int]:
    """The citation numbers of an answer (in its JSON form) that open nothing in its evidence list:
    a mark without a citation, or a citation whose record no evidence item holds."""
    shown = {ref for item in answer.get("evidence", []) for ref in [item["ref"], *(item.get("refs") or [])]}
    cited = {c["n"]: c["ref"] for c in answer.get("citations", [])}
    marks = {int(n) for n in MARK.findall(answer.get("answer", ""))}
    marks |= {n for s in answer.get("statements", []) for n in s.get("citations", [])}
    return sorted(n for n in marks if cited.get(n) not in shown)


def checked(answer: Answer) -> Answer:
    """The answer, with how many of its citations open nothing in its evidence said in its
    diagnostics and logged (the count only: no question text or patient detail is logged)."""
    outside = citations_outside_evidence(answer.to_dict())
    if outside:
        log.warning("an answer cites %d record(s) outside its evidence list", len(outside))
    return replace(answer, diagnostics={**answer.diagnostics, "citations_outside_evidence": len(outside)})

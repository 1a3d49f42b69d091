"""The answer is typed once and becomes JSON in one place; the JSON contract stays as it was."""
from __future__ import annotations

from search.answering.types import Answer, Citation, EvidenceItem, Statement

ALWAYS = {"id", "patient_id", "question", "answer", "statements", "citations", "evidence", "confidence", "abstained",
          "diagnostics", "generator", "removed_statements", "chart"}


def test_an_answer_emits_the_contract_keys_and_optional_ones_only_when_set():
    plain = Answer("q1", "p", "any allergies?", "Penicillin [1]", [Statement("Penicillin", [1])],
                   [Citation(1, "AllergyIntolerance/a", "AllergyIntolerance", "2020-01-01", "Allergy · Penicillin", "x")],
                   [EvidenceItem(1, "AllergyIntolerance/a", ["AllergyIntolerance/a"], "c1", 0.5, "l", "t")],
                   "high", False, {"pipeline": "full"})
    out = plain.to_dict()
    assert set(out) == ALWAYS and out["generator"] == "extractive" and out["chart"] is None
    assert out["statements"] == [{"text": "Penicillin", "citations": [1]}]
    assert out["citations"][0] == {"n": 1, "ref": "AllergyIntolerance/a", "resource_type": "AllergyIntolerance",
                                   "date": "2020-01-01", "label": "Allergy · Penicillin", "snippet": "x"}
    listed = Answer("q2", "p", "on a statin?", "I don't have evidence…", [Statement("Aspirin", [1], context=True)],
                    [], [], "low", True, lead="I don't have evidence… Recorded medications:", class_entries=1)
    out = listed.to_dict()
    assert set(out) == ALWAYS | {"lead", "class_entries"} and out["statements"][0]["context"] is True
    general = Answer(None, "p", "what is a statin?", "…", [], [], [], "low", False, general=True, banner="General")
    assert set(general.to_dict()) == ALWAYS | {"general", "banner"}
    assert Statement("x", [2], conflict=True).to_dict() == {"text": "x", "citations": [2], "conflict": True}

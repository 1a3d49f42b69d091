"""Evidence of a question that spans notes keeps room for other notes (search/retrieval/pipeline.py)."""
from __future__ import annotations

from fhir_ingest.record.contract import Chunk
from search.retrieval.types import Evidence
from search.retrieval.analysis import analyse, spans_notes
from search.retrieval.ranking import select


def note_chunk(note: str, part: int) -> Evidence:
    chunk = Chunk("t", "p", "DocumentReference", note, str(part), f"{note} passage {part}", f"{note} {part}",
                  semantic_type="note")
    return Evidence(chunk, 1.0 - part / 100)


def ranked() -> list[Evidence]:
    # One long note's chunks rank first; the other note's answering chunk comes after them.
    return [note_chunk("long", i) for i in range(6)] + [note_chunk("short", 10)]


def test_one_long_note_fills_the_evidence_without_a_share():
    chosen = select(ranked(), 5)
    assert {ev.chunk.resource_id for ev in chosen} == {"long"}


def test_a_share_per_note_lets_the_other_note_in_and_keeps_the_order():
    chosen = select(ranked(), 5, per_note=2)
    assert [ev.chunk.part for ev in chosen] == ["0", "1", "10", "2", "3"]


def test_comparisons_and_two_part_questions_span_notes():
    for question in ("left carotid: how bad on the 2008 duplex vs at surgery",
                     "was the pain worse in 2007 than in 2009",
                     "what happened with her coumadin after the GI bleed and then after the INR of 12",
                     "which side was weak with the first stroke and with the second one"):
        assert spans_notes(analyse(question)), question


def test_a_list_or_a_single_question_keeps_its_note_whole():
    for question in ("what meds did she go home on after the pacemaker", "Did the MRI of my spine show any MS?",
                     "what was the plan at discharge"):
        assert not spans_notes(analyse(question)), question


def test_a_year_on_one_side_of_a_comparison_does_not_window_the_whole_question():
    from search.retrieval.analysis import time_window
    assert time_window("bp meds when she left after the pacemaker vs what she was taking in 2009") == ("", "")
    assert time_window("what was her a1c in 2009") == ("2009-01-01", "2009-12-31")
    assert time_window("a1c in 2009 vs 2010") == ("2009-01-01", "2010-12-31")
    assert time_window("wt at the 2025 physical vs the prior years") == ("", "2025-12-31")


def test_an_event_on_one_side_of_a_comparison_does_not_window_the_whole_question():
    from search.retrieval.analysis import anchored_on_one_side

    # The echo is of another day than the cath: "at cath" places only the second side.
    assert anchored_on_one_side("ejection fraction on the echo vs on the LV gram at cath")
    assert anchored_on_one_side("bp meds when she left after the pacemaker vs what she was taking in 2009")
    # Both sides placed, or no comparison: the anchor stage decides as before.
    assert not anchored_on_one_side("what happened after the GI bleed and then after the INR of 12")
    assert not anchored_on_one_side("ejection fraction at cath")

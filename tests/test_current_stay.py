"""Deictic references to the stay the clinician is in ("this admission", "since admission", "on
this visit") are a time window: the encounter in progress, else the latest inpatient stay (issue 35).
Without one the question is not answered over the whole record."""
from __future__ import annotations

import pytest

from fhir_ingest.record.contract import Chunk
from search.backends.base import Hit, Scope
from search.retrieval.timeline import CURRENT_STAY, current_stay_window


def encounter(eid: str, start: str, end: str, status: str, klass: str) -> Chunk:
    return Chunk("t", "p", "Encounter", eid, "0", f"Visit {eid}", f"{start} · Visit", date=start,
                 semantic_type="encounter", status=status,
                 fact={"kind": "encounter", "date": start, "end": end, "status": status, "encounter_class": klass})


class Encounters:
    """The two backend reads the window needs, over a list of encounter chunks."""

    def __init__(self, chunks: list[Chunk]):
        self.chunks = {c.chunk_id: c for c in chunks}

    def latest(self, scope: Scope, n: int) -> list[Hit]:
        return [Hit(cid, 0.0) for cid in self.chunks][:n]

    def get_chunks(self, tenant: str, ids: list[str]) -> list[Chunk]:
        return [self.chunks[i] for i in ids]


SCOPE = Scope("t", "p")


@pytest.mark.parametrize("question", [
    "was she vaccinated against influenza this admission?", "any labs since admission?", "meds given on this visit",
    "fevers during the current hospitalization?", "any falls this stay", "pain scores since he was admitted",
    "what was done on this encounter?",
])
def test_the_words_that_point_at_the_present_stay_are_read(question):
    assert CURRENT_STAY.search(question), question


@pytest.mark.parametrize("question", ["what was the reason for the admission?", "this morning's potassium",
                                      "any visits this year?", "current meds"])
def test_other_words_are_not_read_as_the_present_stay(question):
    assert not CURRENT_STAY.search(question), question


def test_the_encounter_in_progress_is_this_admission_over_a_newer_finished_one():
    backend = Encounters([encounter("old", "2020-01-01", "2020-01-05", "finished", "IMP"),
                          encounter("now", "2024-03-01", "", "in-progress", "IMP"),
                          encounter("clinic", "2024-03-10", "2024-03-10", "finished", "AMB")])
    found = current_stay_window(backend, SCOPE, "any antibiotics this admission?")
    assert (found.date_from, found.date_to, found.missing) == ("2024-03-01", "", "")
    assert "current stay" in found.note


def test_without_one_in_progress_the_latest_inpatient_stay_with_its_end():
    backend = Encounters([encounter("old", "2020-01-01", "2020-01-05", "finished", "IMP"),
                          encounter("stay", "2023-06-01", "2023-06-04T12:00:00Z", "finished", "IMP"),
                          encounter("clinic", "2024-03-10", "2024-03-10", "finished", "AMB"),
                          encounter("booked", "2025-01-01", "", "planned", "IMP")])
    found = current_stay_window(backend, SCOPE, "any antibiotics this admission?")
    assert (found.date_from, found.date_to) == ("2023-06-01", "2023-06-04")
    visit = current_stay_window(backend, SCOPE, "vitals on this visit")
    assert (visit.date_from, visit.date_to) == ("2024-03-10", "2024-03-10")


def test_no_stay_to_point_at_is_said_not_searched():
    found = current_stay_window(Encounters([encounter("clinic", "2024-03-10", "2024-03-10", "finished", "AMB")]),
                                SCOPE, "any antibiotics this admission?")
    assert found.missing.startswith("No hospital admission in progress or recorded for 'this admission'")
    assert current_stay_window(Encounters([]), SCOPE, "what was the reason for the admission?") is None

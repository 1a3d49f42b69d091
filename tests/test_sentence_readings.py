"""Note chunks read once (search/sentence_readings.py): a note's pieces are split and its sentences
embedded at most once, whichever question or process meets them first; a changed text is read
again; a removed note's readings go with it."""
from __future__ import annotations

import base64
from collections import Counter

import pytest

import fhir_ingest.record.notes as notes
from fhir_ingest.record.notes import NotRemembered, forget_splits, note_sentences, only_remembered
from search.backends.base import Scope
from search.service import SearchService

from .conftest import indexed_record

PID = "p-readings"
PATIENT = {"resourceType": "Patient", "id": PID, "gender": "male", "birthDate": "1950-01-01"}
TEXT = """HISTORY OF PRESENT ILLNESS: A 64-year-old man seen by Dr. Smith for chest pain.

ALLERGIES:
SULFA AND IVP DYE.

HOSPITAL COURSE:
He was ruled out for MI. An echocardiogram showed an ejection fraction of 55%.

DISCHARGE MEDICATIONS:
1.  Levaquin 250 mg p.o. every other day for the next 5 days.
2.  Novolin 70/30, 15 units b.i.d.
PLAN: Follow up with cardiology in 2 weeks."""


def note(text: str) -> dict:
    return {"resourceType": "DocumentReference", "id": "ds-1", "status": "current",
            "subject": {"reference": f"Patient/{PID}"},
            "type": {"coding": [{"system": "http://loinc.org", "code": "18842-5", "display": "Discharge summary"}]},
            "date": "2010-05-02T10:00:00Z",
            "content": [{"attachment": {"contentType": "text/plain", "data": base64.b64encode(text.encode()).decode()}}]}


class Counted:
    """Counts each text PyRuSH splits and each text the embedder embeds outside retrieval."""

    def __init__(self, monkeypatch, embedder):
        self.split, self.embedded = Counter(), Counter()
        split = notes._split_sentences

        def counting_split(text):
            self.split[text] += 1
            return split(text)

        encode = embedder.encode

        def counting_encode(texts, progress=None):
            self.embedded.update(texts)
            return encode(texts, progress)

        monkeypatch.setattr(notes, "_split_sentences", counting_split)
        monkeypatch.setattr(embedder, "encode", counting_encode)

    def clear(self):
        self.split.clear()
        self.embedded.clear()


@pytest.fixture()
def record(tmp_path, embedder, monkeypatch):
    service = indexed_record(tmp_path, [PATIENT, note(TEXT)])
    forget_splits()              # as in a process that has met none of it
    counted = Counted(monkeypatch, service.embedder)
    yield service, counted, tmp_path
    service.close()


def kept_readings(service) -> dict:
    return dict(service.backend._db().execute("SELECT chunk_id, text_hash FROM chunk_readings").fetchall())


def test_a_note_is_split_and_embedded_once_across_questions_and_processes(record):
    service, counted, folder = record
    first = service.ask("t", PID, "what was the ejection fraction?")
    assert "55%" in first["answer"], first["answer"]
    assert counted.split and counted.embedded, "the first question reads the note"
    assert max(counted.split.values()) == 1 and max(counted.embedded.values()) == 1
    service.ask("t", PID, "what antibiotic did he go home on?")
    # Every piece split once and every sentence embedded once, over both questions.
    assert max(counted.split.values()) == 1, [t for t, n in counted.split.items() if n > 1]
    assert max(counted.embedded.values()) == 1, [t for t, n in counted.embedded.items() if n > 1]
    assert kept_readings(service), "what was computed is kept in the index"

    # Another process (nothing remembered) reads the kept readings instead of splitting again.
    forget_splits()
    counted.clear()
    other = SearchService("embedded", folder / "index.sqlite")
    try:
        again = other.ask("t", PID, "what was the ejection fraction?")
    finally:
        other.close()
    assert again["answer"] == first["answer"]
    assert not counted.split, list(counted.split)
    assert list(counted.embedded) == [], "the sentences' vectors come from the index"


def test_a_changed_note_text_is_split_again(record, tmp_path_factory):
    service, counted, folder = record
    service.ask("t", PID, "what was the ejection fraction?")
    before = kept_readings(service)
    assert before
    changed = TEXT.replace("ejection fraction of 55%", "ejection fraction of 35%")
    path = tmp_path_factory.mktemp("changed") / "record.ndjson"
    import json

    path.write_text("\n".join(json.dumps(r) for r in (PATIENT, note(changed))) + "\n", encoding="utf-8")
    service.index_paths("t", [path])
    # The chunk holding the changed sentence keeps no reading of its old text.
    assert all(kept_readings(service).get(cid) != digest for cid, digest in before.items()), \
        "a reading of the old text survived"
    counted.clear()
    answer = service.ask("t", PID, "what was the ejection fraction?")
    assert "35%" in answer["answer"], answer["answer"]
    assert any("35%" in text for text in counted.split), "the changed text was split again"


def test_a_removed_patients_readings_go_with_the_record_and_anothers_stay(tmp_path, embedder):
    other = {"resourceType": "Patient", "id": "p-other", "gender": "female", "birthDate": "1960-01-01"}
    other_note = {**note(TEXT), "id": "ds-2", "subject": {"reference": "Patient/p-other"}}
    service = indexed_record(tmp_path, [PATIENT, note(TEXT), other, other_note])
    try:
        service.ask("t", PID, "what was the ejection fraction?")
        service.ask("t", "p-other", "what was the ejection fraction?")
        mine = set(service.backend.indexed_texts("t", PID))
        theirs = set(service.backend.indexed_texts("t", "p-other"))
        assert mine & set(kept_readings(service)) and theirs & set(kept_readings(service))
        # Every resource of the patient removed (as a Bulk `deleted` list or a sync would).
        refs = [f"{r['resourceType']}/{r['id']}" for r in service.held_resources("t", PID)]
        service.delete_resources("t", PID, refs)
        kept = set(kept_readings(service))
        assert not mine & kept and theirs & kept
        check = service.backend.check("t")
        assert check.counts["sentence readings"] == len(kept) and not check.warnings, check
    finally:
        service.close()


def test_check_reports_readings_left_without_their_chunk_and_repair_removes_them(record):
    service, _, _ = record
    service.ask("t", PID, "what was the ejection fraction?")
    db = service.backend._db()
    # As an earlier chartcite, which did not know the readings, would leave them.
    db.execute("DELETE FROM chunks WHERE semantic_type = 'note'")
    check = service.backend.check("t")
    assert any("sentence readings belong to chunks the index no longer holds" in w for w in check.warnings), check
    assert service.backend.prune_readings("t") > 0
    assert kept_readings(service) == {}


def test_the_question_is_embedded_once_for_retrieval_and_the_sentences(record):
    service, counted, _ = record
    asked = []
    embedder = service.embedder
    encode_queries = embedder.encode_queries

    def counting(texts):
        asked.extend(texts)
        return encode_queries(texts)

    embedder.encode_queries = counting
    try:
        service.ask("t", PID, "what was the ejection fraction?", pipeline="dense")
        assert asked == ["what was the ejection fraction?"]
        assert counted.embedded and "what was the ejection fraction?" not in counted.embedded
        # The full pipeline searches with the question's synonyms added: the question itself is
        # embedded beside that text, once.
        asked.clear()
        service.ask("t", PID, "what was the ef?", pipeline="full")
        assert asked.count("what was the ef?") == 1 and len(asked) == 2, asked
    finally:
        del embedder.encode_queries


def test_nothing_is_split_inside_only_remembered():
    forget_splits()
    with only_remembered(), pytest.raises(NotRemembered):
        note_sentences("A sentence never split before. And another.")
    note_sentences("A sentence never split before. And another.")
    with only_remembered():
        assert len(note_sentences("A sentence never split before. And another.")) == 2


def test_an_opened_patients_notes_are_read_before_the_first_question(record):
    service, counted, folder = record
    other = SearchService("embedded", folder / "index.sqlite")      # a process that has read nothing
    try:
        assert other.warm_notes("t", PID) == 1
        assert counted.split and counted.embedded
        counted.clear()
        forget_splits()
        answer = other.ask("t", PID, "what antibiotic did he go home on?")
    finally:
        other.close()
    assert "Levaquin" in answer["answer"], answer["answer"]
    # Only the question itself was embedded for its answer: the note's sentences were ready.
    assert not counted.split and list(counted.embedded) == [], (list(counted.split), list(counted.embedded))


def test_opening_the_frame_reads_the_patients_notes_ahead_once(tmp_path, synthea_dir, embedder):
    import shutil

    from smart_app.app import create_app
    from smart_app.settings import Settings

    from .conftest import InlineRunner, demo_launch

    patient = "8ef99ca1-5615-7aa6-d383-47fe931a1f14"
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(synthea_dir / f"{patient}.json.gz", source)
    settings = Settings.load({"CHARTCITE_DATA_DIR": str(tmp_path / "data"), "CHARTCITE_DEMO_SOURCE": str(source),
                              "CHARTCITE_DEMO_LAUNCH": "true"})
    app = create_app(settings, runner=InlineRunner(settings))
    service = app.extensions["chartcite.search"]
    service.warm_up()
    client = app.test_client()
    demo_launch(client, patient)          # indexed during the launch, so the frame finds it ready
    demo_launch(client, patient)
    service.warmer.wait()
    kept = kept_readings(service)
    notes = service.backend.count(Scope("default", patient, semantic_types=("note",)))
    assert notes and len(kept) == notes, (len(kept), notes)
    # The same record opened again queues nothing more.
    assert not service.warm_notes_soon("default", patient, sum(service.patient("default", patient)["chunk_counts"].values()))
    service.close()


def test_chunks_read_while_answering_are_parsed_once_and_a_rewritten_one_anew(record, tmp_path_factory):
    import json

    service, _, _ = record
    backend = service.backend
    ids = list(backend.indexed_texts("t", PID))
    with backend.answering():
        first = {c.chunk_id: c for c in backend.get_chunks("t", ids)}
        note_id = next(cid for cid, c in first.items() if "ejection fraction of 55%" in c.text)
        first[note_id].text = "changed by a caller"       # a caller's change stays its own
        again = {c.chunk_id: c for c in backend.get_chunks("t", ids)}
        assert again[note_id] is not first[note_id] and "ejection fraction of 55%" in again[note_id].text
        assert backend._parsed.get(next(k for k in backend._parsed.chunks if k[0] == note_id)) is not None
        path = tmp_path_factory.mktemp("rewritten") / "record.ndjson"
        path.write_text("\n".join(json.dumps(r) for r in (PATIENT, note(TEXT.replace("55%", "35%")))) + "\n",
                        encoding="utf-8")
        service.index_paths("t", [path])
        rewritten = {c.chunk_id: c for c in backend.get_chunks("t", ids)}
    assert "ejection fraction of 35%" in rewritten[note_id].text
    # Outside a question nothing is remembered: indexing's reads do not fill the memory.
    before = len(backend._parsed.chunks)
    backend.get_chunks("t", ids)
    assert len(backend._parsed.chunks) == before


def test_reading_ahead_waits_while_a_question_is_answered(record):
    import threading
    import time

    service, counted, _ = record
    reading = threading.Thread(target=service.warm_notes, args=("t", PID))
    with service.questions.one():               # a question under way
        reading.start()
        time.sleep(0.5)
        assert not counted.split, "the notes were split while a question was answered"
    reading.join(timeout=60)
    assert not reading.is_alive() and counted.split

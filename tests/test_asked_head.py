"""The thing a question asks, read as its head word, is required of the record (search/retrieval/pipeline.py)."""
from __future__ import annotations

from search.nlp.vocabulary import clinical_not_lay
from search.retrieval.analysis import absent_things, absent_words, analyse, asked_head, asked_things


def test_a_clinical_head_word_no_concept_covers_is_the_thing_asked():
    assert asked_head(analyse("what did pathology say about the appendix")) == ["pathology"]
    assert asked_head(analyse("is an amputation planned")) == ["amputation"]


def test_lay_words_verbs_and_questions_naming_a_concept_ask_no_head_word():
    # "pill" is a lay word (the lexicon's "water pill"): the record's drug name may answer it.
    assert asked_head(analyse("which pill was she started on after the baby")) == []
    # An everyday verb first is no clinical thing.
    assert asked_head(analyse("Why did they move my dad to a different hospital?")) == []
    # A concept the annotator knows is what the answer rests on already.
    assert asked_head(analyse("what did the colonoscopy show")) == []


def test_clinical_words_are_those_clinical_sources_write_and_no_lay_name_uses():
    assert clinical_not_lay("amputation") and clinical_not_lay("pathology")
    assert not clinical_not_lay("pill") and not clinical_not_lay("move")


def test_what_is_wanted_of_the_thing_is_not_the_thing():
    # "side" says what is wanted of the CEA; a record that never writes "side" still answers it.
    assert asked_head(analyse("which side was the CEA")) == []
    assert asked_head(analyse("size and location of the stone")) == ["stone"]   # the thing, required of the record


# --- the thing whose result or status is asked ------------------------------------------------------

def test_the_thing_beside_result_or_status_is_asked_as_one_phrase():
    assert asked_things(analyse("battery status at the last device check")) == ["battery"]
    assert asked_things(analyse("results of his swallow study")) == ["swallow study"]
    # "from the egd" names where the result comes from; the concept EGD is judged on its own.
    assert asked_things(analyse("h pylori result from the egd")) == ["pylori"]


def test_a_lay_word_a_concept_or_a_kind_of_test_alone_is_no_asked_thing():
    # The lexicon knows "sugar": the record may write glucose, which the concept finds.
    assert asked_things(analyse("sugar readings lately")) == []
    assert asked_things(analyse("blood work results")) == []      # a kind of record
    assert asked_things(analyse("lab work results")) == []
    assert asked_things(analyse("a1c results")) == []             # a concept names it
    assert asked_things(analyse("hearing test results")) == []    # "test" alone names no thing
    # A question mark ends the phrase: "status? DNR" is two questions.
    assert "code dnr" not in asked_things(analyse("code status? DNR documented anywhere?"))


def test_the_record_must_write_the_phrase_not_only_its_words(tmp_path):
    from search.backends.embedded import EmbeddedBackend
    from .test_edges import note_chunks, write_chunks

    backend = EmbeddedBackend(tmp_path / "index.sqlite", "test-model", 4)
    write_chunks(backend, note_chunks("t", "A", ["He awoke with trouble swallowing.", "A study of the pacemaker device.",
                                                 "A barium swallow study was normal."]))
    write_chunks(backend, note_chunks("t", "B", ["He awoke with trouble swallowing.", "A sleep study was done.",
                                                 "The pacemaker device was checked."]))
    swallow = analyse("results of his swallow study")
    assert absent_things(backend, "t", "A", swallow) == set()
    assert absent_things(backend, "t", "B", swallow) == {"swallow study"}      # both words, never together
    battery = analyse("battery status at the last device check")
    assert absent_things(backend, "t", "B", battery) == {"battery"}
    assert absent_words(backend, "t", "B", battery) >= {"battery"}

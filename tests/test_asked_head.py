"""The thing a question asks, read as its head word, is required of the record (search/retrieval/pipeline.py)."""
from __future__ import annotations

from search.nlp.vocabulary import clinical_not_lay
from search.retrieval.analysis import analyse, asked_head


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

"""The retrieval pipelines as lists of typed stages, without a model or an index: which stages
each pipeline runs, what ablating removes, and how the one runner counts and times them."""
from __future__ import annotations

import ast
import inspect

import pytest

from search.backends.base import Scope
from search.retrieval.types import RetrievalState, Stage
from search.retrieval.ranking import RERANK_WEIGHTS
from search.retrieval import pipeline
from search.retrieval.pipeline import ABLATABLE, STAGES, pipeline_stages, run_stages, select_top_k


def names(pipeline: str, ablate: tuple[str, ...] = ()) -> list[str]:
    return [s.name for s in pipeline_stages(pipeline, ablate) if s.reported]


def test_pipelines_are_lists_of_named_stages():
    assert names("dense") == names("hybrid") == ["scope", "analyse", "recall", "fuse", "select"]
    assert names("full") == ["scope", "analyse", "anchor", "filter", "recall", "fuse", "recovery", "rerank", "select", "series", "histories"]
    # The same names, different stages: what distinguishes the pipelines is which function runs.
    dense, hybrid = pipeline_stages("dense"), pipeline_stages("hybrid")
    assert [s.run for s in dense if s.name == "recall"] != [s.run for s in hybrid if s.name == "recall"]


def test_ablating_removes_stages_by_name_and_nothing_else():
    for stage in ABLATABLE:
        assert names("full", (stage,)) == [n for n in names("full") if n != stage]
    with pytest.raises(ValueError, match="cannot ablate"):
        pipeline_stages("full", ("select",))
    with pytest.raises(ValueError, match="unknown pipeline"):
        pipeline_stages("bm25")


def test_the_runner_counts_what_each_stage_passes_on():
    def corpus(state, tools):
        state.corpus = 10
        return 10, ""

    def keep_four(state, tools):
        return 4, "kept four"

    state = RetrievalState("q", "t", "p", 5, Scope("t", "p"))
    stages = [Stage("scope", corpus, whole_record=True), Stage("look", keep_four, whole_record=True),
              Stage("hidden", lambda s, t: (99, ""), reported=False), Stage("narrow", lambda s, t: (2, ""))]
    reports = run_stages(stages, state, tools=None)
    assert [(r.name, r.n_in, r.n_out, r.note) for r in reports] == [
        ("scope", 10, 10, ""), ("look", 10, 4, "kept four"), ("narrow", 4, 2, "")]
    assert reports[-1].corpus_ratio == 0.2 and all(r.ms >= 0 for r in reports)
    assert state.ranked_after == {}            # no stage here ranked any evidence


def test_the_runner_keeps_the_ranking_after_each_stage_for_per_stage_recall():
    from fhir_ingest.record.contract import Chunk
    from search.retrieval.types import Evidence

    def rank(state, tools):
        state.evidence = [Evidence(Chunk("t", "p", "Condition", cid, "0", cid, cid), 1.0) for cid in ("b", "a")]
        return 2, ""

    state = RetrievalState("q", "t", "p", 5, Scope("t", "p"))
    run_stages([Stage("fuse", rank)], state, tools=None)
    assert state.ranked_after == {"fuse": [["Condition/b"], ["Condition/a"]]}


def test_select_top_k_keeps_order_and_drops_identical_text():
    from fhir_ingest.record.contract import Chunk
    from search.retrieval.types import Evidence

    def chunk(cid: str, text: str) -> Chunk:
        return Chunk("t", "p", "Condition", cid, "0", text, text, "2024-01-01", "problem")

    state = RetrievalState("q", "t", "p", 2, Scope("t", "p"))
    state.evidence = [Evidence(chunk("a", "Asthma."), 3.0), Evidence(chunk("b", "asthma. "), 2.0),
                      Evidence(chunk("c", "Hypertension."), 1.0)]
    assert select_top_k(state, tools=None) == (2, "")
    assert [e.chunk.resource_id for e in state.evidence] == ["a", "c"]


def test_the_rerank_weights_are_named():
    assert RERANK_WEIGHTS["fused"] == 1.0 and RERANK_WEIGHTS["negated"] < 0
    assert set(RERANK_WEIGHTS) >= {"concepts", "in_window", "latest", "kind", "visit"}


# --- single stages against a hand-made backend (no model, no index) ---------------------------------

class Record:
    """A tiny stand-in for a Backend: four chunks and canned rankings."""

    def __init__(self):
        from fhir_ingest.record.contract import Chunk

        self.chunks = {c.chunk_id: c for c in (
            Chunk("t", "p", "Condition", "asthma", "0", "Asthma.", "Asthma", "2020-01-01", "problem"),
            Chunk("t", "p", "Condition", "htn", "0", "Hypertension.", "HTN", "2021-01-01", "problem"),
            Chunk("t", "p", "Observation", "bp", "0", "Blood pressure 150/90.", "BP", "2022-01-01", "vital"),
            Chunk("t", "p", "Condition", "copd", "0", "COPD.", "COPD", "2019-01-01", "problem"))}
        self.ids = list(self.chunks)

    def count(self, scope):
        return len(self.chunks)

    def search_vector(self, scope, vector, n):
        from search.backends.base import Hit
        return [Hit(self.ids[1], 0.9), Hit(self.ids[0], 0.8)][:n]

    def search_text(self, scope, query, n):
        from search.backends.base import Hit
        return [Hit(self.ids[0], 5.0), Hit(self.ids[2], 4.0)][:n]

    def get_chunks(self, tenant, ids):
        return [self.chunks[i] for i in ids if i in self.chunks]

    def search_concepts(self, scope, keys, n):
        from search.backends.base import Hit
        return [Hit(self.ids[3], 1.0), Hit(self.ids[0], 1.0)]

    def latest(self, scope, n):
        return []

    # Several searches at once, as every backend answers them (one round trip on Elasticsearch).
    from search.backends.base import Backend
    search_many = Backend.search_many


class Embedder:
    def encode_query(self, text):
        return [0.0]


def fresh_state(k: int = 5) -> RetrievalState:
    return RetrievalState("what problems?", "t", "p", k, Scope("t", "p"))


def test_scope_recall_and_fusion_stages():
    from search.retrieval.types import Tools
    from search.retrieval.ranking import RRF_K
    from search.retrieval.pipeline import count_scope, fuse_dense, fuse_rrf, recall_dense

    record = Record()
    tools, state = Tools(record, Embedder()), fresh_state()
    assert count_scope(state, tools) == (4, "") and state.corpus == 4
    assert recall_dense(state, tools) == (2, "") and state.lexical_hits == []
    state.lexical_hits = record.search_text(state.scope, "", 50)
    assert fuse_rrf(state, tools) == (3, "")
    # Reciprocal rank fusion: asthma is 2nd by vector and 1st by text, so first overall.
    assert [e.chunk.resource_id for e in state.evidence] == ["asthma", "htn", "bp"]
    assert state.evidence[0].score == 1 / (RRF_K + 2) + 1 / (RRF_K + 1)
    assert state.evidence[0].dense == 0.8 and state.evidence[0].lexical_rank == 0
    assert fuse_dense(state, tools) == (2, "") and [e.chunk.resource_id for e in state.evidence] == ["htn", "asthma"]


def test_recovery_adds_concept_chunks_neither_recall_found_at_the_floor():
    from search.retrieval.types import Tools
    from search.retrieval.pipeline import fuse_rrf, recover_concepts

    record = Record()
    tools, state = Tools(record, Embedder()), fresh_state()
    state.dense_hits = record.search_vector(state.scope, None, 50)
    fuse_rrf(state, tools)
    state.analysis = type("A", (), {"keys": {"lex:copd"}, "wants_latest": False})()
    floor = min(e.score for e in state.evidence)
    assert recover_concepts(state, tools) == (3, "+1")
    recovered = state.evidence[-1]
    assert recovered.chunk.resource_id == "copd" and recovered.recovered and recovered.score == floor


# --- each step touches only the state fields it declares -------------------------------------------------

MUTATORS = {"append", "extend", "update", "add", "clear", "pop", "remove", "insert", "setdefault", "discard", "sort"}


def _state_field(node) -> str | None:
    """'X' for the expression `state.X`."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "state":
        return node.attr
    return None


def _owner(expr, aliases: dict[str, str]) -> str | None:
    """The state field an expression is part of: `state.X.y[0]`, or `a.y` after `a = state.X`."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        field = _state_field(expr)
        if field:
            return field
        expr = expr.value
    return aliases.get(expr.id) if isinstance(expr, ast.Name) else None


def touched(function: str, functions: dict[str, ast.FunctionDef], seen: set[str] | None = None):
    """(fields read, fields set or changed) by a step, and by the module's functions it hands the
    state to. Changing counts as writing: appending to a list, assigning into the analysis."""
    seen = set() if seen is None else seen
    reads, writes = set(), set()
    if function in seen:
        return reads, writes
    seen.add(function)
    body = functions[function]
    aliases = {node.targets[0].id: _state_field(node.value) for node in ast.walk(body)
               if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
               and _state_field(node.value)}
    for node in ast.walk(body):
        field = _state_field(node)
        if field:
            (reads if isinstance(node.ctx, ast.Load) else writes).add(field)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Store):
            writes.update(filter(None, [_owner(node.value, aliases)]))
        if isinstance(node, ast.AugAssign) and _owner(node.target, aliases):
            reads.add(_owner(node.target, aliases))
            writes.add(_owner(node.target, aliases))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            writes.update(filter(None, [_owner(node.func.value, aliases)]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions \
                and any(isinstance(arg, ast.Name) and arg.id == "state" for arg in node.args):
            more_reads, more_writes = touched(node.func.id, functions, seen)
            reads |= more_reads
            writes |= more_writes
    return reads, writes


def module_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(pipeline))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("pipeline_name", sorted(STAGES))
def test_every_step_declares_exactly_the_state_it_reads_and_writes(pipeline_name):
    functions = module_functions()
    for stage in STAGES[pipeline_name]:
        reads, writes = touched(stage.run.__name__, functions)
        assert (stage.reads, stage.writes) == (reads, writes), stage.name


def test_the_source_reading_sees_aliases_mutations_and_helpers():
    source = """
def helper(state):
    return state.k
def step(state, tools):
    analysis = state.analysis
    analysis.date_from = "2020"
    state.evidence.append(1)
    state.chunk_cache["x"] = 2
    state.corpus += helper(state)
    return state.question, ""
"""
    functions = {node.name: node for node in ast.parse(source).body}
    assert touched("step", functions) == ({"analysis", "evidence", "chunk_cache", "corpus", "k", "question"},
                                          {"analysis", "evidence", "chunk_cache", "corpus"})


def test_a_declared_field_must_be_a_field_of_the_state():
    from search.retrieval.types import state_fields

    assert state_fields("evidence k") == {"evidence", "k"}
    with pytest.raises(ValueError, match="evidnce"):
        state_fields("evidnce")

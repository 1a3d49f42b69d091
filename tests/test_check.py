"""`chartcite check` on the embedded index: it finds every kind of disagreement, and its work grows
with the index, not with its square (it asked the full-text table once per chunk: 289 s at 30,000
chunks). The growth is counted in SQLite's own steps, not timed: bench/check.py prints the seconds."""
from __future__ import annotations

import pytest

from search.backends.embedded import EmbeddedBackend

from .synthetic import DIMENSION, MODEL, fill_embedded, vm_steps


def steps_of_check(backend: EmbeddedBackend, tenant: str) -> int:
    """The virtual-machine steps SQLite takes for one check (counted every 100 steps)."""
    def check():
        assert backend.check(tenant).problems == []
    return vm_steps(backend, check, every=100)


def test_check_grows_with_the_index_not_with_its_square(tmp_path):
    small = EmbeddedBackend(tmp_path / "small.sqlite", MODEL, DIMENSION)
    large = EmbeddedBackend(tmp_path / "large.sqlite", MODEL, DIMENSION)
    fill_embedded(small, "t", 10, 50)
    fill_embedded(large, "t", 40, 50)          # four times the chunks
    ratio = steps_of_check(large, "t") / steps_of_check(small, "t")
    assert ratio < 6, f"four times the chunks took {ratio:.1f} times the steps"


@pytest.mark.parametrize("damage, problem", [
    ("DELETE FROM chunks_fts WHERE rowid = (SELECT min(rowid) FROM chunks_fts)", "1 chunks without a lexical row"),
    ("INSERT INTO chunks_fts (lexical, chunk_id, tenant, patient_id) VALUES ('x', 'gone', 't', 'p000000')",
     "1 lexical rows without a chunk"),
    ("INSERT INTO chunks_fts (lexical, chunk_id, tenant, patient_id) SELECT 'again', chunk_id, tenant, patient_id "
     "FROM chunks LIMIT 1", "1 chunks with several lexical rows"),
    ("INSERT INTO chunk_refs VALUES ('t', 'Observation/x', 'gone')", "1 reference rows without a chunk"),
    ("INSERT INTO chunk_concepts VALUES ('t', 'p000000', 'C1', 'gone')", "1 concept rows without a chunk"),
    ("UPDATE chunks SET vector = x'00' WHERE rowid = (SELECT min(rowid) FROM chunks)",
     "1 chunks without a vector of the index's dimension"),
    ("UPDATE chunks SET vector = x'' WHERE rowid = (SELECT min(rowid) FROM chunks)", "1 chunks still wait"),
    ("DELETE FROM patients WHERE patient_id = 'p000001'", "5 chunks of a patient with no summary"),
    ("DELETE FROM chunks WHERE rowid = (SELECT min(rowid) FROM chunks)", "the summary counts 5 chunks, the index holds 4"),
])
def test_check_finds_each_kind_of_disagreement(tmp_path, damage, problem):
    backend = EmbeddedBackend(tmp_path / "index.sqlite", MODEL, DIMENSION)
    fill_embedded(backend, "t", 3, 5)
    assert backend.check("t").problems == []
    backend._db().execute(damage)
    problems = backend.check("t").problems
    assert any(problem in p for p in problems), problems

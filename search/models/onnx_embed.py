"""The embedding model at int8: ONNX Runtime or OpenVINO instead of PyTorch fp32 on CPU.

Built once from the local sentence-transformers files (never downloaded): the transformer is
exported to ONNX (that fp32 file is kept: `auto` checks the int8 files against it), then
quantised to int8 with weights per output channel (per-tensor scales lose too much: cosine to
fp32 as low as 0.84 on chart texts; per-channel ≥ 0.97). Three variants (CHARTCITE_INT8):

- `dynamic`: activations quantised with scales computed per batch at run time (ONNX Runtime's
  dynamic quantisation). A text's vector then depends slightly on the other texts of its batch.
- `static`: the weight matrices' inputs quantised with scales fixed once, calibrated on the chart
  texts shipped in data/calibration.txt (QDQ format), run by ONNX Runtime. A text's vector is the
  same whatever batch it is in.
- `openvino`: the same static file run by OpenVINO, whose CPU kernels use VNNI and AMX where the
  processor has them (the `openvino` package must be importable).
- `auto`: at first start on a processor, each variant available is timed on chart texts and
  checked against the fp32 file (cosine ≥ 0.97); the fastest that passes is kept, per processor,
  in a JSON file beside the model files. Where none passes (int8 kernels that lose too much on
  some processor), it runs the fp32 ONNX file: slower, never less faithful.

Files are cached under the model cache by the model's fingerprint; processes starting together
build them once under a file lock. At run time only ONNX Runtime (or OpenVINO) and the
`tokenizers` library load, not PyTorch. Pooling and normalisation follow the model's own
sentence-transformers configuration. The embedder's name carries the variant, so an index built
with one is never searched with another.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import itertools
import json
import logging
import os
import queue
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable, Iterator

import numpy as np

from search.files import locked, refuse_shared_folder, temporary_path, write_file
from search.models.embed import Embedder, ModelNotFound, _fingerprint, default_model_cache, default_model_path
from search.models.processor import instruction_sets, processor_name

log = logging.getLogger(__name__)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BATCH_TOKENS = 2048     # padded word pieces per batch: eight full windows
MAX_BATCH = 64

VARIANTS = ("dynamic", "static", "openvino")
INT8_SETTINGS = (*VARIANTS, "auto")
KEPT_CHOICES = (*VARIANTS, "fp32")      # what `auto` may keep: fp32 where no variant passes
# The file each variant runs ("fp32": the reference `auto` checks against, and runs where no variant passes).
FILE_SUFFIX = {"dynamic": "int8", "static": "int8s", "openvino": "int8s", "fp32": "fp32"}
NAME_SUFFIX = {"dynamic": "+onnx-int8", "static": "+onnx-int8s", "openvino": "+openvino-int8s", "fp32": "+onnx-fp32"}
CALIBRATION = Path(__file__).resolve().parent / "data" / "calibration.txt"
# The static scales come from the first texts of the calibration file; `auto` checks the variants'
# cosine on all the others, which the scales never saw (on 64 texts OpenVINO passed at 0.979, on
# the chunks of 20 patients it fell to 0.969), and times them on the last AUTO_TEXTS.
STATIC_TEXTS = 101
AUTO_TEXTS = 64
TIMING_ROUNDS = 3
WORTH_A_CHANGE = 1.10   # auto leaves dynamic only for a variant at least 10% faster
MIN_COSINE = 0.97
# OpenVINO prepares its kernels per input shape: batches padded to a multiple of 16 word pieces
# give it 16 lengths rather than 256 (a question's text in 1.9 ms rather than 4.0 at the median,
# indexing 304 texts/s rather than 277, and less memory). Padding is masked out, so the vectors
# are the same; ONNX Runtime prepares nothing per shape, so it runs the exact lengths.
OPENVINO_SHAPE_STEP = 16
# OpenVINO keeps, per session, the working memory of the largest batch it has run (the model's
# input shapes are left open, so it plans no reuse between layers), and attention's part of it
# grows with rows × length²: eight full windows left a session 200 MB above its compiled model, two
# 107 MB (one session over the texts of 10 shared records: 423 MB, 316 MB bounded, as fast). So a
# batch's rows × length² stays within that of 2,048 word pieces at 64 a text: 2 full windows, 8 of
# 128, 32 of 64 (short texts are bounded by BATCH_TOKENS first). Vectors are the same: padding is
# masked and the static model's scales do not depend on the batch.
OPENVINO_ATTENTION_BUDGET = BATCH_TOKENS * 64
# A batch not done in this long has stopped making progress: a full batch (BATCH_TOKENS word
# pieces) takes about 0.2 s on one core here, so even a machine a hundred times busier finishes
# one well inside it. OpenVINO once sat for 25 minutes on a batch with no sign (issue 39).
BATCH_DEADLINE_SECONDS = 120.0
# Kernels kept for 16 input shapes, not 5,000: a batch per length made RSS grow to 2.7 GB over
# 6,000 texts (1.0 GB at 5 patients, as fast). Since batches are padded to 16 lengths, 0 changes
# nothing (the 60 shared records' texts: 797 MB against 794, as fast): the memory is the batch's.
RUNTIME_CACHE_CAPACITY = 16


def variant_of(model_name: str) -> str | None:
    """The int8 variant (or the fp32 file `auto` may fall back to) whose vectors an index
    recorded as built by `model_name` holds; None for PyTorch fp32 or another backend."""
    return next((variant for variant, suffix in NAME_SUFFIX.items() if model_name.endswith(suffix)), None)


def sentence_config(path: Path) -> tuple[str, bool, int]:
    """(pooling mode, normalised, max tokens) from the model's sentence-transformers files."""
    modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    pooling_dir = next((m["path"] for m in modules if m["type"].endswith("Pooling")), "")
    pooling = json.loads((path / pooling_dir / "config.json").read_text(encoding="utf-8")) if pooling_dir else {}
    mode = "mean" if pooling.get("pooling_mode_mean_tokens") else "cls" if pooling.get("pooling_mode_cls_token") else ""
    if not mode:
        raise ModelNotFound(f"the int8 embedding backend supports mean or CLS pooling; {path} uses neither")
    normalised = any(m["type"].endswith("Normalize") for m in modules)
    bert = path / "sentence_bert_config.json"
    max_tokens = json.loads(bert.read_text(encoding="utf-8")).get("max_seq_length", 256) if bert.exists() else 256
    return mode, normalised, int(max_tokens)


def calibration_texts() -> list[str]:
    return [line for line in CALIBRATION.read_text(encoding="utf-8").splitlines() if line.strip()]


def model_stem(model_path: Path) -> str:
    folder = model_path.name if model_path.name != "model" else model_path.parent.name
    return f"{folder}-{_fingerprint(str(model_path))}"


def int8_model(model_path: Path, cache_dir: Path, variant: str = "dynamic") -> Path:
    """The cached ONNX file a variant runs (`fp32`: the un-quantised export), built first if missing."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    refuse_shared_folder(cache_dir)               # another user could swap the model chartcite runs
    target = cache_dir / f"{model_stem(model_path)}-{FILE_SUFFIX[variant]}.onnx"
    if target.exists():
        return target
    fp32 = target if variant == "fp32" else int8_model(model_path, cache_dir, "fp32")
    with locked(cache_dir / ".build.lock"):       # another process may be building it right now
        if not target.exists():
            partial = temporary_path(target)
            try:
                if variant == "fp32":
                    export(model_path, partial)
                elif variant == "dynamic":
                    quantise_dynamic(fp32, partial)
                else:
                    quantise_static(model_path, fp32, partial)
                os.replace(partial, target)       # whole or not at all, for readers in other processes
            finally:
                partial.unlink(missing_ok=True)
    return target


def export(model_path: Path, target: Path) -> None:
    """The transformer to ONNX at fp32, its last hidden state as output (pooling is done here)."""
    try:
        import torch
    except ImportError as exc:
        raise ModelNotFound(
            f"the embedding model's ONNX file is not built in {target.parent}, and building it (once) needs PyTorch, "
            "which this install leaves out (requirements/runtime.lock); build it where requirements/app.lock is "
            "installed (any `chartcite index` does) and set CHARTCITE_MODEL_CACHE to that folder, as the Docker "
            "image's build stage does") from exc
    from transformers import AutoModel, AutoTokenizer

    log.info("building the embedding model's ONNX files once (export, then int8 quantisation)")
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

    axes = {n: {0: "batch", 1: "tokens"} for n in names + ["last_hidden_state"]}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")           # the exporter's notes on opsets, not ours to act on
        torch.onnx.export(LastHiddenState(), tuple(sample[n] for n in names), str(target), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)


class _QuietQuantiser:
    """The quantiser's advice goes to the root logger: not ours to act on."""

    def __enter__(self):
        root = logging.getLogger()
        self.level, root.level = root.level, logging.ERROR

    def __exit__(self, *exc):
        logging.getLogger().setLevel(self.level)


def quantise_dynamic(fp32: Path, target: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _QuietQuantiser():
        quantize_dynamic(str(fp32), str(target), per_channel=True, weight_type=QuantType.QInt8)


def quantise_static(model_path: Path, fp32: Path, target: Path) -> None:
    """Static int8 in QDQ format: the inputs of the weight matrices (never attention's own
    products, whose ranges vary by text) quantised with scales from the calibration texts, each
    run alone so padding never widens a range; weights per channel; outputs left fp32, so ONNX
    Runtime and OpenVINO fuse each into one integer matrix product."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(sentence_config(model_path)[2])
    texts = calibration_texts()[:STATIC_TEXTS]
    graph = onnx.load(str(fp32), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    matmuls = [node.name for node in graph.node if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights]
    names = [i.name for i in graph.input]

    class Texts(CalibrationDataReader):
        def __init__(self):
            self.left = iter(texts)

        def get_next(self):
            text = next(self.left, None)
            if text is None:
                return None
            e = tokenizer.encode(text)
            arrays = {"input_ids": e.ids, "attention_mask": e.attention_mask, "token_type_ids": e.type_ids}
            return {name: np.array([arrays[name]], dtype=np.int64) for name in names}

    # Ranges are gathered every few texts to bound memory; ONNX Runtime refuses a last group that
    # is empty, so the group size must not divide the number of texts.
    group = next(size for size in range(16, 1, -1) if len(texts) % size)
    with _QuietQuantiser():
        quantize_static(str(fp32), str(target), Texts(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["MatMul", "Gemm"], nodes_to_quantize=matmuls,
                        calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"MatMulConstBOnly": True, "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"],
                                       "DedicatedQDQPair": True, "CalibMaxIntermediateOutputs": group})


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


def compiled_model_cache(onnx_file: Path) -> dict:
    """OpenVINO's cache of compiled models beside the model file, one folder per processor:
    compiling takes about 3 s a session, so every command, worker and server start paid 6 s on two
    cores before its first vector; a cached one loads in a fraction of that. OpenVINO keys each
    entry by the model, the settings and its own version, and compiles afresh when an entry cannot
    be read. Where the model folder cannot be written, every start compiles, as before."""
    folder = onnx_file.parent / "openvino-compiled" / hashlib.sha256(processor_key().encode()).hexdigest()[:12]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    return {"CACHE_DIR": str(folder)} if writable(folder) else {}


class OpenVinoModel:
    """ONNX Runtime's session interface (run, get_inputs, get_outputs) over one OpenVINO model
    compiled for the CPU, one per session, each run on its caller's thread. Two threads with a
    request each on one model hung for good (issue 39: both inside `infer`, every thread on a
    futex). Caught in the act, that was the bindings' first-use deadlock (`infer_alone_first`);
    a model per session keeps the sessions from sharing an executor as well, for about 70 MB.
    OpenVINO's infer requests are not to be shared between threads, so each call takes an idle one
    (made when none is)."""

    def __init__(self, onnx_file: Path, streams: int, threads: int):
        core = require_openvino().Core()
        return_large_blocks_to_the_system()
        # Threads not pinned to cores: indexing prepares the next patients on another thread.
        # What is not int8 stays fp32: on a processor with bf16 OpenVINO would run it in bf16,
        # which lowered the cosine to fp32 from 0.981 to 0.975 on chart texts (for 13% more
        # speed) and would make the same index name mean other vectors on another processor.
        self.compiled = core.compile_model(str(onnx_file), "CPU", {"NUM_STREAMS": streams, "INFERENCE_NUM_THREADS": threads,
                                                                    "ENABLE_CPU_PINNING": False,
                                                                    "INFERENCE_PRECISION_HINT": "f32",
                                                                    "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_CAPACITY,
                                                                    **compiled_model_cache(onnx_file)})
        self._idle: list = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def get_inputs(self) -> list:
        return [SimpleNamespace(name=port.any_name) for port in self.compiled.inputs]

    def get_outputs(self) -> list:
        return [SimpleNamespace(shape=[d.get_length() if d.is_static else None for d in port.get_partial_shape()])
                for port in self.compiled.outputs]

    def run(self, _outputs, feeds: dict) -> list[np.ndarray]:
        if os.getpid() != self._pid:
            # OpenVINO's thread pool does not survive a fork, and a forked child hangs for ever in
            # its next inference, or in compiling the model anew: say so at once instead.
            raise ModelNotFound("the OpenVINO model was loaded before this process was forked and cannot run "
                                "here; load it after forking (chartcite's servers and workers do) or set "
                                "CHARTCITE_INT8 to dynamic or static")
        with self._lock:
            request = self._idle.pop() if self._idle else self.compiled.create_infer_request()
        try:
            return [np.asarray(infer_alone_first(request, feeds)[0])]       # a copy, not the request's memory
        finally:
            with self._lock:
                self._idle.append(request)


# OpenVINO's Python bindings build a table the first time a process reads a tensor's data (a C++
# function-local static whose initializer takes the GIL). Two threads doing that at once deadlock
# for good: one holds the static's guard and waits for the GIL, the other holds the GIL and waits
# for the guard (issue 39's hang, caught in the act: both embedding threads in update_inputs, one
# in __cxa_guard_acquire, the other in the GIL's wait, the main thread unable to run its deadline).
# So the first inference of a process runs alone; once the table is built, threads run together.
_FIRST_INFERENCE = threading.Lock()
_bindings_ready = False


def infer_alone_first(request, feeds: dict):
    global _bindings_ready
    if _bindings_ready:
        return request.infer(feeds)
    with _FIRST_INFERENCE:
        result = request.infer(feeds)
        _bindings_ready = True
        return result


M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter
LARGE_BLOCK = 1 << 20


def return_large_blocks_to_the_system() -> bool:
    """Blocks of 1 MB and more are mapped on their own and unmapped when freed (glibc mallopt).
    glibc's default raises that threshold every time a large block is freed, after which blocks
    of that size come from the heap and stay with the process: the activations of batches of
    every length and size left an OpenVINO indexing run of 20 patients at 2.3 GB, 1.0 GB with the
    threshold fixed (as fast: 14.1 s and 14.3 s). Process-wide, so only for OpenVINO: ONNX Runtime
    keeps its own arena (0.77 GB against 0.68 GB), and PyTorch, whose tensors would then be mapped
    afresh each time, encoded 16% slower. Idempotent; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK))
    except (OSError, AttributeError):
        return False


def require_openvino():
    """The openvino module, or ModelNotFound saying why it cannot be used."""
    try:
        import openvino
    except ImportError as exc:
        raise ModelNotFound(f"CHARTCITE_INT8=openvino needs the openvino package, which is not importable "
                            f"({exc}); install it (pip install openvino) or choose dynamic, static or auto") from exc
    return openvino


def openvino_available() -> bool:
    try:
        require_openvino()
    except ModelNotFound:
        return False
    return True


_embedders: "weakref.WeakSet[OnnxInt8Embedder]" = weakref.WeakSet()


def _forget_pools_in_child() -> None:
    """A forked child has none of its parent's threads: a pool inherited from before the fork
    would wait for ever for them, so each embedder starts a new one on its first use."""
    for embedder in list(_embedders):
        embedder._pool, embedder._pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_in_child)


class EmbedderStalled(RuntimeError):
    """The embedding model made no progress on a batch, even on fresh sessions."""


class SessionWorkers:
    """One thread per session, taking batches from one queue in turn, a question's before any
    record's: a clinician's question waits for the batches in hand, never behind the rest of a
    sync's (a first sync queues a hundred texts at a time). The threads are daemons: a thread
    stuck inside a model (it happened inside OpenVINO) is left behind when the sessions are
    replaced, and cannot keep the process from exiting, as a ThreadPoolExecutor's would."""

    URGENT, ROUTINE, STOP = 0, 1, 2

    def __init__(self, sessions: list, run):
        self.queue: queue.PriorityQueue = queue.PriorityQueue()
        self.order = itertools.count()        # first come, first served within a priority
        self.run, self.count = run, len(sessions)
        for number, session in enumerate(sessions):
            threading.Thread(target=self._work, args=(session,), name=f"chartcite-embed_{number}", daemon=True).start()

    def submit(self, batch: list[str], urgent: bool = False) -> Future:
        future: Future = Future()
        self.queue.put((self.URGENT if urgent else self.ROUTINE, next(self.order), future, batch))
        return future

    def _work(self, session) -> None:
        while (item := self.queue.get())[0] != self.STOP:
            _, _, future, batch = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.run(session, batch))
            except BaseException as exc:     # the caller re-raises it
                future.set_exception(exc)

    def close(self) -> None:
        """Each thread ends once the batches queued before are done (a stuck one never does, and is left)."""
        for _ in range(self.count):
            self.queue.put((self.STOP, next(self.order), None, None))


class OnnxInt8Embedder(Embedder):
    """The Embedder interface over an int8 variant (VARIANTS, or `auto` to pick one); `name`
    records backend, precision and variant, so an index built at fp32 or with another variant is
    never searched with these vectors (or the other way round)."""

    def __init__(self, model_path: str | None = None, cache_dir: str | Path | None = None, batch_size: int = 32,
                 variant: str = "dynamic", cores: int | None = None, batch_deadline: float = BATCH_DEADLINE_SECONDS):
        from tokenizers import Tokenizer

        path = Path(model_path or default_model_path())
        if not path.exists():
            raise ModelNotFound(f"embedding model folder {path} does not exist (CHARTCITE_MODEL)")
        if variant not in (*INT8_SETTINGS, "fp32"):
            raise ModelNotFound(f"CHARTCITE_INT8 must be one of {', '.join(INT8_SETTINGS)}, not {variant!r}")
        cache = Path(cache_dir or default_model_cache())
        if variant == "auto":
            variant = chosen_variant(path, cache)     # load_embedder resolves auto itself, with a data directory
        self.variant = variant
        self.path, self.batch_size = str(path), batch_size
        self.pooling, self.normalised, window = sentence_config(path)
        self.max_tokens = window - 2
        if variant == "openvino":
            require_openvino()                  # says why it cannot, before anything is built
        self.onnx_file = int8_model(path, cache, variant)
        self.threads = session_threads(cores or usable_cores())
        self.batch_deadline = batch_deadline
        self.sessions = self.new_sessions()
        self._pool: SessionWorkers | None = None
        self._pool_lock = threading.Lock()
        _embedders.add(self)
        self.inputs = [i.name for i in self.sessions[0].get_inputs()]
        self.counter = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.counter.no_padding()
        self.counter.no_truncation()
        self.batcher = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.batcher.enable_truncation(window)
        self.shape_step = OPENVINO_SHAPE_STEP if variant == "openvino" else 1
        self.batcher.enable_padding(pad_to_multiple_of=self.shape_step if self.shape_step > 1 else None)
        self.attention_budget = OPENVINO_ATTENTION_BUDGET if variant == "openvino" else None
        self.dimension = int(self.sessions[0].get_outputs()[0].shape[-1] or self.encode_batch(["x"]).shape[1])
        folder = path.name if path.name != "model" else path.parent.name
        self.name = f"{folder}@{self.dimension}-{_fingerprint(self.path)}{NAME_SUFFIX[variant]}"
        self.tokenizer = None

    def count_tokens(self, text: str) -> int:
        return len(self.counter.encode(text, add_special_tokens=False).ids)

    def batch_length(self, text: str) -> int:
        """Word pieces as the model runs them ([CLS] and [SEP] included, cut at the window), which
        is what a batch is padded to: sorted by characters, 23% of the padded word pieces of 500
        chart texts were padding, by word pieces 7% (one session: 2.7 s against 3.4 s). Under OpenVINO,
        rounded up to its shape step."""
        length = min(self._count_tokens_remembered(text), self.max_tokens) + 2
        return -(-length // self.shape_step) * self.shape_step

    def batches(self, ordered: list[str]):
        """Batches bounded by padded word pieces rather than count: many short lab lines at once,
        few long note pieces (a batch of 32 full windows held ~1 GB of activations, and ran slower
        than batches of 8)."""
        batch: list[str] = []
        for text in ordered:              # shortest first: the newest text is the longest
            if batch and not self.batch_fits(len(batch) + 1, self.batch_length(text)):
                yield batch
                batch = []
            batch.append(text)
        if batch:
            yield batch

    def batch_fits(self, rows: int, length: int) -> bool:
        """Whether a batch of `rows` texts padded to `length` word pieces stays within the budgets."""
        within_attention = self.attention_budget is None or rows * length * length <= self.attention_budget
        return rows <= MAX_BATCH and rows * length <= BATCH_TOKENS and within_attention

    def new_sessions(self) -> list:
        """A session per entry of `threads`, each with that many threads."""
        if self.variant == "openvino":
            return [OpenVinoModel(self.onnx_file, 1, n) for n in self.threads]
        return [new_session(self.onnx_file, n) for n in self.threads]

    def encode_batches(self, batches: Iterable[list[str]]) -> Iterator[np.ndarray]:
        """Each batch's vectors, in order, the batches spread over the sessions (one thread each),
        all started at once. The batches are the same as on one session, and so are the vectors:
        the dynamic int8 model scales its activations per batch, so regrouping texts would change
        them. A batch not done within the deadline is reported and run again on new sessions."""
        batches = list(batches)
        workers = self._session_pool()
        return self._in_order(batches, [workers.submit(batch) for batch in batches])

    def encode_query(self, text: str) -> np.ndarray:
        """A question's vector, computed before any batch still queued by indexing."""
        future = self._session_pool().submit([text], urgent=True)
        return next(self._in_order([[text]], [future], urgent=True))[0]

    def encode_queries(self, texts: list[str]) -> list[np.ndarray]:
        """Several queries' vectors, each computed alone as encode_query computes it (the same
        vector whatever the variant), all submitted at once: the sessions run them side by side."""
        batches = [[text] for text in texts]
        workers = self._session_pool()
        return [vectors[0] for vectors in
                self._in_order(batches, [workers.submit(batch, urgent=True) for batch in batches], urgent=True)]

    def _in_order(self, batches: list[list[str]], futures: list[Future], urgent: bool = False) -> Iterator[np.ndarray]:
        done, stalls = 0, 0
        while done < len(batches):
            try:
                vectors = futures[done].result(timeout=self.batch_deadline)
            except FutureTimeout:
                stalls += 1
                for future in futures[done:]:
                    future.cancel()
                self._replace_stalled_sessions(len(batches[done]), stalls)
                workers = self._session_pool()
                futures[done:] = [workers.submit(batch, urgent) for batch in batches[done:]]
                continue
            done, stalls = done + 1, 0
            yield vectors

    def _replace_stalled_sessions(self, texts: int, stalls: int) -> None:
        """Once: reported, and the sessions (and their threads) replaced by new ones. Twice running:
        an error that says what to do, rather than a run that waits for ever."""
        if stalls > 1:
            raise EmbedderStalled(f"the {self.variant} int8 embedding model made no progress on a batch of {texts} "
                                  f"texts in {self.batch_deadline:.0f} s, twice, the second time on new sessions; "
                                  f"set CHARTCITE_INT8 to another variant ({', '.join(v for v in VARIANTS if v != self.variant)})"
                                  f" or CHARTCITE_EMBEDDING_PRECISION=fp32")
        log.warning("the %s int8 embedding model made no progress on a batch of %d texts in %.0f s: its sessions "
                    "are replaced and the batch is run again", self.variant, texts, self.batch_deadline)
        with self._pool_lock:
            stuck, self._pool = self._pool, None
            self.sessions = self.new_sessions()
        if stuck is not None:
            stuck.close()

    def close(self) -> None:
        """Ends the sessions' threads and lets the sessions go (the threads would keep an embedder
        used for a while, as `auto`'s candidates are, alive for the process's life)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
        self.sessions = []

    def _session_pool(self) -> SessionWorkers:
        with self._pool_lock:
            if self._pool is None:
                self._pool = SessionWorkers(self.sessions, self.run_batch)
            return self._pool

    def encode_batch(self, batch: list[str]) -> np.ndarray:
        """One batch's vectors, on the caller's thread."""
        return self.run_batch(self.sessions[0], batch)

    def run_batch(self, session, batch: list[str]) -> np.ndarray:
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


# --- auto: the fastest variant that stays close to fp32, chosen once per processor ----------------

def processor_key() -> str:
    """What the choice is kept under: the processor's model name and the instruction sets the
    kernels are picked by, so a move to another processor (another VM host) chooses again."""
    return f"{processor_name()} | {','.join(instruction_sets()) or 'none'}"


def choice_file(model_path: Path, cache_dir: Path) -> Path:
    return cache_dir / f"{model_stem(model_path)}-int8-choice.json"


def writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK)


def choice_folder(cache_dir: Path, choice_dir: Path | None) -> Path | None:
    """Where `auto` keeps its choice: beside the model files, or, where those cannot be written (a
    container's image), in the data directory that the deployment's processes share, so that the
    app, the worker and beat all run the variant measured once. None where neither is writable."""
    for folder in (cache_dir, choice_dir):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            if writable(folder):
                refuse_shared_folder(folder)
                return folder
    return None


def chosen_variant(model_path: Path, cache_dir: Path, choice_dir: Path | None = None) -> str:
    """The variant `auto` kept for this processor, measured now if it has none."""
    folder, key = choice_folder(cache_dir, choice_dir), processor_key()
    if folder is None:
        log.warning("CHARTCITE_INT8=auto cannot keep its choice in %s (not writable): measuring now, "
                    "and again at every start", cache_dir)
        return calibrate(model_path, cache_dir)["variant"]
    path = choice_file(model_path, folder)

    chosen = kept_variant(kept_choices(path), key)
    if chosen:
        return chosen
    with locked(folder / ".choice.lock"):          # processes starting together measure once
        choices = kept_choices(path)
        if not kept_variant(choices, key):
            choices[key] = calibrate(model_path, cache_dir)
            write_file(path, json.dumps(choices, indent=1, sort_keys=True) + "\n")
        return choices[key]["variant"]


def kept_choices(path: Path) -> dict:
    """The choice file's choices by processor; {} for a file missing, unreadable or of any other
    shape (`[]`, a string), which is then measured again and rewritten, never a crash at start."""
    try:
        choices = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return choices if isinstance(choices, dict) else {}


def kept_variant(choices: dict, key: str) -> str | None:
    """The variant kept for this processor, when the entry is the shape `calibrate` writes."""
    choice = choices.get(key)
    variant = choice.get("variant") if isinstance(choice, dict) else None
    return variant if isinstance(variant, str) and variant in KEPT_CHOICES else None


def calibrate(model_path: Path, cache_dir: Path) -> dict:
    """Each variant available timed on AUTO_TEXTS chart texts, and its vectors' cosine to the fp32
    ONNX model's on every calibration text the static scales did not see; the fastest with every
    cosine ≥ MIN_COSINE wins, and the fp32 file if none does. The variants take turns,
    TIMING_ROUNDS times, and each keeps its best time: other work on the machine only ever slows a run down, and taking turns spreads it over all.
    Each runs on one core (one session of one thread, as every session is): what differs between
    them is the kernels, and the candidates held at once take less memory (peak 1.0 GB, against
    1.8 GB with a session per core on two cores)."""
    unseen = calibration_texts()[STATIC_TEXTS:]
    texts = unseen[-AUTO_TEXTS:]
    embedders: dict[str, OnnxInt8Embedder] = {}
    cosines, skipped, seconds = {}, {}, {}
    try:
        embedders["fp32"] = OnnxInt8Embedder(str(model_path), cache_dir, variant="fp32", cores=1)
        reference = embedders["fp32"].encode(unseen)
        embedders.pop("fp32").close()
        for variant in VARIANTS:
            if variant == "openvino" and not openvino_available():
                skipped[variant] = "the openvino package is not importable"
                continue
            embedders[variant] = OnnxInt8Embedder(str(model_path), cache_dir, variant=variant, cores=1)
            vectors = embedders[variant].encode(unseen)             # also warms it up
            cosines[variant] = round(float((vectors * reference).sum(axis=1).min()), 4)
            seconds[variant] = float("inf")
        for _ in range(TIMING_ROUNDS):
            for variant, embedder in embedders.items():
                started = time.perf_counter()
                embedder.encode(texts)
                seconds[variant] = min(seconds[variant], time.perf_counter() - started)
    finally:
        for embedder in embedders.values():
            embedder.close()
    rates = {variant: round(len(texts) / spent, 1) for variant, spent in seconds.items()}
    variant = fastest_close(rates, cosines)
    if variant == "fp32":
        log.warning("no int8 variant stays within cosine %s of fp32 on this processor (%s): embedding at fp32; "
                    "cosine to fp32 %s", MIN_COSINE, processor_key(), cosines)
    log.info("int8 variant for this processor (%s): %s; texts/s %s, cosine to fp32 %s", processor_key(), variant,
             rates, cosines)
    return {"variant": variant, "texts_per_s": rates, "min_cosine_to_fp32": cosines, "skipped": skipped,
            "texts": len(texts), "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def fastest_close(rates: dict[str, float], cosines: dict[str, float]) -> str:
    """The fastest variant whose cosine to fp32 is at least MIN_COSINE, if it beats dynamic (the
    default, whose index name existing indexes carry) by WORTH_A_CHANGE or dynamic failed; the
    fp32 file when none passes, since a vector further from the model's own would cost recall
    where no one sees it. Static and dynamic run at about the same speed under ONNX Runtime:
    without the margin, noise would pick between them (and between index names) when a choice
    cannot be kept."""
    passing = [variant for variant in rates if cosines.get(variant, 0.0) >= MIN_COSINE]
    if not passing:
        return "fp32"
    fastest = max(passing, key=rates.__getitem__)
    if "dynamic" in passing and rates[fastest] < WORTH_A_CHANGE * rates["dynamic"]:
        return "dynamic"
    return fastest

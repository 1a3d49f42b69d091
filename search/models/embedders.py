"""Which embedder a process uses: int8 under ONNX Runtime (the default) or fp32 under PyTorch."""
from __future__ import annotations

from functools import lru_cache

from search.models.embed import Embedder, ModelNotFound, default_model_cache
from search.models.onnx_embed import OnnxInt8Embedder

PRECISIONS = ("int8", "fp32")


@lru_cache(maxsize=4)
def load_embedder(model_path: str | None, precision: str = "int8", cache_dir: str | None = None) -> Embedder:
    """One model per process: loading costs seconds and hundreds of MB. `int8` (the default): the
    model exported to ONNX and dynamically quantised, built once from the local files and cached;
    `fp32`: the sentence-transformers model under PyTorch."""
    if precision not in PRECISIONS:
        raise ModelNotFound(f"embedding precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "int8":
        return OnnxInt8Embedder(model_path, cache_dir or default_model_cache())
    return Embedder(model_path)

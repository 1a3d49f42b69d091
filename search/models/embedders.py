"""Which embedder a process uses: int8 (the default) or fp32 under PyTorch."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from search.models.embed import Embedder, ModelNotFound, default_model_cache, default_model_path
from search.models.onnx_embed import INT8_SETTINGS, KEPT_CHOICES, OnnxInt8Embedder, chosen_variant

PRECISIONS = ("int8", "fp32")
# No one int8 variant is fastest everywhere (ONNX Runtime's dynamic int8 ran at 1.38x fp32 on an
# AMX Xeon, OpenVINO's at 1.25x with AVX-512 capped to AVX2, each over 4x here): each processor
# measures its own at first start, and an existing index keeps the variant that built it.
DEFAULT_INT8 = "auto"


def load_embedder(model_path: str | None, precision: str = "int8", cache_dir: str | None = None,
                  int8: str = DEFAULT_INT8, choice_dir: str | None = None) -> Embedder:
    """One model per process: loading costs seconds and hundreds of MB. `int8` (the default): the
    model exported to ONNX and quantised, built once from the local files and cached, run as the
    `int8` variant says (CHARTCITE_INT8: dynamic, static, openvino or auto, see onnx_embed);
    `fp32`: the sentence-transformers model under PyTorch. `choice_dir`: where `auto` keeps its
    choice when the model cache is not writable (the data directory). `auto` is resolved first,
    so every caller of one variant shares one model."""
    if precision not in PRECISIONS:
        raise ModelNotFound(f"embedding precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if int8 not in (*INT8_SETTINGS, *KEPT_CHOICES):
        raise ModelNotFound(f"CHARTCITE_INT8 must be one of {', '.join(INT8_SETTINGS)}, not {int8!r}")
    if precision == "int8" and int8 == "auto":
        path = Path(model_path or default_model_path())
        if not path.exists():
            raise ModelNotFound(f"embedding model folder {path} does not exist (CHARTCITE_MODEL)")
        int8 = chosen_variant(path, Path(cache_dir or default_model_cache()), Path(choice_dir) if choice_dir else None)
    return loaded_embedder(model_path, precision, cache_dir, int8 if precision == "int8" else "")


@lru_cache(maxsize=4)
def loaded_embedder(model_path: str | None, precision: str, cache_dir: str | None, int8: str) -> Embedder:
    if precision == "int8":
        return OnnxInt8Embedder(model_path, cache_dir or default_model_cache(), variant=int8)
    return Embedder(model_path)

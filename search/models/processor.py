"""The processor this process runs on: its model name and the instruction sets that decide how
fast the embedding model runs. Benchmarks print it; the `auto` int8 choice is kept per processor."""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

# SSE4.2, AVX, AVX2, FMA, AVX-512 (and its VNNI int8 dot products and bf16), AVX-VNNI, and AMX
# (Intel's tile units for int8 and bf16): ONNX Runtime and OpenVINO pick their kernels by these.
NAMED_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
               "amx_int8", "amx_bf16")


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, tuple[str, ...]]:
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        info = ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 "unknown processor")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return model, tuple(flag for flag in NAMED_FLAGS if flag in flags)


def processor_name() -> str:
    return _cpuinfo()[0]


def instruction_sets() -> tuple[str, ...]:
    """The NAMED_FLAGS this processor has, in NAMED_FLAGS' order."""
    return _cpuinfo()[1]


def core_count() -> int:
    return os.cpu_count() or 1

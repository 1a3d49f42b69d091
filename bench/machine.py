"""The machine a benchmark ran on, for its first and last lines: figures mean little without it."""
from __future__ import annotations

import os
from pathlib import Path

# The instruction sets that decide how fast the embedding model runs (ONNX Runtime picks its
# kernels by them): SSE4.2, AVX, AVX2, FMA, AVX-512 (and its VNNI int8 dot products), AVX-VNNI.
NAMED_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")


def processor() -> str:
    """"AMD EPYC, 2 cores, avx avx2 fma ...; 23 GB" from /proc/cpuinfo and /proc/meminfo."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 "unknown processor")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    named = [flag for flag in NAMED_FLAGS if flag in flags]
    memory = ""
    if Path("/proc/meminfo").exists():
        total_kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"; {total_kb / 2**20:.0f} GB memory"
    return f"{model}, {os.cpu_count()} cores, instruction sets: {' '.join(named) or 'none of ' + ', '.join(NAMED_FLAGS)}{memory}"

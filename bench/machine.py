"""The machine a benchmark ran on, for its first and last lines: figures mean little without it."""
from __future__ import annotations

from pathlib import Path

from search.models.processor import NAMED_FLAGS, core_count, instruction_sets, processor_name

__all__ = ["NAMED_FLAGS", "fields", "header", "processor", "processor_dict", "processor_fields"]


def processor() -> str:
    """"AMD EPYC, 2 cores, instruction sets: avx avx2 fma ...; 23 GB memory" from /proc."""
    named = instruction_sets()
    memory = ""
    if Path("/proc/meminfo").exists():
        total_kb = int(Path("/proc/meminfo").read_text(encoding="utf-8").split()[1])
        memory = f"; {total_kb / 2**20:.0f} GB memory"
    return (f"{processor_name()}, {core_count()} cores, instruction sets: "
            f"{' '.join(named) or 'none of ' + ', '.join(NAMED_FLAGS)}{memory}")


def processor_dict() -> dict:
    """{"cpu": "AMD EPYC", "cores": 2, "isa": "avx2,avx512f,..."} for a JSON result line."""
    return {"cpu": processor_name(), "cores": core_count(), "isa": ",".join(instruction_sets()) or "none"}


def processor_fields() -> str:
    """The same for a `name: key=value ...` line: `cpu="AMD EPYC" cores=2 isa=avx2,avx512f,...`
    (isa=none when it has none of NAMED_FLAGS)."""
    values = processor_dict()
    name = values["cpu"].replace('"', "'")
    return f'cpu="{name}" cores={values["cores"]} isa={values["isa"]}'


def header() -> str:
    """A bench's first line."""
    return f"processor: {processor()}"


def fields() -> str:
    """What a bench appends to its last, machine-readable line."""
    return processor_fields()

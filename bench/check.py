"""`chartcite check` on the embedded index: seconds for 30,000, 100,000 and 300,000 chunks, and per
100,000 chunks (the goal: at most 10 s per 100k, 30 s at 300k). The chunks are synthetic (no
model, no records: what check reads does not depend on their text), 300 per patient, each with a
vector, a full-text row, a reference and a concept, and the patients with their summaries.

The first line names the processor; the last is for scripts:
`check: s_per_100k_at_30000=… s_per_100k_at_100000=… … cpu="…" cores=… isa=…`.
Usage: python bench/check.py [--chunks 30000,100000,300000] [--per-patient 300]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402
from search.backends.embedded import EmbeddedBackend  # noqa: E402
from tests.synthetic import DIMENSION, MODEL, fill_embedded  # noqa: E402


def one_size(folder: Path, chunks: int, per_patient: int) -> tuple[float, float, float]:
    """(seconds to fill, seconds to check, index size in MB) for an index of `chunks` chunks."""
    backend = EmbeddedBackend(folder / f"index-{chunks}.sqlite", MODEL, DIMENSION)
    started = time.perf_counter()
    fill_embedded(backend, "bench", max(1, chunks // per_patient), per_patient)
    filled = time.perf_counter() - started
    started = time.perf_counter()
    result = backend.check("bench")
    checked = time.perf_counter() - started
    assert not result.problems, result.problems
    backend.close()
    return filled, checked, (folder / f"index-{chunks}.sqlite").stat().st_size / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", default="30000,100000,300000")
    parser.add_argument("--per-patient", type=int, default=300)
    args = parser.parse_args()
    print(header(), flush=True)
    print(f"{'chunks':>8} {'patients':>8} {'fill s':>8} {'check s':>8} {'s per 100k':>10} {'index MB':>9}")
    per_100k = []
    with tempfile.TemporaryDirectory() as tmp:
        for chunks in (int(n) for n in args.chunks.split(",")):
            filled, checked, size = one_size(Path(tmp), chunks, args.per_patient)
            per_100k.append(f"s_per_100k_at_{chunks}={checked * 100_000 / chunks:.2f}")
            print(f"{chunks:>8} {chunks // args.per_patient:>8} {filled:>8.1f} {checked:>8.2f} "
                  f"{checked * 100_000 / chunks:>10.2f} {size:>9.0f}", flush=True)
    print(f"check: {' '.join(per_100k)} {fields()}")


if __name__ == "__main__":
    main()

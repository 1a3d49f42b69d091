"""Writes search/models/data/calibration.txt: chart texts the static int8 model is calibrated on.

The static int8 embedding model fixes its activation scales once, from texts run through the
fp32 model when it is built. Those texts must be chartcite's own chunk texts (lab lines,
medication orders, conditions, note passages) and must ship with the code: a hospital's machine
has no shared Synthea set. This script makes them reproducibly from the shared Synthea records
with the real chunker and the default model's tokenizer, then draws LINES of them with a fixed
seed, in the proportions indexing meets them. One text per line, whitespace runs made one space.

Usage: python scripts/make_calibration.py [SYNTHEA_DIR] [--lines 600]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fhir_ingest.record.chunk import PatientChunker, TextBudget  # noqa: E402
from fhir_ingest.record.load import load_resources  # noqa: E402
from search.models.embed import default_model_path  # noqa: E402

TARGET = REPO / "search" / "models" / "data" / "calibration.txt"
SEED = 30          # the issue that asked for it


def chunk_texts(files: list[Path]) -> list[str]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(default_model_path()) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    budget = TextBudget(254, lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids))
    texts = set()
    for path in files:
        for record in load_resources([path])[0]:
            for chunk in PatientChunker("calibration", record.patient_id, record.resources, budget).chunks():
                texts.add(" ".join(chunk.text.split()))
    return sorted(texts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("synthea", nargs="?", default=str(Path(os.environ.get("CHARTCITE_SHARED", REPO.parent / "shared")) / "data" / "synthea"),
                        help="the shared Synthea records (default: CHARTCITE_SHARED/data/synthea)")
    parser.add_argument("--lines", type=int, default=600)
    args = parser.parse_args()
    files = sorted(Path(args.synthea).glob("*.json.gz"))
    if not files:
        raise SystemExit(f"no Synthea bundles (*.json.gz) in {args.synthea}")
    texts = chunk_texts(files)
    chosen = random.Random(SEED).sample(texts, min(args.lines, len(texts)))
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text("\n".join(chosen) + "\n", encoding="utf-8")
    print(f"{len(chosen)} of {len(texts)} distinct chunk texts from {len(files)} patients -> {TARGET.relative_to(REPO)}")


if __name__ == "__main__":
    main()

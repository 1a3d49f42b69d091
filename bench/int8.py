"""The int8 variants side by side on the shared Synthea records' chunk texts: PyTorch fp32 (the
ceiling indexing is measured against), ONNX Runtime dynamic int8, ONNX Runtime static int8 (QDQ)
and OpenVINO on the static model (when the openvino package is importable).

Each variant runs in a process of its own (so its peak RSS is its own), embeds the chunk texts of
the first N patients in the calls indexing makes, after a warm-up, and keeps its best of --repeat
runs. Printed per variant: texts/s, the ratio to PyTorch fp32, the share of padded word pieces
that are padding, the cosine of its vectors to fp32's (min and mean), peak RSS and load time.
The first line names the processor; the last is for scripts:
`int8: patients=… texts=… fp32_texts_per_s=… dynamic_texts_per_s=… dynamic_ratio=… dynamic_cos_min=… …
cpu="…" cores=… isa=…`.

`--cap-isa avx2` runs the variants as they would run on a processor without AVX-512 (nor VNNI,
bf16 or AMX): it caps the kernels of oneDNN (OpenVINO's and PyTorch's), MKL and PyTorch's own at
AVX2 through their documented variables. ONNX Runtime has no such cap, so its variants are left
out there; a real AVX2-only processor is still the figure to trust, and the header says the run
was capped.

Usage: python bench/int8.py [SYNTHEA_DIR] [--patients N] [--repeat R] [--variants fp32,dynamic,static,openvino]
                            [--cap-isa avx2]
The int8 files are built once into ~/.cache/chartcite/models (or --cache) if missing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.machine import fields, header  # noqa: E402

ALL = ("fp32", "dynamic", "static", "openvino")
# What caps each library's kernels at an instruction set, and the variants no variable caps.
CAPS = {"avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                 "ATEN_CPU_CAPABILITY": "avx2"}}
UNCAPPABLE = ("dynamic", "static")       # ONNX Runtime dispatches on the processor alone


def padding_share(embedder, groups: list[list[str]]) -> float:
    """Of the word pieces the model runs (each batch padded to its longest text), the share that
    is padding, for the batches the embedder forms from these calls."""
    real = padded = 0
    for group in groups:
        for batch in embedder.batches(sorted(group, key=embedder.batch_length)):
            lengths = [min(embedder.count_tokens(text), embedder.max_tokens) + 2 for text in batch]
            step = getattr(embedder, "shape_step", 1)                # OpenVINO's batches round up
            real, padded = real + sum(lengths), padded + len(lengths) * -(-max(lengths) // step) * step
    return 1 - real / padded if padded else 0.0


def run_variant(args) -> None:
    """In the child: embed the texts with one variant, save the vectors, print one JSON line."""
    import numpy as np

    from bench.ingest import as_indexing_groups, embedded_in_groups, patient_texts, peak_rss_mb
    from search.models.embed import Embedder, default_model_cache
    from search.models.onnx_embed import OnnxInt8Embedder

    started = time.perf_counter()
    if args.variant == "fp32":
        embedder = Embedder(None)
    else:
        embedder = OnnxInt8Embedder(None, args.cache or default_model_cache(), variant=args.variant)
    load_s = time.perf_counter() - started
    files = sorted(Path(args.synthea).glob("*.json.gz"))[: args.patients]
    groups = as_indexing_groups(patient_texts(files, embedder))
    texts = [text for group in groups for text in group]
    embedder.encode(texts[:64])                                   # warm-up
    best = float("inf")
    for _ in range(args.repeat):
        started = time.perf_counter()
        embedded_in_groups(embedder, groups)
        best = min(best, time.perf_counter() - started)
    np.save(args.out, np.concatenate([embedder.encode(group) for group in groups]))
    print(json.dumps({"variant": args.variant, "name": embedder.name, "texts": len(texts), "seconds": best,
                      "padding": padding_share(embedder, groups), "rss_mb": peak_rss_mb(), "load_s": load_s}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("synthea", nargs="?",
                        default=str(Path(os.environ.get("CHARTCITE_SHARED", REPO.parent / "shared")) / "data" / "synthea"))
    parser.add_argument("--patients", type=int, default=60, help="the first N shared patients (default: all 60)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per variant, the best kept")
    parser.add_argument("--variants", default=",".join(ALL))
    parser.add_argument("--cache", default="", help="where the int8 files are (default ~/.cache/chartcite/models)")
    parser.add_argument("--cap-isa", choices=sorted(CAPS), help="run as on a processor with only this instruction set")
    parser.add_argument("--variant", help=argparse.SUPPRESS)       # the child's side
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        run_variant(args)
        return
    print(header(), flush=True)
    child_env = dict(os.environ)
    if args.cap_isa:
        child_env.update(CAPS[args.cap_isa])
        print(f"kernels capped at {args.cap_isa.upper()} ({', '.join(f'{k}={v}' for k, v in CAPS[args.cap_isa].items())}); "
              f"left out, as ONNX Runtime cannot be capped: {', '.join(UNCAPPABLE)}", flush=True)
    import numpy as np

    from search.models.onnx_embed import openvino_available

    variants = [v for v in args.variants.split(",") if v]
    if "fp32" not in variants:
        sys.exit("the fp32 variant is the reference every ratio and cosine is taken against: keep it in --variants")
    if args.cap_isa:
        variants = [v for v in variants if v not in UNCAPPABLE]
    if "openvino" in variants and not openvino_available():
        print("openvino: the package is not importable, left out")
        variants.remove("openvino")
    results, vectors = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            out = Path(tmp) / f"{variant}.npy"
            done = subprocess.run([sys.executable, __file__, args.synthea, "--patients", str(args.patients),
                                   "--repeat", str(args.repeat), "--cache", args.cache, "--variant", variant,
                                   "--out", str(out)], capture_output=True, text=True, env=child_env, encoding="utf-8")
            if done.returncode:
                sys.exit(f"{variant} failed:\n{done.stderr[-3000:]}")
            results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
            vectors[variant] = np.load(out)
    fp32 = results["fp32"]
    fp32_rate = fp32["texts"] / fp32["seconds"]
    print(f"{args.patients} patients, {fp32['texts']} chunk texts, best of {args.repeat} run(s), each variant in its own process")
    print(f"{'variant':9} {'texts/s':>8} {'÷ fp32':>7} {'padding':>8} {'cos min':>8} {'cos mean':>9} {'peak RSS':>9} {'load s':>7}  index name")
    line = [f"patients={args.patients} texts={fp32['texts']}"]
    for variant, result in results.items():
        rate = result["texts"] / result["seconds"]
        cosine = (vectors[variant] * vectors["fp32"]).sum(axis=1)
        print(f"{variant:9} {rate:8.1f} {rate / fp32_rate:7.2f} {100 * result['padding']:7.1f}% {cosine.min():8.4f} "
              f"{cosine.mean():9.4f} {result['rss_mb']:6.0f} MB {result['load_s']:7.1f}  {result['name']}")
        line.append(f"{variant}_texts_per_s={rate:.1f}")
        if variant != "fp32":
            line.append(f"{variant}_ratio={rate / fp32_rate:.2f} {variant}_cos_min={cosine.min():.4f}")
        line.append(f"{variant}_padding={result['padding']:.3f} {variant}_rss_mb={result['rss_mb']:.0f}")
    capped = f" capped_isa={args.cap_isa}" if args.cap_isa else ""
    print(f"int8: {' '.join(line)}{capped} {fields()}")


if __name__ == "__main__":
    main()

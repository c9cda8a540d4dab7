"""Measure llama.cpp beside kvbench on SmolLM2-135M-Instruct Q4_1 (docs/peers.md, llama.cpp).

Speed: llama-bench tg{N} at depth D for several -ctk/-ctv pairs (flash attention on).
Quality: llama-perplexity -c CTX --chunks C with an f16 cache (saving its log-probabilities)
and with each quantized pair, KL divergence against the f16 run.
Text: kvbench's default text (kernels/model/text.py default_text: CPython's pydoc topics prose),
first CHARS characters, written to the cache for llama-perplexity.

Run (after `make llamacpp`):
  .venv/bin/python scripts/llamacpp_measure.py [--threads 1] [--depth 512] [--n-gen 16]
Prints markdown tables; --json FILE also keeps every parsed result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

from kvbench.kernels.model.text import default_text
from kvbench.peers import llamacpp as lc
from kvbench.peers import llamacpp_perplexity as lp

PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("q4_1", "q4_1")]


def write_text(chars: int) -> Path:
    text = default_text()[:chars]
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = lc.cache_root() / "texts" / f"pydoc-topics-{chars}-{digest}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def speed(args, model: Path) -> list[dict]:
    rows = []
    for k, v in PAIRS:
        kw = dict(depth=args.depth, n_gen=args.n_gen, type_k=k, type_v=v, flash_attn=True)
        raw = args.raw / f"bench-d{args.depth}-n{args.n_gen}-{k}-{v}.json"
        (res,) = lc.run_bench(model, threads=args.threads, reps=args.reps, save_to=raw, **kw)
        rows.append(res)
        ts = res["samples_ts"]
        print(
            f"| {res['type_k']} | {res['type_v']} | {statistics.median(ts):.1f} "
            f"| {min(ts):.1f} – {max(ts):.1f} | {len(ts)} |",
            flush=True,
        )
    return rows


def quality(args, model: Path, text: Path) -> list[dict]:
    """f16 run saving the reference log-probabilities, then one --kl-divergence run per pair
    (it reports the pair's own PPL beside the KL figures)."""
    tag = f"c{args.ctx}-n{args.chunks}"
    base = lc.cache_root() / "llamacpp" / f"kl-base-{tag}.bin"
    common = dict(ctx=args.ctx, chunks=args.chunks, threads=args.threads, flash_attn=True)
    raw = args.raw / f"perplexity-{tag}-f16.txt"
    ref = lp.run_perplexity(model, text_path=text, kl_base=base, save_to=raw, **common)
    print(f"| f16 | f16 | {ref['ppl']:.4f} ± {ref['ppl_err']:.4f} | – | – | – |", flush=True)
    rows = [ref]
    for k, v in PAIRS[1:]:
        raw = args.raw / f"kl-{tag}-{k}-{v}.txt"
        kw = dict(kl_base=base, kl=True, type_k=k, type_v=v, save_to=raw)
        kl = lp.run_perplexity(model, **kw, **common)
        print(
            f"| {k} | {v} | {kl['ppl']:.4f} ± {kl['ppl_err']:.4f} "
            f"| {kl['kl_mean']:.6f} ± {kl['kl_mean_err']:.6f} | {kl['kl_p99']:.6f} "
            f"| {100 * kl['same_top_p']:.2f} % |",
            flush=True,
        )
        rows.append(kl)
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)  # 2 threads collapse on a busy 2-core box
    p.add_argument("--depth", type=int, default=512)
    p.add_argument("--n-gen", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--chars", type=int, default=40000)
    p.add_argument("--skip", choices=("speed", "quality"), default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--pairs", default=None, help="K/V,K/V,... (default: PAIRS; f16/f16 first)")
    p.add_argument("--raw", type=Path, default=Path("."), help="where raw outputs are kept")
    args = p.parse_args()
    model = lc.model_path()
    for name in ("llama-bench", "llama-perplexity"):
        if lc.llamacpp_bin(name) is None:
            print(lc.missing_reason(name), file=sys.stderr)
            return 2
    args.raw.mkdir(parents=True, exist_ok=True)
    if args.pairs:
        PAIRS[:] = [tuple(pair.split("/")) for pair in args.pairs.split(",")]
    out = {"build": lc.build_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    if args.skip != "speed":
        print(f"\n| K | V | tg{args.n_gen} @ d{args.depth} t/s (median) | range | reps |")
        print("| --- | --- | --- | --- | --- |")
        out["speed"] = speed(args, model)
    if args.skip != "quality":
        text = write_text(args.chars)
        print(f"\ntext: {text}")
        print("\n| K | V | PPL | KL mean | KL p99 | same top-1 |")
        print("| --- | --- | --- | --- | --- | --- |")
        out["quality"] = quality(args, model, text)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

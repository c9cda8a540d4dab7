"""Quality (and optionally decode speed) of many cache specs on one model: rows as plain dicts.

`.venv/bin/python scripts/model_table.py --context-len 128 --chunks 2 --out q.csv` measures
every spec of SPECS on the default model and text against the float32 cache, and prints a
markdown table.
Decode speed (`--decode-only --decode-depth N`): for each (spec, kernel) of DECODE_CASES the
cache is prefilled with N tokens of the text (untimed), then whole-model decode steps are timed
(harness/timer.py run_once: mx.eval of the logits and the cache arrays and a synchronize; one
warm-up step, then the median of `--decode-steps` steps).
`--attention-error`: kvbench's synthetic accuracy columns (rel_err of one decode query's
attention output, kv_recon_err) per format on gaussian, outlier and the model's real K/V.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from kvbench.kernels.attention.registry import reference
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.capture import capture_kv
from kvbench.kernels.model.fetch import require_model
from kvbench.kernels.model.load import Model, load_model
from kvbench.kernels.model.quality import chunks, quality, reference_run
from kvbench.kernels.model.run import decode_step, prefill
from kvbench.kernels.model.spec import CacheSpec, kv_bytes
from kvbench.kernels.model.text import default_text, text_info
from kvbench.kernels.model.tokenizer import load_tokenizer
from kvbench.timer import run_once

SPECS = [
    CacheSpec("fp16"),
    CacheSpec("bf16"),
    CacheSpec("int8"),
    CacheSpec("affine8"),
    CacheSpec("int4"),
    CacheSpec("int4", k_group=32),
    CacheSpec("fp4"),
    CacheSpec("fp4", k_group=32),
    CacheSpec("mxfp4"),
    CacheSpec("nvfp4"),
    CacheSpec("affine4"),
    CacheSpec("int8", "int4"),
    CacheSpec("int4", "int8"),
    CacheSpec("int4", sink_tokens=4),
    CacheSpec("int4", recent_tokens=32),
    CacheSpec("int4", k_axis="channel", recent_tokens=32),
    CacheSpec("affine4", k_group=32, k_axis="channel", recent_tokens=32),
]


def bytes_row(model: Model, spec: CacheSpec, n_tokens: int) -> dict:
    c = model.config
    total = kv_bytes(spec, n_tokens, c.n_layers, c.n_kv_heads, c.head_dim)
    elems = 2 * n_tokens * c.n_layers * c.n_kv_heads * c.head_dim
    return {"kv_bytes": total, "bits_per_elem": 8 * total / elems}


# (spec, kernel) pairs timed by --decode-only: dense through SDPA and the oracle, the packed
# formats through the kernels that read them directly, and a mixed spec (dense view)
DECODE_CASES = [
    (CacheSpec("fp32"), "reference"),
    (CacheSpec("fp16"), "sdpa"),
    (CacheSpec("fp16"), "reference"),
    (CacheSpec("int8"), "tiled"),
    (CacheSpec("int4"), "tiled"),
    (CacheSpec("int4"), "dequant_sdpa"),
    (CacheSpec("mxfp4"), "quantized_matmul"),
    (CacheSpec("affine4"), "quantized_matmul"),
    (CacheSpec("int8", "int4"), "sdpa"),
]


def decode_ms(model: Model, spec: CacheSpec, kernel: str, tokens: list[int], steps: int) -> dict:
    """Median wall time of one whole-model decode step at depth len(tokens), and the peak
    memory of the steps (mx.get_peak_memory after a reset that follows the prefill)."""
    cache = make_cache(spec, model.config, len(tokens) + steps + 1, kernel)
    prefill(model, cache, tokens)
    mx.reset_peak_memory()
    times = [
        run_once(lambda i=i: [decode_step(model, cache, tokens[i % len(tokens)]), *cache.arrays()])
        for i in range(steps + 1)
    ]
    ms = statistics.median(times[1:])  # the first step is warm-up
    # min beside the median: on a shared machine the min is the least disturbed step
    best = min(times[1:])
    peak_mb = mx.get_peak_memory() / 1e6
    return {"decode_ms": ms, "decode_ms_min": best, "tokens_per_s": 1e3 / ms, "peak_mb": peak_mb}


def decode_rows(model: Model, ids: list[int], depth: int, steps: int) -> list[dict]:
    rows = []
    for spec, kernel in DECODE_CASES:
        row = {"spec": spec.label, "kernel": kernel, "depth": depth}
        row.update(decode_ms(model, spec, kernel, ids[:depth], steps))
        rows.append(row)
        print(row, flush=True)
    return rows


ERROR_FORMATS = ["fp16", "bf16", "int8", "affine8", "int4", "fp4", "mxfp4", "nvfp4", "affine4"]


def attention_error(fmt, q, k, v, scale: float) -> dict:
    """kvbench's accuracy columns for one decode query: the float32 reference attention over
    the format's stored K/V against the float32 reference over the originals."""
    f32 = get_format("fp32")
    want = reference(q, {"data": k}, {"data": v}, f32, scale=scale)
    got = reference(q, fmt.encode(k), fmt.encode(v), fmt, scale=scale)
    kd, vd = fmt.decode(fmt.encode(k), mx.float32), fmt.decode(fmt.encode(v), mx.float32)
    recon = mx.sqrt(mx.sum((kd - k) ** 2) + mx.sum((vd - v) ** 2))
    recon = recon / mx.sqrt(mx.sum(k * k) + mx.sum(v * v))
    rel = mx.sqrt(mx.sum((got - want) ** 2) / mx.sum(want * want))
    return {"rel_err": rel.item(), "kv_recon_err": recon.item()}


def error_rows(model: Model, ids: list[int], ctx: int) -> list[dict]:
    """rel_err / kv_recon_err per format on gaussian, outlier and real (every layer's
    post-RoPE capture, mean over layers) K/V; gaussian queries as the attention suites use."""
    c = model.config
    q_shape, kv_shape = (1, c.n_heads, 1, c.head_dim), (1, c.n_kv_heads, ctx, c.head_dim)
    sets = {kind: [make_qkv(kind, q_shape, kv_shape, seed=0)] for kind in ("gaussian", "outliers")}
    q = sets["gaussian"][0][0]
    sets["smollm2"] = [
        (q, mx.array(k)[None], mx.array(v)[None]) for k, v in capture_kv(model, ids[:ctx])
    ]
    rows = []
    for name in ERROR_FORMATS:
        for kind, triples in sets.items():
            errs = [attention_error(get_format(name), *t, c.head_dim**-0.5) for t in triples]
            mean = {key: statistics.fmean(e[key] for e in errs) for key in errs[0]}
            rows.append({"format": name, "kv_data": kind, "context_len": ctx, **mean})
            print(rows[-1], flush=True)
    return rows


def run(args) -> list[dict]:
    model = load_model(args.model or require_model())
    tok = load_tokenizer(model)
    ids = tok.encode(default_text())
    if args.decode_only:
        return decode_rows(model, ids, args.decode_depth, args.decode_steps)
    if args.attention_error:
        return error_rows(model, ids, args.context_len)
    token_chunks = chunks(ids, args.context_len, args.chunks, tok.bos_id if tok.add_bos else None)
    ref = reference_run(model, token_chunks)
    rows = []
    specs = [s for s in SPECS if not args.specs or s.label in args.specs.split(",")]
    for spec in specs:
        t0 = time.perf_counter()
        row = {"spec": spec.label, **quality(model, token_chunks, spec, ref, args.kernel)}
        row.update(bytes_row(model, spec, args.context_len), quality_s=time.perf_counter() - t0)
        rows.append({**row, "context_len": args.context_len, **text_info(default_text())})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF file or mlx-lm directory (default: fetched SmolLM2)")
    ap.add_argument("--context-len", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--kernel", default="reference")
    ap.add_argument("--decode-only", action="store_true", help="time DECODE_CASES instead")
    ap.add_argument("--attention-error", action="store_true", help="synthetic vs real K/V")
    ap.add_argument("--decode-depth", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=5)
    ap.add_argument("--specs", help="comma-separated labels of SPECS to run (default: all)")
    ap.add_argument("--out", help="CSV path")
    args = ap.parse_args(argv)
    rows = run(args)
    import pandas as pd

    df = pd.DataFrame(rows)
    if args.out:
        df.to_csv(args.out, index=False)
    print(df.to_markdown(index=False, floatfmt=".4g") if _has_tabulate() else df.to_string())


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()

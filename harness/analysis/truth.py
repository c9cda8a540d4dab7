"""kvbench held against llama.cpp, row by row (suites/truth.yaml; pandas only).

A pair is a kvbench quality row and a llama.cpp quality row (kernel `llama.cpp`) of the same
model, context, chunks, text, K/V types and rotations, both ok. Per pair: kvbench / llama.cpp
for perplexity (each side's `ppl` with its own cache) and for mean KL divergence (kvbench's
against a float32 cache, llama.cpp's against an f16 cache), with a 95% interval on each ratio
from the two standard errors of the mean over scored tokens (llama.cpp's ± and kvbench's
kl_err / ppl_err, computed as llama.cpp computes its own), the two taken as independent and the
ratio as log-normal: exp(log r +- 1.96 sqrt((se_a/a)^2 + (se_b/b)^2)). Both sides score the
same tokens, so their errors are positively correlated and this interval is wider than a paired
one; llama.cpp prints no per-token KL, so a paired bootstrap over tokens is not available.
`goal` says whether the ratio meets issue #33's aim: ppl within 1%, KL within 15% (no KL goal for
an unquantized cache, whose KL on both sides is rounding).
This module imports neither mlx nor kernels/ (it runs on result files alone).
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

PEER = "llama.cpp"
PAIR_KEYS = ("model", "context_len", "chunks", "text", "kv_dtype", "v_dtype", "rotate_k",
             "rotate_v")  # fmt: skip
GOALS = {"ppl": 0.01, "kl": 0.15}  # |ratio - 1| aimed at (issue #33)
DENSE = ("fp16", "bf16", "fp32")  # no KL goal: both sides' KL is rounding (1e-6 nats)
Z95 = 1.959964


def ratio_interval(a: float, se_a: float, b: float, se_b: float) -> tuple[float, float, float]:
    """(a / b, low, high): the 95% interval of a ratio of two independent means with standard
    errors se_a and se_b, log-normal (delta method on log a - log b); nan where undefined."""
    if not (a > 0 and b > 0) or any(map(_missing, (se_a, se_b))):
        return (a / b if b else math.nan), math.nan, math.nan
    r = a / b
    half = Z95 * math.hypot(se_a / a, se_b / b)
    return r, r * math.exp(-half), r * math.exp(half)


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _side(df: pd.DataFrame, peer: bool) -> pd.DataFrame:
    ok = df[(df["status"] == "ok") & (df["phase"] == "quality")]
    ok = ok[(ok["kernel"] == PEER) == peer]
    keys = [k for k in PAIR_KEYS if k in ok.columns]
    return ok.assign(**{k: ok[k].astype(object).fillna("") for k in keys}).set_index(keys)


def truth_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per kvbench / llama.cpp pair: both figures, the ratios and their intervals."""
    mine, peer = _side(df, False), _side(df, True)
    rows = []
    for key, m in mine.iterrows():
        if key not in peer.index:
            continue
        p = peer.loc[key]
        p = p.iloc[0] if isinstance(p, pd.DataFrame) else p
        row = dict(zip(mine.index.names, key))
        row["n_scored"] = m.get("n_scored")
        dense = row.get("kv_dtype") in DENSE  # KL of two unquantized caches: rounding noise
        for name, col, err in (("ppl", "ppl", "ppl_err"), ("kl", "kl_mean", "kl_err")):
            r, lo, hi = ratio_interval(m[col], m.get(err), p[col], p.get(err))
            goal = None if name == "kl" and dense else bool(abs(r - 1) <= GOALS[name])
            row |= {f"{name}_kvbench": m[col], f"{name}_llamacpp": p[col], f"{name}_ratio": r,
                    f"{name}_lo": lo, f"{name}_hi": hi, f"{name}_goal": goal}  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    """The table as markdown: figures, ratio [95% interval], goal met."""
    head = ("| model | ctx | K/V | rotation | tokens | ppl kvbench | ppl llama.cpp | ratio "
            "| KL kvbench | KL llama.cpp | ratio |")  # fmt: skip
    lines = [head, "|" + "---|" * 11]
    for r in table.itertuples():
        rot = "yes" if "hadamard" in (r.rotate_k, r.rotate_v) else "no"
        lines.append(
            f"| {r.model} | {r.context_len} | {r.kv_dtype} | {rot} | {r.n_scored} "
            f"| {r.ppl_kvbench:.4f} | {r.ppl_llamacpp:.4f} | {_ratio(r, 'ppl')} "
            f"| {r.kl_kvbench:.3g} | {r.kl_llamacpp:.3g} | {_ratio(r, 'kl')} |"
        )
    return "\n".join(lines)


def _ratio(r, name: str) -> str:
    ratio, lo, hi = (getattr(r, f"{name}_{k}") for k in ("ratio", "lo", "hi"))
    mark = " (off goal)" if getattr(r, f"{name}_goal") is False else ""
    if math.isnan(lo):
        return f"{ratio:.3f}{mark}"
    return f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]{mark}"


def main(argv: list[str] | None = None) -> int:
    from kvbench.store.results import read_rows

    ap = argparse.ArgumentParser(description="kvbench / llama.cpp per quality row")
    ap.add_argument("results", nargs="+", help="result CSV files (suites/truth.yaml runs)")
    args = ap.parse_args(argv)
    df = pd.concat([read_rows(p) for p in args.results], ignore_index=True)
    table = truth_table(df)
    print(markdown(table) if len(table) else "no kvbench row has a llama.cpp row to pair with")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""kvbench held against llama.cpp, row by row (suites/truth.yaml; pandas only).

A pair is a kvbench quality row and a llama.cpp quality row (kernel `llama.cpp`) of the same
model, context, chunks, text, K/V types and rotations, both ok. Per pair: kvbench / llama.cpp
for perplexity (each side's `ppl` with its own cache) and for mean KL divergence (kvbench's
against a float32 cache, llama.cpp's against its reference pass's cache), with a 95% interval.

Where both rows kept their per-token values (the run's `<run_id>.tokens.csv`, store/tokens.py)
the interval is a paired bootstrap over the scored tokens (stats.paired_token_ratio: token
positions resampled jointly, in moving blocks of ceil(n^(1/3)) tokens, TOKEN_RESAMPLES
resamples, seed TOKEN_SEED, 95% percentile interval), and the ratio is that of the per-token
means: both sides score the same tokens, so the text's hard tokens, which move both means, cancel.
The pair is refused (no interval, the reason in `interval`) when the two rows' tokens are not
the same (chunk, position and token id, position by position). Where a side has no per-token
values (a run from before they were kept), the interval comes from the two standard errors of
the mean (llama.cpp's ± and kvbench's kl_err / ppl_err) taken as independent, the ratio as
log-normal: exp(log r +- 1.96 sqrt((se_a/a)^2 + (se_b/b)^2)), far wider, as the two sides'
errors are correlated; `interval` says which.
`goal` says whether the ratio meets issue #33's aim: ppl within 1%, KL within 15% (no KL goal for
an unquantized cache, whose KL on both sides is rounding).
This module imports neither mlx nor kernels/ (it runs on result files alone).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import UserError
from kvbench.stats import (
    TOKEN_RESAMPLES,
    TOKEN_SEED,
    log_normal_ratio,
    paired_token_ratio,
    token_block,
)
from kvbench.store import tokens as token_store

PEER = "llama.cpp"
PAIR_KEYS = ("model", "context_len", "chunks", "text", "kv_dtype", "v_dtype", "rotate_k",
             "rotate_v")  # fmt: skip
GOALS = {"ppl": 0.01, "kl": 0.15}  # |ratio - 1| aimed at (issue #33)
DENSE = ("fp16", "bf16", "fp32")  # no KL goal: both sides' KL is rounding (1e-6 nats)


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _side(df: pd.DataFrame, peer: bool) -> pd.DataFrame:
    ok = df[(df["status"] == "ok") & (df["phase"] == "quality")]
    ok = ok[(ok["kernel"] == PEER) == peer]
    keys = [k for k in PAIR_KEYS if k in ok.columns]
    return ok.assign(**{k: ok[k].astype(object).fillna("") for k in keys}).set_index(keys)


def truth_table(df: pd.DataFrame, tokens: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per kvbench / llama.cpp pair: both figures, the ratios and their intervals;
    `tokens` the runs' per-token values (store/tokens.py columns plus run_id), if any."""
    mine, peer = _side(df, False), _side(df, True)
    rows = []
    for key, m in mine.iterrows():
        if key not in peer.index:
            continue
        p = peer.loc[key]
        p = p.iloc[0] if isinstance(p, pd.DataFrame) else p
        row = dict(zip(mine.index.names, key))
        row["n_scored"] = m.get("n_scored")
        pair, why = paired_tokens(tokens, m, p)
        row["interval"] = why
        dense = row.get("kv_dtype") in DENSE  # KL of two unquantized caches: rounding noise
        for name, col, err in (("ppl", "ppl", "ppl_err"), ("kl", "kl_mean", "kl_err")):
            if pair is not None:
                tok = "nll" if name == "ppl" else "kl"
                r, lo, hi = paired_token_ratio(pair[0][tok], pair[1][tok], name)
            elif why == INDEPENDENT:
                r, lo, hi = log_normal_ratio(m[col], m.get(err), p[col], p.get(err))
            else:  # refused: the rows' ratio, no interval
                r, lo, hi = (m[col] / p[col] if p[col] else math.nan), math.nan, math.nan
            undefined = (name == "kl" and dense) or not math.isfinite(r)
            goal = None if undefined else bool(abs(r - 1) <= GOALS[name])
            row |= {f"{name}_kvbench": m[col], f"{name}_llamacpp": p[col], f"{name}_ratio": r,
                    f"{name}_lo": lo, f"{name}_hi": hi, f"{name}_goal": goal}  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


PAIRED = "paired bootstrap over scored tokens"
INDEPENDENT = "independent standard errors (no per-token values)"


def paired_tokens(tokens: pd.DataFrame | None, m, p) -> tuple[tuple | None, str]:
    """((kvbench's, llama.cpp's) per-token frames, PAIRED) when both rows kept the same
    tokens; (None, INDEPENDENT) when a side kept none; (None, the reason) when they differ."""
    if tokens is None or tokens.empty:
        return None, INDEPENDENT
    sides = [tokens[(tokens["run_id"] == r["run_id"]) & (tokens["case_id"] == r["case_id"])]
             for r in (m, p)]  # fmt: skip
    if any(s.empty for s in sides):
        return None, INDEPENDENT
    a, b = (s.sort_values(["chunk", "position"], kind="stable") for s in sides)
    if len(a) != len(b):
        return None, f"refused: kvbench kept {len(a)} scored tokens, llama.cpp {len(b)}"
    cols = ["chunk", "position", "token"]
    differ = (a[cols].to_numpy() != b[cols].to_numpy()).any(axis=1)
    if differ.any():
        i = int(np.argmax(differ))
        at = a.iloc[i]
        return None, (f"refused: the tokens differ from chunk {at['chunk']} position "
                      f"{at['position']} on (kvbench token {at['token']}, llama.cpp "
                      f"{b.iloc[i]['token']}; {int(differ.sum())} of {len(a)} differ)")  # fmt: skip
    return (a, b), PAIRED


def markdown(table: pd.DataFrame) -> str:
    """The table as markdown: figures, ratio [95% interval], goal met; below it, how each
    interval was made (and why a pair was refused)."""
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
    return "\n".join(lines + [""] + notes(table))


def notes(table: pd.DataFrame) -> list[str]:
    """One line per way the intervals were made."""
    out = []
    for how, part in table.groupby("interval", sort=False):
        rows = ", ".join(f"{r.model} {r.context_len} {r.kv_dtype}{_rot(r)}"
                         for r in part.itertuples())  # fmt: skip
        if how == PAIRED:
            n = sorted({int(x) for x in part["n_scored"].dropna()})
            blocks = ", ".join(f"{token_block(k)} at {k}" for k in n)
            how = (f"95% percentile intervals of a {PAIRED} (ratio of the per-token means; token "
                   f"positions resampled jointly in circular blocks of ceil(n^(1/3)) tokens: "
                   f"{blocks}; {TOKEN_RESAMPLES} resamples, seed {TOKEN_SEED})")  # fmt: skip
        out.append(f"- {how}: {rows}")
    return out


def _rot(r) -> str:
    return " rotated" if "hadamard" in (r.rotate_k, r.rotate_v) else ""


def _ratio(r, name: str) -> str:
    ratio, lo, hi = (getattr(r, f"{name}_{k}") for k in ("ratio", "lo", "hi"))
    mark = " (off goal)" if getattr(r, f"{name}_goal") is False else ""
    if not math.isfinite(ratio):  # e.g. KL 0 on llama.cpp's side (its f16 row is its base)
        return "-"
    d = 4 if name == "ppl" else 3  # ppl's goal is 1%: a paired interval is often narrower
    if math.isnan(lo):
        return f"{ratio:.{d}f}{mark}"
    return f"{ratio:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]{mark}"


SIDE_FILES = (".samples.csv", token_store.SUFFIX)  # read through the results CSV beside them


def run_files(paths: list[str]) -> list[Path]:
    """The results CSVs named: a directory's runs (store.checks.dir_files), files as given,
    except a run's samples and tokens files (a shell glob `dir/*.csv` names them too: each is
    read through its results CSV); UserError when no results CSV is left."""
    from kvbench.store.checks import dir_files

    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += dir_files(p)
        elif not p.name.endswith(SIDE_FILES):
            out.append(p)
    if not out:
        raise UserError(f"{' '.join(paths)}: no results CSV (only samples or tokens files)")
    return out


def load(paths: list[str]) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The rows of the result CSVs and the per-token values kept beside them, each token line
    with the run_id of its file's row of the same case_id."""
    from kvbench.store.results import read_rows

    rows, toks = [], []
    for path in run_files(paths):
        df = read_rows(path)
        got = token_store.read_tokens(path)
        run_of = dict(zip(df["case_id"].astype(str), df["run_id"].astype(str)))
        rows.append(df)
        toks.append(got.assign(run_id=got["case_id"].map(run_of)).dropna(subset=["run_id"]))
    toks = [t for t in toks if len(t)]
    return pd.concat(rows, ignore_index=True), pd.concat(toks, ignore_index=True) if toks else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kvbench / llama.cpp per quality row")
    ap.add_argument("results", nargs="+", help="result CSV files (suites/truth.yaml runs)")
    args = ap.parse_args(argv)
    try:
        df, tokens = load(args.results)
    except UserError as e:
        print(f"kvbench.analysis.truth: {e}", file=sys.stderr)
        return 2
    table = truth_table(df, tokens)
    print(markdown(table) if len(table) else "no kvbench row has a llama.cpp row to pair with")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long a run takes, estimated before it starts: the dry run's line and the first ETA
(issue 44 item 6; the dry run said "at least 4.0 s" of a quality run that took 237 s).

Timed cases (decode, prefill, model_decode): their time floor, rounds x warmup_s + budget_s
(suite/suite.py time_floor_s). Model phases (quality, retrieval, generate): their forward passes
(suite/model_plan.py forward_passes) x the seconds one pass of the same model took in the newest
earlier run in the output directory (its rows' wall_s over their passes), with the float32
reference on top: once per model, text, context and chunks for quality (shared by the run's
cases), once per case for retrieval and generate (each compares against its own). No earlier
run of the model: unknown (never a guessed speed); the first case's time then sets the ETA.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from kvbench.suite.model_plan import PREFILL_UBATCH, forward_passes

MODEL_PHASES = ("quality", "retrieval", "generate")
ROW_FIELDS = ("phase", "context_len", "chunks", "trials", "gen_tokens")
WANTED = {"model", "status", "wall_s", "kernel", *ROW_FIELDS}


def _passes_of_row(row) -> int:
    fields = {k: row[k] for k in ROW_FIELDS}
    fields.update({k: int(fields[k]) for k in ROW_FIELDS[1:]})
    return forward_passes(SimpleNamespace(**fields))


DEFAULT_OUT = "results"  # also searched: a first run into a new --out still gets an ETA


def pass_seconds(out_dir: str | Path, model: str) -> tuple[float, str] | None:
    """(seconds per forward pass, the run file) from the newest run in out_dir (then in
    ./results) with ok model-phase rows of `model` that record their wall time; None when
    there is none."""
    got = _pass_seconds_in(Path(out_dir), model)
    default = Path(DEFAULT_OUT)
    if got is None and default.is_dir() and default.resolve() != Path(out_dir).resolve():
        got = _pass_seconds_in(default, model)
    return got


def _pass_seconds_in(out_dir: Path, model: str) -> tuple[float, str] | None:
    files = [p for p in Path(out_dir).glob("*.csv") if p.name.count(".") == 1]
    for path in sorted(files, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            rows = pd.read_csv(path, usecols=lambda c: c in WANTED)
        except (OSError, ValueError, pd.errors.ParserError):
            continue  # not a results file: the reader proper says why when it matters
        if not WANTED <= set(rows.columns):
            continue
        # kvbench's own engine only: a llama.cpp row times another program
        mine = rows[(rows["model"] == model) & (rows["status"] == "ok")
                    & rows["phase"].isin(MODEL_PHASES) & rows["wall_s"].notna()
                    & (rows["kernel"] != "llama.cpp")]  # fmt: skip
        passes = sum(_passes_of_row(r) for _, r in mine.iterrows())
        if passes:
            return float(mine["wall_s"].sum()) / passes, str(path)
    return None


def case_seconds(case, settings, per_pass: dict) -> float | None:
    """One case's estimate (module docstring); None when its model's speed is unknown."""
    if case.phase not in MODEL_PHASES:
        return settings.rounds * settings.warmup_s + settings.budget_s
    got = per_pass.get(case.model)
    if got is None:
        return None
    own = forward_passes(case)
    return got[0] * (own if case.phase == "quality" else 2 * own)


def reference_seconds(cases, per_pass: dict) -> float:
    """The quality references, once per model, text, context and chunks."""
    keys = {(c.model, c.text, c.context_len, c.chunks) for c in cases if c.phase == "quality"}
    total = 0.0
    for model, _, ctx, chunks in keys:
        if per_pass.get(model):
            total += per_pass[model][0] * chunks * math.ceil(ctx / PREFILL_UBATCH)
    return total


def estimate(cases, settings, out_dir: str | Path) -> tuple[float | None, list[str]]:
    """(seconds for the whole run or None where a model's speed is unknown, notes saying where
    each model's speed came from)."""
    models = sorted({c.model for c in cases if c.phase in MODEL_PHASES})
    per_pass = {m: pass_seconds(out_dir, m) for m in models}
    notes = []
    for m, got in per_pass.items():
        notes.append(f"{m}: {got[0]:.2f} s per forward pass, from {got[1]}"
                     if got else f"{m}: no earlier run in {out_dir} to time its forward "
                     "passes by; the first case's time sets the ETA")  # fmt: skip
    each = [case_seconds(c, settings, per_pass) for c in cases]
    if any(s is None for s in each):
        return None, notes
    return sum(each) + reference_seconds(cases, per_pass), notes


def relative_costs(cases) -> list[float] | None:
    """Without a measured speed, model-phase cases weighed against each other in forward
    passes, the first quality case of each reference carrying the reference's passes (it
    computes it: the first of six cases took twice the others' time); None when timed cases
    are among them (seconds and passes do not add)."""
    if any(c.phase not in MODEL_PHASES for c in cases):
        return None
    seen, out = set(), []
    for c in cases:
        own = forward_passes(c)
        key = (c.model, c.text, c.context_len, c.chunks)
        ref = (
            own
            if c.phase != "quality"
            else (0 if key in seen else c.chunks * math.ceil(c.context_len / PREFILL_UBATCH))
        )
        seen.add(key)
        out.append(float(own + ref))
    return out

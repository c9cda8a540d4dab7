"""The paired gate: BASE and NEW measured side by side, sample by sample, and judged on pairs.

Two long-lived workers (harness/run/worker.py), one running BASE's code (its git worktree) and
one NEW's, each build a case once; the driver then asks them for single samples in ABBA order
(BASE NEW, NEW BASE, BASE NEW, ...), so every BASE sample has a NEW neighbour taken within
milliseconds and a load burst, a clock change or a noisy neighbour hits both members of a pair
(duet benchmarking, Bulej et al. 2020). A pair is (base_ms, new_ms) of adjacent samples; each
side's sample is the fastest of a block of `Budget.block` calls in a row (preemption and
interrupts only ever add time, so the fastest call of a block is the least disturbed one; on a
busy machine single calls varied 10x here).

Both workers are pinned to the same CPU (`Budget.cpu`; harness/run/worker.py says why).

Statistics per case, on the log ratios r_i = ln(new_i / base_i):
  * ratio = exp(median r): the typical slowdown of NEW against its neighbour;
  * a CI of it from a moving-block bootstrap over pairs (blocks of ceil(n^(1/3)) pairs keep the
    autocorrelation of neighbouring pairs; fixed seed);
  * p = two-sided Wilcoxon signed-rank test of r against 0;
  * verdict: slower when p < alpha, ratio > threshold and the whole CI lies above 1 (faster
    mirrored); unchanged when the CI lies within [1/threshold, threshold]; else inconclusive.
The pairs are kept: `<run>.pairs.csv` (PAIR_COLUMNS) beside the gate's summary.
This module imports neither mlx nor kernels/: it talks to the workers over pipes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import wilcoxon

from kvbench import blas
from kvbench.analysis.rules import Rules
from kvbench.errors import UserError
from kvbench.stats import block_bootstrap_ci

WORKER = Path(__file__).resolve().parent.parent / "run" / "worker.py"
PAIR_COLUMNS = ("case_id", "pair", "first", "base_ms", "new_ms", "block", "t_s")
# a side that could not be measured -> verdict (analysis/compare.py's vocabulary)
UNMEASURED = {"base_skipped": "not_measured", "base_error": "not_measured",
              "new_skipped": "lost", "new_error": "error"}  # fmt: skip
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Budget:
    warmup_s: float = 0.2  # per case and side, after the build
    budget_s: float = 2.0  # pairs per case for at least this long (both sides)...
    max_s: float = 8.0  # ...and on, while the verdict is still open, until this long
    min_pairs: int = 20
    max_pairs: int = 400
    block: int = 3  # calls per side per pair; the fastest stands for the side (docstring)
    cpu: int | None = -1  # the CPU both workers are pinned to; -1: pick one; None: no pinning


def pin_cpu(wanted: int | None) -> int | None:
    """The CPU both workers share (harness/run/worker.py says why): the last CPU this process
    may use, or `wanted`; None where the OS cannot pin (macOS) or when asked not to."""
    if wanted is None or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if wanted == -1:
        return allowed[-1]
    if wanted not in allowed:
        raise UserError(f"--pin-cpu: {wanted}: not one of this process's CPUs {allowed}")
    return wanted


def abba(i: int) -> tuple[str, str]:
    """Which side is sampled first in pair i: BASE NEW, NEW BASE, BASE NEW, ... so that over any
    two pairs each side is first once (a linear drift adds the same to both)."""
    return ("base", "new") if i % 2 == 0 else ("new", "base")


class Worker:
    """One side's worker process, spoken to one JSON line at a time."""

    def __init__(self, tree: Path, suite: Path, device: str | None, name: str, cpu=None):
        cmd = [sys.executable, str(WORKER), str(tree), str(suite)]
        cmd += ["--device", device] if device else []
        cmd += ["--cpu", str(cpu)] if cpu is not None else []
        self.name = name
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=blas.child_env(ld_preload=False),  # both sides on this process's BLAS
        )

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise UserError(f"gate: the {self.name} worker ended (see its messages above)")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def decided(pairs: list, rules: Rules) -> bool:
    """Whether the pairs so far give a verdict other than inconclusive."""
    got = judge_pairs([p[3] for p in pairs], [p[4] for p in pairs], rules)
    return got["verdict"] != "inconclusive"


def measure_case(
    sides: dict[str, Worker], case_id: str, budget: Budget, rules=None, clock=time.perf_counter
):
    """(status, note, pairs) of one case: pairs as tuples of PAIR_COLUMNS. Pairs are taken for
    budget_s, then on (checked every 10 pairs) while the verdict is open, up to max_s."""
    rules = rules or Rules()
    for name, w in sides.items():
        got = w.ask(op="build", case_id=case_id, warmup_s=budget.warmup_s)
        if "ok" not in got:
            kind = "skipped" if "skip" in got else "error"
            return f"{name}_{kind}", f"{name}: {got.popitem()[1]}", []
    pairs, start = [], clock()
    while len(pairs) < budget.max_pairs:
        elapsed = clock() - start
        if len(pairs) >= budget.min_pairs and elapsed >= budget.budget_s:
            if elapsed >= budget.max_s or (len(pairs) % 10 == 0 and decided(pairs, rules)):
                break
        first, second = abba(len(pairs))
        got = {side: sides[side].ask(op="sample", n=budget.block) for side in (first, second)}
        failed = [side for side, g in got.items() if "ms" not in g]
        if failed:
            return f"{failed[0]}_error", f"{failed[0]}: {got[failed[0]].get('error')}", []
        ms = {side: min(g["ms"]) for side, g in got.items()}
        row = (case_id, len(pairs), first, ms["base"], ms["new"], budget.block, clock() - start)
        pairs.append(row)
    for w in sides.values():
        w.ask(op="drop")
    return "ok", "", pairs


def judge_pairs(base_ms, new_ms, rules: Rules) -> dict:
    """Paired statistics and verdict (module docstring) of one case's pairs."""
    b, n = np.asarray(base_ms, dtype=float), np.asarray(new_ms, dtype=float)
    out = {"pairs": len(b), "ratio": math.nan, "ratio_ci_low": math.nan,
           "ratio_ci_high": math.nan, "p_value": math.nan}  # fmt: skip
    if len(b) < max(rules.min_samples, 6):
        return {**out, "verdict": "inconclusive", "note": f"too few pairs ({len(b)})"}
    r = np.log(n / b)
    lo, hi = block_bootstrap_ci(r, rules.confidence, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)
    p = float(wilcoxon(r).pvalue) if np.any(r != 0) else 1.0
    ratio = float(math.exp(np.median(r)))
    out.update(ratio=ratio, ratio_ci_low=math.exp(lo), ratio_ci_high=math.exp(hi), p_value=p)
    t = rules.threshold
    if p < rules.alpha and ratio > t and lo > 0:
        return {**out, "verdict": "slower", "note": ""}
    if p < rules.alpha and ratio < 1 / t and hi < 0:
        return {**out, "verdict": "faster", "note": ""}
    if 1 / t <= math.exp(lo) and math.exp(hi) <= t:
        return {**out, "verdict": "unchanged", "note": ""}
    return {**out, "verdict": "inconclusive", "note": "CI of the paired ratio beyond threshold"}


def unpaired_note(base_ms, new_ms) -> str:
    """The unpaired figures of the same samples, shown beside for reference."""
    from kvbench import stats

    ratio = float(np.median(new_ms) / np.median(base_ms))
    p = stats.mann_whitney_p(base_ms, new_ms)
    return f"unpaired: ratio {ratio:.3f}, rank-test p {p:.2g}"


def table_row(case_id: str, label: str, status: str, note: str, pairs: list, rules: Rules):
    """One compare-table row (analysis/compare.py COLUMNS) for a paired case."""
    row = {"case_id": case_id, "label": label, "metric": "median_ms", "regression": False}
    if status != "ok":  # as compare: only what BASE measured and NEW lost is a regression
        verdict = UNMEASURED[status]
        return {**row, "verdict": verdict, "note": note, "regression": status.startswith("new")}
    b = np.array([p[3] for p in pairs])
    n = np.array([p[4] for p in pairs])
    judged = judge_pairs(b, n, rules)
    notes = [f"paired: {judged.pop('pairs')} pairs", unpaired_note(b, n), judged.pop("note")]
    return {
        **row, **judged, "base": float(np.median(b)), "new": float(np.median(n)),
        "base_n": len(b), "new_n": len(n), "note": "; ".join(x for x in notes if x),
        "regression": judged["verdict"] == "slower",
    }  # fmt: skip


def run_pairs(
    trees: dict[str, Path], suite: Path, device: str | None, budget: Budget, rules, progress=None
) -> tuple[dict, list, dict]:
    """Measure every case of `suite` in pairs. Returns (labels, pairs, status per case)."""
    for name, tree in trees.items():
        if not (tree / "harness" / "__init__.py").is_file():
            raise UserError(f"{tree}: {name} holds no kvbench code (no harness/ at that commit)")
    cpu = pin_cpu(budget.cpu)
    workers = {name: Worker(tree, suite, device, name, cpu) for name, tree in trees.items()}
    try:
        lists = {k: w.ask(op="cases") for k, w in workers.items()}
        for name, got in lists.items():
            if "cases" not in got:
                raise UserError(f"{suite}: the {name} side cannot load it: {got.get('error')}")
        labels = {c["case_id"]: c["label"] for got in lists.values() for c in got["cases"]}
        all_pairs, status = [], {}
        for i, cid in enumerate(labels, 1):
            if progress:
                progress(f"kvbench gate: paired {i}/{len(labels)}: {labels[cid]}")
            st, note, pairs = measure_case(workers, cid, budget, rules)
            status[cid] = (st, note)
            all_pairs += pairs
        return labels, all_pairs, status
    finally:
        for w in workers.values():
            w.close()

"""The gate study of docs/compare.md: false verdicts in A/A and detection of a planted 1.25x
slowdown, for (a) two unpaired single runs + `kvbench compare`, (b) pooled ABBA rounds
(`kvbench gate --rounds 2`) and (c) the paired gate (`kvbench gate`), under a background load
that this script starts and stops (busy loops on every core, on and off every few seconds).

    python scripts/gate_study.py --reps-aa 7 --reps-slow 3 --out /tmp/study

Works in a temporary clone of this repository (HEAD): A/A compares HEAD with itself; the slow
side is a temporary commit on top whose cache engine attends over a quarter of the context a
second time in every layer (real extra work, about +25% of the attention). Writes one CSV row
per (method, scenario, repetition, case) and prints the summary table.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SUITE = "suites/gate.yaml"
SLOW_PATCH = (
    "        return kernel(query, k, v, fmt, mask=mask, scale=scale, tile_kv=case.tile_kv)\n",
    "        out = kernel(query, k, v, fmt, mask=mask, scale=scale, tile_kv=case.tile_kv)\n"
    "        k4, v4 = cache.view(layer, max(1, case.context_len // 4))  # study: +25% work\n"
    "        extra = kernel(query, k4, v4, fmt, mask=mask, scale=scale, tile_kv=case.tile_kv)\n"
    "        return out + 0 * extra\n",
)


def busy(stop_at: float, on_s: float, off_s: float) -> None:
    """Spin for on_s, sleep for off_s, until stop_at (bounded: ends by itself)."""
    while time.time() < stop_at:
        end = time.time() + on_s
        while time.time() < end:
            pass
        time.sleep(off_s)


def start_load(seconds: float, on_s: float = 3.0, off_s: float = 3.0) -> list:
    stop_at = time.time() + seconds
    procs = [mp.Process(target=busy, args=(stop_at, on_s, off_s), daemon=True)
             for _ in range(mp.cpu_count())]  # fmt: skip
    for p in procs:
        p.start()
    return procs


def sh(cwd: Path, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def kvbench(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return sh(cwd, sys.executable, "-m", "kvbench", *args)


def make_clone(where: Path) -> Path:
    repo = where / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    for k, v in (("user.email", "study@example.com"), ("user.name", "study")):
        sh(repo, "git", "config", k, v)
    return repo


def plant_slowdown(repo: Path) -> None:
    path = repo / "harness" / "engines" / "cache.py"
    text = path.read_text()
    assert SLOW_PATCH[0] in text, "cache engine changed: update SLOW_PATCH"
    path.write_text(text.replace(SLOW_PATCH[0], SLOW_PATCH[1]))
    sh(repo, "git", "commit", "-qam", "study: +25% attention work")


def verdicts(table_csv: str) -> list[str]:
    from io import StringIO

    return list(pd.read_csv(StringIO(table_csv))["verdict"]) if table_csv.strip() else []


def run_method(method: str, repo: Path, base: str, results: Path) -> tuple[list[str], float]:
    """(verdicts per case, wall seconds) of one repetition of a method."""
    t0 = time.time()
    fmt = ("--format", "csv")
    if method == "unpaired":  # two separate runs, one per side, then compare
        from kvbench.analysis.gate import run_in_tree

        tree = results.parent / f"tree-{base.replace('~', '-')}"
        if not tree.exists():
            sh(repo, "git", "worktree", "add", "-q", "--detach", str(tree), base)
        a = run_in_tree(tree, repo / SUITE, results, None)
        b = run_in_tree(repo, repo / SUITE, results, None)
        out = kvbench(repo, "compare", str(a), str(b), *fmt)
    elif method == "pooled":
        out = kvbench(repo, "gate", base, "--rounds", "2", "--suite", SUITE,
                      "--results", str(results), *fmt)  # fmt: skip
    else:
        out = kvbench(repo, "gate", base, "--suite", SUITE, "--results", str(results), *fmt)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{method}: {out.stderr[-1500:]}")
    return verdicts(out.stdout), time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps-aa", type=int, default=7)
    ap.add_argument("--reps-slow", type=int, default=3)
    ap.add_argument("--methods", default="paired,pooled,unpaired")
    ap.add_argument("--out", default="gate-study")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvbench-study-"))
    repo = make_clone(work)
    rows = []
    load = start_load(seconds=4 * 3600)  # ended below; bounded in any case
    try:
        plans = [("aa", "HEAD", args.reps_aa), ("slow", "HEAD~1", args.reps_slow)]
        for scenario, base, reps in plans:
            if scenario == "slow":
                plant_slowdown(repo)
            for method in args.methods.split(","):
                for rep in range(reps):
                    results = work / f"results-{scenario}-{method}-{rep}"
                    results.mkdir()
                    got, wall = run_method(method, repo, base, results)
                    print(f"{scenario} {method} {rep}: {got} in {wall:.0f} s", flush=True)
                    rows += [dict(scenario=scenario, method=method, rep=rep, case=i, verdict=v,
                                  wall_s=wall) for i, v in enumerate(got)]  # fmt: skip
                    pd.DataFrame(rows).to_csv(out / "study.csv", index=False)
    finally:
        for p in load:
            p.terminate()
    print(summary(pd.DataFrame(rows)).to_string(index=False))
    return 0


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and scenario: cases, false / correct verdicts, inconclusive, wall time."""
    out = []
    for (scenario, method), g in df.groupby(["scenario", "method"]):
        v = g["verdict"]
        wall = g.drop_duplicates("rep")["wall_s"].mean()
        row = dict(scenario=scenario, method=method, cases=len(v))
        row.update(inconclusive=int((v == "inconclusive").sum()), wall_s_per_gate=round(wall))
        if scenario == "aa":
            row["false_verdicts"] = int(v.isin(["slower", "faster"]).sum())
        else:
            row["called_slower"] = int((v == "slower").sum())
        out.append(row)
    return pd.DataFrame(out)


if __name__ == "__main__":
    raise SystemExit(main())

"""Synthetic result files for compare / history tests: real file format, chosen samples."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np

from kvbench.store.schema import COLUMNS, SAMPLE_COLUMNS, make_record
from kvbench.store.writer import write_csv_atomic

CASE = {"model": "tiny", "phase": "decode", "kv_dtype": "fp16", "kernel": "sdpa", "n_seqs": 1}


def draw(n: int, median_ms: float = 1.0, seed: int = 0, sigma: float = 0.05) -> np.ndarray:
    """n log-normal timing samples around median_ms (timings are skewed, never negative)."""
    return median_ms * np.exp(np.random.default_rng(seed).normal(0.0, sigma, n))


def write_run(
    out_dir, run_id: str, cases: dict, *, commit="aaaaaaaaaaaa", dirty=False, timestamp=None,
    suite="fake", rounds=1, **context,
) -> Path:  # fmt: skip
    """cases: case_id -> samples (ms) or -> dict of row fields (e.g. status, error, gbps);
    the samples are split evenly into `rounds` rounds, in order."""
    rows, samples = [], []
    for i, (cid, spec) in enumerate(cases.items()):
        fields = dict(spec) if isinstance(spec, dict) else {"samples": spec}
        x = np.asarray(fields.pop("samples", []), dtype=float)
        if len(x):
            fields.setdefault("median_ms", float(np.median(x)))
            fields.setdefault("n_samples", len(x))
            rnd = [j * rounds // len(x) for j in range(len(x))]
            samples += [(cid, "step", rnd[j], j, float(v)) for j, v in enumerate(x)]
        row = {**CASE, "context_len": 64 * (i + 1), "status": "ok", **fields}
        rows.append(
            make_record(
                run_id=run_id,
                suite=suite,
                case_id=cid,
                commit=commit,
                dirty=dirty,
                timestamp=timestamp or f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00",
                **context,
                **row,
            )  # fmt: skip
        )
    path = Path(out_dir) / f"{run_id}.csv"
    write_csv_atomic(path, COLUMNS, [dataclasses.astuple(r) for r in rows])
    write_csv_atomic(Path(out_dir) / f"{run_id}.samples.csv", SAMPLE_COLUMNS, samples)
    return path


def git(repo, *args) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def make_repo(path: Path, n_commits: int) -> list[str]:
    """A git repository with n_commits commits; returns their full shas, oldest first."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    shas = []
    for i in range(n_commits):
        (path / "f.txt").write_text(str(i))
        git(path, "add", "f.txt")
        git(path, "commit", "-qm", f"c{i}")
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas

"""`kvbench calibrate SUITE`: how far A/A runs of the same code move apart on this host.

The suite runs `runs` times with this tree's code (as separate processes, like two separate
`kvbench run`s of a user); for each case the between-run noise is the largest spread
max/min - 1 of the runs' medians. It is stored per host in `<results>/calibration.json`, and
`kvbench compare` of two separate runs on the same host gives no slower/faster verdict for a
ratio inside it (analysis/compare.py within_noise). This module imports no mlx.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np

from kvbench.errors import UserError
from kvbench.store import git
from kvbench.store.results import load_runs

FILE = "calibration.json"


def noise_of_runs(rows_by_run: list) -> dict[str, float]:
    """case_id -> max/min - 1 of the case's medians over the runs (ok rows only)."""
    medians: dict[str, list[float]] = {}
    for rows in rows_by_run:
        for r in rows[rows["status"] == "ok"].itertuples():
            medians.setdefault(r.case_id, []).append(float(r.median_ms))
    return {c: float(max(m) / min(m) - 1) for c, m in medians.items() if len(m) >= 2}


def load_noise(results: str | Path, host: str | None = None) -> dict[str, float]:
    """This host's stored noise per case ({} when never calibrated)."""
    path = Path(results) / FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the calibration: {e}") from None
    return data.get(host or socket.gethostname(), {}).get("noise", {})


def store_noise(results: Path, noise: dict[str, float], runs: int) -> Path:
    path = results / FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[socket.gethostname()] = {"runs": runs, "noise": noise}
    tmp = path.with_name(f".{FILE}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def calibrate(suite: str, results: str, runs: int = 3, device: str | None = None) -> dict:
    """Run `suite` `runs` times here, store and return the per-case between-run noise."""
    from kvbench.analysis.gate import run_in_tree

    if runs < 2:
        raise UserError(f"--runs: {runs}: needs at least 2 runs to see them move apart")
    repo = git.toplevel(Path.cwd()) or Path.cwd()
    out = Path(results).resolve()
    paths = [run_in_tree(repo, Path(suite).resolve(), out, device) for _ in range(runs)]
    rows = [load_runs([p], str(p), pool=False).rows for p in paths]
    noise = noise_of_runs(rows)
    store_noise(out, noise, runs)
    return {"noise": noise, "median": float(np.median(list(noise.values()))) if noise else 0.0}

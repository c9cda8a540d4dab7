"""The default install runs the registered models with no torch (issue #33): `make install`
brings no torch, but CI's `make peers` does, so the check blocks torch in a subprocess (a
sitecustomize that makes `import torch` fail) and runs a gemma3-270m quality case there through
the CLI: its SentencePiece vocabulary is read from the GGUF without transformers' torch-bound
reader (kernels/model/tokenizer.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvbench.kernels.model.fetch import model_path
from kvbench.store.checks import dir_files

NO_TORCH = "import sys\nsys.modules['torch'] = None  # every `import torch` raises ImportError\n"


def no_torch_env(tmp_path) -> dict:
    site = tmp_path / "no_torch"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_TORCH)
    return {**os.environ, "PYTHONPATH": str(site)}


def test_the_block_holds(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import torch"], env=no_torch_env(tmp_path),
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "torch" in done.stderr


def test_a_gemma_quality_case_runs_without_torch(tmp_path):
    if model_path("gemma3-270m") is None:
        pytest.skip("gemma3-270m not fetched: kvbench model fetch gemma3-270m")
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: s\nsettings: {warmup_s: 0, min_samples: 1, max_samples: 1, budget_s: 0.1, "
        "rounds: 1}\nfixed: {model: gemma3-270m, phase: quality, context_len: 32, chunks: 2}\n"
        "sweep:\n  kv_dtype: [int8]\n"
    )
    cmd = [sys.executable, "-m", "kvbench", "run", str(suite), "--out", str(tmp_path / "out")]
    done = subprocess.run(cmd, env=no_torch_env(tmp_path), capture_output=True, text=True,
                          timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    from kvbench.store.results import read_rows

    rows = read_rows(dir_files(tmp_path / "out")[0])
    row = rows.iloc[0]
    assert row["status"] == "ok", row["error"]
    # 2 chunks of 32, each starting with Gemma's BOS; 15 scored tokens each
    assert bool(row["chunk_bos"]) and row["n_scored"] == 30
    assert 1 < row["ppl_ref"] < 1e4 and 0 <= row["kl_mean"] < 1

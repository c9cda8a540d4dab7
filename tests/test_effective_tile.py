"""The row records the tile a kernel really used: a null tile_kv is the kernel's default."""

from __future__ import annotations

import pandas as pd

from kvbench.kernels.attention.registry import KERNELS, effective_tile
from kvbench.run.session import run_suite
from kvbench.suite.suite import expand, load_suite

SUITE = """
name: t
settings: {warmup_s: 0.0, min_samples: 3, max_samples: 3, budget_s: 0.01, rounds: 1}
fixed: {model: tiny, context_len: 16}
sweep: {kernel: [tiled, sdpa], tile_kv: [null, 8]}
"""


def test_declared_default_tiles():
    assert KERNELS["tiled"].default_tile == 256
    assert KERNELS["metal"].default_tile == KERNELS["cuda"].default_tile == 32
    assert KERNELS["sdpa"].default_tile is None and KERNELS["reference"].default_tile is None
    assert effective_tile("tiled", None) == 256 and effective_tile("tiled", 8) == 8
    assert effective_tile("metal", None) == 32 and effective_tile("sdpa", None) is None


def test_row_records_the_effective_tile_and_the_case_id_is_unchanged(write_suite, tmp_path, quiet):
    suite = load_suite(write_suite(SUITE))
    cases = expand(suite)
    writer = run_suite(suite, cases, tmp_path / "out", quiet)
    rows = pd.read_csv(writer.csv_path, dtype={"case_id": str}).set_index("case_id")
    assert set(rows["status"]) == {"ok"}
    for case in cases:
        got = rows.loc[case.case_id, "tile_kv"]  # the case_id still hashes the Case field
        if case.kernel == "tiled":
            assert got == (case.tile_kv or 256)
        elif case.tile_kv is None:
            assert pd.isna(got)  # sdpa has no tiles: empty

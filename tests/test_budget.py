"""The memory-budget finding (harness/analysis/findings/budget.py) and its figure
(harness/report/budget.py) on planted rows: formats and cache policies on one frontier of
bytes per context token, the ladder of budgets, the policies never on a frontier."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.analysis.findings import TOPICS
from kvbench.analysis.findings import budget as B

CTX = 2048
# SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K and V) = 11,520 elements per token
ELEMS = 11_520


def row(kv_dtype: str, bits: float, kl: float, policy="none", ratio=0.0, **extra) -> dict:
    """A quality row as the model engine writes it: a policy row's kept bytes per token beside
    the full cache's kv_bytes (kept = 1 - ratio of every token's bytes)."""
    full = int(ELEMS * bits / 8 * CTX)
    kept = {"kept_bytes_per_token": full * (1 - ratio) / CTX} if policy != "none" else {}
    return {"phase": "quality", "status": "ok", "model": "smollm2-135m", "context_len": CTX,
            "kv_dtype": kv_dtype, "kernel": "reference", "bits_per_elem": bits, "kv_bytes": full,
            "kl_mean": kl, "n_scored": 126, "policy": policy, "compression_ratio": ratio,
            **kept, **extra}  # fmt: skip


def planted() -> pd.DataFrame:
    # bytes per token: fp16 23,040; q8_0-like int8 12,240; snapkv 0.5 on fp16 11,520; q4 6,480;
    # knorm 0.5 on fp16 11,520 but worse than snapkv; window 0.75 on fp16 5,760
    return pd.DataFrame([
        row("fp32", 32, 0.0),
        row("fp16", 16, 1e-5),
        row("int8", 8.5, 2e-4, group_size=32),
        row("fp16", 16, 0.02, "snapkv", 0.5),
        row("fp16", 16, 0.09, "knorm", 0.5),  # same bytes as snapkv 0.5, higher KL: dominated
        row("int4", 4.5, 0.05, group_size=32),
        row("fp16", 16, 0.30, "window", 0.75),
    ])  # fmt: skip


def test_bytes_per_token_from_kv_bytes_or_its_own_column():
    d = pd.DataFrame({"kv_bytes": [2048 * 100, 10], "context_len": [2048, 2048],
                      "kept_bytes_per_token": [None, 7.0]})  # fmt: skip
    assert B.bytes_per_token(d).tolist() == [100.0, 7.0]


def test_policy_labels():
    assert B.policy_of({"policy": "snapkv", "compression_ratio": 0.5}) == "snapkv 0.5"
    assert B.policy_of({"policy": "window", "compression_ratio": 0.0, "kv_budget": 512}) == (
        "window 512"
    )
    assert B.policy_of({"policy": "none", "compression_ratio": 0.0}) == B.FULL
    assert B.policy_of({"policy": None}) == B.FULL
    assert B.policy_of({"policy": float("nan")}) == B.FULL


def test_points_put_formats_and_policies_on_one_frontier():
    p = B.points(planted()).set_index("label")
    assert p.loc["fp16", "bytes_per_token"] == ELEMS * 2
    assert p.loc["fp16, snapkv, ratio 0.5", "bytes_per_token"] == ELEMS  # half of fp16's
    on = set(p.index[p["frontier"]])
    # fp32 is dominated by nothing (KL 0 is the best figure), fp16 by nothing cheaper and
    # as good; knorm 0.5 has snapkv's bytes and a worse KL
    assert "fp16, knorm, ratio 0.5" not in on
    policies = {"fp16, snapkv, ratio 0.5", "fp16, window, ratio 0.75"}
    assert on == {"fp32", "fp16", "int8/g32", "int4/g32"} | policies


def test_finding_names_the_ladder_and_the_policies_never_on_it():
    assert TOPICS[B.TOPIC] is B.find  # registered
    lines = [f.text for f in B.find(planted())]
    assert len(lines) == 2
    ladder, never = lines
    assert ladder.startswith("smollm2-135m at ctx 2K, KL")
    # cheapest first: window 0.75 at 5,760 B/token is the best under 6,480
    first = ladder.split(": ", 1)[1].split("; ")[0]
    assert first.startswith(">= 5,760 B/token: fp16, window, ratio 0.75, KL 0.3 (126 tokens)")
    assert ladder.index("snapkv, ratio 0.5") < ladder.index(">= 23,040 B/token: fp16,")
    assert never == "smollm2-135m: policies never on a frontier of bytes per context token: knorm"


def test_retrieval_points_higher_is_better():
    rows = planted().assign(phase="retrieval", kl_mean=None, n_trials=10,
                            n_correct=[10, 10, 10, 9, 10, 6, 2])  # fmt: skip
    p = B.points(rows).set_index("label")
    assert p.loc["fp16, knorm, ratio 0.5", "frontier"]  # as cheap as snapkv 0.5 and more found
    assert not p.loc["fp16, snapkv, ratio 0.5", "frontier"]
    assert p.loc["fp16, knorm, ratio 0.5", "value"] == pytest.approx(1.0)


def test_no_policy_in_the_run_no_finding():
    assert B.find(planted().assign(policy="none", compression_ratio=0.0)) == []


def test_a_fractional_ratio_is_named_as_it_is():
    # cache_config used to turn every float choice to int: ratios 0.25/0.5/0.75 all read
    # "ratio 0" and three configurations merged into one
    from kvbench.analysis.findings.common import cache_config

    r = {"kv_dtype": "fp16", "policy": "snapkv", "compression_ratio": 0.5}
    assert cache_config(r) == "fp16, snapkv, ratio 0.5"
    assert cache_config({**r, "compression_ratio": 0.75}) != cache_config(r)


def test_the_figure_plots_every_point_and_labels_the_frontier():
    from kvbench.report.budget import budget

    fig = budget(planted())
    assert fig.key == "budget"
    labelled = {t for tr in fig.fig.data if tr.mode == "markers+text" for t in tr.text}
    assert "fp16, knorm, ratio 0.5" not in labelled and "int4/g32" in labelled
    xs = sorted(x for tr in fig.fig.data if tr.mode != "lines" for x in tr.x)
    assert xs[0] == ELEMS * 2 * 0.25 and len(xs) == 7
    assert budget(planted().assign(policy="none", compression_ratio=0.0)) is None


def test_the_bits_frontier_leaves_policy_rows_to_this_one():
    from kvbench.analysis.findings import tradeoff

    text = " ".join(f.text for f in tradeoff.find(planted()))
    assert "int4/g32" in text and "snapkv" not in text and "knorm" not in text

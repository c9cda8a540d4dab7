"""The trade-off view (harness/analysis/findings/tradeoff.py, harness/report/tradeoff.py) on
hand-made rows: the Pareto frontier per (model, context, metric) by hand, the formats never on
one, each format's fastest decode kernel, and the figure in headless chromium. The numbers are
invented rows for structure, never reported as measurements."""

from __future__ import annotations

import pandas as pd
import pytest
import report_browser
from test_report_tasks import row

from kvbench.analysis.findings import findings, tradeoff
from kvbench.report.page import write_report
from kvbench.report.tradeoff import tradeoff as tradeoff_fig

# (kv_dtype, group, rotation, k_axis, bits, KL): frontier by hand over (bits, KL):
# affine2 3.0 on; tq3_prod 3.5 on; tq4_mse 4.25 on; q4_0 4.5 (0.18) and q4_0 rotated 4.5 (0.04)
# both dominated by tq4_mse (4.25, 0.03); fp16 16 on (lowest KL)
QUALITY = [
    ("fp16", None, "none", "token", 16.0, 1e-4),
    ("q4_0", None, "none", "token", 4.5, 0.18),
    ("q4_0", None, "hadamard", "token", 4.5, 0.04),
    ("tq4_mse", None, "none", "token", 4.25, 0.03),
    ("tq3_prod", None, "none", "token", 3.5, 0.2),
    ("affine2", 32, "none", "channel", 3.0, 0.5),
]
# retrieval at 1024, found / trials: q4_0 4/4 at 4.5 bits dominates fp16 4/4 at 16; tq4_mse 3/4
RETRIEVAL = [("fp16", 16.0, 4), ("q4_0", 4.5, 4), ("tq4_mse", 4.25, 3)]
# model_decode at 1024 (most formats), fp16 alone at 512 (not chosen); a faster GPU row of fp16
# at 1024 is another device, with fewer formats: never mixed in
DECODE = [
    ("fp16", "sdpa", 1024, 50.0), ("fp16", "tiled", 1024, 60.0),
    ("q4_0", "dequant_sdpa", 1024, 70.0), ("q4_0", "tiled", 1024, 65.0),
    ("tq4_mse", "tiled", 1024, 90.0), ("fp16", "sdpa", 512, 20.0), ("fp16", "cuda", 1024, 1.0),
]  # fmt: skip


def rows() -> pd.DataFrame:
    out = []
    for fmt, g, rot, axis, bits, kl in QUALITY:
        out.append(row(phase="quality", context_len=128, kv_dtype=fmt, group_size=g, rotate_k=rot,
                       rotate_v=rot, k_axis=axis, recent_tokens=32 if g else 0,
                       bits_per_elem=bits, kl_mean=kl, n_scored=504))  # fmt: skip
    for fmt, bits, found in RETRIEVAL:
        out.append(row(phase="retrieval", context_len=1024, kv_dtype=fmt, task="passkey",
                       depth=0.5, n_correct=found, n_trials=4, ref_accuracy=1.0, n_ref_agree=found,
                       bits_per_elem=bits))  # fmt: skip
    for fmt, kernel, ctx, ms in DECODE:
        dev = {"device": "nvidia h200", "backend": "cuda"} if kernel == "cuda" else {}
        out.append(row(phase="model_decode", context_len=ctx, kv_dtype=fmt, kernel=kernel, **dev,
                       median_ms=ms, ci_low_ms=ms * 0.95, ci_high_ms=ms * 1.05, n_samples=5,
                       bits_per_elem=16.0))  # fmt: skip
    return pd.DataFrame(out)


def test_frontier_by_hand():
    d = tradeoff.points(rows())
    kl = d[d["metric"] == "KL"].set_index("config")["frontier"].to_dict()
    kivi = "affine2/g32, channel keys, fp16 residual 32"
    assert kl == {"fp16": True, "q4_0": False, "q4_0, hadamard K/V": False, "tq4_mse": True,
                  "tq3_prod": True, kivi: True}  # fmt: skip
    ret = d[d["metric"] == "retrieval"].set_index("config")["frontier"].to_dict()
    assert ret == {"fp16": False, "q4_0": True, "tq4_mse": True}
    assert d[d["metric"] == "retrieval"].set_index("config")["value"]["tq4_mse"] == 0.75


def test_dominance_keeps_identical_points_and_drops_equal_bits_worse_score():
    bits = pd.Series([4.0, 4.0, 4.0, 8.0])
    kl = pd.Series([0.1, 0.1, 0.2, 0.1])
    assert list(tradeoff.on_frontier(bits, kl)) == [True, True, False, False]
    share = pd.Series([0.5, 1.0, 1.0, 1.0])
    assert list(tradeoff.on_frontier(bits, share, lower_is_better=False)) == [
        False, True, True, False
    ]  # fmt: skip


def test_fastest_kernel_per_format_at_the_context_with_most_formats():
    times, where = tradeoff.decode_times(rows(), "smollm2-135m")
    assert where == "model_decode of smollm2-135m at ctx 1K on cpu"
    m = "smollm2-135m"
    assert times.to_dict("index") == {
        "fp16": {"kernel": "sdpa", "median_ms": 50.0, "timed_model": m},
        "q4_0": {"kernel": "tiled", "median_ms": 65.0, "timed_model": m},
        "tq4_mse": {"kernel": "tiled", "median_ms": 90.0, "timed_model": m},
    }
    # a model with quality rows and no decode rows of its own borrows them, and says whose
    other = rows().assign(
        model=lambda d: d["model"].where(d["phase"] == "model_decode", "gemma3-270m")
    )
    titles = [a.text for a in tradeoff_fig(other).fig.layout.annotations]
    assert titles[-1] == "gemma3-270m: ms per step, fastest kernel (smollm2-135m's decode rows)"


def test_finding_names_formats_never_on_a_frontier():
    (f,) = [f for f in findings(rows()) if f.topic == "trade-off"]
    assert "never on one: q4_0, hadamard K/V." in f.text  # q4_0: on the retrieval frontier
    on = "fp16 | tq4_mse | tq3_prod | affine2/g32, channel keys, fp16 residual 32 | q4_0;"
    assert f"frontier of bits per element: {on}" in f.text
    assert "fp16 50 ms (sdpa), q4_0 65 ms (tiled), tq4_mse 90 ms (tiled)" in f.text
    assert f.figure == "tradeoff"


def test_figure_panels_and_table():
    fig = tradeoff_fig(rows())
    titles = [a.text for a in fig.fig.layout.annotations]
    assert titles == [
        "smollm2-135m · ctx 128: KL vs bits",
        "smollm2-135m · ctx 1K: retrieval vs bits",
        "smollm2-135m: time per decode step (fastest kernel)",
    ]
    assert len(fig.table) == len(QUALITY) + len(RETRIEVAL)
    assert tradeoff_fig(rows()[lambda d: d["phase"] == "model_decode"]) is None


@pytest.mark.skipif(report_browser.chromium() is None, reason="chromium not installed")
def test_the_tradeoff_figure_renders_in_headless_chromium(tmp_path):
    csv = tmp_path / "r.csv"
    rows().to_csv(csv, index=False)
    out = tmp_path / "r.html"
    write_report([csv], out)
    got = report_browser.probe(out)
    assert got["errors"] == [] and got["console"] == [], got
    assert got["plots"] == got["drawn"] >= 1
    assert [o for o in got["overlaps"] if o[0] == "plot-tradeoff"] == [], got["overlaps"]
    text = out.read_text()
    assert "The trade-off: what each bit buys" in text and "never on one: q4_0" in text


def test_the_tradeoff_suite_covers_every_format_of_the_registry():
    from pathlib import Path

    from kvbench.kernels.formats.registry import FORMATS
    from kvbench.suite.suite import expand, load_suite

    cases = expand(load_suite(Path(__file__).resolve().parent.parent / "suites/tradeoff.yaml"))
    quality = {c.kv_dtype for c in cases if c.phase == "quality"}
    decode = {c.kv_dtype for c in cases if c.phase == "decode"}
    # a format missing here is added to suites/tradeoff.yaml's kv_dtype list (docs/architecture.md
    # "Add a format"); the message names it
    missing = sorted(set(FORMATS) - (quality & decode))
    assert missing == [], f"suites/tradeoff.yaml kv_dtype lacks {missing}"
    assert quality == decode == set(FORMATS)

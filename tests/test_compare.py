"""compare: verdicts on synthetic samples with known truth, formats, exit codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_runs import draw, write_run

from kvbench import stats
from kvbench.analysis.compare import COLUMNS, Rules, compare, judge
from kvbench.analysis.compare_text import FORMATS
from kvbench.cli import main
from kvbench.store.results import load

IDS = [f"case{i:08d}" for i in range(8)]


def same_code(tmp_path, n=30):
    """Two runs of 'identical code': every sample drawn from one distribution per case."""
    base = {c: draw(n, 1.0 + i, seed=i) for i, c in enumerate(IDS)}
    new = {c: draw(n, 1.0 + i, seed=100 + i) for i, c in enumerate(IDS)}
    return write_run(tmp_path, "base", base), write_run(tmp_path, "new", new)


def test_identical_code_flags_no_regression(tmp_path, capsys):
    b, n = same_code(tmp_path)
    cmp = compare(load(str(b)), load(str(n)))
    assert cmp.regressions.empty
    assert set(cmp.table["verdict"]) <= {"unchanged", "inconclusive"}
    assert (cmp.table["ratio_ci_low"] < 1).all() and (cmp.table["ratio_ci_high"] > 1).all()
    assert main(["compare", str(b), str(n)]) == 0


def test_planted_slowdown_is_a_significant_regression(tmp_path, capsys):
    b, _ = same_code(tmp_path)
    slow = {
        c: draw(30, 1.0 + i, seed=100 + i) * (1.5 if i == 3 else 1.0) for i, c in enumerate(IDS)
    }
    n = write_run(tmp_path, "slow", slow)
    cmp = compare(load(str(b)), load(str(n)))
    hit = cmp.table.set_index("case_id").loc[IDS[3]]
    assert hit["verdict"] == "slower" and hit["regression"]
    assert hit["p_value"] < 0.002 and 1.4 < hit["ratio"] < 1.6
    assert hit["ratio_ci_low"] > 1.1
    assert list(cmp.regressions["case_id"]) == [IDS[3]]
    assert main(["compare", str(b), str(n), "--format", "json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["case_id"] for r in rows if r["verdict"] == "slower"] == [IDS[3]]


def test_too_few_samples_is_inconclusive_never_a_regression(tmp_path, capsys):
    b = write_run(tmp_path, "b", {"c1": draw(3, 1.0, seed=1)})
    n = write_run(tmp_path, "n", {"c1": draw(3, 3.0, seed=2)})  # 3x slower, 3 samples a side
    cmp = compare(load(str(b)), load(str(n)))
    assert cmp.table.loc[0, "verdict"] == "inconclusive" and cmp.regressions.empty
    assert "too few samples" in cmp.table.loc[0, "note"]
    assert main(["compare", str(b), str(n)]) == 0


def test_alpha_out_of_reach_of_the_sample_counts_is_inconclusive():
    # 5 a side: the exact U test cannot give p below 2 / C(10, 5) = 0.0079 > 0.002
    assert stats.min_two_sided_p(5, 5) == pytest.approx(2 / 252)
    base, new = draw(5, 1.0, seed=1), draw(5, 2.0, seed=2)
    assert judge(base, new, Rules())["verdict"] == "inconclusive"
    assert judge(base, new, Rules(alpha=0.05))["verdict"] == "slower"


def test_faster_and_small_significant_changes():
    base = draw(40, 1.0, seed=1, sigma=0.01)
    assert judge(base, draw(40, 0.5, seed=2, sigma=0.01), Rules())["verdict"] == "faster"
    small = judge(base, draw(40, 1.03, seed=2, sigma=0.01), Rules())
    assert small["verdict"] == "unchanged" and small["p_value"] < 0.002  # real, below 1.1x
    noisy = judge(draw(10, 1.0, seed=3, sigma=0.6), draw(10, 1.0, seed=4, sigma=0.6), Rules())
    assert noisy["verdict"] == "inconclusive" and "noisy" in noisy["note"]


def test_bootstrap_ci_is_reproducible_and_covers_the_ratio():
    base, new = draw(30, 1.0, seed=1), draw(30, 1.5, seed=2)
    lo, hi = stats.bootstrap_ratio_ci(base, new)
    assert (lo, hi) == stats.bootstrap_ratio_ci(base, new)  # fixed seed
    assert lo < np.median(new) / np.median(base) < hi and lo > 1.3


def test_value_metrics_respect_direction_and_never_gate(tmp_path):
    b = write_run(tmp_path, "b", {"c1": {"gbps": 10.0, "peak_mem_bytes": 100}})
    n = write_run(tmp_path, "n", {"c1": {"gbps": 5.0, "peak_mem_bytes": 50}})
    g = compare(load(str(b)), load(str(n)), "gbps").table.iloc[0]
    m = compare(load(str(b)), load(str(n)), "peak_mem_bytes").table.iloc[0]
    assert (g["verdict"], g["ratio"]) == ("worse", 0.5)  # higher GB/s is better
    assert (m["verdict"], m["ratio"]) == ("better", 0.5)  # lower memory is better
    assert np.isnan(g["p_value"]) and "no significance test" in g["note"]
    assert not g["regression"] and not m["regression"]


def test_one_sided_and_failed_cases(tmp_path, capsys):
    ok = draw(20, 1.0, seed=1)
    b = write_run(tmp_path, "b", {"both": ok, "gone": ok, "broke": ok})
    err = {"status": "error", "error": "ParityError: bad"}
    n = write_run(tmp_path, "n", {"both": ok, "added": ok, "broke": err})
    t = compare(load(str(b)), load(str(n))).table.set_index("case_id")
    assert t.loc["gone", "verdict"] == "base_only" and t.loc["added", "verdict"] == "new_only"
    assert t.loc["broke", "verdict"] == "error" and t.loc["broke", "regression"]
    assert "ParityError" in t.loc["broke", "note"]
    assert main(["compare", str(b), str(n)]) == 1
    out = capsys.readouterr().out
    assert "only in base" in out and "only in new" in out


def test_context_mismatch_warns(tmp_path, capsys):
    x = draw(20, 1.0, seed=1)
    b = write_run(tmp_path, "b", {"c": x}, mlx_version="0.29.0", backend="cpu")
    n = write_run(tmp_path, "n", {"c": x}, mlx_version="0.32.4", backend="cpu")
    assert main(["compare", str(b), str(n)]) == 0
    err = capsys.readouterr().err
    assert "different mlx_version" in err and "backend" not in err


def test_a_different_blas_is_flagged(tmp_path, capsys):
    x = draw(20, 1.0, seed=1)
    b = write_run(tmp_path, "b", {"c": x}, blas="bundled", blas_gflops=1.8)
    n = write_run(tmp_path, "n", {"c": x}, blas="openblas 0.3.21 SkylakeX", blas_gflops=40.0)
    assert main(["compare", str(b), str(n)]) == 0
    err = capsys.readouterr().err
    assert "different blas: ['bundled'] vs ['openblas 0.3.21 SkylakeX']" in err
    same = write_run(tmp_path, "s", {"c": x}, blas="bundled", blas_gflops=2.5)
    assert main(["compare", str(b), str(same)]) == 0  # a re-measured GFLOP/s is no difference
    assert "different" not in capsys.readouterr().err


def test_formats(tmp_path, capsys):
    b, n = same_code(tmp_path)
    cmp = compare(load(str(b)), load(str(n)))
    assert FORMATS["csv"](cmp).splitlines()[0] == ",".join(COLUMNS)
    md = FORMATS["markdown"](cmp)
    assert "| case | base | new | ratio |" in md and "no regression" in md
    out = tmp_path / "cmp.md"
    assert main(["compare", str(b), str(n), "--format", "markdown", "-o", str(out)]) == 0
    assert out.read_text().strip() == capsys.readouterr().out.strip()


@pytest.mark.parametrize(
    "argv, text",
    [
        (["compare", "no/such/file.csv", "x"], "not a results CSV, a results directory or a git"),
        (["compare", "{d}/b.samples.csv", "{d}/b.csv"], "raw-samples file"),
        (["compare", "{d}/b.csv", "{d}/b.csv", "--metric", "speed"], "--metric: speed"),
        (["compare", "{d}/b.csv", "{d}/b.csv", "--threshold", "0.5"], "--threshold"),
    ],
)
def test_cli_errors_exit_2_with_one_line(tmp_path, capsys, argv, text):
    write_run(tmp_path, "b", {"c": draw(5)})
    assert main([a.format(d=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1 and err.startswith("kvbench: ")


def test_measured_at_base_then_error_or_skipped_at_new_is_a_regression(tmp_path, capsys):
    ok = draw(20, 1.0, seed=1)
    skip = {"status": "skipped", "error": "kernel metal runs on metal, not cpu"}
    err = {"status": "error", "error": "ParityError: bad"}
    b = write_run(tmp_path, "b", {"broke": ok, "dropped": ok, "never": skip, "both_bad": err})
    n = write_run(tmp_path, "n", {"broke": err, "dropped": skip, "never": skip, "both_bad": err})
    t = compare(load(str(b)), load(str(n))).table.set_index("case_id")
    assert (t.loc["broke", "verdict"], t.loc["broke", "regression"]) == ("error", True)
    assert (t.loc["dropped", "verdict"], t.loc["dropped", "regression"]) == ("lost", True)
    assert "stops running" in t.loc["dropped", "note"]
    for cid in ("never", "both_bad"):  # not measured at BASE: nothing was lost
        assert (t.loc[cid, "verdict"], t.loc[cid, "regression"]) == ("not_measured", False)
    assert main(["compare", str(b), str(n)]) == 1
    out = capsys.readouterr().out
    assert "1 error, 1 lost, 2 not_measured; 2 regression(s)" in out


def _drift_side(tmp_path, name, slots, drift, **kw):
    """One side's runs at the given time slots: no real difference, the machine drifts
    linearly (every sample of the run at slot t is (1 + drift * t) times slower)."""
    d = tmp_path / name
    d.mkdir()
    return [
        write_run(d, f"{name}{t}", {"c": draw(40, 1.0 + drift * t, seed=t, sigma=0.02)}, **kw)
        for t in slots
    ]


def _verdict(base_paths, new_paths):
    from kvbench.store.results import load_runs

    cmp = compare(load_runs(base_paths, "base"), load_runs(new_paths, "new"))
    return cmp.table.loc[0, "verdict"], cmp.table.loc[0, "ratio"]


def test_pooling_interleaved_runs_absorbs_drift_that_single_runs_call_a_regression(tmp_path):
    # A at t1, t3 and B at t2, t4, the same code, 5% drift per run slot
    a = _drift_side(tmp_path, "a", (1, 3), 0.05)
    b = _drift_side(tmp_path, "b", (2, 4), 0.05)
    single, ratio = _verdict(a[:1], b[1:])  # A's t1 run against B's t4 run (e.g. a cached BASE)
    assert single == "slower" and ratio > 1.1  # a false regression
    pooled, ratio = _verdict(a, b)
    assert pooled != "slower" and ratio < 1.1  # what is left is one slot of drift (< 10%)


def test_abba_order_cancels_a_linear_drift_that_alternation_leaves(tmp_path):
    # a steep drift (15% per slot): with ABBA (A t1 t4, B t2 t3) both sides' mean slot is 2.5
    a = _drift_side(tmp_path, "a", (1, 4), 0.15)
    b = _drift_side(tmp_path, "b", (2, 3), 0.15)
    assert _verdict(b[1:], a[1:])[0] == "slower"  # single runs B t3 -> A t4: a false regression
    assert _verdict(a[:1], b[:1])[0] == "slower"  # A t1 -> B t2 too
    verdict, ratio = _verdict(b, a)  # pooled: the mixtures' medians agree (a bimodal pool
    assert verdict not in ("slower", "faster") and abs(ratio - 1) < 0.02  # may be inconclusive)
    # plain alternation (A t1 t3, B t2 t4) keeps one slot of drift (15%) in the ratio; the
    # runs of each pooled side differ by 26%, so the between-run noise band absorbs it
    alt_a = _drift_side(tmp_path, "alt_a", (1, 3), 0.15)
    alt_b = _drift_side(tmp_path, "alt_b", (2, 4), 0.15)
    verdict, ratio = _verdict(alt_a, alt_b)
    assert ratio > 1.1 and verdict == "inconclusive"

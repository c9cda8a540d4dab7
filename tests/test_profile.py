"""`kvbench profile`: one case, per-stage breakdown; Metal capture refused off Apple silicon."""

import pytest

from kvbench import engines
from kvbench.cli import main
from kvbench.engines import cache as cache_engine
from kvbench.engines.contract import Engine
from kvbench.kernels.attention.registry import KERNELS, Kernel, any_format, ops
from kvbench.run.profile import breakdown, capture_problem, find_case, format_breakdown
from kvbench.suite.suite import expand, load_suite

SMOKE = "suites/smoke.yaml"


def test_breakdown_percentages_and_rest():
    rows = breakdown({"step": [10.0, 10.0, 10.0], "write": [2.0] * 3, "attend": [7.0] * 3})
    by = {r["stage"]: r for r in rows}
    assert by["step"]["pct_of_step"] == 100
    assert by["write"]["pct_of_step"] == 20 and by["attend"]["pct_of_step"] == 70
    assert by["rest"]["median_ms"] == pytest.approx(1.0)
    text = format_breakdown(expand(load_suite(SMOKE))[0], "cpu", rows)
    assert "write" in text and "20.0%" in text


def test_find_case_by_id_or_unique_prefix():
    cases = expand(load_suite(SMOKE))
    assert find_case(cases, cases[1].case_id, SMOKE) is cases[1]
    assert find_case(cases, cases[1].case_id[:8], SMOKE) is cases[1]
    from kvbench.errors import UserError

    with pytest.raises(UserError, match="no case has"):
        find_case(cases, "zzzz", SMOKE)


def test_profile_cli_prints_every_stage(capsys):
    case = expand(load_suite(SMOKE))[0]
    assert main(["profile", SMOKE, "--case", case.case_id]) == 0
    out = capsys.readouterr().out
    for stage in ("step", "write", "attend", "rest", "% of step"):
        assert stage in out


def test_metal_capture_is_one_line_error_off_apple(capsys, tmp_path):
    case = expand(load_suite(SMOKE))[0]
    trace = str(tmp_path / "x.gputrace")
    assert main(["profile", SMOKE, "--case", case.case_id, "--metal-capture", trace]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Metal backend; this backend is cpu" in err


def test_capture_preconditions(monkeypatch, tmp_path):
    monkeypatch.delenv("MTL_CAPTURE_ENABLED", raising=False)
    assert "MTL_CAPTURE_ENABLED=1" in capture_problem(str(tmp_path / "a.gputrace"), "metal")
    monkeypatch.setenv("MTL_CAPTURE_ENABLED", "1")
    assert capture_problem(str(tmp_path / "a.gputrace"), "metal") is None
    assert ".gputrace" in capture_problem(str(tmp_path / "a.trace"), "metal")


def test_gpu_case_cannot_be_profiled_on_cpu(capsys):
    suite = "suites/tiles.yaml"
    case = next(c for c in expand(load_suite(suite)) if c.kernel == "metal")
    assert main(["profile", suite, "--case", case.case_id]) == 2
    assert "kernel metal runs on metal, not cpu" in capsys.readouterr().err


def _wrong_ops(q, k, v, fmt, **kw):
    return ops(q, k, v, fmt, **kw) * 2  # fails the parity gate


def _broken_build(case):
    raise ValueError("engine exploded")


@pytest.mark.parametrize(
    "patch,reason",
    [
        (lambda mp: mp.setitem(KERNELS, "ops", Kernel(_wrong_ops, any_format)), "ParityError: "),
        (
            lambda mp: mp.setitem(
                engines.ENGINES,
                "cache",
                Engine(cache_engine.claims, cache_engine.skip_reason, _broken_build),
            ),
            "ValueError: engine exploded",
        ),
    ],
)
def test_a_case_that_fails_is_one_line_exit_2(capsys, monkeypatch, patch, reason):
    """`run` makes such a case an error row; `profile` says it in one line."""
    case = next(c for c in expand(load_suite(SMOKE)) if c.kernel == "ops")
    patch(monkeypatch)
    assert main(["profile", SMOKE, "--case", case.case_id]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbench: {SMOKE}: --case {case.case_id}: {reason}"), err
    assert err.strip().count("\n") == 0 and "Traceback" not in err

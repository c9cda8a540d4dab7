"""Axes on the command line (harness/suite/cli_axes.py): values, suffixes, merging with a suite
file, and the one-line errors (issue 44 item 1)."""

from __future__ import annotations

import argparse

import pytest

from kvbench.axes import TABLE
from kvbench.cli import main
from kvbench.errors import SuiteError
from kvbench.suite.cli_axes import add_axis_options, given_axes, merge, parse_value, suite_of
from kvbench.suite.suite import expand

AXIS = {a.name: a for a in TABLE}


def parse(*argv: str):
    p = argparse.ArgumentParser()
    p.add_argument("suite", nargs="?")
    add_axis_options(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(
    "text, want", [("2048", 2048), ("2k", 2048), ("32K", 32768), ("1M", 2**20), ("1g", 2**30)]
)
def test_whole_numbers_take_binary_suffixes(text, want):
    assert parse_value(AXIS["context_len"], text, "--context") == want


@pytest.mark.parametrize("text", ["2x", "1.5k", "k", "-4", ""])
def test_a_bad_whole_number_names_the_option(text):
    with pytest.raises(SuiteError, match="command line: --context: .* not a whole number"):
        parse_value(AXIS["context_len"], text, "--context")


def test_optional_axes_take_none_words_and_floats_parse():
    assert parse_value(AXIS["tile_kv"], "default", "--tile-kv") is None
    assert parse_value(AXIS["v_dtype"], "none", "--v-dtype") is None
    assert parse_value(AXIS["prefix_frac"], "0.25", "--prefix-frac") == 0.25


def test_every_axis_has_its_option():
    args = parse(*[x for a in TABLE for x in (f"--{a.name.replace('_', '-')}", "1")])
    assert all(getattr(args, f"axis_{a.name}") == "1" for a in TABLE)


def test_comma_lists_are_checked_as_a_suite_value_with_a_did_you_mean():
    with pytest.raises(SuiteError, match=r"^command line: --kv-dtype: .*q4_O") as e:
        given_axes(parse("--kv-dtype", "fp16,q4_O"))
    assert "\n" not in str(e.value)


def test_shorthand_and_axis_for_the_same_axis_is_refused():
    with pytest.raises(SuiteError, match="--context and --context-len"):
        given_axes(parse("--context", "2k", "--context-len", "4k"))


def test_without_a_file_one_value_is_fixed_a_list_is_swept_rotate_is_zipped():
    args = parse("--model", "llama-3-8b", "--kv-dtype", "fp16,q8_0,q4_0", "--rotate",
                 "none,hadamard", "--context", "2k")  # fmt: skip
    suite = suite_of(args)
    assert suite.fixed == {"model": "llama-3-8b", "context_len": 2048}
    assert suite.sweep == {"kv_dtype": ["fp16", "q8_0", "q4_0"]}
    assert suite.zip == [{"rotate_k": ["none", "hadamard"], "rotate_v": ["none", "hadamard"]}]
    cases = expand(suite)
    assert len(cases) == 6  # 3 formats x 2 rotations, K and V rotated together
    assert all(c.rotate_k == c.rotate_v for c in cases)


RAW = {
    "fixed": {"model": "llama-3-8b", "context_len": 1024},
    "sweep": {"kv_dtype": ["fp16", "int8"]},
    "zip": [{"n_seqs": [1, 2, 4], "layout": ["per-stream", "unified", "unified"]}],
}


def test_the_command_line_overrides_fixed_and_swept_axes_of_a_suite():
    got = merge(RAW, {"context_len": [512, 4096], "kv_dtype": ["int4"]})
    assert got["fixed"] == {"model": "llama-3-8b", "kv_dtype": "int4"}
    assert got["sweep"] == {"context_len": [512, 4096]}
    assert RAW["fixed"]["context_len"] == 1024  # the file's mapping is left as it was


def test_the_command_line_narrows_a_zip_group_and_names_what_it_has():
    got = merge(RAW, {"n_seqs": [2, 4]})
    assert got["zip"] == [{"n_seqs": [2, 4], "layout": ["unified", "unified"]}]
    with pytest.raises(SuiteError, match=r"--n-seqs: 8 is not in .* \(it has: 1, 2, 4\)"):
        merge(RAW, {"n_seqs": [8]}, path="s.yaml")


def test_model_phase_only_runs_sample_once():
    got = merge(None, {"phase": ["quality"], "model": ["smollm2-135m"]})
    assert got["settings"]["max_samples"] == 1 and got["settings"]["rounds"] == 1
    assert "settings" not in merge(None, {"phase": ["decode"], "model": ["llama-3-8b"]})


def test_run_dry_run_from_axes_alone(capsys):
    argv = ["run", "--model", "llama-3-8b", "--kv-dtype", "fp16,int4", "--context", "1k,2k"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 cases" in out and "ctx1024" in out and "ctx2048 int4" in out


def test_run_with_a_file_and_axes_narrows_the_file(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text("fixed: {model: llama-3-8b}\nsweep: {context_len: [512, 1024], "
                     "kv_dtype: [fp16, int8, int4]}\n")  # fmt: skip
    assert main(["run", str(suite), "--kv-dtype", "int8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 cases" in out and "fp16" not in out


def test_run_with_neither_file_nor_axes_is_a_one_line_error(capsys):
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbench: command line: ") and err.count("\n") == 1


@pytest.mark.parametrize("pct", ["0", "-1", "nan", "100"])
def test_a_bad_tolerance_is_one_line(pct, capsys):
    assert main(["run", "--model", "llama-3-8b", "--context", "1k", "--tolerance", pct]) == 2
    assert capsys.readouterr().err.startswith("kvbench: --tolerance: ")


def test_value_typos_get_a_did_you_mean_look_alike_digits_first():
    from kvbench.suite.validate import did_you_mean

    assert did_you_mean("q4_O", ["q4_1", "q4_0"]) == "did you mean 'q4_0'? "
    assert did_you_mean("llama3-8b", ["llama-3-8b", "tiny"]) == "did you mean 'llama-3-8b'? "
    assert did_you_mean("zzz", ["fp16"]) == ""
    with pytest.raises(SuiteError, match="did you mean 'llama-3-8b'"):
        given_axes(parse("--model", "llama3-8b"))


def test_filter_typos_and_empty_matches_name_what_the_suite_has():
    from kvbench.suite.suite import apply_filters

    cases = expand(suite_of(parse("--model", "llama-3-8b", "--kv-dtype", "fp16,q4_0",
                                  "--context", "1k")))  # fmt: skip
    with pytest.raises(SuiteError, match="did you mean 'kv_dtype'"):
        apply_filters(cases, ["kv_dtyp=q4_0"])
    with pytest.raises(SuiteError, match=r"no case matches; did you mean 'q4_0'\? the cases have "
                       r"kv_dtype fp16, q4_0$"):  # fmt: skip
        apply_filters(cases, ["kv_dtype=q4_O"])
    assert [c.kv_dtype for c in apply_filters(cases, ["kv_dtype=q4_0"])] == ["q4_0"]


def test_a_missing_suite_file_has_no_stray_key(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert (
        capsys.readouterr().err
        == f"kvbench: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory\n"
    )

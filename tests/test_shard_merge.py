"""`run --shard i/n` (every case exactly once, cost-balanced, deterministic) and `merge`
(several hosts' results into one results set keyed by case and host)."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from fake_runs import write_run
from test_walls import kvbench_without_mlx

from kvbench.cli import main
from kvbench.errors import UserError
from kvbench.store.merge import merge
from kvbench.store.results import load_dir
from kvbench.suite.shard import assign, case_cost, parse_shard, shard_cases
from kvbench.suite.suite import expand, load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["smoke.yaml", "quant.yaml", "streams.yaml", "sharded.yaml", "sharded-gpu.yaml"]


@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_every_case_in_exactly_one_part(suite, n):
    cases = expand(load_suite(ROOT / "suites" / suite))
    parts = [shard_cases(cases, i, n) for i in range(1, n + 1)]
    ids = [c.case_id for part in parts for c in part]
    assert sorted(ids) == sorted(c.case_id for c in cases)  # all of them, none twice
    for part in parts:  # each part keeps the suite's order
        order = [cases.index(c) for c in part]
        assert order == sorted(order)
    loads = [sum(case_cost(c) for c in part) for part in parts]
    assert max(loads) - min(loads) <= max(case_cost(c) for c in cases)


def test_the_split_does_not_depend_on_the_suite_order():
    cases = expand(load_suite(ROOT / "suites" / "quant.yaml"))
    assert assign(cases, 3) == assign(list(reversed(cases)), 3)


def test_cost_is_the_cache_bytes_by_hand():
    case = expand(load_suite(ROOT / "suites" / "smoke.yaml"))[0]  # tiny, ctx 64, fp16
    assert case_cost(case) == 2 * 2 * 1 * 2 * 64 * 64 * 2  # K+V, layers, seqs, heads, ctx, D, B


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1", "a/b", "1/0", ""])
def test_bad_shard_is_a_user_error(bad):
    with pytest.raises(UserError, match="--shard"):
        parse_shard(bad)


def rows_of(path):
    return load_dir(path).rows


def test_merge_keys_by_case_and_host(tmp_path):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    # the same run_id on two hosts (CI jobs of one commit started in the same second)
    write_run(a, "20260101T000000Z-aaaa", {"c1": [1.0, 1.1], "c2": [2.0]}, host="mac-1")
    write_run(b, "20260101T000000Z-aaaa", {"c1": [3.0, 3.1], "c3": [4.0]}, host="mac-2")
    # a later re-run on mac-2 errs: it must not hide the ok row
    write_run(b, "20260101T000100Z-aaaa", {"c1": {"status": "error"}}, host="mac-2",
              timestamp="2026-01-01T00:01:00+00:00")  # fmt: skip
    merged = merge([str(a), str(b)], out)
    assert (merged.rows, merged.dropped, merged.runs) == (4, 1, 2)
    rows = rows_of(out)
    assert sorted(zip(rows["case_id"], rows["host"])) == [
        ("c1", "mac-1"), ("c1", "mac-2"), ("c2", "mac-1"), ("c3", "mac-2"),
    ]  # fmt: skip
    assert set(rows["status"]) == {"ok"} and rows["run_id"].nunique() == 2
    assert "20260101T000000Z-aaaa-mac-2" in set(rows["run_id"])
    samples = load_dir(out).samples  # each run's samples are those of its own rows
    mac2 = rows[rows["host"] == "mac-2"]["run_id"].iloc[0]
    got = samples[(samples["run_id"] == mac2) & (samples["case_id"] == "c1")]["ms"]
    assert sorted(got) == [3.0, 3.1]


def test_merge_writes_integers_as_integers(tmp_path):
    write_run(tmp_path / "a", "r1", {"c1": [1.0, 2.0], "c2": {"status": "skipped"}}, host="h")
    merge([str(tmp_path / "a")], tmp_path / "out")
    text = (tmp_path / "out" / "r1.csv").read_text()
    assert pd.read_csv(tmp_path / "out" / "r1.csv")["n_samples"].iloc[0] == 2
    assert ",2.0," not in text


def test_merge_refuses_bad_input(tmp_path, capsys):
    assert main(["merge", str(tmp_path / "nothing"), "-o", str(tmp_path / "o")]) == 2
    assert "no such results directory" in capsys.readouterr().err
    write_run(tmp_path / "a", "r1", {"c1": [1.0]}, host="h")
    assert main(["merge", str(tmp_path / "a"), "-o", str(tmp_path / "a")]) == 2


def test_merge_runs_without_mlx(tmp_path):
    write_run(tmp_path / "a", "r1", {"c1": [1.0]}, host="h")
    r = kvbench_without_mlx("merge", str(tmp_path / "a"), "-o", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_two_shards_merged_reproduce_the_single_host_case_set(tmp_path):
    """End to end: the smoke suite run as two parts, merged: the single-host case set."""
    suite = str(ROOT / "suites" / "smoke.yaml")
    run = [sys.executable, "-m", "kvbench", "run", suite, "--filter", "context_len=64"]
    for i in (1, 2):
        done = subprocess.run([*run, "--shard", f"{i}/2", "--out", str(tmp_path / f"host{i}")],
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    assert main(["merge", str(tmp_path / "host1"), str(tmp_path / "host2"),
                 "-o", str(tmp_path / "all")]) == 0  # fmt: skip
    listed = subprocess.run([*run, "--dry-run"], capture_output=True, text=True, check=True)
    lines = listed.stdout.splitlines()
    want = sorted(x.split()[0] for x in lines if re.match(r"[0-9a-f]{12}  ", x))
    rows = rows_of(tmp_path / "all")
    assert sorted(rows["case_id"]) == want and set(rows["status"]) == {"ok"}


def test_merge_keeps_the_kept_rows_per_token_values(tmp_path):
    from kvbench.store.tokens import TOKEN_COLUMNS, read_tokens, tokens_path
    from kvbench.store.writer import write_csv_atomic

    a = tmp_path / "a"
    run = write_run(a, "r1", {"c1": [1.0], "c2": [2.0]}, host="h")
    lines = [("c1", 0, 8, 5, 2.5, 0.1), ("c1", 0, 9, 6, 1.5, -1e-5), ("gone", 0, 8, 5, 1.0, 0.0)]
    write_csv_atomic(tokens_path(run), TOKEN_COLUMNS, lines)
    merge([str(a)], tmp_path / "out")
    got = read_tokens(tmp_path / "out" / "r1.csv")
    assert got.values.tolist() == [list(x) for x in lines[:2]]  # only the kept rows' tokens


@pytest.mark.parametrize("bare_first", [True, False])
def test_merge_keeps_the_copy_of_a_run_that_has_its_samples(tmp_path, bare_first):
    """#44 item 9: two identical copies of a run, one without its samples file: the copy with
    samples is kept whatever the input order (it kept the first given, and compare then said
    'no raw samples')."""
    import shutil

    full, bare = tmp_path / "full", tmp_path / "bare"
    run = write_run(full, "r1", {"c1": [1.0, 1.2, 1.1]}, host="h")
    bare.mkdir()
    shutil.copy(run, bare / run.name)  # the results CSV alone
    inputs = [str(bare), str(full)] if bare_first else [str(full), str(bare)]
    merged = merge(inputs, tmp_path / "out")
    assert (merged.rows, merged.dropped) == (1, 1)
    samples = load_dir(tmp_path / "out").samples
    assert sorted(samples["ms"]) == [1.0, 1.1, 1.2]

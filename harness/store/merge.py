"""`kvbench merge DIR... -o OUT`: the results of several hosts joined into one results set.

Each input (a results directory or a results CSV) is read run by run through the one reader
(store/results.py: migration of older schema versions included). One row is kept per (case_id,
host) by the reader's picking rule (status ok before partial before anything else, then the
newest): a case measured on two hosts stays two rows, a host's re-run of a case is ranked, never
added twice. The kept rows are written back as runs: OUT/<run_id>.csv and, beside it, the raw
samples of exactly those rows in OUT/<run_id>.samples.csv (and their per-token values, where
the input kept any, in OUT/<run_id>.tokens.csv: store/tokens.py), so OUT is a results directory that
compare, history and report read like any other. Two inputs with the same run_id (jobs of one
commit started in the same second on different hosts) stay apart: the run_id gets the host
appended (then a number, if still taken). This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.errors import UserError
from kvbench.store.checks import dir_files
from kvbench.store.results import load_run, pick_rows
from kvbench.store.schema import COLUMNS, SAMPLE_COLUMNS, Record
from kvbench.store.tokens import TOKEN_COLUMNS, read_tokens, tokens_path
from kvbench.store.writer import write_csv_atomic

MERGE_KEYS = ("case_id", "host")
INT_COLUMNS = [f.name for f in dataclasses.fields(Record) if str(f.type).startswith("int")]


@dataclass(frozen=True)
class Merged:
    out_dir: Path
    runs: int  # run files written
    rows: int  # rows kept, one per (case_id, host)
    dropped: int  # rows of the inputs not kept (the same case re-run on the same host)
    hosts: dict  # host -> rows kept


def run_files(inputs: list[str]) -> list[Path]:
    """Every results CSV named or inside a named directory, in the order given."""
    files = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            files += dir_files(path)  # other CSVs are skipped, with a word (store/checks.py)
        elif path.is_file():
            files.append(path)  # named: read as a run, or refused
        else:
            raise UserError(f"{given}: no such results directory or CSV")
    return files


def merge(inputs: list[str], out_dir: str | Path) -> Merged:
    """Join the runs of `inputs` into out_dir (module docstring); returns what was written."""
    out_dir = Path(out_dir)
    files = run_files(inputs)
    if not files:
        raise UserError(f"{', '.join(inputs)}: no kvbench results")
    if any(out_dir.resolve() == f.parent.resolve() for f in files):
        raise UserError(f"{out_dir}: -o must not be one of the inputs")
    loaded = [load_run(f) for f in files]
    tokens = [read_tokens(f) for f in files]
    rows = pd.concat(
        [
            r.assign(_file=i, _bare=bare(r, s, t))
            for i, ((r, s), t) in enumerate(zip(loaded, tokens))
        ],
        ignore_index=True,
    )
    # of equal rows the picking rule keeps the first: a copy with its evidence (samples,
    # per-token values) first, never a bare copy of the same run because it was given first
    rows = rows.sort_values("_bare", kind="stable").drop(columns="_bare")
    kept = pick_rows(rows, keys=MERGE_KEYS)
    names = run_names(kept)
    for name in names.values():  # never over a run already in OUT (checked before writing)
        for path in (out_dir / f"{name}.csv", out_dir / f"{name}.samples.csv",
                     tokens_path(out_dir / f"{name}.csv")):  # fmt: skip
            if path.exists():
                raise UserError(f"{path}: -o: exists and is not overwritten; merge into a new "
                                "directory")  # fmt: skip
    for i, part in kept.groupby("_file", sort=True):
        write_run(out_dir, names[i], part, loaded[i][1])
        write_tokens(out_dir, names[i], part, tokens[i])
    hosts = kept["host"].fillna("?").value_counts().to_dict()
    return Merged(out_dir, len(names), len(kept), len(rows) - len(kept), hosts)


def bare(rows: pd.DataFrame, samples: pd.DataFrame, tokens: pd.DataFrame) -> list[int]:
    """Per row: 0 when its run file holds its samples or per-token values, else 1."""
    have = set(tokens["case_id"].astype(str))
    if not samples.empty:
        have |= set(samples["case_id"].astype(str))
    return [0 if str(c) in have else 1 for c in rows["case_id"]]


def run_names(kept: pd.DataFrame) -> dict[int, str]:
    """Input file -> the run_id its kept rows get in OUT (unique across the merged set)."""
    names, taken = {}, set()
    for i, part in kept.groupby("_file", sort=True):
        base = str(part["run_id"].iloc[0])
        name = base
        if name in taken:
            host = re.sub(r"[^A-Za-z0-9._-]+", "-", str(part["host"].iloc[0]))
            name = f"{base}-{host}"
        n = 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        names[i] = name
        taken.add(name)
    return names


def write_run(out_dir: Path, run_id: str, rows: pd.DataFrame, samples: pd.DataFrame) -> None:
    rows = rows.drop(columns="_file").assign(run_id=run_id)
    for col in INT_COLUMNS:  # a column with empty cells reads as float: write 5, not 5.0
        rows[col] = pd.to_numeric(rows[col], errors="coerce").astype("Int64")
    rows = rows.astype(object).where(rows.notna(), None)
    write_csv_atomic(out_dir / f"{run_id}.csv", COLUMNS, rows[list(COLUMNS)].to_numpy().tolist())
    if not samples.empty:
        mine = samples[samples["case_id"].isin(set(rows["case_id"]))]
        cells = mine[list(SAMPLE_COLUMNS)].to_numpy().tolist()
        write_csv_atomic(out_dir / f"{run_id}.samples.csv", SAMPLE_COLUMNS, cells)


def write_tokens(out_dir: Path, run_id: str, rows: pd.DataFrame, tokens: pd.DataFrame) -> None:
    """The kept rows' per-token values, where their run kept any."""
    mine = tokens[tokens["case_id"].isin(set(rows["case_id"].astype(str)))]
    if len(mine):
        cells = mine[list(TOKEN_COLUMNS)].to_numpy().tolist()
        write_csv_atomic(tokens_path(out_dir / f"{run_id}.csv"), TOKEN_COLUMNS, cells)


def render(merged: Merged) -> str:
    hosts = ", ".join(f"{h}: {n}" for h, n in sorted(merged.hosts.items()))
    return (
        f"merged {merged.rows} rows (one per case and host; {hosts}) into {merged.runs} runs in "
        f"{merged.out_dir}; {merged.dropped} re-run rows not kept"
    )

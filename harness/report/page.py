"""`kvbench report`: result CSVs -> one self-contained, offline HTML page.

Inputs are result CSVs (harness/store/schema.py's columns) or directories of them; raw-sample
files (`*.samples.csv`) are skipped and compare CSVs (`kvbench compare --format csv`: ratio,
verdict, ...; docs/compare.md) found among the inputs are treated like `--compare FILE`.
Which rows the figures use:
  - the "current" rows: one row per (case_id, device, backend) by the results store's one
    picking rule (harness/store/results.py: measured before error, then the newest), so several
    suites' files combine and a re-run replaces the older row, but a re-run that errors does not
    hide a good one; with `latest=True` only the newest run's rows;
  - the history figure uses every run given, restricted to the current cases.
plotly.js is inlined once in the page head; no file, font or script is fetched from anywhere.
Result files are read by the results store (one reader for compare, history, gate and report).
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.case import label_of
from kvbench.errors import UserError
from kvbench.files import check_output_file, write_atomic
from kvbench.store.checks import dir_files
from kvbench.store.results import is_results_csv, load_run, migrate, pick_rows, read_csv
from kvbench.store.schema import COLUMNS


def _csv_files(paths) -> list[Path]:
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += dir_files(p, compares=True)  # others skipped, with a word (store/checks.py)
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"{p}: no such file or directory")
    return files


def _is_compare(df: pd.DataFrame) -> bool:
    return {"ratio", "verdict"} <= set(df.columns) and "status" not in df.columns


def _bool(col: pd.Series) -> pd.Series:
    return col.map(lambda v: v if isinstance(v, bool) else {"True": True, "False": False}.get(v))


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Every Record column present (older files lack some), booleans as booleans, a label."""
    df = migrate(df, "results")
    for c in ("dirty", "unstable"):
        df[c] = _bool(df[c])
    df["label"] = [label_of(r) for r in df.to_dict("records")]
    return df


def load(paths) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(all result rows, compare rows or None) from CSV files and directories."""
    results, compares = [], []
    for f in _csv_files(paths):
        df = read_csv(f)
        if _is_compare(df):
            compares.append(df)
        elif is_results_csv(f):
            results.append(load_run(f)[0])  # its samples read too: a row must agree with them
        else:
            raise UserError(f"{f}: neither a kvbench result CSV nor a compare CSV")
    rows = (
        normalize(pd.concat(results, ignore_index=True))
        if results
        else normalize(pd.DataFrame(columns=COLUMNS))
    )
    return rows, load_compare_frames(compares)


def load_compare_frames(frames: list[pd.DataFrame]) -> pd.DataFrame | None:
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    missing = [c for c in ("label", "ratio", "ratio_ci_low", "ratio_ci_high") if c not in df]
    if missing:
        raise UserError(f"compare CSV: missing columns {', '.join(missing)}")
    return df


def load_compare(path: str | Path) -> pd.DataFrame:
    return load_compare_frames([read_csv(Path(path))])


def run_order(rows: pd.DataFrame) -> list[str]:
    """run_ids from oldest to newest (by each run's latest timestamp, then run_id)."""
    if rows.empty:
        return []
    ts = rows.groupby("run_id", dropna=False)["timestamp"].max().fillna("")
    return sorted(ts.index, key=lambda r: (str(ts[r]), str(r)))


def current(rows: pd.DataFrame, latest: bool = False) -> pd.DataFrame:
    """The rows the figures show: the newest row per (case_id, device, backend)."""
    order = run_order(rows)
    if not order:
        return rows
    if latest:
        return rows[rows["run_id"] == order[-1]].reset_index(drop=True)
    return pick_rows(rows)


def build(paths, latest: bool = False, compare: str | Path | None = None, title=None) -> str:
    """The report page's HTML for result paths (files or directories)."""
    from kvbench.analysis.findings import findings
    from kvbench.report.figures import all_figures
    from kvbench.report.html import page

    rows, compare_rows = load(paths)
    if compare is not None:
        extra = load_compare(compare)
        compare_rows = extra if compare_rows is None else pd.concat([compare_rows, extra])
    if rows.empty and compare_rows is None:
        raise UserError(f"{' '.join(map(str, paths))}: no result rows found")
    cur = current(rows, latest)
    history = rows[rows["case_id"].isin(cur["case_id"])] if len(cur) else rows
    figures = all_figures(cur, history, compare_rows, run_order(rows))
    return page(cur, figures, title=title, found=findings(cur) if len(cur) else [])


def write_report(
    paths, out: str | Path, latest: bool = False, compare=None, title=None
) -> tuple[Path, int]:
    """Write the report; returns (path, number of figures)."""
    out = check_output_file(out)  # before the work: not a directory, folder writable
    html = build(paths, latest=latest, compare=compare, title=title)
    write_atomic(out, html)  # a unique temporary name: concurrent reports never collide
    return out, html.count('class="figure"')

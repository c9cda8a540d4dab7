"""What the one reader (store/results.py) refuses in a results or samples file, and which files
of a results directory it reads.

A run file is believed only when it is whole and its figures can be timings: the file ends with
a newline (kvbench appends whole lines, so a file that does not was cut short); every `*_ms`
column and `n_samples` of a measured row (ok, partial) is finite and not negative; a row with
samples has a median; and, where the samples file holds a row's step samples, there are
`n_samples` of them and `median_ms` is their median (a hand-edited median of -5 or 1e308 beside
samples whose median is 0.14 ms is refused, not printed beside a ratio computed from the
samples). Each refusal names the file, the data row and the column.

In a results directory, a `*.csv` that is not a run is skipped: a saved compare table without a
word (kvbench wrote it), anything else (0 bytes, binary, not UTF-8, another CSV) with one warning
line on stderr naming the file and why, the same in compare, history, gate, merge and report. A
run file that is damaged is refused, never skipped: its rows would silently go missing. A row
without a case_id or with a status no run writes cannot be placed: it is left out with one
warning line naming the file and the data rows, by every reader alike.
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import UserError
from kvbench.files import not_regular
from kvbench.store.status import MEASURED, STATUSES

RUN_COLUMNS = {"run_id", "case_id", "status"}
COMPARE_COLUMNS = {"ratio", "verdict"}
SAMPLES_COLUMNS = {"case_id", "stage", "ms"}
MEDIAN_RTOL = 1e-6  # CSV cells keep full float precision (repr): only an edit moves a median
_warned: set[str] = set()


def warn_skipped(path: Path, reason: str, what: str = "skipped") -> None:
    """One warning line per skipped file (or its skipped rows) per process (compare DIR DIR
    reads DIR twice)."""
    if str(path) in _warned:
        return
    _warned.add(str(path))
    print(f"kvbench: warning: {path}: {what}: {reason}", file=sys.stderr)


def header(path: Path) -> tuple[set | None, str | None]:
    """(the CSV's columns, None), or (None, why it is not a readable CSV)."""
    why = not_regular(path)
    if why is not None:  # a named pipe would block the read for ever
        return None, why
    try:
        if path.stat().st_size == 0:
            return None, "an empty file (0 bytes)"
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError as e:
        return None, f"cannot read: {e.strerror}"
    if b"\x00" in head:
        return None, "a binary file, not a CSV"
    try:
        return set(pd.read_csv(path, nrows=0).columns), None
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        return None, f"not a CSV ({str(e).splitlines()[0] if str(e) else type(e).__name__})"


def dir_files(path: Path, compares: bool = False) -> list[Path]:
    """The runs in a results directory (and compare CSVs, when asked), sorted by name; other
    CSVs are skipped (module docstring)."""
    out = []
    side = (".samples.csv", ".tokens.csv")  # a run's raw samples and per-token values
    for f in sorted(p for p in path.glob("*.csv") if not p.name.endswith(side)):
        cols, why = header(f)
        if cols is not None and RUN_COLUMNS <= cols:
            out.append(f)
        elif cols is not None and COMPARE_COLUMNS <= cols:
            out += [f] if compares else []
        else:
            warn_skipped(f, why or "not a kvbench run (no run_id, case_id, status columns)")
    return out


def whole_lines(path: Path) -> None:
    """A file kvbench wrote ends with a newline; one that does not was cut in its last row."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return
            f.seek(-1, 2)
            last = f.read(1)
    except OSError:
        return  # the CSV reader names the error
    if last != b"\n":
        raise UserError(f"{path}: last row: cut short (no newline at the end); the file is damaged")


def skip_bad_rows(rows: pd.DataFrame, path) -> pd.DataFrame:
    """Rows every reader can place: a case_id and a known status. The others are left out with
    one warning line naming the file and each data row (issue 35: they dropped out of history
    silently and the report miscounted them)."""
    case_id = rows["case_id"].astype(str).str.strip()
    no_id = rows["case_id"].isna().to_numpy() | case_id.eq("").to_numpy()
    unknown = ~rows["status"].isin(STATUSES).to_numpy()
    bad = no_id | unknown
    if not bad.any():
        return rows
    why = []
    for i in bad.nonzero()[0]:
        what = "no case_id" if no_id[i] else f"status {rows['status'].iloc[i]!r} (not one of "
        why.append(f"data row {i + 1}: {what}" + ("" if no_id[i] else f"{', '.join(STATUSES)})"))
    warn_skipped(path, "; ".join(why), f"skipped {len(why)} rows")
    return rows[~bad]


def _refuse(path, col: str, i: int, what: str, value) -> UserError:
    return UserError(f"{path}: {col}: {what} in data row {i + 1}: {value!r}")


def check_times(rows: pd.DataFrame, path) -> None:
    """Every timestamp given is an ISO 8601 date and time (as kvbench writes them): the newest
    row is picked by it, and text such as 'yesterday' sorted after every real time (#44)."""
    if "timestamp" not in rows:
        return
    for i, v in enumerate(rows["timestamp"]):
        if v is None or v != v or str(v).strip() == "":
            continue  # not recorded (an import without a time): ranked last, as before
        try:
            ok = len(str(v)) >= 16 and str(v)[10] in "T " and dt.datetime.fromisoformat(str(v))
        except ValueError:
            ok = False
        if not ok:
            raise _refuse(path, "timestamp", i, "not a time (ISO 8601 date and time)", v)


def check_rows(rows: pd.DataFrame, path) -> None:
    """Timings of measured rows finite and not negative; a median wherever there are samples;
    timestamps that are times."""
    check_times(rows, path)
    measured = rows["status"].isin(MEASURED).to_numpy()
    cols = [c for c in rows.columns if c.endswith("_ms") or c == "n_samples"]
    for col in cols:
        x = pd.to_numeric(rows[col], errors="coerce").to_numpy(dtype=float)
        bad = measured & ~np.isnan(x) & (~np.isfinite(x) | (x < 0))
        if bad.any():
            i = int(bad.nonzero()[0][0])
            raise _refuse(path, col, i, "not a time or count (negative or infinite)", x[i])
    if "n_samples" in rows and "median_ms" in rows:
        n = pd.to_numeric(rows["n_samples"], errors="coerce").fillna(0).to_numpy()
        med = pd.to_numeric(rows["median_ms"], errors="coerce").to_numpy(dtype=float)
        bad = measured & (n > 0) & np.isnan(med)
        if bad.any():
            i = int(bad.nonzero()[0][0])
            raise _refuse(path, "median_ms", i, f"missing though n_samples is {int(n[i])}", med[i])


def check_against_samples(rows: pd.DataFrame, samples: pd.DataFrame, path) -> None:
    """Where the samples file holds a measured row's step samples: n_samples of them, and the
    row's median_ms is their median."""
    if samples.empty or "n_samples" not in rows:
        return
    steps = samples[samples["stage"] == "step"].groupby("case_id")["ms"]
    count, median = steps.size(), steps.median()
    for i, row in enumerate(rows.to_dict("records")):
        cid = row["case_id"]
        if row["status"] not in MEASURED or cid not in count.index:
            continue
        if row["n_samples"] != count[cid]:
            raise _refuse(
                path, "n_samples", i, f"{count[cid]} step samples on disk", row["n_samples"]
            )
        m = row.get("median_ms")
        if not np.isclose(m, median[cid], rtol=MEDIAN_RTOL, atol=0):
            what = f"not the median of its samples ({median[cid]!r} ms)"
            raise _refuse(path, "median_ms", i, what, m)

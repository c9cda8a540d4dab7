"""Result sets for compare and history: results CSVs, directories of them, or a git ref.

A side is given as
  * a results CSV `<run_id>.csv` (raw samples from `<run_id>.samples.csv` beside it),
  * a results directory (every run in it), or
  * a git ref (any name `git rev-parse` resolves to a commit): the runs in the results
    directory whose `commit` column (12-character short sha) matches it.
A path that exists wins over a ref of the same name.

This is the one reader of result files: compare, history, gate and the report all load rows
through `read_rows` (text columns kept as text, booleans as booleans, older schema versions
migrated, newer ones refused) and pick them with `pick_rows`.

One case, several runs: one row per (case_id, device, backend) — the same case measured on two
machines is two rows, never one replacing the other. Ranking: status ok before partial before
anything else (a re-run that errors never hides a good row); for a git ref, a clean tree before
a dirty one; then the latest timestamp. Pooling the samples of runs taken at different times
would mix between-run drift into one sample set that the rank test treats as independent draws.

Pooled (pool=True, `compare --pool`, and `gate --rounds N` with N > 1): each case's row is
rebuilt from the raw samples of every measured run of that case on the side (for a git ref,
only clean-tree runs when there are any), concatenated, with harness/stats.py (median, p10,
p90, IQR, CV, CI, n; write_ms / attend_ms / mask_ms = median of their pooled stage samples).
Other columns (GB/s, memory, accuracy) stay those of the latest run. This is meant for runs
that were *interleaved* with the other side's (gate --rounds), so that drift hits both sides
alike; docs/compare.md says why.

This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench import SCHEMA_VERSION, stats
from kvbench.case import label_of
from kvbench.errors import UserError
from kvbench.files import check_output_file, not_regular
from kvbench.store import git
from kvbench.store.checks import (
    check_against_samples,
    check_rows,
    dir_files,
    skip_bad_rows,
    whole_lines,
)
from kvbench.store.migrate_v1 import with_v1_facts
from kvbench.store.schema import COLUMNS, METRIC_STAGE, Record
from kvbench.store.status import MEASURED

# Read as text: a 12-digit commit or case id made only of digits must not become a number.
TEXT_COLUMNS = {c: str for c in ("run_id", "case_id", "commit", "branch", "suite", "host", "label")}
STATUS_RANK = {"ok": 0, "partial": 1}
PICK_KEYS = ("case_id", "device", "backend")
NUMERIC_COLUMNS = tuple(
    f.name for f in dataclasses.fields(Record) if str(f.type).startswith(("int", "float"))
)  # one row per case per machine (module docstring)


def is_dirty(rows: pd.DataFrame) -> pd.Series:
    """The `dirty` column as booleans (a CSV holds it as text; missing counts as clean)."""
    return rows["dirty"].astype(str).eq("True")


def migrate(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Rows of any schema version up to SCHEMA_VERSION in today's form: every column present
    (older files lack the newer ones, which stay empty); a newer version is refused."""
    version = pd.to_numeric(df.get("schema_version"), errors="coerce")
    newest = version.max() if version is not None and len(df) else None
    if newest is not None and newest == newest and newest > SCHEMA_VERSION:
        raise UserError(
            f"{source}: schema_version: {int(newest)} is newer than this kvbench reads "
            f"({SCHEMA_VERSION}); update kvbench"
        )
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        df = pd.concat([df, pd.DataFrame(None, index=df.index, columns=missing)], axis=1)
    return with_v1_facts(df)


@dataclass
class ResultSet:
    source: str  # what the user named (path or ref), for headings
    rows: pd.DataFrame  # every row of every run loaded
    samples: pd.DataFrame  # run_id, case_id, stage, round, sample, ms
    prefer_clean: bool = False  # a git ref: runs of a clean tree first
    pool: bool = False  # one row per case from the samples of all its runs (docstring)
    _by_key: dict | None = field(default=None, repr=False)  # (run, case, stage) -> samples
    _pool_runs: dict | None = field(default=None, repr=False)  # case_id -> pooled run_ids
    _round_medians: pd.Series | None = field(default=None, repr=False)  # by run/case/stage
    notes: list[str] = field(default_factory=list)  # what the reader noticed (missing samples)

    def pick(self) -> pd.DataFrame:
        """One row per case_id, by the ranking in the module docstring, in first-seen order;
        pooled over every measured run of the case when self.pool."""
        picked = pick_rows(self.rows, self.prefer_clean)
        return self._pooled(picked) if self.pool and not picked.empty else picked

    def heading(self) -> str:
        """The source, plus how many runs a pooled side pooled (for the compare header)."""
        if not self.pool:
            return self.source
        counts = {len(r) for r in self.pool_runs().values()} or {0}
        k = str(min(counts)) if len(counts) == 1 else f"{min(counts)}-{max(counts)}"
        return f"{self.source} [pooled: {k} run{'' if k == '1' else 's'} per case]"

    def pool_runs(self) -> dict:
        """case_id -> the run_ids whose samples are pooled for it (measured runs only; for a
        git ref, clean-tree runs when the case has any)."""
        if self._pool_runs is None:
            df = self.rows[self.rows["status"].isin(MEASURED)]
            out = {}
            for cid, g in df.groupby("case_id", sort=False):
                if self.prefer_clean:
                    clean = g[~is_dirty(g)]
                    g = clean if not clean.empty else g
                out[cid] = list(dict.fromkeys(g["run_id"]))
            self._pool_runs = out
        return self._pool_runs

    def _pooled(self, picked: pd.DataFrame) -> pd.DataFrame:
        picked = picked.copy()
        picked["pooled_runs"] = 0
        runs = self.pool_runs()
        for i, row in picked.iterrows():
            if row["status"] not in MEASURED or row["case_id"] not in runs:
                continue
            picked.loc[i, "pooled_runs"] = len(runs[row["case_id"]])
            for metric in METRIC_STAGE:
                x = self.samples_of(row, metric)
                if not len(x) or metric not in picked.columns:
                    continue
                if metric == "median_ms":
                    for key, v in stats.summarize(x).items():
                        if key in picked.columns:
                            picked[key] = picked[key].astype(object)
                            picked.at[i, key] = v
                else:
                    picked[metric] = picked[metric].astype(object)
                    picked.at[i, metric] = float(np.median(x))
        return picked.infer_objects()

    def round_medians(self, row, metric: str = "median_ms") -> np.ndarray:
        """The median of each round (each rebuild of the case) of the row's run, or of every
        pooled run: how far whole repetitions of the same code move apart on this machine."""
        stage = METRIC_STAGE.get(metric)
        if stage is None or self.samples.empty or "round" not in self.samples.columns:
            return np.array([])
        if self._round_medians is None:  # once per result set, not once per case
            keys = ["run_id", "case_id", "stage", "round"]
            self._round_medians = self.samples.groupby(keys)["ms"].median()
        cid = row["case_id"]
        runs = self.pool_runs().get(cid, [row["run_id"]]) if self.pool else [row["run_id"]]
        med = self._round_medians
        parts = [med.loc[(r, cid, stage)] for r in runs if (r, cid, stage) in med.index]
        return np.concatenate([p.to_numpy(dtype=float) for p in parts]) if parts else np.array([])

    def samples_of(self, row, metric: str = "median_ms") -> np.ndarray:
        """The raw samples behind `metric` of one picked row (empty if none were kept); for a
        pooled side, those of every pooled run of the case, concatenated in run order."""
        stage = METRIC_STAGE.get(metric)
        if stage is None or self.samples.empty:
            return np.array([])
        if self._by_key is None:
            groups = self.samples.groupby(["run_id", "case_id", "stage"], sort=False)["ms"]
            self._by_key = {k: g.to_numpy(dtype=float) for k, g in groups}
        cid = row["case_id"]
        runs = self.pool_runs().get(cid, [row["run_id"]]) if self.pool else [row["run_id"]]
        parts = [self._by_key.get((r, cid, stage), np.array([])) for r in runs]
        return np.concatenate(parts) if parts else np.array([])


def pick_rows(
    rows: pd.DataFrame, prefer_clean: bool = False, keys: tuple = PICK_KEYS
) -> pd.DataFrame:
    """One row per `keys` (PICK_KEYS; merge: case and host) by the ranking in the module
    docstring, in first-seen order."""
    if rows.empty:
        return rows
    df = rows.copy()
    df["_order"] = range(len(df))
    df["_status"] = df["status"].map(STATUS_RANK).fillna(2)
    df["_dirty"] = is_dirty(df) if prefer_clean else False
    keys = [k for k in keys if k in df.columns]
    key_cols = df[keys].astype(object)
    df["_key"] = key_cols.where(key_cols.notna(), "").astype(str).agg("|".join, axis=1)
    df = df.sort_values(
        ["_status", "_dirty", "timestamp", "run_id"], ascending=[True, True, False, False]
    )
    best = df.drop_duplicates("_key", keep="first").sort_values("_order")
    return best.drop(columns=["_order", "_status", "_dirty", "_key"]).reset_index(drop=True)


def read_csv(path: Path) -> pd.DataFrame:
    why = not_regular(path)
    if why is not None and not why.startswith("cannot"):  # a named pipe blocks open() for ever
        raise UserError(f"{path}: {why}, not a results file")
    try:
        df = pd.read_csv(path, dtype=TEXT_COLUMNS)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {e}") from None
    return df


def numeric(df: pd.DataFrame, columns, source) -> pd.DataFrame:
    """The given columns as numbers; text that is not a number (or a number that cannot be a
    time or a count: negative, NaN written out) is refused naming the file, column and row."""
    for col in columns:
        if col not in df.columns:
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna() & df[col].notna() & df[col].astype(str).str.strip().ne("")
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(
                f"{source}: {col}: not a number in data row {i + 1}: {df[col].iloc[i]!r}"
            )
        df[col] = values
    return df


def read_rows(path: str | Path) -> pd.DataFrame:
    """One results CSV's rows, migrated to today's columns (`migrate`), numeric columns as
    numbers (text in one is refused, never compared as a string)."""
    path = Path(path)
    whole_lines(path)
    rows = read_csv(path)
    missing = {"run_id", "case_id", "status"} - set(rows.columns)
    if missing:
        raise UserError(f"{path}: not a kvbench results CSV (no {', '.join(sorted(missing))})")
    rows = numeric(skip_bad_rows(rows, path).copy(), NUMERIC_COLUMNS, path)
    check_rows(rows, path)  # store/checks.py: timings that can be timings
    return migrate(rows, str(path))


def read_samples(path: Path) -> pd.DataFrame:
    """A raw-samples file: whole, its columns checked, `ms` finite and non-negative."""
    whole_lines(path)
    df = read_csv(path)
    missing = [c for c in ("case_id", "stage", "ms") if c not in df.columns]
    if missing:
        raise UserError(f"{path}: not a kvbench samples file (no {', '.join(missing)} column)")
    df = numeric(df, ("round", "sample", "ms"), path)
    bad = ~np.isfinite(df["ms"].to_numpy(dtype=float)) | (df["ms"] < 0).to_numpy()
    if bad.any():
        i = int(bad.nonzero()[0][0])
        raise UserError(f"{path}: ms: not a time in data row {i + 1}: {df['ms'].iloc[i]!r}")
    return df


def samples_path(csv_path: Path) -> Path:
    return csv_path.with_name(csv_path.name[: -len(".csv")] + ".samples.csv")


def is_results_csv(path: Path) -> bool:
    try:
        header = set(pd.read_csv(path, nrows=0).columns)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return False
    return {"run_id", "case_id", "status"} <= header


def is_samples_csv(path: Path) -> bool:
    try:
        header = set(pd.read_csv(path, nrows=0).columns)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return False
    return {"case_id", "stage", "ms"} <= header


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_output(out: str | Path, inputs=()) -> Path:
    """An -o file checked before any work: writable (files.check_output_file), not one of the
    inputs (nor the samples file beside an input run), and not an existing results or samples
    file anywhere: an output never overwrites what a run measured."""
    out = check_output_file(out)
    named = [Path(str(p)) for p in inputs if p is not None and Path(str(p)).is_file()]
    named += [samples_path(p) for p in named if p.name.endswith(".csv")]
    if any(_same_file(out, p) for p in named):
        raise UserError(f"{out}: -o: is one of the inputs; give another file name")
    if out.is_file() and (is_results_csv(out) or is_samples_csv(out)):
        raise UserError(
            f"{out}: -o: is a kvbench results file and is not overwritten; give another file name"
        )
    return out


def load_run(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run's rows and raw samples (samples empty when the file is missing)."""
    path = Path(path)
    if path.name.endswith(".samples.csv"):
        raise UserError(f"{path}: a raw-samples file; give the results CSV beside it")
    rows = read_rows(path)
    sp = samples_path(path)
    samples = read_samples(sp) if sp.exists() else pd.DataFrame()
    check_against_samples(rows, samples, path)
    if not samples.empty:
        # the samples file has no run_id column: every sample belongs to this file's run
        samples["run_id"] = rows["run_id"].iloc[0] if len(rows) else path.stem
    return rows, samples


def missing_samples(paths) -> list[str]:
    """A note for each run whose raw-samples file is absent: its rows cannot be tested."""
    return [
        f"{samples_path(Path(p))}: missing: the rows of this run have no raw samples, so no "
        "significance test is possible on them"
        for p in paths
        if not samples_path(Path(p)).exists()
    ]


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_dir(path: str | Path) -> ResultSet:
    path = Path(path)
    files = dir_files(path)  # other CSVs are skipped, with a word (store/checks.py)
    loaded = [load_run(p) for p in files]
    rows = _concat([r for r, _ in loaded])
    if rows.empty:
        raise UserError(f"{path}: no kvbench results in this directory")
    samples = _concat([s for _, s in loaded])
    return ResultSet(str(path), rows, samples, notes=missing_samples(files))


def load_ref(ref: str, results_dir: str | Path = "results", repo: str | Path = ".") -> ResultSet:
    sha = git.resolve_ref(ref, repo)
    if sha is None:
        raise UserError(f"{ref}: not a results CSV, a results directory or a git ref")
    if not Path(results_dir).is_dir():
        raise UserError(f"{ref}: results directory {results_dir} does not exist")
    everything = load_dir(results_dir)
    rows = everything.rows[everything.rows["commit"] == sha[:12]]
    if rows.empty:
        raise UserError(
            f"{ref}: commit {sha[:12]} has no results in {results_dir} "
            f"(run a suite at that commit, or `make compare BASE={ref}`)"
        )
    runs = set(rows["run_id"])
    s = everything.samples
    samples = s[s["run_id"].isin(runs)] if not s.empty else s
    notes = [n for n in everything.notes if any(f"/{r}.samples.csv:" in n for r in runs)]
    return ResultSet(f"{ref} ({sha[:12]})", rows, samples, prefer_clean=True, notes=notes)


def load(
    spec: str, results_dir: str | Path = "results", repo: str | Path = ".", pool: bool = False
) -> ResultSet:
    """A result set from a results CSV, a results directory or a git ref (see the docstring);
    pool=True pools every run of a case instead of picking the latest."""
    path = Path(spec)
    if path.exists() and not path.is_dir() and not path.is_file():
        raise UserError(f"{path}: {not_regular(path)}, not a results CSV or directory")
    if path.is_dir():
        rs = load_dir(path)
    elif path.is_file():
        rows, samples = load_run(path)
        if rows.empty:
            raise UserError(f"{path}: no rows")
        rs = ResultSet(str(path), rows, samples, notes=missing_samples([path]))
    else:
        rs = load_ref(spec, results_dir, repo)
    rs.pool = pool
    return rs


def load_runs(paths, source: str, pool: bool = True) -> ResultSet:
    """These run CSVs (not every run of a commit: gate's rounds of one side), pooled."""
    loaded = [load_run(p) for p in paths]
    rows = _concat([r for r, _ in loaded])
    if rows.empty:
        raise UserError(f"{source}: no rows in {', '.join(str(p) for p in paths)}")
    samples = _concat([s for _, s in loaded])
    return ResultSet(source, rows, samples, pool=pool, notes=missing_samples(paths))


def label(row) -> str:
    """A short human name for a row (Case.label's format; the benchmark name for imports)."""
    if not isinstance(row.get("model"), str):
        name = row.get("bench_name")
        return name if isinstance(name, str) else str(row.get("case_id"))
    return label_of(row)


def format_label(r) -> str:
    """A row's cache format with its group size, e.g. fp16, int4/g32 (one name for analysis and
    the report)."""
    g = r.get("group_size")
    return f"{r['kv_dtype']}/g{int(g)}" if pd.notna(g) else str(r["kv_dtype"])


def measured(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that carry a time (status ok or partial, a median), with their `fmt`
    (format_label)."""
    d = df[df["status"].isin(MEASURED) & df["median_ms"].notna()].copy()
    d["fmt"] = [format_label(r) for r in d.to_dict("records")] if len(d) else []
    return d

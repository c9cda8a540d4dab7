"""Writing results: one row per case (harness/store/schema.py's Record).

Results live in `<out>/<run_id>.csv` (one row per case) and `<out>/<run_id>.samples.csv` (every
raw sample: case_id, stage, round, sample, ms), and for rows that keep per-token values (the
quality phase) `<out>/<run_id>.tokens.csv` (store/tokens.py). A run claims the names
exclusively, then appends each finished case's samples and tokens and then its row
(ResultsWriter), so an interrupted or killed run leaves complete, readable files holding every
row measured so far, each with its samples (docs/reliability.md). This module imports neither
mlx nor kernels/.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from pathlib import Path

from kvbench.errors import UserError
from kvbench.files import append_bytes, create_exclusive, write_atomic
from kvbench.store.schema import COLUMNS, SAMPLE_COLUMNS, Record
from kvbench.store.tokens import TOKEN_COLUMNS, tokens_path


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def csv_text(header, rows) -> str:
    """CSV text of rows (sequences of cells; header None: rows only)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    if header is not None:
        w.writerow(header)
    w.writerows([_cell(v) for v in row] for row in rows)
    return buf.getvalue()


def write_csv_atomic(path: Path, header, rows) -> None:
    """Write rows (sequences matching header) to path via a uniquely named temporary file and a
    rename (harness/files.py: one-line error on failure, umask mode)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{path.parent}: cannot create the directory: {e.strerror}") from None
    write_atomic(path, csv_text(header, rows))


class ResultsWriter:
    """The files of one run: `claim` picks a run id no other run in the directory holds, by
    creating both files exclusively; `add` appends a row's raw samples, then the row (a row on
    disk always has its samples; a crash between the two leaves only unreferenced samples).
    Each append is one write of whole lines, cut back if it fails (files.append_bytes), so the
    files are readable at every moment and a run of n cases writes O(n) bytes, not O(n^2)."""

    def __init__(self, out_dir: str | Path, run_id: str):
        self.run_id = run_id
        self.csv_path = Path(out_dir) / f"{run_id}.csv"
        self.samples_path = Path(out_dir) / f"{run_id}.samples.csv"
        self.tokens_path = tokens_path(self.csv_path)  # created with the first per-token row
        self.records: list[Record] = []
        self.n_samples = 0
        self._created = False
        self._tokens_created = False

    def _create(self) -> bool:
        """Create both files with their headers; False when either already exists (or a stray
        per-token file holds the run id)."""
        if self.tokens_path.exists():
            return False
        if not create_exclusive(self.csv_path, csv_text(COLUMNS, []).encode()):
            return False
        if not create_exclusive(self.samples_path, csv_text(SAMPLE_COLUMNS, []).encode()):
            self.csv_path.unlink(missing_ok=True)  # a stray samples file holds this name
            return False
        self._created = True
        return True

    @classmethod
    def claim(cls, out_dir: str | Path, base: str) -> ResultsWriter:
        """A writer for run id base (or base-2, base-3, ...: the first free one in out_dir)."""
        for n in range(1, 10_000):
            w = cls(out_dir, base if n == 1 else f"{base}-{n}")
            if w._create():
                return w
        raise UserError(f"{out_dir}: --out: no free run id for {base}")

    def discard_if_empty(self) -> None:
        """Remove the claimed files when no row was written (a run stopped before its first)."""
        if self._created and not self.records:
            self.csv_path.unlink(missing_ok=True)
            self.samples_path.unlink(missing_ok=True)
            self.tokens_path.unlink(missing_ok=True)

    def add(self, record: Record, samples: list[tuple] = (), tokens: list[tuple] = ()) -> None:
        self.add_many([(record, samples, tokens)])

    def add_many(self, items: list[tuple]) -> None:
        """Append several rows at once, each (record, samples) or (record, samples, tokens): all
        their samples and per-token lines first, then the rows."""
        if not self._created and not self._create():
            raise UserError(f"{self.csv_path}: exists already; results are never overwritten")
        samples = [s for item in items for s in item[1]]
        append_bytes(self.samples_path, csv_text(None, samples).encode())
        self.n_samples += len(samples)
        self._add_tokens([t for item in items if len(item) > 2 for t in item[2]])
        rows = [dataclasses.astuple(item[0]) for item in items]
        append_bytes(self.csv_path, csv_text(None, rows).encode())
        self.records += [item[0] for item in items]

    def _add_tokens(self, lines: list[tuple]) -> None:
        if not lines:
            return
        if not self._tokens_created:
            head = csv_text(TOKEN_COLUMNS, []).encode()
            if not create_exclusive(self.tokens_path, head):
                raise UserError(f"{self.tokens_path}: exists already; results are never "
                                "overwritten")  # fmt: skip
            self._tokens_created = True
        append_bytes(self.tokens_path, csv_text(None, lines).encode())

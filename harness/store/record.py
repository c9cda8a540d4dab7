"""Records: one row per case. The Record's fields are the CSV header, in order; its case block
is the axis table (kvbench.axes), in the table's order.

Results live in `<out>/<run_id>.csv` (one row per case) and `<out>/<run_id>.samples.csv` (every
raw sample: case_id, stage, round, sample, ms). Both files are rewritten atomically (temporary
file + rename) after every finished case, so an interrupted run leaves complete, readable files
holding every row measured so far. This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.axes import TABLE, Axis


@dataclass(frozen=True)
class _Head:
    # identity
    run_id: str | None = None
    suite: str | None = None
    case_id: str | None = None
    status: str | None = None  # ok | error | skipped | partial
    error: str | None = None
    bench_name: str | None = None  # imported rows: the benchmark's own name (pytest-benchmark)


@dataclass(frozen=True)
class _Measured:
    # latency of one timed call (decode step over all layers, or the whole prefill)
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    iqr_ms: float | None = None
    cv: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    n_samples: int | None = None
    unstable: bool | None = None
    write_ms: float | None = None  # median of the write (and quantize) stage alone
    attend_ms: float | None = None  # median of the attention stage alone
    mask_ms: float | None = None  # median of the mask-building stage alone (unified layout)
    # traffic and throughput (explicit model, harness/engines/metrics.py)
    bytes_read: int | None = None
    bytes_written: int | None = None
    gbps: float | None = None
    peak_gbps: float | None = None
    peak_method: str | None = None
    pct_peak_bw: float | None = None
    flops: int | None = None
    tflops: float | None = None
    tokens_per_s: float | None = None
    # memory
    # kv_bytes: exact format bytes of the K/V the case holds: n_seqs x context_len for the
    # cache engine, the occupied cells for a workload
    kv_bytes: int | None = None
    bits_per_elem: float | None = None  # stored bits per K/V element, scales included
    # bits of one K/V element's code alone, scales excluded (from the format, kernels/ at run
    # time, so the report need not import kernels/; store/migrate_v1.py for older rows)
    data_bits: int | None = None
    alloc_bytes: int | None = None  # measured: active-memory growth when the cache is allocated
    peak_mem_bytes: int | None = None  # measured: peak above the pre-cache baseline (stages)
    fill_peak_bytes: int | None = None  # measured: peak above it while allocating + filling
    # many-sequence layouts (docs/streams.md): cells per layer, bytes over all layers, K and V
    cells_alloc: int | None = None  # cells allocated (all streams)
    cells_used: int | None = None  # occupied cells at the timed step (a shared cell once)
    n_kv: int | None = None  # extent attended over (largest of the step's calls), padded
    bytes_alloc: int | None = None  # format bytes of cells_alloc
    bytes_used: int | None = None  # format bytes of cells_used
    kv_util: float | None = None  # cells_used / cells_alloc
    bytes_touched: int | None = None  # K/V bytes the step's attention covers (n_kv per seq)
    bytes_needed: int | None = None  # K/V bytes of each sequence's own cells only
    # paged layout (docs/layouts.md): pages per layer; the block table once for all layers
    pages_alloc: int | None = None  # pages in the pool
    pages_used: int | None = None  # pages held by some sequence at the timed step
    pages_cow: int | None = None  # pages copied on write (a partly shared last page)
    page_frag: float | None = None  # internal fragmentation: empty slots / slots of used pages
    block_table_bytes: int | None = None  # int32 block tables, n_seqs x the longest table
    edit_units: int | None = None  # kv_edit: keys re-rotated or cells moved by one edit
    # accuracy vs the float32 reference on the un-quantized K/V
    max_abs_err: float | None = None
    rel_err: float | None = None
    cosine: float | None = None
    kv_recon_err: float | None = None  # relative L2 error of decoded K/V vs the originals
    # context
    commit: str | None = None
    dirty: bool | None = None
    branch: str | None = None
    timestamp: str | None = None
    host: str | None = None
    os: str | None = None
    device: str | None = None
    backend: str | None = None
    mlx_version: str | None = None
    kvbench_version: str | None = None
    schema_version: int | None = None
    peer_version: str | None = None  # peer kernels: their package and version ("mlx-lm 0.32.2")
    # "kvbench" (kvbench's own kernel) or "peer" (kernels/peers.py), recorded at run time so
    # that analysis needs no copy of the peer registry; store/migrate_v1.py for older rows
    kernel_kind: str | None = None


def record_class(table: tuple[Axis, ...] = TABLE) -> type:
    """The Record: the head columns, then one column per axis of `table` (derived ones too), then
    the measured columns; every field optional (an error row has no times)."""
    case_block = [(a.name, _optional(a.type), field(default=None)) for a in table]
    spec = [(f.name, f.type, field(default=None)) for f in dataclasses.fields(_Head)]
    spec += case_block
    spec += [(f.name, f.type, field(default=None)) for f in dataclasses.fields(_Measured)]
    cls = dataclasses.make_dataclass("Record", spec, frozen=True)
    cls.__module__ = __name__
    return cls


def _optional(annotation: str) -> str:
    return annotation if "None" in annotation else f"{annotation} | None"


Record = record_class()


COLUMNS = tuple(f.name for f in dataclasses.fields(Record))
SAMPLE_COLUMNS = ("case_id", "stage", "round", "sample", "ms")


def make_record(**values) -> Record:
    """A Record from some of its fields; a key that is not a column raises (a forgotten column
    would otherwise vanish from the CSV)."""
    unknown = sorted(set(values) - set(COLUMNS))
    if unknown:
        raise TypeError(f"make_record: not Record columns: {', '.join(unknown)}")
    return Record(**values)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv_atomic(path: Path, header, rows) -> None:
    """Write rows (sequences matching header) to path via a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows([_cell(v) for v in row] for row in rows)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultsWriter:
    """Accumulates records and raw samples of one run; rewrites both files on every add."""

    def __init__(self, out_dir: str | Path, run_id: str):
        self.csv_path = Path(out_dir) / f"{run_id}.csv"
        self.samples_path = Path(out_dir) / f"{run_id}.samples.csv"
        self.records: list[Record] = []
        self.samples: list[tuple] = []

    def add(self, record: Record, samples: list[tuple] = ()) -> None:
        self.records.append(record)
        self.samples.extend(samples)
        write_csv_atomic(self.csv_path, COLUMNS, [dataclasses.astuple(r) for r in self.records])
        write_csv_atomic(self.samples_path, SAMPLE_COLUMNS, self.samples)

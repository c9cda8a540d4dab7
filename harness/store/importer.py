"""import: pytest-benchmark JSON -> kvbench results CSV (+ raw samples), for compare and report.

What maps, and from where (nothing else is filled in; absent means empty, never guessed):
  * timing: the raw data (`--benchmark-save-data`: stats.data, seconds per call): the samples
    file gets every round and the statistics are kvbench's own (harness/stats.py summarize).
    A benchmark without raw data (no stats, no stats.data, or an empty list) is refused: a row
    whose figures no sample backs cannot be tested, and `stats.data: []` beside `rounds: 20`
    used to become an ok row claiming 20 samples (issue 27).
  * the case: extra_info["case"] (the Case fields; kvbench's benchmarks store them), so rows
    join `kvbench run` rows on case_id; a foreign benchmark gets case_id = sha1(fullname)[:12].
  * context: commit_info (commit, dirty, branch), machine_info (host, os), datetime
    (timestamp), extra_info (device, backend, mlx_version, kvbench_version).
This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
from pathlib import Path

from kvbench import SCHEMA_VERSION
from kvbench.axes import TABLE
from kvbench.errors import UserError
from kvbench.files import check_output_dir, read_text
from kvbench.stats import summarize
from kvbench.store.schema import COLUMNS, SAMPLE_COLUMNS, make_record
from kvbench.store.writer import write_csv_atomic

MS_PER_S = 1e3  # pytest-benchmark's samples are seconds; kvbench writes milliseconds
MAX_SAMPLE_MS = 1e12  # about 32 years: a sample beyond it is no time (its statistics overflow)
CONTEXT_KEYS = ("device", "backend", "mlx_version", "kvbench_version")
STAT_KEYS = ("median", "iqr", "mean", "stddev", "rounds")


def _load(path: Path) -> dict:
    text = read_text(path)  # capped, strict UTF-8 (harness/files.py)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: cannot read JSON: {e}") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a pytest-benchmark JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise UserError(f"{path}: benchmarks: not a pytest-benchmark JSON (--benchmark-json)")
    _check(path, doc)
    return doc


def _check(path: Path, doc: dict) -> None:
    """Every key the import reads has the type it needs, else UserError naming file and key."""

    def need(ok: bool, key: str, reason: str) -> None:
        if not ok:
            raise UserError(f"{path}: {key}: {reason}")

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def timing(key: str, v) -> None:  # a time or a count: a finite number, not negative
        need(number(v), key, f"not a number: {v!r}")
        need(math.isfinite(v) and v >= 0, key, f"not a time (negative or not finite): {v!r}")

    for key in ("commit_info", "machine_info"):
        need(isinstance(doc.get(key) or {}, dict), key, "not a mapping")
    for key in ("id", "branch"):
        v = (doc.get("commit_info") or {}).get(key)
        need(v is None or isinstance(v, str), f"commit_info.{key}", f"not text: {v!r}")
    stamp = doc.get("datetime")
    if stamp:
        try:
            _iso(stamp)
        except (TypeError, ValueError):
            need(False, "datetime", f"not an ISO 8601 time: {stamp!r}")
    for i, bench in enumerate(doc["benchmarks"]):
        where = f"benchmarks[{i}]"
        need(isinstance(bench, dict), where, "not a mapping")
        need(isinstance(bench.get("fullname"), str), f"{where}.fullname", "missing")
        for key in ("extra_info", "stats"):
            need(isinstance(bench.get(key) or {}, dict), f"{where}.{key}", "not a mapping")
        stats = bench.get("stats") or {}
        for key in STAT_KEYS:
            if stats.get(key) is not None:
                timing(f"{where}.stats.{key}", stats[key])
        data = stats.get("data")
        need(data not in (None, []), f"{where}.stats.data", "no raw samples (run pytest with "
             "--benchmark-save-data; a row without samples cannot be compared)")  # fmt: skip
        need(isinstance(data, list), f"{where}.stats.data", "not a list")
        for j, v in enumerate(data):
            timing(f"{where}.stats.data[{j}]", v)
            ms = v * MS_PER_S  # checked in the unit written: 1e308 s is finite, in ms it is not
            need(ms <= MAX_SAMPLE_MS, f"{where}.stats.data[{j}]",
                 f"{v!r} s is {ms:g} ms: not a time (at most {MAX_SAMPLE_MS:g} ms)")  # fmt: skip
        case = (bench.get("extra_info") or {}).get("case")
        for axis, reason in _case_problems(case if isinstance(case, dict) else {}):
            need(False, f"{where}.extra_info.case.{axis}", reason)


def _case_problems(case: dict) -> list[tuple[str, str]]:
    """Case fields whose value has the wrong type for its axis (a text context_len would be
    written, then break every reader of the file)."""
    kinds = {"int": int, "float": (int, float), "str": str}
    out = []
    for axis in TABLE:
        v = case.get(axis.name)
        if v is None and (axis.name not in case or "None" in axis.type):
            continue
        kind = kinds[axis.type.split(" | ")[0]]
        if isinstance(v, bool) or not isinstance(v, kind):
            out.append((axis.name, f"not {axis.type.split(' | ')[0]}: {v!r}"))
    return out


def context(doc: dict) -> dict:
    commit, machine = doc.get("commit_info") or {}, doc.get("machine_info") or {}
    sha = commit.get("id")
    os_parts = [machine.get(k) for k in ("system", "release", "machine")]
    stamp = doc.get("datetime")
    return {
        "commit": sha[:12] if sha else None,
        "dirty": commit.get("dirty"),
        "branch": commit.get("branch"),
        "timestamp": _iso(stamp) if stamp else None,
        "host": machine.get("node"),
        "os": " ".join(os_parts) if all(os_parts) else None,
        "schema_version": SCHEMA_VERSION,
        "suite": "pytest-benchmark",
    }


def _iso(stamp: str) -> str:
    t = dt.datetime.fromisoformat(stamp)
    t = t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).isoformat(timespec="seconds")


def run_id_for(ctx: dict) -> str:
    t = dt.datetime.fromisoformat(ctx["timestamp"]) if ctx["timestamp"] else None
    stamp = t.strftime("%Y%m%dT%H%M%SZ") if t else "undated"
    return f"{stamp}-{(ctx['commit'] or 'nogit')[:8]}-pytest"


def case_fields(bench: dict) -> dict:
    extra = bench.get("extra_info") or {}
    case = extra.get("case") if isinstance(extra.get("case"), dict) else {}
    out = {k: v for k, v in case.items() if k in COLUMNS}
    if case.get("n_q_heads") and case.get("n_kv_heads"):
        out["gqa_ratio"] = case["n_q_heads"] // case["n_kv_heads"]  # as kvbench run derives it
    out["case_id"] = (
        extra.get("case_id") or hashlib.sha1(bench["fullname"].encode()).hexdigest()[:12]
    )
    out.update({k: extra[k] for k in CONTEXT_KEYS if k in extra})
    return out


def timing(stats: dict) -> tuple[dict, list[float]]:
    """Row statistics and raw samples (ms) from a benchmark's stats (raw data checked present)."""
    samples_ms = [float(s) * MS_PER_S for s in stats["data"]]  # pytest-benchmark: seconds per call
    return summarize(samples_ms), samples_ms


def convert(doc: dict) -> tuple[list, list]:
    """(records, sample rows) for every benchmark in a pytest-benchmark document."""
    ctx = context(doc)
    ctx["run_id"] = run_id_for(ctx)
    records, samples = [], []
    for bench in doc["benchmarks"]:
        fields = case_fields(bench)
        stats, raw = timing(bench.get("stats") or {})
        records.append(
            make_record(**ctx, **fields, **stats, status="ok", bench_name=bench["fullname"])
        )
        samples += [(fields["case_id"], "step", 0, i, ms) for i, ms in enumerate(raw)]
    return records, samples


def import_file(path: str | Path, out_dir: str | Path = "results") -> tuple[Path, int]:
    """Write <out_dir>/<run_id>.csv and .samples.csv from a pytest-benchmark JSON file."""
    records, samples = convert(_load(Path(path)))
    if not records:
        raise UserError(f"{path}: benchmarks: empty")
    check_output_dir(out_dir, 0)
    # the samples first: the rows never exist on disk without them
    csv_path = Path(out_dir) / f"{records[0].run_id}.csv"
    for path in (csv_path, csv_path.with_name(csv_path.stem + ".samples.csv")):
        if path.exists():  # the same file imported before, or another run of that name
            raise UserError(f"{path}: --out: exists and is not overwritten (imported already?)")
    write_csv_atomic(csv_path.with_name(csv_path.stem + ".samples.csv"), SAMPLE_COLUMNS, samples)
    write_csv_atomic(csv_path, COLUMNS, [dataclasses.astuple(r) for r in records])
    return csv_path, len(records)

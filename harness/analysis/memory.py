"""Exact, resident and peak memory of each case side by side (pandas only; no mlx, no kernels/).

* exact: kv_bytes, the format's byte formula for the K/V the case holds;
* declared: cache_bytes, the bytes of the cache's arrays (capacity, padding and free cells);
* resident: resident_bytes, active memory above the case's pre-cache baseline after the fill
  (the residency gate, harness/engines/residency.py: never below declared in an ok row); for
  llama.cpp rows, the KV buffer llama.cpp reports in its log (peer_kv_bytes);
* peak: peak_mem_bytes, the peak above the same baseline during the timed stages (llama.cpp:
  its context's buffers as it reports them, allocated up front).
Byte counts need no interval: two figures differ when their ratio is beyond SAME_TOL.
"""

from __future__ import annotations

import pandas as pd

from kvbench.store.results import format_label
from kvbench.store.status import MEASURED

SAME_TOL = 0.01  # the residency gate's tolerance: ratios within 1% read as equal
LLAMACPP_SOURCE = "llama.cpp's own figures"


def _col(d: pd.DataFrame, name: str) -> pd.Series:
    return d[name].astype(float) if name in d else pd.Series(float("nan"), index=d.index)


def memory_rows(cur: pd.DataFrame) -> pd.DataFrame:
    """Measured rows with a resident figure, with exact_b, declared_b, resident_b, end_b,
    peak_b, the ratios resident_x (resident / exact) and peak_x (peak / resident), and source
    (measured by kvbench, or llama.cpp's own figures)."""
    if "status" not in cur or "kv_bytes" not in cur:
        return cur.iloc[0:0]
    d = cur[cur["status"].isin(MEASURED) & cur["kv_bytes"].notna()].reset_index(drop=True)
    measured = _col(d, "resident_bytes")
    resident = measured.fillna(_col(d, "peer_kv_bytes"))
    exact, peak = d["kv_bytes"].astype(float), _col(d, "peak_mem_bytes")
    new = pd.DataFrame(
        {
            "resident_b": resident,
            "source": measured.notna().map({True: "kvbench", False: LLAMACPP_SOURCE}),
            "exact_b": exact,
            "declared_b": _col(d, "cache_bytes"),
            "end_b": _col(d, "resident_end_bytes"),
            "peak_b": peak,
            "resident_x": resident / exact,
            "peak_x": peak / resident,
            "fmt": [format_label(r) for r in d.to_dict("records")] if len(d) else [],
        },
        index=d.index,
    )
    d = pd.concat([d.drop(columns=[c for c in new if c in d]), new], axis=1)
    if "layout" not in d:
        d["layout"] = "per-stream"
    return d[d["resident_b"].notna()].copy()


def _span(x: pd.Series) -> str:
    lo, hi = float(x.min()), float(x.max())
    return f"×{lo:.3g}" if round(lo, 2) == round(hi, 2) else f"×{lo:.3g}–{hi:.3g}"


def _cases(n: int) -> str:
    return f"{n} case" if n == 1 else f"{n} cases"


def _resident_clause(g: pd.DataFrame) -> str:
    x = g["resident_x"]
    if (x < 1 - SAME_TOL).any():
        short = g[x < 1 - SAME_TOL]
        return (
            f"resident falls SHORT of exact in {len(short)} of {_cases(len(g))} "
            f"({_span(short['resident_x'])}): part of the cache is not there"
        )
    if (x <= 1 + SAME_TOL).all():
        return f"resident = exact ({_span(x)}, {_cases(len(g))})"
    decl = (g["declared_b"] / g["exact_b"]).dropna()
    if decl.empty:
        why = "the cache holds more than its K/V (capacity, padding, free cells)"
    elif (decl <= 1 + SAME_TOL).all():
        why = "its arrays hold exactly the K/V, the rest is other arrays kept beside the cache"
    else:
        why = f"its arrays declare {_span(decl)} exact (capacity, padding, free cells)"
    return f"resident {_span(x)} exact ({_cases(len(g))}): {why}"


def _peak_clause(g: pd.DataFrame) -> str:
    x = g["peak_x"].dropna()
    if x.empty:
        return "no peak recorded"
    if (x < 1 - SAME_TOL).any():
        return f"peak {_span(x)} resident: BELOW it, so not measured from the same baseline"
    if (x <= 1 + SAME_TOL).all():
        return f"peak = resident ({_span(x)})"
    return f"peak {_span(x)} resident: the timed stages allocate beyond the cache"


def memory_lines(cur: pd.DataFrame) -> list[str]:
    """One line per layout (and figure source): how resident compares with exact, and peak
    with resident, over its cases."""
    d = memory_rows(cur)
    lines = []
    for (layout, source), g in d.groupby(["layout", "source"], sort=True):
        who = "" if source == "kvbench" else f" ({source})"
        lines.append(f"{layout}{who}: {_resident_clause(g)}; {_peak_clause(g)}")
    return lines

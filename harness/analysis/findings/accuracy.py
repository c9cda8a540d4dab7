"""Topic "accuracy": per format, the median relative error of the attention output against
float32 [accuracy]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding, measured

TOPIC = "accuracy"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = measured(cur)
    d = d[d["rel_err"].notna()] if "rel_err" in d else d.iloc[0:0]
    if d["fmt"].nunique() < 2:
        return []
    g = d.groupby("fmt").agg(err=("rel_err", "median"), bits=("bits_per_elem", "first"),
                             n=("rel_err", "size")).sort_values("bits")  # fmt: skip
    line = "{}: attention rel. error {:.2g} (median of {} cases) at {:.3g} bits/elem"
    return [
        Finding(TOPIC, line.format(f, r.err, int(r.n), r.bits), "accuracy", True)
        for f, r in g.iterrows()
    ]

"""Topic "accuracy": per cache configuration (the format and every cache choice that varies: a
rotation, a V format, ...), the median relative error of the attention output against float32
over the cases of one model and context (common.group_axes: the workload's other axes and the
kernels are pooled, the choices kept apart) [accuracy]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import (
    KEPT_APART,
    WORKLOAD_AXES,
    Finding,
    apart_text,
    config_of,
    group_axes,
    groups,
    measured,
    varying,
    with_role,
)

TOPIC = "accuracy"
LINE = "{}: attention rel. error {:.2g} (median of {} cases) at {:.3g} bits/elem"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = measured(cur)
    d = d[d["rel_err"].notna()] if "rel_err" in d else d.iloc[0:0]
    choices = varying(d, with_role("choice"))
    if d.empty or d["fmt"].nunique() < 2:  # one format: nothing to set side by side
        return []
    pooled = [a for a in WORKLOAD_AXES if a not in KEPT_APART]
    lines = []
    for values, g in groups(d, group_axes(d, pooled=pooled)):
        named = list(dict.fromkeys(["kv_dtype", *choices]))  # the format always
        head = config_of(g.iloc[0], named) + apart_text(values, d)
        bits = g["bits_per_elem"].iloc[0]
        ctx = values.get("context_len")
        order = (str(values.get("model")), ctx if ctx == ctx else 0, bits, head)  # fewest bits
        lines.append((order, LINE.format(head, g["rel_err"].median(), len(g), bits)))
    return [Finding(TOPIC, text, "accuracy", True) for _, text in sorted(lines)]

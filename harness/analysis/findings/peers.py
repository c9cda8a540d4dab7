"""Topic "kvbench vs peers": each kvbench kernel against the fastest peer kernel of the same
case [peers]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import (
    Finding,
    baseline,
    is_peer,
    measured,
    span,
    stated,
    tally,
)

TOPIC = "kvbench vs peers"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = measured(cur)
    if d.empty:
        return []
    peer = is_peer(d)
    if not peer.any() or peer.all():
        return []
    m = baseline(d[~peer], d[peer], "kernel")
    out = []
    for kernel, g in m.groupby("kernel", sort=True):
        best = ", ".join(f"{k} ({n})" for k, n in g["kernel_b"].value_counts().items())
        text = (
            f"{kernel}: {span(g['ratio'])} the best peer's time ({tally(g['verdict'])} of "
            f"{len(g)} cases; best peer: {best})"
        )
        out.append(Finding(TOPIC, text, "peers", stated(g)))
    return out

"""Topic "quality by position": per quality row where kl_pos* exist, KL of the first and last
quarter of the scored half, on how many tokens each (described, not judged: no interval)
[qualityctx]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding
from kvbench.analysis.findings.tasks import ctx_text, task_rows

TOPIC = "quality by position"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = task_rows(cur, "quality", "kl_pos1")
    out = []
    for r in d.to_dict("records"):
        first, last = r["kl_pos1"], r["kl_pos4"]
        ratio = f", last / first {last / first:.3g}" if first > 0 else ""
        text = (
            f"{r['config']} at {ctx_text(r['context_len'])}: KL {first:.3g} in the first "
            f"quarter of the scored half ({int(r['n_pos1'])} tokens), {last:.3g} in the last "
            f"({int(r['n_pos4'])} tokens){ratio} (no interval: a description, not a verdict)"
        )
        out.append(Finding(TOPIC, text, "qualityctx", False))
    return out

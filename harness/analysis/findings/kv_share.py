"""Topic "KV share of a model step": how much of a real model's decode step is the KV cache
(write + attention over the stored cache, each timed on its own) across context, the context
where it passes one half, and each format's KV bytes beside its KV time against fp16
(analysis/kv_share.py) [kvshare]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis import kv_share
from kvbench.analysis.findings.common import Finding

TOPIC = "KV share of a model step"


def _ctx(x: float) -> str:
    return f"{x:,.0f}"


def half_line(r) -> str:
    where = {
        "measured": f"passes half at ctx ~{_ctx(r.half_ctx or 0)} (between measured contexts)",
        "extrapolated": f"would pass half at ctx ~{_ctx(r.half_ctx or 0)} (extrapolated from "
        "straight-line fits of the KV part and the rest over the measured contexts)",
        "never": "does not pass half on these contexts' trend (the rest grows as fast or faster)",
        "one context": "is under half (one context measured: no trend to extrapolate)",
        "below": f"is past half already at ctx {r.ctx_min}",
    }[r.half_how]
    span = (f"{r.share_min:.0%} of the step at ctx {r.ctx_min}"
            + (f", {r.share_max:.0%} at ctx {r.ctx_max}" if r.contexts > 1 else ""))  # fmt: skip
    return f"{r.model}, {r.config}: the KV part (write + attention) is {span}; it {where}"


def find(cur: pd.DataFrame) -> list[Finding]:
    out = [Finding(TOPIC, half_line(r), "kvshare", False)
           for r in kv_share.half_table(cur).itertuples()]  # fmt: skip
    bt = kv_share.bytes_vs_time(cur)
    if bt.empty:
        return out
    for r in bt.sort_values(["model", "config", "context_len"]).itertuples():
        text = (f"{r.model}, {r.config} at ctx {int(r.context_len)}: KV bytes {r.bytes_ratio:.2f}x "
                f"fp16's, KV time {r.time_ratio:.2f}x fp16's fastest ({r.kv_ms:.3g} ms against "
                f"{r.kv_ms_base:.3g} ms with {r.kernel_base})")  # fmt: skip
        out.append(Finding(TOPIC, text, "kvshare", False))
    return out

"""Topic "decode-time error": per (model, context), each configuration's tokens to the first
divergence from the float32 cache's greedy continuation, agreement, and teacher-forced KL, on
how many positions [generate]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding
from kvbench.analysis.findings.tasks import ctx_text, task_rows

TOPIC = "decode-time error"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = task_rows(cur, "generate", "gen_kl_mean")
    out = []
    for (model, ctx), part in d.groupby(["model", "context_len"], sort=False):
        for r in part.sort_values("gen_kl_mean").itertuples():
            least = int(r.gen_first_diverge_min)
            text = (
                f"{r.config} at {ctx_text(ctx)} ({model}): first divergence from the float32 "
                f"cache after {r.gen_first_diverge:.3g} tokens (least {least}"
                f"), agreement {r.gen_agree:.2f}, teacher-forced KL {r.gen_kl_mean:.3g} on "
                f"{int(r.gen_tokens_scored)} positions"
            )
            out.append(Finding(TOPIC, text, "generate", True))
    return out

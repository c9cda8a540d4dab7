"""Topic "decode-time error": per (model, context), each configuration's tokens to the first
divergence from the float32 cache's greedy continuation, agreement, and teacher-forced KL, on
how many positions [generate]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import (
    KEPT_APART,
    WORKLOAD_AXES,
    Finding,
    group_axes,
    groups,
    with_role,
)
from kvbench.analysis.findings.tasks import ctx_text, task_rows

TOPIC = "decode-time error"


def find(cur: pd.DataFrame) -> list[Finding]:
    d = task_rows(cur, "generate", "gen_kl_mean")
    out = []
    # one group per model and context (common.group_axes; the configurations are each a line)
    pooled = [a for a in WORKLOAD_AXES if a not in KEPT_APART]
    for values, part in groups(d, group_axes(d, compared=with_role("choice"), pooled=pooled)):
        model, ctx = values["model"], values["context_len"]
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

"""The KV share of a model step (analysis/kv_share.py, its finding topic and figure) by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.analysis import kv_share
from kvbench.analysis.findings import kv_share as topic
from kvbench.report.kvshare import kv_share_figure
from kvbench.store.schema import COLUMNS


def row(fmt, ctx, write, attend, step, kv_bytes, kernel="sdpa", group=None, **kw) -> dict:
    r = dict.fromkeys(COLUMNS)
    r.update(status="ok", phase="model_decode", model="m", kv_dtype=fmt, group_size=group,
             kernel=kernel, context_len=ctx, write_ms=write, attend_ms=attend, median_ms=step,
             kv_bytes=kv_bytes, case_id=f"{fmt}{ctx}", **kw)  # fmt: skip
    return r


def rows() -> pd.DataFrame:
    """fp16: KV 10 ms + 1 ms per 1K of context, the rest 90 ms flat: shares 11/101, 14/104,
    26/116 at 1K, 4K, 16K; passes half where 10 + x/1K = 90, x = 80K (extrapolated).
    int8: KV 20 + 6 per 1K, the rest 80: 26/106 at 1K, 44/124 at 4K, 116/196 at 16K: half
    between 4K (0.355) and 16K (0.592)."""
    out = []
    for ctx in (1024, 4096, 16384):
        k = ctx / 1024
        out.append(row("fp16", ctx, 5 + k / 2, 5 + k / 2, 100 + k, 2000 * ctx))
        out.append(row("int8", ctx, 10 + 3 * k, 10 + 3 * k, 100 + 6 * k, 1000 * ctx,
                       kernel="dequant_sdpa", group=32))  # fmt: skip
    return pd.DataFrame(out)


def test_share_and_half_context_by_hand():
    t = kv_share.half_table(rows()).set_index("config")
    fp16, int8 = t.loc["fp16 · sdpa"], t.loc["int8/g32 · dequant_sdpa"]
    assert fp16["share_min"] == pytest.approx(11 / 101) and fp16["half_how"] == "extrapolated"
    assert fp16["half_ctx"] == pytest.approx(80 * 1024)
    s4, s16 = 44 / 124, 116 / 196
    want = 4096 + (0.5 - s4) * (16384 - 4096) / (s16 - s4)
    assert int8["half_how"] == "measured" and int8["half_ctx"] == pytest.approx(want)


def test_never_and_below():
    d = pd.DataFrame([row("fp16", 1024, 1, 1, 100, 1), row("fp16", 2048, 1, 1, 200, 2)])
    assert kv_share.half_context(kv_share.share_rows(d)) == (None, "never")
    d = pd.DataFrame([row("fp16", 1024, 40, 40, 100, 1), row("fp16", 2048, 60, 60, 150, 2)])
    assert kv_share.half_context(kv_share.share_rows(d)) == (1024.0, "below")


def test_bytes_beside_time_and_the_finding_lines():
    bt = kv_share.bytes_vs_time(rows()).set_index("context_len")
    assert bt.loc[4096, "bytes_ratio"] == 0.5 and bt.loc[4096, "time_ratio"] == pytest.approx(
        44 / 14
    )
    lines = [f.text for f in topic.find(rows())]
    assert any("int8/g32 · dequant_sdpa" in t and "between measured contexts" in t for t in lines)
    assert any("at ctx 4096: KV bytes 0.50x fp16's, KV time 3.14x fp16" in t for t in lines)


def test_rows_without_the_kv_parts_give_no_figure_or_finding():
    d = rows().assign(write_ms=None)
    assert kv_share_figure(d) is None and topic.find(d) == []
    fig = kv_share_figure(rows())
    assert set(fig.table["cache · kernel"]) == {"fp16 · sdpa", "int8/g32 · dequant_sdpa"}
    assert len(fig.fig.data) == 4


def test_the_base_is_fp16s_fastest_kernel_and_one_context_has_no_trend():
    """Two fp16 kernels at 1K (KV 11 ms sdpa, 40 ms reference): int8's ratio is against 11."""
    d = rows()
    d = pd.concat([d, pd.DataFrame([row("fp16", 1024, 20, 20, 100, 2000 * 1024,
                                        kernel="reference")])])  # fmt: skip
    bt = kv_share.bytes_vs_time(d).set_index("context_len")
    assert bt.loc[1024, "kv_ms_base"] == 11 and bt.loc[1024, "kernel_base"] == "sdpa"
    one = pd.DataFrame([row("fp32", 1024, 1, 1, 100, 1)])
    assert kv_share.half_context(kv_share.share_rows(one)) == (None, "one context")

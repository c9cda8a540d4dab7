"""The report of a real model's tasks (harness/report/tasks.py, harness/analysis/findings/
retrieval.py, generate.py, by_position.py) on hand-made rows: the findings' counts and Wilson
intervals by hand, the Pareto per model and context, the retrieval heatmap's cells, and the page
in headless chromium. The numbers are invented rows for structure, never reported as
measurements."""

from __future__ import annotations

import pandas as pd
import pytest
import report_browser

from kvbench.analysis.findings import by_position, findings, generate, retrieval
from kvbench.analysis.findings.tasks import config_label
from kvbench.report import tasks
from kvbench.report.page import write_report
from kvbench.stats import wilson
from kvbench.store.schema import COLUMNS


def row(**kw) -> dict:
    r = dict.fromkeys(COLUMNS)
    r.update(
        run_id="20261125T120000Z-abc",
        suite="q",
        status="ok",
        model="smollm2-135m",
        n_layers=30,
        n_q_heads=9,
        n_kv_heads=3,
        head_dim=64,
        kernel="reference",
        k_axis="token",
        sink_tokens=0,
        recent_tokens=0,
        timestamp="2026-11-25T12:00:00",
        device="cpu",
        backend="cpu",
        case_id=str(len(kw)) + str(sorted(kw.items())),
    )
    r.update(kw)
    return r


def retrieval_rows() -> list[dict]:
    """passkey at 8192 over two depths, 10 trials each: int4 6 + 6 = 12/20, fp16 20/20;
    at 4096 int4 9 + 10, fp16 10 + 10 (overlapping intervals)."""
    out = []
    cells = {
        (8192, "int4"): (6, 6),
        (8192, "fp16"): (10, 10),
        (4096, "int4"): (9, 10),
        (4096, "fp16"): (10, 10),
    }
    for (ctx, fmt), hits in cells.items():
        for depth, k in zip((0.1, 0.9), hits):
            out.append(
                row(
                    phase="retrieval",
                    task="passkey",
                    context_len=ctx,
                    kv_dtype=fmt,
                    depth=depth,
                    trials=10,
                    n_trials=10,
                    n_correct=k,
                    accuracy=k / 10,
                    ref_accuracy=1.0,
                    n_ref_agree=k,
                    bits_per_elem=4.5 if fmt == "int4" else 16,
                )
            )
    return out


def quality_rows() -> list[dict]:
    out = []
    for ctx in (2048, 4096):
        for fmt, bits, kl in (
            ("fp16", 16, 1e-4),
            ("int8", 8.5, 1e-3),
            ("int4", 4.5, 0.1),
            ("fp4", 4.5, 0.2),
        ):
            pos = {f"kl_pos{i}": kl * (1 + 0.1 * i) for i in range(1, 5)}
            npos = {f"n_pos{i}": 256 for i in range(1, 5)}
            out.append(
                row(
                    phase="quality",
                    context_len=ctx,
                    kv_dtype=fmt,
                    bits_per_elem=bits,
                    kl_mean=kl * ctx / 2048,
                    n_scored=1024,
                    delta_ppl=kl,
                    **pos,
                    **npos,
                )
            )
    out.append(
        row(
            phase="quality",
            context_len=4096,
            kv_dtype="int4",
            bits_per_elem=4.6,
            kl_mean=0.3,
            n_scored=1024,
            window=2048,
            sink_tokens=4,
        )
    )
    return out


def generate_rows() -> list[dict]:
    return [
        row(
            phase="generate",
            context_len=2048,
            kv_dtype=f,
            gen_tokens=32,
            gen_kl_mean=kl,
            gen_kl_max=3 * kl,
            gen_first_diverge=fd,
            gen_first_diverge_min=int(fd) - 1,
            gen_agree=ag,
            gen_tokens_scored=64,
            bits_per_elem=b,
        )
        for f, kl, fd, ag, b in (("fp16", 1e-4, 32, 1.0, 16), ("int4", 0.08, 7.5, 0.4, 4.5))
    ]


def test_retrieval_findings_by_hand():
    got = retrieval.find(pd.DataFrame(retrieval_rows()))
    by_ctx = {f.text.split(" (")[0]: f for f in got}
    at8 = by_ctx["passkey at 8K"]
    lo, hi = wilson(12, 20)
    assert f"int4 in 12/20 ({lo:.2f}-{hi:.2f})" in at8.text and "fp16 in 20/20" in at8.text
    assert "the float32 cache in 20/20" in at8.text
    assert at8.supported and "not separated" not in at8.text  # 0.78 < 0.84: apart
    at4 = by_ctx["passkey at 4K"]
    assert "int4 in 19/20" in at4.text and not at4.supported and "not separated" in at4.text
    assert "answers equal to the float32 cache's: int4 12/20, fp16 20/20 (apart)" in at8.text


def test_agreement_alone_can_separate():
    """multikey at 1K as measured: accuracy 0/6 vs 3/6 overlaps, agreement 0/6 vs 6/6 not."""
    rows = [
        row(
            phase="retrieval",
            task="multikey",
            context_len=1024,
            kv_dtype=f,
            depth=0.5,
            trials=6,
            n_trials=6,
            n_correct=k,
            ref_accuracy=0.5,
            n_ref_agree=a,
        )
        for f, k, a in (("fp16", 3, 6), ("int4", 0, 0))
    ]
    (f,) = retrieval.find(pd.DataFrame(rows))
    assert "int4 in 0/6 (0.00-0.39), fp16 in 3/6 (0.19-0.81)" in f.text
    assert "(intervals overlap: not separated)" in f.text and "int4 0/6, fp16 6/6 (apart)" in f.text
    assert f.supported


def test_generate_and_position_findings():
    gen = generate.find(pd.DataFrame(generate_rows()))
    assert gen[0].text.startswith("fp16 at 2K") and "after 7.5 tokens (least 6)" in gen[1].text
    assert "teacher-forced KL 0.08 on 64 positions" in gen[1].text
    pos = by_position.find(pd.DataFrame(quality_rows()))
    assert any("int4 at 2K: KL 0.11 in the first quarter" in f.text for f in pos)
    assert all("(256 tokens)" in f.text for f in pos)


def test_window_rows_are_their_own_configuration():
    assert config_label(row(kv_dtype="int4", window=2048, sink_tokens=4)) == (
        "int4, sliding window 2048 + 4 sinks"
    )
    assert config_label(row(kv_dtype="int4", sink_tokens=4)) == "int4, 4 sinks"
    assert config_label(row(kv_dtype="int4", quantized_kv_start=512)) == "int4, fp16 until 512"


def test_engines_and_arithmetic_are_never_pooled():
    """The same q4_0 cache through kvbench, kvbench in llama.cpp's arithmetic and llama-passkey
    at one depth: three counts of 1 trial, not one of 3 (the report pooled them before)."""
    base = dict(phase="retrieval", task="passkey-llamacpp", context_len=8192, kv_dtype="q4_0",
                depth=0.1, trials=1, n_trials=1, ref_accuracy=1.0, bits_per_elem=4.5)  # fmt: skip
    rows = [
        row(**base, n_correct=1, n_ref_agree=1),
        row(**base, n_correct=0, n_ref_agree=0, q_quant="q8_0", k_order="gguf"),
        row(**base, n_correct=0, n_ref_agree=0, kernel="llama.cpp"),
    ]
    lines = [f.text for f in retrieval.find(pd.DataFrame(rows))]
    assert len(lines) == 3 and not any("in 1/3" in t for t in lines)
    assert "(smollm2-135m, reference): finds the needle: q4_0 in 1/1" in lines[0]
    assert "(smollm2-135m, reference, k:gguf, q:q8_0): finds the needle: q4_0 in 0/1" in lines[1]
    assert "(smollm2-135m, llama.cpp): finds the needle: q4_0 in 0/1" in lines[2]
    # one engine throughout: the label is the cache alone, as before
    alone = retrieval.find(pd.DataFrame(rows[:1]))[0].text
    assert "(smollm2-135m): finds the needle: q4_0 in 1/1" in alone


def test_heatmap_cells_and_pareto_panels():
    df = pd.DataFrame(retrieval_rows() + quality_rows() + generate_rows())
    fig = tasks.retrieval(df)
    cells = fig.table.set_index(["cache", "context", "depth"])
    assert cells.loc[("int4", 8192, 0.1), "correct"] == 6
    assert cells.loc[("fp16", 4096, 0.9), "trials"] == 10
    heat = fig.fig.data[0]
    assert heat.type == "heatmap" and list(heat.x) == ["4096", "8192"]
    q = tasks.quality_context(df)
    assert set(q.table["context"]) == {2048, 4096} and len(q.table) == 9
    assert "int4, sliding window 2048 + 4 sinks" in set(q.table["cache"])
    gen = tasks.generate(df).table.set_index("cache")
    assert gen.loc["int4", "KL"] == 0.08 and gen.loc["fp16", "first diverge"] == 32
    assert gen.loc["int4", "least"] == 6 and gen.loc["int4", "agreement"] == 0.4


@pytest.mark.skipif(report_browser.chromium() is None, reason="chromium not installed")
def test_the_task_figures_render_in_headless_chromium(tmp_path):
    csv = tmp_path / "q.csv"
    pd.DataFrame(retrieval_rows() + quality_rows() + generate_rows()).to_csv(csv, index=False)
    out = tmp_path / "r.html"
    write_report([csv], out)
    got = report_browser.probe(out)
    assert got["errors"] == [] and got["console"] == [], got
    assert got["plots"] == got["drawn"] >= 3
    text = out.read_text()
    assert "passkey at 8K" in text and "Retrieval: depth x context" in text
    assert any(f.topic == "retrieval" for f in findings(pd.read_csv(csv)))


def test_task_tables_show_what_the_evidence_cost_and_older_rows_show_nothing():
    """Rows with cost columns: their figures in the tables (each retrieval cell its own: depth
    0.1 took 10 s, depth 0.9 30 s); rows without them (older results): no cost column."""
    ret = retrieval_rows()
    for i, r in enumerate(ret):
        r.update(wall_s=10.0 + 20 * (i % 2), decode_tokens_per_s=5.0, ref_wall_s=40.0)
    qual = quality_rows()
    for r in qual:
        r.update(wall_s=3.0, prefill_tokens_per_s=700.0)
    cells = tasks.retrieval(pd.DataFrame(ret)).table.set_index(["cache", "context", "depth"])
    assert cells.loc[("int4", 8192, 0.1), "wall s"] == 10.0
    assert cells.loc[("int4", 8192, 0.9), "wall s"] == 30.0
    assert cells.loc[("int4", 8192, 0.9), "f32 ref s"] == 40.0
    q = tasks.quality_context(pd.DataFrame(qual)).table
    assert set(q["prefill tok/s"]) == {700.0} and "decode tok/s" not in q
    old = tasks.quality_context(pd.DataFrame(quality_rows())).table
    assert not {"wall s", "prefill tok/s"} & set(old)

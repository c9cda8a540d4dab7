"""Findings: the ratio's interval, the threshold, and each topic's line on hand-made rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvbench.analysis import findings as fd
from kvbench.store.schema import COLUMNS


def row(ms: float, half: float = 0.02, **case) -> dict:
    """A measured row: median ms, CI ms*(1 -/+ half)."""
    r = dict.fromkeys(COLUMNS)
    r.update(status="ok", model="tiny", n_layers=2, n_q_heads=8, n_kv_heads=2, gqa_ratio=4,
             head_dim=64, phase="decode", context_len=1024, kv_dtype="fp16", kernel="sdpa",
             n_seqs=1, layout="per-stream", prefix_frac=0.0, kv_data="gaussian", seed=0,
             median_ms=ms, ci_low_ms=ms * (1 - half), ci_high_ms=ms * (1 + half),
             kv_bytes=1000, kernel_kind="kvbench")  # fmt: skip
    r.update(case)
    return r


def frame(*rows) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=COLUMNS)


def test_ratio_interval_is_built_from_both_cis():
    a = {"median_ms": 2.0, "ci_low_ms": 1.8, "ci_high_ms": 2.4}
    b = {"median_ms": 1.0, "ci_low_ms": 0.9, "ci_high_ms": 1.2}
    r, lo, hi = fd.common.ratio_ci(a, b)
    assert (r, lo, hi) == pytest.approx((2.0, 1.8 / 1.2, 2.4 / 0.9))


@pytest.mark.parametrize(
    "lo, hi, want",
    [(1.12, 1.5, "slower"), (1.05, 1.5, "same"), (0.5, 0.9, "faster"), (0.5, 0.95, "same"),
     (math.nan, 2.0, "few")],
)  # fmt: skip
def test_verdict_needs_the_whole_interval_beyond_the_threshold(lo, hi, want):
    assert fd.common.verdict(lo, hi, threshold=1.1) == want


def test_fastest_states_a_clear_lead_and_a_tie_as_no_difference():
    clear = fd.fastest.find(frame(row(1.0), row(2.0, kernel="ops")))
    assert len(clear) == 1 and clear[0].supported and clear[0].figure == "latency"
    assert "fp16 sdpa" not in clear[0].text or "is fastest" in clear[0].text
    assert "sdpa is fastest, 1 ms; 2.00×" in clear[0].text
    tie = fd.fastest.find(frame(row(1.0, half=0.1), row(1.05, half=0.1, kernel="ops")))
    assert not tie[0].supported and "no difference measured" in tie[0].text


def test_fastest_is_per_context():
    rows = [row(1.0, context_len=c) for c in (256, 1024)]
    rows += [row(3.0, kernel="ops", context_len=c) for c in (256, 1024)]
    found = fd.fastest.find(frame(*rows))
    assert [f.text.split(":")[0] for f in found] == ["decode · ctx 256", "decode · ctx 1024"]


def test_formats_against_fp16_with_the_crossing_context():
    rows = []
    for ctx, int4_ms in ((256, 2.0), (1024, 1.0), (4096, 0.4), (16384, 0.3)):
        rows += [row(1.0, context_len=ctx), row(int4_ms, context_len=ctx, kv_dtype="int4",
                                                  kernel="dequant_sdpa", kv_bytes=280)]  # fmt: skip
    (f,) = fd.formats.find(frame(*rows))
    assert f.figure == "formats" and f.supported
    assert f.text.startswith("int4 dequant_sdpa time / fp16's: ctx 256 ×2, ctx 1024 ×1, ")
    assert "KV bytes ×0.28" in f.text
    assert "faster in 2, slower in 1, no difference measured in 1 of 4 cases" in f.text
    assert f.text.endswith("faster from ctx 4096")


def test_formats_prefers_the_same_kernel_for_the_baseline():
    rows = [row(1.0), row(0.5, kernel="ops"), row(1.0, kv_dtype="fp32", kernel="ops")]
    found = {f.text.split(" time")[0]: f for f in fd.formats.find(frame(*rows))}
    assert "ctx 1024 ×2 (slower in 1 of 1" in found["fp32 ops"].text  # ops vs fp16 ops


def test_layouts_by_prefix_fraction():
    rows = []
    for frac, uni_ms, mem in ((0.0, 1.0, 1000), (0.9, 1.5, 300)):
        for n in (2, 4):
            rows.append(row(1.0, n_seqs=n, prefix_frac=frac, bytes_alloc=1000))
            rows.append(row(uni_ms, n_seqs=n, prefix_frac=frac, layout="unified",
                            bytes_alloc=mem))  # fmt: skip
    found = fd.layouts.find(frame(*rows))
    assert [f.figure for f in found] == ["layouts", "layouts"]
    assert "shared prefix 0: unified holds ×1 the KV memory" in found[0].text
    assert "no difference measured in 2 of 2 pairs" in found[0].text and not found[0].supported
    assert "shared prefix 0.9: unified holds ×0.3" in found[1].text
    assert "latency ×1.5 (slower in 2 of 2 pairs" in found[1].text


def test_tiles_counts_the_best_tile_per_context():
    rows = [row(ms, kernel="tiled", tile_kv=t) for t, ms in ((32, 2.0), (64, 1.0), (128, 1.05))]
    rows += [row(ms, kernel="tiled", tile_kv=t, kv_dtype="int4")
             for t, ms in ((32, 3.0), (64, 2.0), (128, 1.0))]  # fmt: skip
    (f,) = fd.tiles.find(frame(*rows))
    assert f.text == (
        "ctx 1024: fastest tile over 2 configurations: tile 128 in 1 (clear lead in 1); "
        "tile 64 in 1 (clear lead in 0)"
    )


def test_peers_against_the_fastest_peer():
    rows = [row(1.0), row(3.0, kernel="ops"), row(2.0, kernel="torch_sdpa", kernel_kind="peer"),
            row(0.8, kernel="numpy_ref", kernel_kind="peer")]  # fmt: skip
    found = {f.text.split(":")[0]: f for f in fd.peers.find(frame(*rows))}
    assert found["sdpa"].text.startswith("sdpa: ×1.2 the best peer's time")
    assert "best peer: numpy_ref (1)" in found["sdpa"].text
    assert "×3.8 the best peer's time (slower in 1 of 1" in found["ops"].text


def test_quality_only_when_its_columns_exist():
    df = frame(row(1.0), row(1.0, kv_dtype="int4"))
    assert fd.quality.find(df) == []
    df = df.assign(delta_ppl=[0.0, 0.31], kl_mean=[0.0, 0.012])
    lines = {f.text for f in fd.quality.find(df)}
    assert any(x.startswith("int4: Δppl +0.31, KL 0.012") for x in lines)  # then its bytes


def test_too_few_samples_give_no_interval_and_no_verdict():
    rows = frame(row(1.0, n_samples=2), row(5.0, kernel="ops", n_samples=2))
    (f,) = fd.fastest.find(rows)
    assert (
        not f.supported and "too few samples to judge (×5.00 [no interval: fewer than 5" in f.text
    )


def test_no_finding_from_rows_without_a_comparison():
    assert fd.findings(frame(row(1.0))) == []


def test_quality_rows_carry_no_time_and_each_cache_configuration_is_its_own_line():
    import pandas as pd

    rows = pd.DataFrame(
        [
            dict(status="ok", kv_dtype="int8", phase="quality", kl_mean=8e-4, delta_ppl=0.1),
            dict(status="ok", kv_dtype="int8", v_dtype="int4", phase="quality", kl_mean=0.02,
                 delta_ppl=0.5),
            dict(status="error", kv_dtype="int4", phase="quality", kl_mean=None),
        ]
    )  # fmt: skip
    lines = [f.text for f in fd.quality.find(rows)]
    assert len(lines) == 2 and "V int4" in lines[1] and "KL 0.02" in lines[1]
    assert "KL 0.0008" in lines[0] and "V int4" not in lines[0]


def test_memory_sets_exact_resident_and_peak_side_by_side_per_layout():
    mem = dict(kv_bytes=1000, cache_bytes=1000, resident_bytes=1000, peak_mem_bytes=1004)
    rows = frame(
        row(1.0, **mem),
        row(1.0, **mem | {"context_len": 512, "peak_mem_bytes": 1500}),
        # unified: 1000 B of K/V held in 1900 B of cells, 2000 B resident with the step's arrays
        row(
            1.0,
            layout="unified",
            **mem | {"cache_bytes": 1900, "resident_bytes": 2000, "peak_mem_bytes": 2100},
        ),  # fmt: skip
        # a row measured before the gate existed: resident below exact
        row(1.0, layout="paged", **mem | {"resident_bytes": 250}),
        # llama.cpp: no kvbench measurement, its own KV buffer and context buffers
        row(1.0, kernel="llama.cpp", kv_bytes=1000, peer_kv_bytes=1100, peak_mem_bytes=3300),
        row(1.0, layout="window", **mem | {"resident_bytes": 1050, "peak_mem_bytes": 1050}),
        row(1.0, kv_bytes=1000),  # no memory figure: not counted
    )
    lines = [f.text for f in fd.memory.find(rows)]
    assert lines == [
        "paged: resident falls SHORT of exact in 1 of 1 case (×0.25): part of the cache is not "
        "there; peak ×4.02 resident: the timed stages allocate beyond the cache",
        "per-stream: resident = exact (×1, 2 cases); peak ×1–1.5 resident: the timed stages "
        "allocate beyond the cache",
        "per-stream (llama.cpp's own figures): resident ×1.1 exact (1 case): the cache holds "
        "more than its K/V (capacity, padding, free cells); peak ×3 resident: the timed stages "
        "allocate beyond the cache",
        "unified: resident ×2 exact (1 case): its arrays declare ×1.9 exact (capacity, padding, "
        "free cells); peak ×1.05 resident: the timed stages allocate beyond the cache",
        "window: resident ×1.05 exact (1 case): its arrays hold exactly the K/V, the rest is "
        "other arrays kept beside the cache; peak = resident (×1)",
    ]


def _line(fmt: str, a: float, b: float, bytes_per_ctx: float, ctxs=(256, 1024, 4096), **kw):
    return [
        row(a + b * c, kv_dtype=fmt, context_len=c, kv_bytes=bytes_per_ctx * c, **kw) for c in ctxs
    ]


def test_where_a_format_pays_off_by_hand():
    # fp16: 1.0 + 0.001 ctx ms; int8: 1.5 + 0.0005 ctx: equal at (1.5 - 1.0) / 0.0005 = 1000
    rows = _line("fp16", 1.0, 0.001, 4.0) + _line("int8", 1.5, 0.0005, 2.125)
    found = fd.payoff.find(frame(*rows))
    assert len(found) == 1 and found[0].figure == "formats"
    text = found[0].text
    assert "faster than fp16 beyond ctx 1,000;" in text  # inside 256-4096: not extrapolated
    assert "time slope ×0.5 against bytes ×0.53" in text
    assert "1.5 + 0.5 µs/token" in text and "(fp16 sdpa: 1 + 1)" in text


def test_payoff_never_always_and_extrapolated():
    rows = _line("fp16", 1.0, 0.001, 4.0)
    rows += _line("int8", 0.5, 0.0008, 2.125)  # below fp16 everywhere
    rows += _line("fp4", 2.0, 0.0012, 1.125)  # slower and steeper: never
    rows += _line("int4", 9.0, 0.0009, 1.125)  # equal at 80,000: beyond what was measured
    rows += _line("nvfp4", 0.5, 0.0015, 1.125)  # starts faster, steeper: faster below 1,000
    text = {f.text.split()[0]: f.text for f in fd.payoff.find(frame(*rows))}
    assert "faster than fp16 at every context;" in text["int8"]
    assert "never faster than fp16" in text["fp4"]
    assert "beyond ctx 80,000 (extrapolated: measured 256-4096)" in text["int4"]
    assert "faster than fp16 only below ctx 1,000;" in text["nvfp4"]


def test_payoff_needs_three_contexts_and_the_same_workload():
    two = _line("fp16", 1.0, 0.001, 4.0, ctxs=(256, 1024)) + _line(
        "int8", 1.5, 0.0005, 2.125, ctxs=(256, 1024)
    )
    assert fd.payoff.find(frame(*two)) == []
    # fp16 measured only at GQA 4, int8 only at GQA 8: no line pairs across workloads
    other = _line("fp16", 1.0, 0.001, 4.0) + _line("int8", 1.5, 0.0005, 2.125, gqa_ratio=8)
    assert fd.payoff.find(frame(*other)) == []


def test_rows_differing_only_in_a_rotation_are_two_configurations_not_one():
    # issue #32: rows that differ only in rotate_k read "dequant_sdpa is fastest, 1 ms; 1.50x
    # ahead of dequant_sdpa" when rotate_k was outside the hand list of choice axes
    rows = [
        row(1.0, kv_dtype="int4", kernel="dequant_sdpa", rotate_k="none"),
        row(1.5, kv_dtype="int4", kernel="dequant_sdpa", rotate_k="hadamard"),
        row(3.0, kv_dtype="fp16", kernel="sdpa", rotate_k="none"),
    ]
    (f,) = fd.fastest.find(frame(*rows))
    assert f.supported
    best, nxt = f.text.split(": ", 1)[1].split(" is fastest")[0], f.text.split(" ahead of ")[1]
    assert best != nxt, f.text
    assert best == "int4 dequant_sdpa rotK:none" and nxt == "int4 dequant_sdpa rotK:hadamard"
    # alone, the two rotations are still two configurations of one workload
    (f,) = fd.fastest.find(frame(*rows[:2]))
    assert f.text.endswith("ahead of rotK:hadamard"), f.text


def test_every_axis_of_the_table_has_a_role_the_findings_read():
    from kvbench.axes import ROLES, TABLE

    for axis in TABLE:
        assert axis.role in ROLES, (axis.name, axis.role)
    names = {a.name for a in TABLE}
    config, workload = set(fd.common.CONFIG_AXES), set(fd.common.WORKLOAD_AXES)
    assert config | workload == names and not config & workload
    assert {"kv_dtype", "layout", "rotate_k", "kernel", "tile_kv"} <= config
    assert {"context_len", "n_seqs", "model", "depth"} <= workload


def test_formats_and_payoff_keep_a_rotated_format_apart_from_the_plain_one():
    rows = [
        row(2.0, kv_dtype="fp16", rotate_k="none"),
        row(1.0, kv_dtype="int4", kernel="dequant_sdpa", rotate_k="none"),
        row(3.0, kv_dtype="int4", kernel="dequant_sdpa", rotate_k="hadamard"),
    ]
    lines = sorted(f.text for f in fd.formats.find(frame(*rows)))
    assert len(lines) == 2, lines
    assert lines[0].startswith("int4 dequant_sdpa rotK:hadamard time / fp16's: ctx 1024 ×1.5")
    assert lines[1].startswith("int4 dequant_sdpa rotK:none time / fp16's: ctx 1024 ×0.5")
    ctxs = (256, 1024, 4096)
    fits = [*_line("fp16", 1.0, 1e-3, 4.0, ctxs, rotate_k="none")]
    fits += _line("int4", 2.0, 2e-4, 1.0, ctxs, rotate_k="none")
    fits += _line("int4", 2.0, 9e-4, 1.0, ctxs, rotate_k="hadamard")
    text = sorted(f.text for f in fd.payoff.find(frame(*fits)))
    assert len(text) == 2 and "rot K hadamard" in text[0] and "rot K none" in text[1], text


def test_quality_keeps_each_model_apart():
    # issue #41: the truth suite's SmolLM2 and Gemma rows printed "q4_0, hadamard K/V ... ppl
    # 14.29", the median of Gemma's 14.02 and SmolLM2's 14.55
    q4 = dict(status="ok", phase="quality", context_len=2048, kv_dtype="q4_0", kernel="reference",
              rotate_k="hadamard", rotate_v="hadamard")  # fmt: skip
    rows = pd.DataFrame([dict(q4, model="smollm2-135m", ppl=14.55),
                         dict(q4, model="gemma3-270m", ppl=14.02)])  # fmt: skip
    lines = sorted(f.text for f in fd.quality.find(rows))
    assert lines == ["q4_0, hadamard K/V (gemma3-270m): ppl 14.02",
                     "q4_0, hadamard K/V (smollm2-135m): ppl 14.55"], lines  # fmt: skip
    # one model at two contexts: two lines, each saying its context
    rows = rows.assign(model="m", context_len=[2048, 8192])
    assert sorted(f.text for f in fd.quality.find(rows)) == [
        "q4_0, hadamard K/V (ctx 2048): ppl 14.55",
        "q4_0, hadamard K/V (ctx 8192): ppl 14.02",
    ]


def test_accuracy_keeps_rotated_and_unrotated_rows_apart():
    # issue #41: rows with rel_err 0.10 (plain), 0.02 and 0.03 (rotated) printed one line
    # "int4/g32 ... 0.03", the median of all three
    rows = [row(1.0, kv_dtype="int4", group_size=32, rotate_k="none", rel_err=0.10),
            row(1.0, kv_dtype="int4", group_size=32, rotate_k="hadamard", rel_err=0.02,
                gqa_ratio=1),
            row(1.0, kv_dtype="int4", group_size=32, rotate_k="hadamard", rel_err=0.03),
            row(1.0, kv_dtype="fp16", rotate_k="none", rel_err=0.001)]  # fmt: skip
    rows = frame(*rows).assign(bits_per_elem=[5.0, 5.0, 5.0, 16.0])
    lines = [f.text for f in fd.accuracy.find(rows)]
    assert lines == [
        "int4/g32 rotK:hadamard: attention rel. error 0.025 (median of 2 cases) at 5 bits/elem",
        "int4/g32 rotK:none: attention rel. error 0.1 (median of 1 cases) at 5 bits/elem",
        "fp16 rotK:none: attention rel. error 0.001 (median of 1 cases) at 16 bits/elem",
    ], lines


def test_accuracy_lists_formats_by_bits_and_keeps_contexts_apart():
    kinds = (("int8", 8.5, 0.004), ("int4", 4.5, 0.05))
    rows = [row(1.0, kv_dtype=k, context_len=c, rel_err=e, bits_per_elem=b)
            for k, b, e in kinds for c in (256, 1024)]  # fmt: skip
    lines = [f.text.split(":")[0] for f in fd.accuracy.find(frame(*rows))]
    assert lines == ["int4 (ctx 256)", "int8 (ctx 256)", "int4 (ctx 1024)", "int8 (ctx 1024)"]


def test_the_one_grouping_never_pools_model_or_context():
    d = frame(row(1.0, kv_dtype="int4"), row(2.0, kv_dtype="int8", gqa_ratio=1))
    assert fd.common.group_axes(d) == ["model", "context_len", "gqa_ratio", "kv_dtype"]
    assert fd.common.group_axes(d, compared=["kv_dtype"], pooled=["gqa_ratio"]) == [
        "model", "context_len"]  # fmt: skip
    with pytest.raises(ValueError):
        fd.common.group_axes(d, pooled=["model"])


def test_every_topic_has_a_planted_rows_test():
    # each topic's find() is called on hand-made rows in some test module
    import re
    from pathlib import Path

    text = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    alias = dict(re.findall(r"import (\w+) as (\w+)", text)[::-1])  # module -> a name for it
    for module in fd.MODULES:
        name = module.__name__.rsplit(".", 1)[1]
        called = {f"{name}.find(", f"{alias.get(name, name)}.find("}
        assert any(c in text for c in called), f"no planted-rows test calls {name}.find"


def test_tradeoff_names_each_models_frontier_apart():
    q = dict(status="ok", phase="quality", context_len=128, kernel="reference", n_scored=64,
             group_size=None)  # fmt: skip
    rows = pd.DataFrame(
        [dict(q, model=m, kv_dtype=k, bits_per_elem=b, kl_mean=kl)
         for m, pts in (("a", ((16, 1e-4), (4.5, 0.02), (8.5, 0.03))), ("b", ((16, 1e-4),)))
         for k, (b, kl) in zip(("fp16", "int4", "int8"), pts)]
    )  # fmt: skip
    lines = [f.text for f in fd.tradeoff.find(rows)]
    assert len(lines) == 2 and lines[0].startswith("a (KL at ctx 128)") and "b (" in lines[1]
    assert "never on one: int8" in lines[0] and "never on one: none" in lines[1], lines


def test_quality_lines_say_the_saving_against_fp16():
    """#44 item 3: the memory saving in the findings: each configuration's bytes and their share
    of the fp16 row's at the same workload (by formula where the run has no fp16 row)."""
    import pandas as pd

    q = dict(status="ok", phase="quality", model="m", context_len=2048, n_layers=30,
             n_kv_heads=3, head_dim=64, n_seqs=1)  # fmt: skip
    fp16 = 2 * 2 * 30 * 3 * 64 * 2048  # K and V x layers x heads x dims x positions x 2 B
    q8 = dict(q, kv_dtype="q8_0", kv_bytes=fp16 * 17 // 32, kl_mean=5e-4)
    rows = pd.DataFrame([dict(q, kv_dtype="fp16", kv_bytes=fp16, kl_mean=1e-6), q8])
    lines = {f.text.split(":")[0]: f.text for f in fd.quality.find(rows)}
    assert lines["q8_0"].endswith(f", {fp16 * 17 / 32 / 2**20:,.3g} MiB = 53% of fp16's")
    alone = {f.text.split(":")[0]: f.text for f in fd.quality.find(rows.iloc[1:])}
    assert alone["q8_0"].endswith("= 53% of fp16's")


def test_a_policy_rows_saving_is_per_context_token_as_the_answer_says():
    """A policy row's kv_bytes hold its compressed context (half a quality chunk): snapkv at
    0.5 on fp16 cells is 50% of fp16's per context token (the answer block's figure), where
    kv_bytes alone said 25%."""
    q = dict(status="ok", phase="quality", model="m", context_len=2048, n_layers=30,
             n_kv_heads=3, head_dim=64, n_seqs=1)  # fmt: skip
    fp16 = 2 * 2 * 30 * 3 * 64 * 2048
    kept = fp16 // 4  # 512 of the 1,024 context positions' fp16 cells
    snap = dict(q, kv_dtype="fp16", kv_bytes=kept, kl_mean=0.05, policy="snapkv",
                compression_ratio=0.5, kept_bytes_per_token=kept / 1024)  # fmt: skip
    rows = pd.DataFrame([dict(q, kv_dtype="fp16", kv_bytes=fp16, kl_mean=1e-6,
                              policy="none"), snap])  # fmt: skip
    line = next(f.text for f in fd.quality.find(rows) if "snapkv" in f.text)
    assert line.endswith(f", {fp16 / 2 / 2**20:,.3g} MiB = 50% of fp16's"), line

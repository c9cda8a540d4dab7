"""Phase serve (harness/engines/serve.py, kernels/model/serve.py): many sequences of a model
decoding together, and llama-batched-bench beside it (harness/peers/llamacpp_batched.py).

A row's cells are counted by hand from llama-batched-bench's b11434 formula, its speeds from
its own definitions; the batch's truth (each checked sequence alone) must hold; bad axes are
refused in one line naming the key."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_model import TINY, weights, write_gguf

from kvbench.case import Case
from kvbench.engines import common, engine_for
from kvbench.engines import serve as engine
from kvbench.engines.contract import carrying
from kvbench.errors import SuiteError
from kvbench.kernels.model.load import load_model
from kvbench.peers import llamacpp
from kvbench.peers.llamacpp import LlamaCppError
from kvbench.peers.llamacpp_batched import batched_command, parse_jsonl
from kvbench.suite.validate import check_model

TOKENS = tuple(np.random.default_rng(2).integers(0, TINY["vocab"], 200).tolist())


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    model = load_model(write_gguf(tmp_path / "t.gguf", weights(seed=4)))
    monkeypatch.setattr(common, "model_of", lambda name: (model, None))
    monkeypatch.setattr(common, "tokens_of", lambda name, text: TOKENS)
    yield model


def case(**kw) -> Case:
    base = dict(model="smollm2-135m", n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64)
    return Case(**{**base, "phase": "serve", "context_len": 16, "gen_tokens": 3,
                   "n_seqs": 3, "kernel": "reference", **kw})  # fmt: skip


@pytest.mark.parametrize(
    "layout, workload, cells",
    [("per-stream", "none", 3 * (16 + 3)), ("unified", "none", 3 * (16 + 3)),
     ("per-stream", "shared-prefix", 3 * 16 + 3 * 3), ("unified", "shared-prefix", 16 + 3 * 3)],
)  # fmt: skip
def test_a_serve_row_counts_llama_batched_benchs_cells_and_speeds(tiny, layout, workload, cells):
    c = case(layout=layout, workload=workload)
    assert engine_for(c).build.__wrapped__ is engine.build
    state = carrying(engine.build)(c)
    row = state.check()
    assert row["n_kv_req"] == row["cells_used"] == cells
    assert (row["pp"], row["tg"], row["pl"]) == (16, 3, 3)
    n_pp = 16 if workload == "shared-prefix" else 3 * 16
    assert row["s_pp"] == pytest.approx(n_pp / row["t_pp"])
    assert row["s_tg"] == pytest.approx(3 * 3 / row["t_tg"])
    assert row["s"] == pytest.approx((n_pp + 3 * 3) / row["t"])
    assert row["t"] == pytest.approx(row["t_pp"] + row["t_tg"])
    assert row["tg_step_p10_ms"] <= row["tg_step_ms"] <= row["tg_step_p90_ms"]
    # fp16 cells, every layer, K and V: 2 layers x 2 heads x 64 x 2 B x 2
    assert row["bytes_used"] == state.kv_bytes == cells * 2 * 2 * 64 * 2 * 2
    assert row["serve_greedy_agree"] == 1.0 and row["serve_max_abs_logit"] < 5e-3


@pytest.mark.parametrize(
    "kw, key",
    [(dict(layout="paged", page_size=16), "layout"),
     (dict(workload="independent"), "workload"),
     (dict(workload="shared-prefix", n_seqs=1), "workload"),
     (dict(workload="shared-prefix", prefix_frac=0.5), "prefix_frac"),
     (dict(v_dtype="int4"), "kv_dtype"),
     (dict(policy="knorm", compression_ratio=0.5), "policy"),
     (dict(window=8), "window")],
)  # fmt: skip
def test_what_serve_does_not_run_is_refused_naming_the_key(kw, key):
    with pytest.raises(SuiteError) as e:
        check_model("s.yaml", case(**kw))
    assert e.value.key == key and "\n" not in str(e.value)


def test_a_text_too_short_for_the_prompts_is_an_error_naming_both(tiny):
    with pytest.raises(ValueError, match="fewer than the 20 prompts x 16 tokens"):
        carrying(engine.build)(case(n_seqs=20))


# ---- llama-batched-bench ----------------------------------------------------------------------

# one line as llama-batched-bench b11434 printed it here (-npp 64 -ntg 4 -npl 4 -pps, per-stream)
LINE = ('{"n_kv_max": 1024, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 1, '
        '"n_gpu_layers": -1, "n_threads": 1, "n_threads_batch": 1, "pp": 64, "tg": 4, "pl": 4, '
        '"n_kv": 272, "t_pp": 0.712128, "speed_pp": 89.871483, "t_tg": 0.227483, '
        '"speed_tg": 70.334923, "t": 0.939611, "speed": 85.141624}')  # fmt: skip


def test_its_json_line_becomes_the_rows_columns():
    got = parse_jsonl("log line\n" + LINE + "\n", 64, 4, 4)
    assert got["n_kv_req"] == 272 == 4 * 64 + 4 * 4 and got["s_tg"] == 70.334923
    assert got["t"] == 0.939611 and got["is_pp_shared"] == 1
    with pytest.raises(LlamaCppError, match="no result for pp 64, tg 4, pl 8"):
        parse_jsonl(LINE, 64, 4, 8)  # a test past -c is skipped by the tool without a word


def test_its_verbose_log_gives_the_kv_buffer_of_every_stream():
    from kvbench.peers.llamacpp_batched import log_memory

    log = (
        "0.00.123.034 I llama_kv_cache:        CPU KV buffer size =    22.50 MiB\n"
        "0.00.139.898 I llama_kv_cache: size =   22.50 MiB (   256 cells,  30 layers,  4/4 "
        "seqs), K (f16):   11.25 MiB, V (f16):   11.25 MiB\n"
    )  # b11434, -c 544 -npl 4 -v
    mem = log_memory(log, streams=4)
    assert mem["kv_bytes"] == 1024 * 30 * 3 * 64 * 2 * 2 and mem["kv_cells"] == 4 * 256


def test_its_command_names_every_setting():
    cmd = batched_command("bb", "m.gguf", pp=64, tg=4, pl=4, shared=True, unified=False,
                          ctx=272, type_k="q8_0", type_v="q8_0", threads=2)  # fmt: skip
    text = " ".join(cmd)
    for part in ("-npp 64", "-ntg 4", "-npl 4", "-c 272", "-ctk q8_0", "-ctv q8_0", "-fa 1",
                 "-t 2", "--output-format jsonl", "-pps"):  # fmt: skip
        assert part in text
    assert "-kvu" not in cmd


@pytest.mark.skipif(
    llamacpp.missing_reason("llama-batched-bench") is not None
    or not llamacpp.model_path().is_file(),
    reason="llama-batched-bench (make llamacpp) and SmolLM2 (kvbench model fetch) needed",
)
@pytest.mark.parametrize("layout", ["per-stream", "unified"])
def test_llama_batched_bench_holds_the_cells_kvbench_holds(layout):
    from kvbench.engines import llamacpp as engine_llamacpp

    c = Case(model="smollm2-135m", n_layers=30, n_q_heads=9, n_kv_heads=3, head_dim=64,
             phase="serve", kernel="llama.cpp", context_len=32,
             gen_tokens=2, n_seqs=2, layout=layout, workload="shared-prefix")  # fmt: skip
    state = carrying(engine_llamacpp.build)(c)
    res = state.job({}, True)
    want = 2 * 32 + 2 * 2 if layout == "per-stream" else 32 + 2 * 2
    assert res.accuracy["n_kv_req"] == want
    assert res.accuracy["s_tg"] > 0 and res.extra["peer_kv_types"] == "f16/f16"
    # its buffer: each stream padded to 256 cells, as kvbench's layout pads (cells_alloc)
    cells = 2 * 256 if layout == "per-stream" else 256
    assert res.extra["peer_kv_cells"] == cells
    kv_bytes = cells * 30 * 3 * 64 * 2 * 2  # layers, KV heads, head_dim, f16, K and V
    assert abs(res.extra["peer_kv_bytes"] - kv_bytes) <= 6 * 1024  # MiB printed to 2 decimals


@pytest.mark.parametrize(
    "layout, workload, stream_cells, streams",
    [("per-stream", "none", 256, 3), ("unified", "none", 256, 1),
     ("unified", "shared-prefix", 256, 1)],
)  # fmt: skip
def test_the_memory_guard_plans_every_sequence_s_cells(layout, workload, stream_cells, streams):
    """The plan the memory guard reads (suite/model_plan.py): the layout's cells as allocated
    (each stream padded to 256 cells), not one sequence's context."""
    from kvbench.suite.cache_spec import spec_of
    from kvbench.suite.model_plan import model_plan

    c = case(layout=layout, workload=workload)
    plan = model_plan(c, spec_of(c), vocab=300)
    per_cell = 2 * 2 * 64 * 2 * 2  # layers x KV heads x head_dim x fp16 bytes x (K, V)
    assert plan["cache"] == streams * stream_cells * per_cell
    assert plan["reference"] == (16 + 3) * per_cell  # the truth check's single sequence
    big = model_plan(case(n_seqs=64, context_len=4096), spec_of(case()), vocab=300)
    assert big["cache"] == 64 * 4352 * per_cell  # pad(4096 + 3) = 4352 cells a stream


def test_a_second_check_runs_the_schedule_again_from_an_empty_cache(tiny):
    state = carrying(engine.build)(case(layout="unified"))
    first, second = state.check(), state.check()
    assert first["cells_used"] == second["cells_used"] == 3 * (16 + 3)


def test_a_page_size_without_layout_paged_is_refused_in_serve_too():
    from kvbench.suite.validate import check_streams

    with pytest.raises(SuiteError) as e:
        check_streams("s.yaml", case(page_size=16))
    assert e.value.key == "page_size"


def test_the_report_draws_throughput_against_sequences_with_llama_cpp_dashed():
    import pandas as pd

    from kvbench.report.serve import serve_figure
    from kvbench.store.schema import COLUMNS

    rows = []
    for kernel, s_tg in (("sdpa", (7.0, 10.0)), ("llama.cpp", (65.0, 116.0))):
        for n, s in zip((1, 4), s_tg):
            rows.append({"phase": "serve", "status": "ok", "model": "smollm2-135m",
                         "context_len": 512, "kernel": kernel, "kv_dtype": "fp16",
                         "layout": "per-stream", "workload": "none", "n_seqs": n, "s_tg": s,
                         "kv_bytes": n * 544 * 23040, "n_kv_req": n * 544})  # fmt: skip
    cur = pd.DataFrame(rows).reindex(columns=COLUMNS)
    fig = serve_figure(cur)
    traces = fig.fig.data
    assert [t.y.tolist() for t in traces if t.line.dash == "dash"][0] == [65.0, 116.0]
    assert len(traces) == 4 and fig.table is not None  # 2 configurations x 2 panels
    assert serve_figure(cur.assign(phase="quality")) is None


def test_plan_answers_how_many_sequences_fit_by_hand():
    """kvbench plan --context C --budget B: SmolLM2's shape (30 layers, 3 KV heads, head_dim 64),
    fp16: 23,040 B a token. 100 MiB / (544 x 23,040 B) = 8.4 -> 8 per-stream; unified with a
    512-token prompt shared: pad256(512 + 32n) cells x 23,040 B <= 100 MiB -> 4,352 cells ->
    n = 120 (the serve rows' bytes at 8 sequences, 95.6 MiB, are the same formula's)."""
    from kvbench.kernels.stores.footprint import LayoutArgs
    from kvbench.suite.plan import KVShape, _format, most_sequences

    shape, fmt, budget = KVShape("smollm2", 30, 3, 64, 9), _format("fp16", None, 64), 100 * 2**20
    assert most_sequences(shape, fmt, "per-stream", 544, LayoutArgs(), budget) == 8
    assert most_sequences(shape, fmt, "unified", 544, LayoutArgs(prefix=512), budget) == 120
    assert most_sequences(shape, fmt, "per-stream", 10**6, LayoutArgs(), budget) == 0

"""kv_edit shift / self-extend on a model: the suite's one-line refusals (harness/suite/
model_edit.py), the retrieval rows that read a prompt through them (harness/engines/
model_tasks.py) and the llama-passkey arguments and context check of the llama.cpp engine."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_model_tasks import case, tiny  # noqa: F401 - the fixture

from kvbench.engines import common
from kvbench.engines import llamacpp as llama_engine
from kvbench.engines import model_tasks as engine
from kvbench.engines.contract import carrying
from kvbench.errors import SuiteError
from kvbench.kernels.model import passkey
from kvbench.kernels.model.shift import Schedule
from kvbench.suite import model_edit

SHAPE = SimpleNamespace(trained_context=256, windows=(None, None))
EDIT = dict(phase="retrieval", task=passkey.TASK, depth=0.5)


def refused(sizes=(400,), n_keep=25, shape=SHAPE, **kw) -> str:
    with pytest.raises(SuiteError) as e:
        model_edit.check("s.yaml", case(**{**EDIT, **kw}), shape, list(sizes), n_keep)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_refusals_name_the_key():
    assert "ga_w" in refused(kv_edit="self-extend", ga_n=3, ga_w=100)
    assert "not a multiple of ga_n 3" in refused(kv_edit="self-extend", ga_n=3, ga_w=100)
    assert "nothing to extend" in refused(sizes=(200,), kv_edit="self-extend", ga_n=2)
    assert "no shift happens" in refused(sizes=(200,), kv_edit="shift")
    # context_limit 16, n_keep 25: 256 cells, n_ctx 231, not a multiple of ga_w 64
    assert "overrun" in refused(kv_edit="shift", context_limit=16, ga_w=64)
    assert "ga_n must be >= 2" in refused(kv_edit="self-extend")
    windowed = SimpleNamespace(trained_context=256, windows=((8, 0), None))
    ring = refused(kv_edit="self-extend", ga_n=2, shape=windowed)
    assert "swa_cache" in ring and "failed to find a memory slot" in ring
    model_edit.check("s.yaml", case(**EDIT, kv_edit="self-extend", ga_n=2, swa_cache="full"),
                     windowed, [400], 25)  # fmt: skip
    assert "no sliding-window layers" in refused(kv_edit="self-extend", ga_n=2, swa_cache="full")
    assert "self-extend's" in refused(kv_edit="shift", swa_cache="full", shape=windowed)
    assert "needs kv_edit" in refused(swa_cache="full")
    assert "plain cache" in refused(kv_edit="shift", kv_dtype="int8", v_dtype="int4")
    assert "phase retrieval or quality" in refused(kv_edit="shift", phase="generate", task="none")
    assert "policy" in refused(kv_edit="shift", policy="window", compression_ratio=0.5)
    # 300 tokens past the trained length 256, but + 16 answer positions inside n_ctx 487
    # (512 cells - n_keep 25): passkey.cpp makes no shift
    assert "no shift happens" in refused(sizes=(300,), kv_edit="shift")
    assert "past smollm2-135m's trained length" in refused(kv_edit="shift", context_limit=512)
    assert "needs kv_edit" in refused(ga_n=2)
    assert "a number sizes a kv_edit's context" in refused(context_limit=100)


def test_a_plain_model_case_passes_and_the_limit_check():
    model_edit.check("s.yaml", case(**EDIT), None, [], 0)
    model_edit.check("s.yaml", case(**EDIT, kv_edit="shift", context_limit=16, ga_w=77),
                     SHAPE, [400], 25)  # fmt: skip
    assert model_edit.context_limit("4096") is None and model_edit.context_limit(8) is None
    assert "positive integer" in model_edit.context_limit("wide")


def prompt_tokens(c) -> int:
    return max(len(p.tokens) for p in common.prompts_of(c.model, c.task, c.context_len,
                                                         c.depth, c.trials, c.seed))  # fmt: skip


def test_a_shift_row_says_what_the_edit_did(tiny):  # noqa: F811 - the fixture
    # n_keep 16, context_limit 16: 256 cells, n_ctx 240 = 4 x 60; the prompt goes past it
    c = case(**EDIT, kv_edit="shift", context_limit=16, n_keep=16, ga_w=60, context_len=330,
             kv_dtype="fp32")  # fmt: skip
    state = carrying(engine.build)(c)
    row = state.check()
    n = prompt_tokens(c)
    shifts_per_trial = -(-(n - 240) // 60)  # one before each batch past n_ctx
    n_past = 240 - 60 + (n - 240 - (shifts_per_trial - 1) * 60)
    closing = n_past - 240 + 16 > 0
    assert n > 240 and row["kv_shifts"] == shifts_per_trial + closing
    assert row["cells_alloc"] == 256 and row["n_past"] <= 240 - 16 + 16
    assert row["edit_units"] > 0 and len(json.loads(row["answer_texts"])) == 1
    assert row["n_ref_agree"] == 1  # the float32 reference reads the prompt through the same shift
    # the context's cells, not the prompt
    assert state.kv_bytes == common.model_kv_bytes(c, state.resolved.spec, 256)


def test_a_self_extend_row_keeps_positions_inside_the_limit(tiny):  # noqa: F811 - the fixture
    # context_limit 128, ga_n 2, ga_w 64: pad(256 + 25) = 512 cells, the prompt grouped
    c = case(**EDIT, kv_edit="self-extend", context_limit=128, ga_n=2, ga_w=64,
             context_len=300)  # fmt: skip
    state = carrying(engine.build)(c)
    row = state.check()
    n = prompt_tokens(c)
    last = (n - 1) // 64 * 64  # the last batch's first token: it stays ungrouped
    tokenizer = common.model_of("x")[1]
    assert state.effective["n_keep"] == len(passkey.tokens(tokenizer, passkey.PREFIX))
    assert row["kv_shifts"] == 0 and row["cells_alloc"] == 512
    # n_past: the prompt's, then one a decode step (the prompt's last token was the first)
    assert row["n_past"] == last // 2 + (n - last) + row["decode_tokens"] - 1 < n


def test_llama_passkey_gets_the_schedule_and_must_report_it(tiny):  # noqa: F811 - the fixture
    model = SimpleNamespace(config=SimpleNamespace(trained_context=256),
                            metadata={"general.architecture": "llama"})  # fmt: skip
    c = case(**EDIT, kv_edit="self-extend", context_limit=128, ga_n=2, ga_w=64, n_keep=20)
    args, sch = llama_engine.edit_args(c, model, common.model_of("x")[1])
    assert dict(args) == {"keep": 20, "n_batch": 64, "grp_attn_n": 2,
                          "ctx_train": ("llama", 128)}  # fmt: skip
    assert sch == Schedule(128, 20, 64, 2, "exact") and sch.n_cells == 512
    ok = {"n_ctx": 492, "n_kv_req": 512, "n_batch": 64, "n_grp": 2}
    llama_engine.check_context(ok, sch)
    with pytest.raises(ValueError, match="llama-passkey's context"):
        llama_engine.check_context({**ok, "n_kv_req": 768}, sch)
    # swa_cache full: --swa-full asked, and a run whose log lacks its warning is refused
    full = case(**EDIT, kv_edit="self-extend", context_limit=128, ga_n=2, ga_w=64, n_keep=20,
                swa_cache="full")  # fmt: skip
    args, sch = llama_engine.edit_args(full, model, common.model_of("x")[1])
    assert dict(args)["swa_full"] is True and sch.swa_full
    llama_engine.check_context({**ok, "swa_full": True}, sch)
    with pytest.raises(ValueError, match="swa_full"):
        llama_engine.check_context(ok, sch)


def test_a_full_swa_cache_allocates_every_cell():
    """Layer 0 a window of 8 at context 1000: its ring is 8 + 512 - 1 = 519 cells (one prefill
    ubatch of 512 past the window), with swa_cache full 1000, as the global layer 1."""
    from kvbench.suite.model_plan import model_cells

    kw = dict(**EDIT, context_len=1000, n_layers=2, kv_edit="self-extend", ga_n=2)
    windows = ((8, 0), None)
    assert model_cells(case(**kw), windows) == [519, 1000]
    assert model_cells(case(**kw, swa_cache="full"), windows) == [1000, 1000]


def test_the_arithmetic_twin_keeps_llama_cpps_key_order(tmp_path):
    """q_quant twins llama.cpp's arithmetic: keys in GGUF's interleaved order on a llama GGUF
    (its converter permutes the Q/K rows), in the model's own order on Gemma 3."""
    from tiny_model import weights, write_gguf, write_random_mlx_dir

    from kvbench.suite.validate import check_key_order

    llama = str(write_gguf(tmp_path / "t.gguf", weights(seed=3)))
    gemma = str(write_random_mlx_dir(tmp_path / "g", "gemma3_text", n_layers=4))
    for model, right, wrong in ((llama, "gguf", "hf"), (gemma, "hf", "gguf")):
        check_key_order("s.yaml", case(model=model, q_quant="q8_0", k_order=right))
        check_key_order("s.yaml", case(model=model, k_order=wrong))  # no twin: any order
        with pytest.raises(SuiteError, match=f"holds keys in order {right}"):
            check_key_order("s.yaml", case(model=model, q_quant="q8_0", k_order=wrong))

"""Topic "who lost the answer" (harness/analysis/findings/attribution.py) on planted rows: each
cell's verdict worked out by hand from its sides' answers."""

from __future__ import annotations

import json

import pandas as pd

from kvbench.analysis import findings as fd
from kvbench.analysis.findings import attribution
from kvbench.store.schema import COLUMNS

KEY = "39384"


def row(kernel="reference", ok=True, ref=1.0, text=None, **case) -> dict:
    r = dict.fromkeys(COLUMNS)
    r.update(status="ok", model="smollm2-135m", phase="retrieval", task="passkey-llamacpp",
             context_len=800, kv_edit="shift", kv_dtype="q8_0", kernel=kernel, q_quant="none",
             k_order="hf", peer_weights="gguf", n_trials=1, n_correct=int(ok),
             ref_accuracy=ref, depth=0.1,
             answer_texts=json.dumps([text or (f" {KEY}." if ok else " 12345.")]))  # fmt: skip
    r.update(case)
    return r


def cell(depth: float, plain=True, named=True, peer=True, f32=True, ref=1.0, **kw) -> list:
    return [
        row(ok=plain, ref=ref, depth=depth, **kw),
        row(ok=named, ref=ref, depth=depth, q_quant="q8_0", k_order="gguf", **kw),
        # llama.cpp's rows record the key order its cache holds (a llama GGUF's: gguf)
        row("llama.cpp", ok=peer, ref=1.0, depth=depth, k_order="gguf", **kw),
        row("llama.cpp", ok=f32, ref=1.0, depth=depth, peer_weights="f32", k_order="gguf", **kw),
    ]


def texts(rows) -> dict:
    got = attribution.find(pd.DataFrame(rows, columns=COLUMNS))
    return {f.text.split(" shift depth ")[1].split(" ")[0]: f.text for f in got[1:]}


def test_each_part_that_lost_the_answer_is_named():
    rows = cell(0.1, named=False, peer=False, f32=False) + cell(0.3) + cell(0.5, ref=0.0)
    rows += cell(0.7, plain=False) + cell(0.9, peer=False)
    got = texts(rows)
    assert "the arithmetic lost it" in got["0.1"]
    assert "kvbench gives llama-passkey's answer" in got["0.1"]  # both say 12345
    assert "none lost it" in got["0.3"] and "llama-passkey 1/1" in got["0.3"]
    assert "the context lost it" in got["0.5"] and "float32 cache 0/1" in got["0.5"]
    assert "the cache lost it under float32 queries" in got["0.7"]
    assert "in llama.cpp's arithmetic the same cache finds it" in got["0.7"]
    both = texts(cell(0.7, plain=False, named=False))["0.7"]
    assert "the cache lost it (the float32 cache finds it)" in both
    assert "the peer's weights lost it" in got["0.9"]
    assert "kvbench gives llama-passkey's answer" in got["0.9"]  # the f32 copy's: same weights
    differ = cell(0.2, named=False, f32=False)
    differ[1]["answer_texts"] = json.dumps([" 11111."])
    assert "its answer differs" in texts(differ)["0.2"]
    assert len(got) == 5


def test_wilson_intervals_past_one_trial_and_the_registry():
    rows = [{**r, "n_trials": 4, "n_correct": 4 if r["kernel"] == "reference" else 2,
             "answer_texts": json.dumps([f" {KEY}."] * 4)} for r in cell(0.5)]  # fmt: skip
    [_, f] = attribution.find(pd.DataFrame(rows, columns=COLUMNS))
    assert "llama-passkey 2/4 (0.15-0.85)" in f.text and "kvbench 4/4 (0.51-1.00)" in f.text
    # the twin 3 of 4 against llama-passkey's 2 of 4: not the same verdict, though neither
    # found the key in every trial
    twin = [{**r, "n_correct": 3} if r["q_quant"] == "q8_0" else r for r in rows]
    total = attribution.find(pd.DataFrame(twin, columns=COLUMNS))[0].text
    assert "the same verdict in 0 of 1" in total
    same = [{**r, "n_correct": 2} if r["q_quant"] == "q8_0" else r for r in rows]
    total = attribution.find(pd.DataFrame(same, columns=COLUMNS))[0].text
    assert "the same verdict in 1 of 1" in total
    assert fd.TOPICS[attribution.TOPIC] is attribution.find
    # no llama.cpp row: nothing to attribute
    assert attribution.find(pd.DataFrame(cell(0.5)[:2], columns=COLUMNS)) == []


def test_the_cells_agreement_is_counted_by_verdict_and_by_number():
    # 0.1: both miss with one number (12345); 0.3: all find; 0.9: kvbench finds, the GGUF's
    # llama-passkey misses, its float32 copy finds; 0.2: both miss, numbers differ; 0.4: fp16
    # (no row in llama.cpp's arithmetic: kvbench's plain row stands for it), only the GGUF peer
    rows = cell(0.1, named=False, peer=False, f32=False) + cell(0.3) + cell(0.9, peer=False)
    differ = cell(0.2, named=False, peer=False, f32=False)
    differ[1]["answer_texts"] = json.dumps([" 11111."])
    fp16 = [r for r in cell(0.4, kv_dtype="fp16") if r["q_quant"] == "none"]
    got = attribution.find(pd.DataFrame(rows + differ + fp16[:2], columns=COLUMNS))
    assert got[0].text == (
        "5 cells: in llama.cpp's arithmetic kvbench against llama-passkey on the GGUF: the same "
        "verdict in 4 of 5, the same number in 3 of 5; against llama-passkey on its "
        "float32 copy: the same verdict in 4 of 4, the same number in 3 of 4"
    )


def test_a_twin_in_another_key_order_is_not_llama_cpps_arithmetic():
    # the peer's row records k_order hf (Gemma); a q8_0-query row with GGUF's order is left out
    rows = [{**r, "k_order": "hf"} if r["kernel"] == "llama.cpp" else r
            for r in cell(0.5, named=False)]  # fmt: skip
    [_, f] = attribution.find(pd.DataFrame(rows, columns=COLUMNS))
    assert "in llama.cpp's arithmetic" not in f.text and "none lost it" in f.text
    rows[1]["k_order"] = "hf"  # the twin in the peer's order counts again
    [_, f] = attribution.find(pd.DataFrame(rows, columns=COLUMNS))
    assert "in llama.cpp's arithmetic 0/1" in f.text and "the arithmetic lost it" in f.text

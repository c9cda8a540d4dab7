"""The serve engine: phase serve, many sequences of a real model decoding together
(kernels/model/serve.py, llama-batched-bench's schedule) through one model cache over a
per-stream or unified layout (kernels/model/batched.py SeqCache; docs/serve.md).

A case: pp = context_len prompt tokens per sequence, tg = gen_tokens greedy steps, pl =
n_seqs sequences; workload shared-prefix shares one prompt (llama-batched-bench -pps), any
other workload gives each sequence its own prompt: consecutive context_len-token slices of the
text. After an untimed warm-up pass (llama-batched-bench decodes 16 tokens first), the whole
schedule runs once; the row holds llama-batched-bench's figures under its names (pp, tg, pl,
n_kv as n_kv_req, t_pp, s_pp, t_tg, s_tg, t, s), the decode steps' median and spread (tg_step_ms,
tg_step_p10_ms, tg_step_p90_ms), the cells the layout allocated and holds (cells_alloc,
cells_used) and their exact format bytes (bytes_alloc, bytes_used = kv_bytes), and the truth of
the batch: the first and last sequence run alone through the single-sequence cache,
teacher-forced with their generated tokens (serve_max_abs_logit: the largest logit difference;
serve_greedy_agree: the least fraction of greedy choices equal).
"""

from __future__ import annotations

import numpy as np

from kvbench.case import Case
from kvbench.engines import common
from kvbench.engines.contract import State, memory_baseline
from kvbench.engines.serve_rows import PHASE, held_cells, shared, stream_cells
from kvbench.kernels.model import serve
from kvbench.kernels.model.batched import SeqCache
from kvbench.kernels.stores.layouts import Layout
from kvbench.suite.resolved import Resolved

WARMUP_TOKENS = 16


def claims(case: Case) -> bool:
    return case.phase == PHASE


skip_reason = common.model_skip_reason


def prompts_of(case: Case) -> np.ndarray:
    """[pl, pp] consecutive slices of the text ([1, pp] shared); ValueError if it is short."""
    tokens = common.tokens_of(case.model, case.text)
    rows = 1 if shared(case) else case.n_seqs
    need = rows * case.context_len
    if len(tokens) < need:
        raise ValueError(f"text {case.text}: {len(tokens)} tokens, fewer than the {rows} "
                         f"prompts x {case.context_len} tokens phase serve reads")  # fmt: skip
    return np.asarray(tokens[:need], dtype=np.int64).reshape(rows, case.context_len)


def new_cache(case: Case, r: Resolved, model, n_seqs: int, cells: int) -> SeqCache:
    layout = Layout(case.layout, n_seqs, cells)
    return SeqCache(r.spec, model.config, layout, case.kernel, case.tile_kv)


def warm_up(case: Case, r: Resolved, model) -> None:
    cache = new_cache(case, r, model, 1, WARMUP_TOKENS)
    serve.run(model, cache, np.zeros((1, WARMUP_TOKENS), np.int64), 1, WARMUP_TOKENS)


def build(case: Case, r: Resolved) -> State:
    model, _ = common.model_of(case.model)
    prompts = prompts_of(case)
    baseline = memory_baseline()
    fresh = lambda: new_cache(case, r, model, case.n_seqs, stream_cells(case))  # noqa: E731
    held = {"cache": fresh(), "ran": False}  # a second check (another round) starts empty
    keep = tuple(sorted({0, case.n_seqs - 1}))

    def check() -> dict:
        if held["ran"]:
            held["cache"] = fresh()
        cache, held["ran"] = held["cache"], True
        warm_up(case, r, model)
        served = serve.run(model, cache, prompts, case.gen_tokens, common.UBATCH, keep)
        diffs, agree = [], []
        for i, seq in enumerate(keep):
            prompt = prompts[0 if served.shared else seq]
            d, a = serve.check_alone(model, r.spec, case.kernel, prompt, served, i, seq,
                                     case.tile_kv)  # fmt: skip
            diffs.append(d)
            agree.append(a)
        lay = cache.layout
        if lay.cells_used != held_cells(case):  # llama-batched-bench's count, per layout
            raise ValueError(f"the cache holds {lay.cells_used} cells, the schedule "
                             f"{held_cells(case)}")  # fmt: skip
        used = common.model_kv_bytes(case, r.spec, lay.cells_used)
        return {
            **served.fields(),
            "cells_alloc": lay.cells_alloc, "cells_used": lay.cells_used,
            "bytes_alloc": common.model_kv_bytes(case, r.spec, lay.cells_alloc),
            "bytes_used": used, "kv_util": lay.cells_used / lay.cells_alloc,
            "serve_max_abs_logit": max(diffs), "serve_greedy_agree": min(agree),
        }  # fmt: skip

    return State(
        {},
        check,
        traffic=(0, 0),
        kv_bytes=common.model_kv_bytes(case, r.spec, held_cells(case)),
        bits_per_elem=common.model_bits_per_elem(case, r.spec),
        baseline_bytes=baseline,
        cache=lambda: held["cache"].arrays(),
        effective=common.model_effective(case),
    )

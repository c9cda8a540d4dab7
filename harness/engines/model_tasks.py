"""The model's task phases: retrieval and generate (kernels/model/retrieval.py, generate.py),
on the model and cache of the model engine (harness/engines/model.py). No stage is sampled:
the row holds what check() returns, as for the quality phase, with what its evidence cost
(wall_s, prefill and decode tokens and seconds, the float32 reference's ref_wall_s:
kernels/model/meter.py).

* phase retrieval: `trials` prompts of task `task` (passkey, niah, multikey, vartrack) of at
  most context_len tokens with the needle at `depth` of the haystack (trial i seeded by
  seed + i), in the model's chat template where it has one; the answer is generated greedily
  with the case's cache and with a float32 cache. The row: accuracy against the truth and
  agreement with the float32 cache's answers, each with a 95% Wilson interval.
* phase generate: for each of `chunks` chunks of context_len tokens of the text, the model
  generates `gen_tokens` tokens greedily after the chunk; the row: tokens to the first
  divergence from the float32 cache's continuation, agreement, and the teacher-forced KL along
  it. quantized_kv_start as mlx-lm's (fp16 until that many positions are held).
The float32 references are computed once per process and shared by every format.
"""

from __future__ import annotations

from functools import lru_cache

from kvbench.case import Case
from kvbench.engines import common, edit_rows
from kvbench.engines.contract import State
from kvbench.kernels.model import compress, generate, meter, quality, retrieval, shift
from kvbench.kernels.model.cache import make_cache
from kvbench.suite import model_edit
from kvbench.suite.cache_spec import TASK_PHASES
from kvbench.suite.model_plan import PREFILL_UBATCH
from kvbench.suite.resolved import Resolved

UBATCH = PREFILL_UBATCH  # prefill micro-batch of the task phases (llama.cpp's default ubatch)


def claims(case: Case) -> bool:
    return case.phase in TASK_PHASES


skip_reason = common.model_skip_reason


def answers(key: tuple, spec, kernel: str, tile_kv, case=None, saturated=None, edit=None,
            edits=None, kept=None) -> list[str]:  # fmt: skip
    """Each trial's greedy continuation (its text) with `spec`'s cache (and the case's sliding
    window, if any); key: (model, task, context_len, depth, trials, seed). Each trial's K/V
    elements stored saturated (FP8) appended to `saturated` when given. `edit`
    (suite/model_edit.py edit_of): the prompt read through llama.cpp's context shift or
    self-extend (kernels/model/shift.py), each trial's counts appended to `edits`. The case's
    cache policy, if any, compresses each prompt's haystack (compress.policy_answer), what it
    kept noted in `kept`."""
    model, tokenizer = common.model_of(key[0])
    if case is not None:
        model = common.windowed(model, case)
    got = []
    for p in common.prompts_of(*key):
        if case is not None and case.policy != "none":  # the haystack compressed, not the question
            policy = common.policy_of(case)
            got.append(compress.policy_answer(model, tokenizer, p, key[1], spec, kernel, policy,
                                              kept, UBATCH, tile_kv))  # fmt: skip
            continue
        if edit is not None:
            got.append(edited_answer(model, tokenizer, p, key, spec, kernel, tile_kv, edit, edits))
            continue
        capacity = len(p.tokens) + p.gen_tokens  # a window layer's ring: one prefill ubatch
        cache = make_cache(spec, model.config, capacity, kernel, tile_kv, max_step=UBATCH)
        got.append(retrieval.greedy_answer(model, cache, tokenizer, p, key[1], UBATCH))
        if saturated is not None:
            saturated.append(cache.saturated())
    return got


def edited_answer(model, tokenizer, p, key, spec, kernel, tile_kv, edit, edits) -> str:
    """One trial through the edit: a cache of the schedule's cells (an overrun fails as
    llama_decode would), the prompt and answer as passkey.cpp reads them."""
    sch = edit_rows.schedule(key[0], edit)
    config, windows = shift.full_windows(model.config, sch.swa_full)
    # a sliding-window layer's ring: one prefill ubatch past its window (read_prompt's steps)
    inner = make_cache(spec, config, sch.n_cells, kernel, tile_kv, max_step=UBATCH)
    cache = shift.ShiftCache(inner, shift.rope_params(model.net), sch.div_sign, windows)
    text = shift.greedy_answer(model, cache, tokenizer, p, key[1], sch, UBATCH)
    if edits is not None:
        edits.append({**cache.counts, "n_past": cache.offset, "cells": sch.n_cells})
    return text


@lru_cache(maxsize=16)
def reference_answers(*key, edit=None) -> tuple[tuple, float]:
    """The float32 cache's continuations and the wall seconds they took (once per process);
    with `edit`, through the same context shift or self-extend."""
    with meter.metered() as m:
        got = tuple(answers(key, quality.REFERENCE_SPEC, "reference", None, edit=edit))
    return got, m.wall_s


def retrieval_state(case: Case, r: Resolved) -> State:
    def check() -> dict:
        key = (case.model, case.task, case.context_len, case.depth, case.trials, case.seed)
        edit, edits = model_edit.edit_of(case), []
        ref, ref_s = reference_answers(*key, edit=edit)
        spec, sat, kept = r.spec, [], compress.Kept()
        with meter.metered() as m:
            got = answers(key, spec, case.kernel, case.tile_kv, case, sat, edit, edits, kept)
        truth = [p.answer for p in common.prompts_of(*key)]
        row = common.answer_fields(case.task, got, list(ref), truth)
        row["prompt_tokens"] = max(len(p.tokens) for p in common.prompts_of(*key))
        row |= {"kv_saturated": sum(sat)} if spec.saturates else {}
        row |= edit_rows.edit_fields(edits)
        row |= kept.fields() if case.policy != "none" else {}
        return {**row, **m.fields(), "ref_wall_s": ref_s, "ubatch": edit_rows.edit_ubatch(case)}

    fields, held = edit_rows.edit_effective(
        case
    )  # an edit's cache holds the context's cells at most
    kv_bytes, bits = (
        policy_bytes(case, r)
        if case.policy != "none"
        else (common.model_kv_bytes(case, r.spec, held), common.model_bits_per_elem(case, r.spec))
    )
    return State({}, check, traffic=(0, 0), kv_bytes=kv_bytes, bits_per_elem=bits,
                 effective={**common.model_effective(case), **fields})  # fmt: skip


def policy_bytes(case: Case, r: Resolved, n: int | None = None) -> tuple[int, float]:
    """A policy row's kv_bytes and bits per element of the n tokens compressed (default: the
    first prompt's haystack; the row's kept_* fields are that prompt's too)."""
    if n is None:
        key = (case.model, case.task, case.context_len, case.depth, case.trials, case.seed)
        n = common.prompts_of(*key)[0].haystack[1]
    c = common.model_of(case.model)[0].config
    kv_bytes = common.policy_kv_bytes(case, r, n)
    return kv_bytes, 8 * kv_bytes / (2 * c.n_layers * c.n_kv_heads * c.head_dim * n)


@lru_cache(maxsize=8)
def generate_reference(name: str, text: str, context_len: int, n_chunks: int, n_new: int):
    """The chunks, the float32 cache's continuations and the wall seconds these took."""
    model, _ = common.model_of(name)
    chunks = common.chunks_of(name, text, context_len, n_chunks)
    with meter.metered() as m:
        refs = [generate.reference(model, c, n_new, UBATCH) for c in chunks]
    return chunks, refs, m.wall_s


def generate_state(case: Case, r: Resolved) -> State:
    def check() -> dict:
        model = common.windowed(common.model_of(case.model)[0], case)
        chunks, refs, ref_s = generate_reference(case.model, case.text, case.context_len,
                                                 case.chunks, case.gen_tokens)  # fmt: skip
        kept, cache_of, settle = compress.Kept(), None, None
        if case.policy != "none":  # each chunk but its last token compressed, then generation
            cache_of, settle = compress.generate_cache_of(
                model, r.spec, lambda: common.policy_of(case), kept, case.kernel, UBATCH,
                case.tile_kv)  # fmt: skip
        with meter.metered() as m:
            row = generate.generate_error(
                model, chunks, refs, r.spec, case.gen_tokens, case.kernel, case.tile_kv,
                case.quantized_kv_start, UBATCH, cache_of,
            )  # fmt: skip
        if settle is not None:
            settle()
            row |= kept.fields()
        bos = common.chunk_bos(case.model) is not None
        return {**row, **m.fields(), "ref_wall_s": ref_s, "chunk_bos": bos,
                "ubatch": common.ubatch_of(case)}  # fmt: skip

    kv_bytes, bits = common.model_kv_bytes(case, r.spec), common.model_bits_per_elem(case, r.spec)
    if case.policy != "none":
        kv_bytes, bits = policy_bytes(case, r, case.context_len - 1)
    return State({}, check, traffic=(0, 0), kv_bytes=kv_bytes, bits_per_elem=bits,
                 effective=common.model_effective(case))  # fmt: skip


def build(case: Case, r: Resolved) -> State:
    """The case resolved (a bad format failed there, not in the model): its cache spec."""
    return retrieval_state(case, r) if case.phase == "retrieval" else generate_state(case, r)

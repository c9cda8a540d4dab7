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

import json
from functools import lru_cache

from kvbench.case import Case
from kvbench.engines import model as base
from kvbench.engines.contract import State
from kvbench.kernels.model import generate, meter, passkey, quality, retrieval
from kvbench.kernels.model.cache import make_cache
from kvbench.stats import wilson
from kvbench.suite.cache_spec import TASK_PHASES, format_of, spec_of
from kvbench.suite.model_plan import PREFILL_UBATCH

UBATCH = PREFILL_UBATCH  # prefill micro-batch of the task phases (llama.cpp's default ubatch)


def claims(case: Case) -> bool:
    return case.phase in TASK_PHASES


skip_reason = base.skip_reason


@lru_cache(maxsize=16)
def prompts_of(name: str, task: str, context_len: int, depth: float, trials: int, seed: int):
    model, tokenizer = base.model_of(name)
    if task == passkey.TASK:  # llama.cpp's prompt exactly, no chat template (model/passkey.py)
        return tuple(passkey.prompt(tokenizer, context_len, depth, i) for i in range(trials))
    chat = retrieval.chat_frame(tokenizer, model.metadata)
    out = []
    for i in range(trials):
        trial = retrieval.make_trial(task, seed + i)
        out.append(retrieval.build_prompt(trial, tokenizer, context_len, depth, seed + i, chat))
    return tuple(out)


def answers(key: tuple, spec, kernel: str, tile_kv, case=None, saturated=None) -> list[str]:
    """Each trial's greedy continuation (its text) with `spec`'s cache (and the case's sliding
    window, if any); key: (model, task, context_len, depth, trials, seed). Each trial's K/V
    elements stored saturated (FP8) appended to `saturated` when given."""
    model, tokenizer = base.model_of(key[0])
    if case is not None:
        model = base.windowed(model, case)
    got = []
    for p in prompts_of(*key):
        capacity = len(p.tokens) + p.gen_tokens  # a window layer's ring: one prefill ubatch
        cache = make_cache(spec, model.config, capacity, kernel, tile_kv, max_step=UBATCH)
        got.append(retrieval.greedy_answer(model, cache, tokenizer, p, key[1], UBATCH))
        if saturated is not None:
            saturated.append(cache.saturated())
    return got


@lru_cache(maxsize=16)
def reference_answers(*key) -> tuple[tuple, float]:
    """The float32 cache's continuations and the wall seconds they took (once per process)."""
    with meter.metered() as m:
        got = tuple(answers(key, quality.REFERENCE_SPEC, "reference", None))
    return got, m.wall_s


def answer_fields(task: str, texts: list[str], ref_texts: list[str], truth: list[str]) -> dict:
    """A retrieval row's columns: the summary of the answers read from the continuations
    (retrieval.summarize) and every trial's continuation text, a JSON list (`answer_texts`)."""
    got = [retrieval.extract(task, t) for t in texts]
    ref = [retrieval.extract(task, t) for t in ref_texts]
    row = retrieval.summarize(task, got, ref, truth)
    n = row["n_trials"]
    row["accuracy_lo"], row["accuracy_hi"] = wilson(row["n_correct"], n)
    row["ref_agree_lo"], row["ref_agree_hi"] = wilson(row["n_ref_agree"], n)
    return {**row, "answer_texts": json.dumps(texts)}


def retrieval_state(case: Case) -> State:
    def check() -> dict:
        key = (case.model, case.task, case.context_len, case.depth, case.trials, case.seed)
        ref, ref_s = reference_answers(*key)
        spec, sat = spec_of(case), []
        with meter.metered() as m:
            got = answers(key, spec, case.kernel, case.tile_kv, case, sat)
        truth = [p.answer for p in prompts_of(*key)]
        row = answer_fields(case.task, got, list(ref), truth)
        row["prompt_tokens"] = max(len(p.tokens) for p in prompts_of(*key))
        row |= {"kv_saturated": sum(sat)} if spec.saturates else {}
        return {**row, **m.fields(), "ref_wall_s": ref_s, "ubatch": base.ubatch_of(case)}

    return State({}, check, traffic=(0, 0), kv_bytes=base.kv_bytes(case),
                 bits_per_elem=base.bits_per_elem(case),
                 effective=base.effective(case))  # fmt: skip


@lru_cache(maxsize=8)
def generate_reference(name: str, text: str, context_len: int, n_chunks: int, n_new: int):
    """The chunks, the float32 cache's continuations and the wall seconds these took."""
    model, _ = base.model_of(name)
    chunks = base.chunks_of(name, text, context_len, n_chunks)
    with meter.metered() as m:
        refs = [generate.reference(model, c, n_new, UBATCH) for c in chunks]
    return chunks, refs, m.wall_s


def generate_state(case: Case) -> State:
    def check() -> dict:
        model = base.windowed(base.model_of(case.model)[0], case)
        chunks, refs, ref_s = generate_reference(case.model, case.text, case.context_len,
                                                 case.chunks, case.gen_tokens)  # fmt: skip
        with meter.metered() as m:
            row = generate.generate_error(
                model, chunks, refs, spec_of(case), case.gen_tokens, case.kernel, case.tile_kv,
                case.quantized_kv_start, UBATCH,
            )  # fmt: skip
        bos = base.chunk_bos(case.model) is not None
        return {**row, **m.fields(), "ref_wall_s": ref_s, "chunk_bos": bos,
                "ubatch": base.ubatch_of(case)}  # fmt: skip

    return State({}, check, traffic=(0, 0), kv_bytes=base.kv_bytes(case),
                 bits_per_elem=base.bits_per_elem(case),
                 effective=base.effective(case))  # fmt: skip


def build(case: Case) -> State:
    format_of(case)  # a bad format fails here, not in the model
    return retrieval_state(case) if case.phase == "retrieval" else generate_state(case)

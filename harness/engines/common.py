"""What engines share, on the engines' lowest floor: no engine imports another engine
(tests/test_walls.py ENGINE_FLOORS), so a helper two engines need lives here.

* the attention call of a case (problem_of), why its kernel cannot run (kernel_reason), the axes
  as run (effective) and FP8 saturation counts, for every engine over kvbench's own stores;
* a many-sequence workload: its tables, calls, reference, stages and State (streams, paged,
  edits);
* a real model: the model, its tokens and chunks, its byte and FLOP model and the axes as run
  (model, model_tasks, llamacpp), and the task prompts both kvbench and llama.cpp answer.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace
from functools import lru_cache

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines.contract import State, window_reason
from kvbench.kernels.attention.gpu.kernels import DTYPE_NAMES, kv_code
from kvbench.kernels.attention.gpu.launch import Problem
from kvbench.kernels.attention.registry import (
    KERNELS,
    effective_tile,
    reference,
    unsupported_reason,
)
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model import cache as kv_store
from kvbench.kernels.model import passkey, policies, quality, retrieval
from kvbench.kernels.model import spec as kv_spec
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.source import model_file
from kvbench.kernels.model.text import default_text, text_file
from kvbench.kernels.model.tokenizer import load_tokenizer
from kvbench.kernels.stores.layouts import cells_from_tokens
from kvbench.kernels.stores.workloads import Replay, Workload
from kvbench.stats import wilson
from kvbench.suite import policy as suite_policy
from kvbench.suite import resolved
from kvbench.suite.cache_spec import rotation_blocks
from kvbench.suite.model_plan import PREFILL_UBATCH
from kvbench.suite.resolved import Resolved

UBATCH = PREFILL_UBATCH  # prefill micro-batch (llama.cpp's default n_ubatch): a window ring holds
# window + sinks + UBATCH - 1 cells (kernels/stores/window.py), not window + the whole prefill


def problem_of(case: Case, fmt) -> Problem:
    """The attention call a case makes, as the GPU kernels' launch planner sees it."""
    return Problem(
        n_seqs=case.n_seqs,
        n_q_heads=case.n_q_heads,
        n_kv_heads=case.n_kv_heads,
        head_dim=case.head_dim,
        kv_len=case.context_len,
        dtype=DTYPE_NAMES.get(fmt.compute_dtype, str(fmt.compute_dtype)),
        kv_code=kv_code(fmt) or fmt.name,
        group_size=case.group_size,
        q_len=1 if case.phase == "decode" else case.context_len,
    )


def kernel_reason(case: Case, backend: str, problem: Problem) -> str | None:
    """Why the case's kvbench kernel cannot run a call of this shape here, or None."""
    fmt = resolved.of_case(case).k_fmt
    reason = window_reason(case)
    return reason or unsupported_reason(case.kernel, fmt, backend, problem, case.tile_kv)


def effective(case: Case) -> dict:
    """The case axes as the kernel runs them: a null tile_kv is the kernel's default tile, a
    null rotation block llama.cpp's rule."""
    bk, bv = rotation_blocks(case)
    return {"tile_kv": effective_tile(case.kernel, case.tile_kv), "rot_block_k": bk,
            "rot_block_v": bv}  # fmt: skip


def saturated(fmt, k: mx.array, v: mx.array) -> dict:
    """kv_saturated: elements of layer 0's K and V (every position, as written) the format
    stores as its largest value (FP8); {} for a format that does not saturate."""
    sat = [fmt.saturated(x) for x in (k, v)]
    return {} if sat[0] is None else {"kv_saturated": int((sat[0] + sat[1]).item())}


def call_problem(case: Case, fmt) -> Problem:
    """The shape of one attention call of the case (as plan_calls makes them): one sequence at
    a time, or a unified buffer whose n_seqs queries are query rows of one call."""
    problem = problem_of(case, fmt)  # kv_len is nominal for workloads
    if case.decode_order == "sequential":
        return dataclasses.replace(problem, n_seqs=1)
    if case.layout == "unified":
        return dataclasses.replace(problem, n_seqs=1, q_len=case.n_seqs)
    return problem


def workload_of(case: Case) -> Workload:
    return Workload(case.n_seqs, case.context_len, case.prefix_len, case.decode_order, case.churn)


def make_tables(case: Case, n_tokens: int):
    """q32 [S, Hq, 1, D] and K/V tables [1, Hkv, n_tokens, D] (float32, by token id)."""
    tables = make_qkv(
        case.kv_data,
        (case.n_seqs, case.n_q_heads, 1, case.head_dim),
        (1, case.n_kv_heads, n_tokens, case.head_dim),
        case.seed,
    )
    mx.eval(tables)
    return tables


def sequence_reference(case: Case, rp: Replay, tables, fmt) -> mx.array:
    """[S, Hq, 1, D]: each sequence attends over exactly its own tokens' K/V (in fmt)."""
    q32, k_tab, v_tab = tables
    scale = 1.0 / math.sqrt(case.head_dim)
    outs = []
    for s, toks in enumerate(rp.seq_tokens):
        idx = mx.array(toks)
        k, v = (fmt.encode(mx.take(tab, idx, axis=2)) for tab in (k_tab, v_tab))
        outs.append(reference(q32[s : s + 1], k, v, fmt, scale=scale))
    return mx.concatenate(outs, axis=0)


def stored_saturated(fmt, tokens, tables) -> dict:
    """kv_saturated: elements of layer 0's K and V the format stores as its largest value
    (FP8), over the cells of token ids `tokens` [S, L] (-1 empty) as the fill encoded them from
    the float32 tables: every occupied cell once (a shared prefix once), the step's tokens
    included (their cells are in the replay). {} for a format that does not saturate."""
    _, k_tab, v_tab = tables
    cells = [cells_from_tokens(tokens, tab) for tab in (k_tab, v_tab)]  # [S, Hkv, L, D] each
    return saturated(fmt, *cells)


def layered_stages(run, build_inputs, inputs) -> dict:
    """A many-sequence step over `run`'s store, layer by layer: mask (building the step's
    masks or block-table inputs), write (every layer's new K/V), attend (every layer, with
    `inputs` built once) and step (all three, the inputs built anew)."""
    n_layers = run.store.n_layers

    def write() -> list[mx.array]:
        for layer in range(n_layers):
            run.write(layer)
        return run.store.arrays()

    def attend() -> list[mx.array]:
        return [o for layer in range(n_layers) for o in run.attend(layer, inputs)]

    def step() -> list[mx.array]:
        fresh, outs = build_inputs(), []
        for layer in range(n_layers):
            run.write(layer)
            outs += run.attend(layer, fresh)
        return outs + run.store.arrays()

    return {"step": step, "write": write, "mask": build_inputs, "attend": attend}


def workload_state(run, stages, check, row: dict, traffic_bytes, effective: dict) -> State:
    """The State of a many-sequence case: its counts as row fields, and as kv_bytes the K/V
    the workload holds (its occupied cells), not n_seqs x context_len: a shared prefix is
    stored once, finished sequences are gone."""
    return State(
        stages,
        check,
        traffic=traffic_bytes,
        kv_bytes=row["bytes_used"],
        alloc_bytes=run.alloc_bytes,
        baseline_bytes=run.baseline,
        cache=run.store.arrays,
        effective=effective,
        extra=row,
    )


def workload_skip_reason(case: Case, backend: str) -> str | None:
    """The cache engine's kernels, asked about the streams' call shapes."""
    fmt = resolved.of_case(case).k_fmt
    return kernel_reason(case, backend, call_problem(case, fmt))


@lru_cache(maxsize=2)
def model_of(name: str):
    """The model (a registered one from the kvbench cache, a GGUF file, an mlx-lm directory or
    a Hugging Face repo id: kernels/model/source.py) and its tokenizer."""
    model = load_model(model_file(name))
    return model, load_tokenizer(model)


@lru_cache(maxsize=4)
def tokens_of(name: str, text: str) -> tuple[int, ...]:
    _, tokenizer = model_of(name)
    body = default_text() if text == "default" else text_file(text)
    return tuple(tokenizer.encode(body))


def chunk_bos(name: str) -> int | None:
    """The BOS id that starts every chunk where the model's vocabulary adds one (Gemma,
    Llama 3, Mistral), as llama-perplexity puts it there; None where it adds none (SmolLM2)."""
    _, tokenizer = model_of(name)
    if tokenizer is None or not tokenizer.add_bos:
        return None
    return tokenizer.bos_id


def chunks_of(name: str, text: str, context_len: int, n_chunks: int) -> list[list[int]]:
    """The text's chunks as llama-perplexity builds them (quality.chunks with chunk_bos)."""
    tokens = list(tokens_of(name, text))
    return quality.chunks(tokens, context_len, n_chunks, chunk_bos(name))


def ubatch_of(case: Case) -> int:
    """Tokens one forward pass of the case's prefill takes at most (the row's ubatch)."""
    return min(UBATCH, case.context_len)


def weight_bytes(model) -> int:
    """Bytes of every weight array of the model (quantized weights with scales and biases)."""
    from mlx.utils import tree_flatten

    return sum(a.nbytes for _, a in tree_flatten(model.net.parameters()))


def matmul_macs(model) -> int:
    """Multiply-adds per token of every linear layer (out x in features, quantized ones
    unpacked) and of the output head (the embedding, where the model ties it)."""
    import mlx.nn as nn

    macs, head = 0, False
    for name, m in model.net.named_modules():
        if isinstance(m, nn.QuantizedLinear):
            macs += m.weight.shape[0] * m.weight.shape[1] * 32 // m.bits
        elif isinstance(m, nn.Linear):
            macs += m.weight.size
        head = head or name.endswith("lm_head")
    return macs if head else macs + model.config.vocab * model.config.hidden


def decode_flops(case: Case, model, attended: list[int] | None = None) -> int:
    """Matmul FLOPs of one decode step: 2 per multiply-add of every linear layer and the
    output head, plus attention over the positions each layer attends (4 * Hq * L * D per
    layer; `attended`: L per layer, default the whole context, context_len)."""
    c = model.config
    attended = [case.context_len] * c.n_layers if attended is None else attended
    return 2 * matmul_macs(model) + 4 * c.n_heads * c.head_dim * sum(attended)


def decode_traffic(case: Case, model, spec, held: int | None = None) -> tuple[int, int]:
    """(read, written) of one decode step, each tensor once: every weight, the K/V the step
    reads (`held` bytes; default the context_len - 1 positions held), the new token's K/V
    written (activations not counted)."""
    depth = model_kv_bytes(case, spec, case.context_len - 1)
    held = depth if held is None else held
    return weight_bytes(model) + held, model_kv_bytes(case, spec) - depth


def windowed(model, case: Case):
    """The model as a case runs it: with `window` set, every layer a sliding window of that
    many positions plus `sink_tokens` sinks (kernels/model/cache.py WindowCache, mlx-lm's
    RotatingKVCache semantics), the weights shared."""
    if case.window is None:
        return model
    windows = ((case.window, case.sink_tokens),) * model.config.n_layers
    return replace(model, config=replace(model.config, windows=windows))


def model_effective(case: Case) -> dict:
    """The Hadamard blocks in effect (a null rot_block_k / rot_block_v: llama.cpp's rule)."""
    return dict(zip(("rot_block_k", "rot_block_v"), rotation_blocks(case)))


def model_kv_bytes(case: Case, spec, n_tokens: int | None = None) -> int:
    """Exact bytes the case's cache holds after n_tokens (default context_len), each layer at
    its own positions: a sliding-window layer (the model's, or every layer with `window`)
    holds min(n_tokens, window + sinks); with swa_cache full, every cell (kernels/model/shift.py
    full_windows)."""
    c = windowed(model_of(case.model)[0], case).config
    n = case.context_len if n_tokens is None else n_tokens
    windows = () if case.swa_cache == "full" else c.windows
    return kv_spec.kv_bytes(spec, n, c.n_layers, c.n_kv_heads, c.head_dim,
                            windows=windows)  # fmt: skip


def model_bits_per_elem(case: Case, spec) -> float:
    """Stored bits per K/V element of the whole spec (separate formats, fp16 sinks and
    residual window, per-channel scales included): kv_bytes over the context's elements (a
    sliding window holds fewer than the context: its bits per context element are fewer)."""
    c = model_of(case.model)[0].config
    elems = 2 * c.n_layers * c.n_kv_heads * case.context_len * c.head_dim
    return 8 * model_kv_bytes(case, spec) / elems


def model_skip_reason(case: Case, backend: str) -> str | None:
    """A plain spec runs the kernel on the stored format; any other spec (separate K/V formats,
    per-channel keys, sinks, a residual window) and any cache policy (kernels/model/evicting.py)
    hand the kernel a dense view."""
    r = resolved.of_case(case)
    f32 = case.kernel in KERNELS and KERNELS[case.kernel].float32
    dense = get_format("fp32" if f32 else "fp16")
    stored = r.spec.plain and case.policy == "none"
    try:
        for fmt in (r.k_fmt, r.v_fmt) if stored else (dense,):
            kv_store.check_kernel(case.kernel, fmt, backend)
    except ValueError as e:
        return str(e)
    return None


@lru_cache(maxsize=16)
def prompts_of(name: str, task: str, context_len: int, depth: float, trials: int, seed: int):
    model, tokenizer = model_of(name)
    if task == passkey.TASK:  # llama.cpp's prompt exactly, no chat template (model/passkey.py)
        return tuple(passkey.prompt(tokenizer, context_len, depth, i) for i in range(trials))
    chat = retrieval.chat_frame(tokenizer, model.metadata)
    out = []
    for i in range(trials):
        trial = retrieval.make_trial(task, seed + i)
        out.append(retrieval.build_prompt(trial, tokenizer, context_len, depth, seed + i, chat))
    return tuple(out)


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


# ---- cache policies (kernels/model/policies/, harness/suite/policy.py) ----------------------

# a case's policy axes -> the policy's own parameter names (kernels/model/policies/)
POLICY_PARAMS = {
    "n_sink": {"window": "sinks", "expected_attention": "n_sink"},
    "obs_window": "window",
    "kernel_size": "kernel_size",
    "scorer": "scorer",
}


def policy_of(case: Case):
    """A new policy for one chunk, with the case's budget and the axes its policy reads
    (suite/policy.py TAKES: any other is at its default, checked before the run)."""
    budget = policies.Budget(kv_budget=case.kv_budget) if case.kv_budget is not None else (
        policies.Budget(compression_ratio=case.compression_ratio))  # fmt: skip
    params = {}
    for axis in suite_policy.reads(case):
        name = POLICY_PARAMS[axis]
        params[name[case.policy] if isinstance(name, dict) else name] = getattr(case, axis)
    return policies.make(case.policy, budget, **params)


def policy_read_bytes(case: Case, r: Resolved, read_cells: list[int]) -> int:
    """Exact bytes a step over a policy cache reads of what it held before the step: per
    layer, each KV head's `read_cells` (evicting.py EvictingCache.read_cells: the kept cells,
    a layer's padding included), K and V in their formats, and each layer's per-tensor
    scales."""
    c = model_of(case.model)[0].config
    cells = sum(read_cells) * c.n_kv_heads
    kf, vf = r.k_fmt, r.v_fmt
    fixed = (kf.tensor_bytes(c.n_kv_heads) + vf.tensor_bytes(c.n_kv_heads)) * c.n_layers
    return kf.nbytes(cells, c.head_dim) + vf.nbytes(cells, c.head_dim) + fixed


def policy_kv_bytes(case: Case, r: Resolved, n: int | None = None) -> int:
    """Exact bytes of the compressed context (the row's kv_bytes for a policy): the planned
    cells' K and V in their formats, each layer's per-tensor scales, and h2o's float32 score
    per kept cell; the run's kept_bytes (measured from the cache's cells) must equal it. n:
    the tokens compressed (default: a quality chunk's context half)."""
    c = model_of(case.model)[0].config
    n = suite_policy.compressed_tokens(case) if n is None else n
    per_layer = policies.planned_cells(policy_of(case), n, c.n_layers, c.n_kv_heads)
    windows = c.windows or (None,) * c.n_layers  # a window layer keeps its own ring's positions
    rings = {i: min(n, w[0] + w[1]) * c.n_kv_heads for i, w in enumerate(windows) if w}
    cells = sum(rings.get(i, x) for i, x in enumerate(per_layer))
    scored = sum(x for i, x in enumerate(per_layer) if i not in rings)
    kf, vf = r.k_fmt, r.v_fmt  # the case resolved (suite/resolved.py)
    fixed = (kf.tensor_bytes(c.n_kv_heads) + vf.tensor_bytes(c.n_kv_heads)) * c.n_layers
    state = 4 * scored if case.policy == "h2o" else 0
    return kf.nbytes(cells, c.head_dim) + vf.nbytes(cells, c.head_dim) + fixed + state

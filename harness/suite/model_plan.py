"""What a model-phase case allocates, planned from its shape before anything is allocated (the
memory guard, harness/run/memory.py, skips a case whose plan exceeds the memory available), and
the forward passes of the model it runs at least (the dry run says them).

Issue 35: `gen_tokens: 1e9` sized the float32 reference cache at context_len + 1e9 positions and
MLX's CPU backend segfaulted when the allocation failed. The parts, in bytes:
  * cache: the case's cache (kernels/model/spec.py kv_bytes: data, scales, fp16 sinks and
    residual) at its capacity: context_len positions, + gen_tokens for phase generate; a
    sliding-window layer (the model's, or every layer with `window`) its ring as allocated,
    window + sinks + one forward's positions - 1 (kernels/stores/footprint.py layer_cells);
  * reference: the float32 cache of the same capacity and layers (quality, retrieval, generate
    compare against it; model_decode has none);
  * scores: attention scores and probabilities (float32) of the longest forward pass:
    PREFILL_UBATCH positions at a time (quality's chunks, the task phases' prompts, the prefill
    of model_decode), over every query head;
  * logits: float32 log-probabilities kept for the comparison: quality keeps the reference's
    scored half of every chunk and one micro-batch of its own (kernels/model/quality.py compares
    each as it is computed); generate keeps the reference's gen_tokens steps of every chunk and
    one run of its own.
The model's weights are loaded once per process and are not part of a case's plan.
"""

from __future__ import annotations

import math
from collections import Counter

from kvbench.case import Case
from kvbench.kernels.model.serve import stream_cells
from kvbench.kernels.model.spec import kv_bytes
from kvbench.kernels.stores.footprint import layer_cells
from kvbench.kernels.stores.layouts import KV_PAD, pad_to

PREFILL_UBATCH = 512  # the prefill micro-batch of every model phase (llama.cpp's n_ubatch default)
F32 = 4


def capacity(case: Case) -> int:
    """Positions the case's caches hold at most."""
    return case.context_len + (case.gen_tokens if case.phase == "generate" else 0)


def model_cells(case: Case, windows: tuple = ()) -> list[int]:
    """Cells each layer of the case's model cache allocates: its capacity, or a sliding-window
    layer's ring (window + sinks + one forward's positions - 1; every layer with `window`; none
    with swa_cache full)."""
    n, layers = capacity(case), case.n_layers
    if case.swa_cache == "full":  # the model's window layers keep every cell (--swa-full)
        windows = ()
    if case.window is not None:
        windows = ((case.window, case.sink_tokens),) * layers
    query = min(PREFILL_UBATCH, n)  # one forward's positions
    return layer_cells(n, windows if len(windows) == layers else (), layers, query)


def serve_plan(case: Case, spec, vocab: int) -> dict[str, int]:
    """Phase serve (harness/engines/serve.py): the layout's cells as allocated (per-stream:
    n_seqs streams of pp + tg cells, unified: one of every sequence's, a shared prompt once;
    each padded to KV_PAD), the single-sequence cache of the truth check, the scores of one
    prefill micro-batch of every row over a stream, and one row's logits per sequence."""
    pp, tg, pl = case.context_len, case.gen_tokens, case.n_seqs
    shared = case.workload == "shared-prefix" and pl > 1
    per_stream = case.layout != "unified"
    stream = pad_to(stream_cells(pp, tg, pl, shared, not per_stream), KV_PAD)
    cells = stream * (pl if per_stream else 1)
    rows = 1 if shared else pl
    query = min(PREFILL_UBATCH, pp)
    layers, heads, dim = case.n_layers, case.n_kv_heads, case.head_dim
    parts = {
        "cache": kv_bytes(spec, cells, layers, heads, dim),
        "reference": kv_bytes(spec, pp + tg, layers, heads, dim),
        "scores": 2 * case.n_q_heads * rows * query * stream * F32,
        "logits": pl * vocab * F32,
    }
    return {**parts, "total": sum(parts.values())}


def model_plan(case: Case, spec, vocab: int, windows: tuple = ()) -> dict[str, int]:
    """The parts of a model-phase case's planned bytes (module docstring) and their total;
    `spec`: its cache (suite/resolved.py of_case); `windows`: the model's per-layer windows
    (kernels/model/load.py Shape.windows)."""
    if case.phase == "serve":
        return serve_plan(case, spec, vocab)
    n = capacity(case)
    heads, dim = case.n_kv_heads, case.head_dim
    query = min(PREFILL_UBATCH, n)  # one forward's positions
    cells = Counter(model_cells(case, windows))
    cache = sum(kv_bytes(spec, c, k, heads, dim) for c, k in cells.items())
    ref = sum(2 * k * c * heads * dim * F32 for c, k in cells.items())
    reference = 0 if case.phase == "model_decode" else ref
    logits = 0
    if case.phase == "quality":
        scored = case.context_len // 2
        logits = (case.chunks * scored + min(PREFILL_UBATCH, scored)) * vocab * F32
    elif case.phase == "generate":
        logits = (case.chunks + 1) * case.gen_tokens * vocab * F32
    parts = {
        "cache": cache,
        "reference": reference,
        "scores": 2 * case.n_q_heads * query * n * F32,
        "logits": logits,
    }
    return {**parts, "total": sum(parts.values())}


def forward_passes(case: Case) -> int:
    """The forward passes of the model the case runs at least (each prefill piece and each
    decode step is one; the float32 references, shared by the cases of a run, come on top;
    model_decode's timed steps are counted by its samples)."""
    pieces = math.ceil((case.context_len - 1) / PREFILL_UBATCH)
    if case.phase == "quality":  # every chunk in micro-batches
        return case.chunks * math.ceil(case.context_len / PREFILL_UBATCH)
    if case.phase == "generate":  # a free run and a teacher-forced run of every chunk
        return case.chunks * 2 * (pieces + case.gen_tokens)
    if case.phase == "retrieval":  # every trial's prompt and at least one answer token
        return case.trials * (pieces + 1)
    return pieces

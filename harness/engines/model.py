"""The model engine: a real model (mlx-lm's architecture, kernels/model/load.py) with its KV
cache stored in the case's format through kvbench's own formats and kernels
(kernels/model/cache.py; in the model through kernels/model/seam.py).

* phase model_decode: the cache is prefilled with the text's first context_len - 1 tokens
  (untimed, as llama-bench's `-d`); the timed step is one whole-model decode step at that depth
  (every layer writes its K/V, quantizing on write, and attends with the case's kernel). Every
  sample decodes the same next token at the same depth: the cache's write position is reset
  before each step, so each sample is the context_len-th token. tokens_per_s = 1 / step.
  `matvec` and `rope`: how the step's one-token weight products and its RoPE ran
  (kernels/model/matvec.py, rope.py). Under a prefill-time cache policy the depth's tokens
  are compressed once at the end of their prefill and the step reads the kept cells
  (policy_decode; docs/policies.md "Phase model_decode").
* phase quality: the text is cut into `chunks` chunks of context_len tokens (as
  llama-perplexity: each chunk's first token replaced by BOS where the vocabulary adds one,
  the row's chunk_bos; the second half of each chunk is scored); the model runs over each chunk
  with the cache in the case's format and with a float32 cache; the row gets ppl, ppl_ref,
  delta_ppl, kl_mean, kl_p99 (KL divergence of the next-token distributions, nats) and
  top1_agree, and each scored token's nll and kl go to the run's per-token file
  (store/tokens.py). Each chunk goes through the model in micro-batches of common.UBATCH tokens (the
  row's ubatch), as llama-perplexity's default n_ubatch. No stage is sampled (n_samples 0); the
  row states what its evidence cost:
  wall_s, prefill tokens / seconds / tokens per second, and ref_wall_s, the float32
  reference's (kernels/model/meter.py).
* phase quality with kv_edit shift (suite/model_edit.py): each chunk, longer than the context,
  read through llama.cpp's context shift (kernels/model/shift_quality.py; docs/context-shift.md
  "Under the quality phase"); the tokens read after the first shift are scored against the
  float32 cache read through the same shifts, and ppl_noshift, shift_delta_ppl and shift_kl
  hold that float32 cache against one that reads the chunk whole (what the shift itself costs).
  The row adds kv_shifts, n_past, cells_alloc and edit_units as a retrieval shift row does;
  ref_wall_s is both references' seconds.
* kv_bytes: the exact bytes of the cache after context_len tokens (kernels/model/spec.py kv_bytes:
  data, scales, biases, fp16 sinks and residual window); alloc_bytes: what the store holds.
The model, the tokenized text and the float32 reference of each (model, text, context, chunks)
are loaded once per process and shared by every case.
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines import common, edit_rows
from kvbench.engines.contract import TOKENS, State, memory_baseline
from kvbench.engines.model_step import ModelStep
from kvbench.errors import SuiteError
from kvbench.kernels.model import cache as kv_store
from kvbench.kernels.model import compress, matvec, meter, quality, rope, shift_quality
from kvbench.kernels.model.evicting import make_policy_cache
from kvbench.kernels.model.run import prefill
from kvbench.suite import model_edit
from kvbench.suite import policy as suite_policy
from kvbench.suite.cache_spec import MODEL_PHASES
from kvbench.suite.resolved import Resolved


def claims(case: Case) -> bool:
    return case.phase in MODEL_PHASES


skip_reason = common.model_skip_reason


@lru_cache(maxsize=8)
def reference_of(name: str, text: str, context_len: int, n_chunks: int):
    """The chunks, their float32-cache log-probabilities and the wall seconds these took (once
    per process)."""
    model, _ = common.model_of(name)
    chunks = common.chunks_of(name, text, context_len, n_chunks)
    with meter.metered() as m:
        ref = quality.reference_pieces(model, chunks, common.UBATCH)
    return chunks, ref, m.wall_s


def decode_state(case: Case, r: Resolved, n_new: int = 1) -> State:
    """The timed step: n_new tokens (at most common.UBATCH) at depth context_len - n_new
    (engines/model_step.py); 1 is the model_decode phase's decode step, more a prefill
    micro-batch (kvbench profile --ubatch). With settings.stages the runner also times the
    step's KV write and attention over the stored cache on their own (write_ms, attend_ms).
    Under a cache policy (a prefill-time one: suite/policy.py) the depth's tokens are
    compressed once at the end of their prefill (policy_decode) and the step reads the kept
    cells."""
    model, _ = common.model_of(case.model)
    spec = r.spec
    depth = case.context_len - n_new
    tokens = common.tokens_of(case.model, case.text)
    if len(tokens) < case.context_len:
        raise ValueError(f"text {case.text}: {len(tokens)} tokens, fewer than context_len")
    baseline = memory_baseline()
    if case.policy != "none":
        cache, byte_model, kept = policy_decode(case, r, model, list(tokens[:depth]))
    else:
        cache = kv_store.make_cache(spec, model.config, case.context_len, case.kernel,
                                    case.tile_kv, max_step=common.UBATCH)  # fmt: skip
        prefill(model, cache, list(tokens[:depth]), common.UBATCH)
        byte_model, kept = plain_bytes(case, model, spec), {}
    mx.eval(cache.arrays())
    # FP8: what the prefill stored saturated (the timed steps rewrite one position over again)
    held = {"kv_saturated": cache.saturated()} if spec.saturates else {}
    step = ModelStep(model, cache, list(tokens[depth : case.context_len]))
    return State(
        {"step": step, "write": step.part("write"), "attend": step.part("attend")},
        lambda: held,
        **byte_model,
        alloc_bytes=cache.held_bytes(),
        baseline_bytes=baseline,
        cache=cache.arrays,
        effective=common.model_effective(case),
        extra={**cpu_paths(step), **kept},
        profile=step,
    )


def plain_bytes(case: Case, model, spec) -> dict:
    """The byte and FLOP model of a step over every position held (common.py)."""
    return {
        "traffic": common.decode_traffic(case, model, spec),
        "flops": common.decode_flops(case, model),
        "bits_per_elem": common.model_bits_per_elem(case, spec),
        "kv_bytes": common.model_kv_bytes(case, spec),
    }


def policy_decode(case: Case, r: Resolved, model, context: list[int]):
    """(cache, byte model, row fields) of a step under a prefill-time policy: `context` (the
    depth's tokens) prefilled with every position held and compressed once at its end
    (kvpress's setup, as compress.py), so the step writes its token after the kept cells and
    reads only those; ModelStep's rewind (offset, positions, cell counts) restores that state
    exactly (tests/test_evicting.py). kv_bytes: the kept cells (the formula,
    common.policy_kv_bytes) and the step's new tokens, as a full-cache row's counts its
    context_len positions; traffic and FLOPs: the cells the step reads (common.policy_read_bytes:
    a layer whose heads keep different counts reads its padding too), never the context's.
    policy_s: the selection and gather's wall seconds, once, outside the timed samples."""
    n_new = case.context_len - len(context)
    cache = make_policy_cache(r.spec, model, case.context_len, case.kernel,
                              common.policy_of(case), case.tile_kv, common.UBATCH)  # fmt: skip
    prefill(model, cache, context, common.UBATCH)
    cache.compress()
    kept = compress.Kept(policy_s=cache.policy_s)
    kept.note(cache, len(context))
    new = common.model_kv_bytes(case, r.spec) - common.model_kv_bytes(case, r.spec, len(context))
    kv_bytes = common.policy_kv_bytes(case, r, len(context)) + new
    c = model.config
    elems = 2 * c.n_layers * c.n_kv_heads * c.head_dim * case.context_len
    read = cache.read_cells()  # per layer, each KV head's cells
    read_bytes = common.policy_read_bytes(case, r, read)
    byte_model = {
        "traffic": common.decode_traffic(case, model, r.spec, read_bytes),
        "flops": common.decode_flops(case, model, [x + n_new for x in read]),
        "bits_per_elem": 8 * kv_bytes / elems,  # of the context's K/V, as held after the step
        "kv_bytes": kv_bytes,
    }
    return cache, byte_model, kept.fields()


def cpu_paths(step: ModelStep) -> dict:
    """How one step ran, seen in one step run here (before the timer's warm-up): `matvec`,
    its one-token weight products ("blocked": kernels/model/matvec.py's row blocks; "gemm":
    x @ W.T as mlx-lm writes it, e.g. on another device) and `rope` ("table":
    kernels/model/rope.py; "fast": mx.fast.rope)."""
    blocked, tabled = matvec.blocked_products(), rope.table_calls()
    mx.eval(step())
    return {"matvec": "blocked" if matvec.blocked_products() > blocked else "gemm",
            "rope": "table" if rope.table_calls() > tabled else "fast"}  # fmt: skip


@lru_cache(maxsize=8)
def shift_reference_of(name: str, text: str, context_len: int, n_chunks: int, edit: tuple):
    """The chunks, their float32-cache log-probabilities read through the edit's shifts, what
    the shift costs that cache against reading each chunk whole (shift_quality.shift_cost) and
    the wall seconds both references took (once per process)."""
    model, _ = common.model_of(name)
    chunks = common.chunks_of(name, text, context_len, n_chunks)
    sch = edit_rows.schedule(name, edit)
    with meter.metered() as m:
        ref = shift_quality.reference_pieces(model, chunks, sch, common.UBATCH)
        whole = shift_quality.reference_pieces(model, chunks, sch, common.UBATCH, shifted=False)
    return chunks, ref, shift_quality.shift_cost(chunks, ref, whole, sch), m.wall_s


def shift_quality_state(case: Case, r: Resolved, edit: tuple) -> State:
    """phase quality through a context shift (module docstring)."""
    try:  # a model fetched after the suite was checked: its shape is known only now
        model_edit.check_case("the suite", case, None)
    except SuiteError as e:
        raise ValueError(str(e)) from None
    model = common.model_of(case.model)[0]
    sch = edit_rows.schedule(case.model, edit)

    def check() -> dict:
        chunks, ref, cost, ref_s = shift_reference_of(case.model, case.text, case.context_len,
                                                      case.chunks, edit)  # fmt: skip
        edits = []
        with meter.metered() as m:
            row = quality.quality(model, chunks, r.spec, ref, case.kernel, common.UBATCH,
                                  case.tile_kv, keep_tokens=True, first=sch.n_ctx,
                                  pieces=shift_quality.pieces_through(sch, edits))  # fmt: skip
        per_token = row.pop("per_token")
        return {**row, **cost, **m.fields(), "ref_wall_s": ref_s, TOKENS: per_token,
                "chunk_bos": common.chunk_bos(case.model) is not None,
                "ubatch": edit_rows.edit_ubatch(case),
                **edit_rows.edit_fields(edits)}  # fmt: skip

    fields, held = edit_rows.edit_effective(case)  # the context's cells at most
    return State({}, check, traffic=(0, 0), kv_bytes=common.model_kv_bytes(case, r.spec, held),
                 bits_per_elem=common.model_bits_per_elem(case, r.spec),
                 effective={**common.model_effective(case), **fields})  # fmt: skip


def quality_state(case: Case, r: Resolved) -> State:
    if (edit := model_edit.edit_of(case)) is not None:
        return shift_quality_state(case, r, edit)
    model = common.windowed(common.model_of(case.model)[0], case)

    def check() -> dict:
        chunks, ref, ref_s = reference_of(case.model, case.text, case.context_len, case.chunks)
        kept = compress.Kept()
        pieces = quality.piece_logprobs
        if case.policy != "none":
            pieces = compress.pieces_under(lambda: common.policy_of(case), kept)
        with meter.metered() as m:
            row = quality.quality(model, chunks, r.spec, ref, case.kernel, common.UBATCH,
                                  case.tile_kv, keep_tokens=True, pieces=pieces)  # fmt: skip
        bos = common.chunk_bos(case.model) is not None
        per_token = row.pop("per_token")  # the run's per-token file (store/tokens.py)
        return {**row, **m.fields(), "ref_wall_s": ref_s, "chunk_bos": bos,
                "ubatch": common.ubatch_of(case), TOKENS: per_token,
                **(kept.fields() if case.policy != "none" else {})}  # fmt: skip

    kv_bytes, bits = common.model_kv_bytes(case, r.spec), common.model_bits_per_elem(case, r.spec)
    if case.policy != "none":  # bits per element of the context's K/V, as kept
        kv_bytes = common.policy_kv_bytes(case, r)
        c = model.config
        bits = (
            8
            * kv_bytes
            / (2 * c.n_layers * c.n_kv_heads * c.head_dim * suite_policy.compressed_tokens(case))
        )
    return State({}, check, traffic=(0, 0), kv_bytes=kv_bytes, bits_per_elem=bits,
                 effective=common.model_effective(case))  # fmt: skip


def build(case: Case, r: Resolved) -> State:
    """The case resolved (a bad format failed there, not in the model): its cache spec."""
    return quality_state(case, r) if case.phase == "quality" else decode_state(case, r)

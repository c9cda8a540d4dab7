"""The model engine: a real model (mlx-lm's architecture, kernels/model/load.py) with its KV
cache stored in the case's format through kvbench's own formats and kernels
(kernels/model/cache.py; in the model through kernels/model/seam.py).

* phase model_decode: the cache is prefilled with the text's first context_len - 1 tokens
  (untimed, as llama-bench's `-d`); the timed step is one whole-model decode step at that depth
  (every layer writes its K/V, quantizing on write, and attends with the case's kernel). Every
  sample decodes the same next token at the same depth: the cache's write position is reset
  before each step, so each sample is the context_len-th token. tokens_per_s = 1 / step.
  `matvec` and `rope`: how the step's one-token weight products and its RoPE ran
  (kernels/model/matvec.py, rope.py).
* phase quality: the text is cut into `chunks` chunks of context_len tokens (as
  llama-perplexity: each chunk's first token replaced by BOS where the vocabulary adds one,
  the row's chunk_bos; the second half of each chunk is scored); the model runs over each chunk
  with the cache in the case's format and with a float32 cache; the row gets ppl, ppl_ref,
  delta_ppl, kl_mean, kl_p99 (KL divergence of the next-token distributions, nats) and
  top1_agree, and each scored token's nll and kl go to the run's per-token file
  (store/tokens.py). Each chunk goes through the model in micro-batches of UBATCH tokens (the
  row's ubatch), as llama-perplexity's default n_ubatch. No stage is sampled (n_samples 0); the
  row states what its evidence cost:
  wall_s, prefill tokens / seconds / tokens per second, and ref_wall_s, the float32
  reference's (kernels/model/meter.py).
* kv_bytes: the exact bytes of the cache after context_len tokens (kernels/model/spec.py kv_bytes:
  data, scales, biases, fp16 sinks and residual window); alloc_bytes: what the store holds.
The model, the tokenized text and the float32 reference of each (model, text, context, chunks)
are loaded once per process and shared by every case.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines.contract import TOKENS, State, memory_baseline
from kvbench.engines.model_step import ModelStep
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model import cache as kv_store
from kvbench.kernels.model import matvec, meter, quality, rope
from kvbench.kernels.model import spec as kv_spec
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.run import prefill
from kvbench.kernels.model.source import model_file
from kvbench.kernels.model.text import default_text, text_file
from kvbench.kernels.model.tokenizer import load_tokenizer
from kvbench.suite.cache_spec import MODEL_PHASES, format_of, rotation_blocks, spec_of
from kvbench.suite.model_plan import PREFILL_UBATCH

UBATCH = PREFILL_UBATCH  # prefill micro-batch (llama.cpp's default n_ubatch): a window ring holds
# window + sinks + UBATCH - 1 cells (kernels/stores/window.py), not window + the whole prefill


def claims(case: Case) -> bool:
    return case.phase in MODEL_PHASES


def skip_reason(case: Case, backend: str) -> str | None:
    """A plain spec runs the kernel on the stored format; any other spec (separate K/V formats,
    per-channel keys, sinks, a residual window) hands the kernel a dense view."""
    spec = spec_of(case)
    f32 = case.kernel in KERNELS and KERNELS[case.kernel].float32
    dense = get_format("fp32" if f32 else "fp16")
    try:
        for fmt in spec.formats() if spec.plain else (dense,):
            kv_store.check_kernel(case.kernel, fmt, backend)
    except ValueError as e:
        return str(e)
    return None


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


@lru_cache(maxsize=8)
def reference_of(name: str, text: str, context_len: int, n_chunks: int):
    """The chunks, their float32-cache log-probabilities and the wall seconds these took (once
    per process)."""
    model, _ = model_of(name)
    chunks = chunks_of(name, text, context_len, n_chunks)
    with meter.metered() as m:
        ref = quality.reference_pieces(model, chunks, UBATCH)
    return chunks, ref, m.wall_s


def ubatch_of(case: Case) -> int:
    """Tokens one forward pass of the case's prefill takes at most (the row's ubatch)."""
    return min(UBATCH, case.context_len)


def decode_state(case: Case, n_new: int = 1) -> State:
    """The timed step: n_new tokens (at most UBATCH) at depth context_len - n_new
    (engines/model_step.py); 1 is the model_decode phase's decode step, more a prefill
    micro-batch (kvbench profile --ubatch). With settings.stages the runner also times the
    step's KV write and attention over the stored cache on their own (write_ms, attend_ms)."""
    model, _ = model_of(case.model)
    spec = spec_of(case)
    depth = case.context_len - n_new
    tokens = tokens_of(case.model, case.text)
    if len(tokens) < case.context_len:
        raise ValueError(f"text {case.text}: {len(tokens)} tokens, fewer than context_len")
    baseline = memory_baseline()
    cache = kv_store.make_cache(spec, model.config, case.context_len, case.kernel, case.tile_kv,
                                max_step=UBATCH)  # fmt: skip
    prefill(model, cache, list(tokens[:depth]), UBATCH)
    mx.eval(cache.arrays())
    # FP8: what the prefill stored saturated (the timed steps rewrite one position over again)
    held = {"kv_saturated": cache.saturated()} if spec.saturates else {}
    step = ModelStep(model, cache, list(tokens[depth : case.context_len]))
    return State(
        {"step": step, "write": step.part("write"), "attend": step.part("attend")},
        lambda: held,
        traffic=decode_traffic(case, model),
        flops=decode_flops(case, model),
        bits_per_elem=bits_per_elem(case),
        kv_bytes=kv_bytes(case),
        alloc_bytes=cache.held_bytes(),
        baseline_bytes=baseline,
        cache=cache.arrays,
        effective=effective(case),
        extra=cpu_paths(step),
        profile=step,
    )


def cpu_paths(step: ModelStep) -> dict:
    """How one step ran, seen in one step run here (before the timer's warm-up): `matvec`,
    its one-token weight products ("blocked": kernels/model/matvec.py's row blocks; "gemm":
    x @ W.T as mlx-lm writes it, e.g. on another device) and `rope` ("table":
    kernels/model/rope.py; "fast": mx.fast.rope)."""
    blocked, tabled = matvec.blocked_products(), rope.table_calls()
    mx.eval(step())
    return {"matvec": "blocked" if matvec.blocked_products() > blocked else "gemm",
            "rope": "table" if rope.table_calls() > tabled else "fast"}  # fmt: skip


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


def decode_flops(case: Case, model) -> int:
    """Matmul FLOPs of one decode step: 2 per multiply-add of every linear layer and the
    output head, plus attention over the context (4 * Hq * L * D per layer)."""
    c = model.config
    return 2 * matmul_macs(model) + c.n_layers * 4 * c.n_heads * case.context_len * c.head_dim


def decode_traffic(case: Case, model) -> tuple[int, int]:
    """(read, written) of one decode step, each tensor once: every weight, the K/V of the
    context_len - 1 positions held, the new token's K/V written (activations not counted)."""
    held = kv_bytes(case, case.context_len - 1)
    return weight_bytes(model) + held, kv_bytes(case) - held


def windowed(model, case: Case):
    """The model as a case runs it: with `window` set, every layer a sliding window of that
    many positions plus `sink_tokens` sinks (kernels/model/cache.py WindowCache, mlx-lm's
    RotatingKVCache semantics), the weights shared."""
    if case.window is None:
        return model
    windows = ((case.window, case.sink_tokens),) * model.config.n_layers
    return replace(model, config=replace(model.config, windows=windows))


def quality_state(case: Case) -> State:
    model = windowed(model_of(case.model)[0], case)

    def check() -> dict:
        chunks, ref, ref_s = reference_of(case.model, case.text, case.context_len, case.chunks)
        with meter.metered() as m:
            row = quality.quality(model, chunks, spec_of(case), ref, case.kernel, UBATCH,
                                  case.tile_kv, keep_tokens=True)  # fmt: skip
        bos = chunk_bos(case.model) is not None
        per_token = row.pop("per_token")  # the run's per-token file (store/tokens.py)
        return {**row, **m.fields(), "ref_wall_s": ref_s, "chunk_bos": bos,
                "ubatch": ubatch_of(case), TOKENS: per_token}  # fmt: skip

    return State({}, check, traffic=(0, 0), kv_bytes=kv_bytes(case),
                 bits_per_elem=bits_per_elem(case), effective=effective(case))  # fmt: skip


def effective(case: Case) -> dict:
    """The Hadamard blocks in effect (a null rot_block_k / rot_block_v: llama.cpp's rule)."""
    return dict(zip(("rot_block_k", "rot_block_v"), rotation_blocks(case)))


def kv_bytes(case: Case, n_tokens: int | None = None) -> int:
    """Exact bytes the case's cache holds after n_tokens (default context_len), each layer at
    its own positions: a sliding-window layer (the model's, or every layer with `window`)
    holds min(n_tokens, window + sinks)."""
    c = windowed(model_of(case.model)[0], case).config
    n = case.context_len if n_tokens is None else n_tokens
    return kv_spec.kv_bytes(spec_of(case), n, c.n_layers, c.n_kv_heads, c.head_dim,
                            windows=c.windows)  # fmt: skip


def bits_per_elem(case: Case) -> float:
    """Stored bits per K/V element of the whole spec (separate formats, fp16 sinks and
    residual window, per-channel scales included): kv_bytes over the context's elements (a
    sliding window holds fewer than the context: its bits per context element are fewer)."""
    c = model_of(case.model)[0].config
    return 8 * kv_bytes(case) / (2 * c.n_layers * c.n_kv_heads * case.context_len * c.head_dim)


def build(case: Case) -> State:
    format_of(case)  # a bad format fails here, not in the model
    return quality_state(case) if case.phase == "quality" else decode_state(case)

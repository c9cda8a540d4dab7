"""Decode-time error: what a cache format does to the tokens a model generates.

After a prefill of the prompt, the model generates `n_new` tokens greedily, every new K/V
written into the cache in the spec's format (quantize on write; `recent_tokens` of fp16
residual as the spec says). The float32 cache's greedy continuation of the same prompt is the
reference:

* first_diverge: tokens generated before the first one that differs (n_new when none does);
* agree: the fraction of the n_new positions where the two continuations hold the same token
  (after a divergence the two contexts differ, so this counts how far they drift apart);
* kl_mean: teacher-forced KL(p_ref || p) of the next-token distributions along the reference
  continuation (the format's cache is fed the reference tokens, so both see the same context):
  the error of each decode step itself, not of a drifted context.

`quantized_kv_start`, as mlx-lm's generate: the cache holds fp16 K/V until its offset reaches
quantized_kv_start (checked after every forward), then every position held is converted to the
spec's format and from there on each new K/V is written in it. 0: quantized from the first
write. While the cache is fp16 the float32 reference kernel attends over it.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.run import check_finite, decode, prefill
from kvbench.kernels.model.spec import CacheSpec

FP16 = CacheSpec("fp16")


class DeferredCache:
    """fp16 until `start` positions are held, then the spec's cache (mlx-lm's
    quantized_kv_start). A StoredCache (kernels/model/protocol.py): no mark / rewind, the
    generate phase never rewinds. `max_step`: the most tokens one forward writes (the prefill's
    micro-batch), which sizes both caches' window rings (make_cache; default capacity)."""

    def __init__(
        self, spec, config, capacity, kernel="reference", tile_kv=None, start=0, max_step=None
    ):
        self.spec, self.config, self.capacity = spec, config, capacity
        self.kernel, self.tile_kv, self.start = kernel, tile_kv, start
        self.max_step = max_step or capacity
        self.early = make_cache(FP16, config, capacity, "reference", max_step=self.max_step)
        self.late = None
        self.held: list[list[mx.array]] = [[] for _ in range(2 * config.n_layers)]
        self.offset = 0
        if start == 0:
            self._switch()

    @property
    def switched(self) -> bool:
        return self.late is not None

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        if self.switched:
            return self.late.attend(layer, q, k, v, scale)
        self.held[2 * layer].append(k.astype(mx.float16))
        self.held[2 * layer + 1].append(v.astype(mx.float16))
        return self.early.attend(layer, q, k, v, scale)

    def advance(self, n: int) -> None:
        self.offset += n
        (self.late or self.early).advance(n)
        if not self.switched and self.offset >= self.start:
            self._switch()

    def _switch(self) -> None:
        """Every held position (its fp16 value, as mlx-lm converts its fp16 cache) written into
        a cache in the spec's format, max_step positions per write (a window layer's ring
        takes no more at once)."""
        self.late = make_cache(self.spec, self.config, self.capacity, self.kernel, self.tile_kv,
                               max_step=self.max_step)  # fmt: skip
        c = self.config
        q = mx.zeros((1, c.n_heads, 1, c.head_dim), dtype=mx.float32)
        held = [mx.concatenate(h, axis=2) for h in self.held] if self.offset else []
        for s in range(0, self.offset, self.max_step):
            for layer in range(c.n_layers):
                k, v = (held[2 * layer + i][:, :, s : s + self.max_step] for i in (0, 1))
                k, v = k.astype(mx.float32), v.astype(mx.float32)
                self.late.attend(layer, q, k, v, c.head_dim**-0.5)  # the write; output unused
            self.late.advance(k.shape[2])
            mx.eval(self.late.arrays())

    def arrays(self) -> list[mx.array]:
        return (self.late or self.early).arrays()

    def saturated(self) -> int:
        """K/V elements the spec's cache stored saturated (FP8); the fp16 part stores none."""
        return self.late.saturated() if self.switched else 0


def make_deferred(spec, config, capacity, kernel="reference", tile_kv=None, start=0, max_step=None):
    """The spec's cache, fp16 until `start` positions are held (start 0: the plain cache);
    max_step: the most tokens one forward writes (None: capacity)."""
    if start == 0:
        return make_cache(spec, config, capacity, kernel, tile_kv, max_step=max_step)
    return DeferredCache(spec, config, capacity, kernel, tile_kv, start, max_step)


def _log_softmax(logits: mx.array) -> mx.array:
    logits = logits.astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def free_run(
    model, cache, prompt: list[int], n_new: int, ubatch=None, what: str = "the cache"
) -> tuple[list[int], list]:
    """Greedy continuation (n_new tokens) and the log-probabilities before each token."""
    prefill(model, cache, prompt[:-1], ubatch)
    token, out, lps = prompt[-1], [], []
    for _ in range(n_new):
        lp = _log_softmax(decode(model, cache, token))
        mx.eval(lp)
        check_finite(lp, f"{what}, greedy decoding", len(prompt) - 1 + len(out))
        token = int(mx.argmax(lp).item())
        out.append(token)
        lps.append(lp)
    return out, lps


def teacher_forced(
    model, cache, prompt: list[int], ref: list[int], ubatch=None, what: str = "the cache"
) -> list:
    """Log-probabilities before each reference token, the cache fed the reference tokens."""
    prefill(model, cache, prompt[:-1], ubatch)
    token, lps = prompt[-1], []
    for nxt in ref:
        lp = _log_softmax(decode(model, cache, token))
        mx.eval(lp)
        check_finite(lp, f"{what}, teacher-forced decoding", len(prompt) - 1 + len(lps))
        lps.append(lp)
        token = nxt
    return lps


def first_divergence(a: list[int], b: list[int]) -> int:
    """Positions before the first that differs (len when none does)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def kl_along(ref_lps: list, lps: list) -> np.ndarray:
    """KL(p_ref || p) per position (nats)."""
    r, p = mx.stack(ref_lps), mx.stack(lps)
    return np.array(mx.sum(mx.exp(r) * (r - p), axis=-1))


def reference(model, prompt: list[int], n_new: int, ubatch=None) -> tuple[list[int], list]:
    """The float32 cache's greedy continuation and its log-probabilities."""
    cache = make_cache(CacheSpec("fp32"), model.config, len(prompt) + n_new, "reference",
                       max_step=ubatch)  # fmt: skip
    return free_run(model, cache, prompt, n_new, ubatch, "the float32 cache")


def generate_error(
    model,
    prompts,
    refs,
    spec,
    n_new: int,
    kernel="reference",
    tile_kv=None,
    start=0,
    ubatch=None,
    cache_of=None,
) -> dict:
    """gen_first_diverge (mean over prompts), gen_first_diverge_min, gen_agree, gen_kl_mean,
    gen_kl_max, gen_tokens_scored of `spec` against `refs` (reference() of each prompt); with
    an FP8 format, kv_saturated over every prompt's free run. cache_of(prompt, capacity): the
    cache each run takes (default: the spec's, fp16 until `start`)."""
    if cache_of is None:

        def cache_of(prompt, cap):
            return make_deferred(spec, model.config, cap, kernel, tile_kv, start, ubatch)

    diverge, agree, kls, sat = [], [], [], []
    for prompt, (ref_tokens, ref_lps) in zip(prompts, refs):
        cap = len(prompt) + n_new
        cache = cache_of(prompt, cap)
        tokens, _ = free_run(model, cache, prompt, n_new, ubatch, f"the {spec.label} cache")
        sat.append(cache.saturated())
        diverge.append(first_divergence(tokens, ref_tokens))
        agree.append(np.mean([a == b for a, b in zip(tokens, ref_tokens)]))
        cache = cache_of(prompt, cap)
        forced = teacher_forced(model, cache, prompt, ref_tokens, ubatch, f"the {spec.label} cache")
        kls.append(kl_along(ref_lps, forced))
    kl = np.concatenate(kls)
    out = {"kv_saturated": sum(sat)} if spec.saturates else {}
    return out | {
        "gen_first_diverge": float(np.mean(diverge)),
        "gen_first_diverge_min": int(min(diverge)),
        "gen_agree": float(np.mean(agree)),
        "gen_kl_mean": float(kl.mean()),
        "gen_kl_max": float(kl.max()),
        "gen_tokens_scored": int(kl.size),
    }

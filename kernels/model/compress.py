"""A model run under a cache policy (kernels/model/evicting.py, kernels/model/policies/): the
context is prefilled with every position held, then compressed where a deployment compresses
it (kvpress's setup: at the end of the context; the question or continuation that follows is
never compressed), and what follows runs over the kept cells (a decode policy keeps evicting
after every pass).

* kept_positions: the positions each layer and KV head keeps of a context, what kvpress's
  presses are held against.
* pieces_under: the quality phase's log-probabilities under a policy (quality.quality takes
  it): each chunk's first half is the context, compressed; the scored second half follows.
* policy_answer: a retrieval prompt's answer, its haystack compressed, its question not.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import mlx.core as mx

from kvbench.kernels.model import meter, retrieval
from kvbench.kernels.model.evicting import make_policy_cache
from kvbench.kernels.model.load import Model
from kvbench.kernels.model.run import forward, prefill
from kvbench.kernels.model.spec import CacheSpec


def kept_positions(model: Model, tokens: list[int], policy, ubatch: int = 512, spec=None) -> list:
    """Per layer, [Hkv, kept] the positions each KV head keeps after `tokens` (the context) go
    through the model in passes of `ubatch` and the cache compresses (float32 cells unless
    `spec` says otherwise; heads keeping fewer cells than the layer's most padded with -1)."""
    cache = make_policy_cache(spec or CacheSpec("fp32"), model, len(tokens), "reference", policy)
    prefill(model, cache, list(tokens), ubatch)
    cache.compress()
    return cache.kept_positions()


@dataclass
class Kept:
    """What a policy kept of the first chunk's (or prompt's) context, the row's cells and
    bytes (every quality chunk of one context length keeps as many), and the policy's own cost
    over every chunk or prompt."""

    context_tokens: int = 0
    cells: list = field(default_factory=list)  # per layer, per KV head
    kept_bytes: int = 0
    policy_s: float = 0.0
    ring_cells: int = 0  # of cells, the sliding-window layers' (fixed: not the policy's)

    def note(self, cache, context_tokens: int) -> None:
        """What `cache` (just compressed) keeps of a context of context_tokens."""
        self.context_tokens, self.cells = context_tokens, cache.kept_cells()
        self.kept_bytes = cache.kept_bytes()
        rings = getattr(cache, "rings", {})  # WindowedEvictingCache: the model's own windows
        self.ring_cells = sum(sum(self.cells[i]) for i in rings)

    def ring_bytes(self) -> int:
        """kept_bytes' share of the ring layers' cells (one format a cell, so their share of the
        cells; the per-tensor scales and the policy's small state are split the same way)."""
        total = sum(sum(h) for h in self.cells)
        return round(self.kept_bytes * self.ring_cells / total) if total else 0

    def fields(self) -> dict:
        layers = [sum(h) for h in self.cells]
        heads_differ = any(len(set(h)) > 1 for h in self.cells)
        return {
            "context_tokens": self.context_tokens,
            "kept_cells": sum(layers),
            "kept_layers": "/".join(map(str, layers)),
            "kept_heads": ";".join(",".join(map(str, h)) for h in self.cells)
            if heads_differ
            else None,
            "kept_bytes": self.kept_bytes,
            "kept_bytes_per_token": (self.kept_bytes - self.ring_bytes()) / self.context_tokens,
            "kept_ring_bytes": self.ring_bytes(),
            "policy_s": self.policy_s,
        }


def compressed(
    model: Model,
    spec,
    policy,
    context: list[int],
    capacity: int,
    kernel,
    ubatch,
    tile_kv,
    kept: Kept,
):
    """A policy cache holding `context` compressed (its cells and bytes noted in `kept`)."""
    cache = make_policy_cache(spec, model, capacity, kernel, policy, tile_kv, ubatch)
    prefill(model, cache, context, ubatch)
    cache.compress()
    if not kept.context_tokens:  # the row states the first chunk's or prompt's
        kept.note(cache, len(context))
    return cache


def pieces_under(make_policy, kept: Kept):
    """quality.piece_logprobs's twin under a policy (same arguments, a new policy per chunk):
    the chunk's first half is the context, compressed; the second half follows teacher-forced
    over the kept cells (one token a pass for a decode policy, which keeps evicting; ubatch
    tokens a pass otherwise), its logits scored at the same positions as the full cache's."""

    def pieces(model, chunk, spec, kernel="reference", ubatch=None, tile_kv=None, saturated=None):
        n, first = len(chunk), len(chunk) // 2
        policy = make_policy()
        cache = compressed(model, spec, policy, chunk[:first], n, kernel, ubatch, tile_kv, kept)
        step = 1 if policy.decode else min(ubatch or n, n)
        for s in range(first, n - 1, step):
            piece = mx.array([chunk[s : min(s + step, n - 1)]])
            with meter.timed("decode" if step == 1 else "prefill", piece.shape[1]):
                logits = forward(model, piece, cache)[0]
                mx.eval(logits, cache.arrays())
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            mx.eval(lp)
            yield lp
        kept.policy_s += cache.policy_s
        if saturated is not None:
            saturated.append(cache.saturated())

    return pieces


def policy_answer(model: Model, tokenizer, prompt, task: str, spec, kernel, policy, kept: Kept,
                  ubatch=None, tile_kv=None) -> str:  # fmt: skip
    """A retrieval prompt's greedy answer under a policy, as kvpress asks it: the instruction
    and the haystack (prompt.haystack's end) are the context, compressed; the question and
    the answer's start are never compressed; greedy decoding follows (a decode policy keeps
    evicting)."""
    end = prompt.haystack[1]
    capacity = len(prompt.tokens) + prompt.gen_tokens
    cache = compressed(model, spec, policy, prompt.tokens[:end], capacity, kernel, ubatch, tile_kv,
                       kept)  # fmt: skip
    text = retrieval.greedy_answer(
        model, cache, tokenizer, replace(prompt, tokens=prompt.tokens[end:]), task, ubatch
    )
    kept.policy_s += cache.policy_s
    return text


def generate_cache_of(model: Model, spec, make_policy, kept: Kept, kernel, ubatch=None,
                      tile_kv=None):  # fmt: skip
    """generate.generate_error's cache_of under a policy: the prompt but its last token (what
    free_run prefills) is the context, compressed when it is held; generation follows over
    the kept cells (a decode policy keeps evicting). Each cache's cells and bytes go to
    `kept` (the first prompt's) and its cost once the run ends (cache.policy_s, read by
    `settle`)."""
    made = []

    def cache_of(prompt: list[int], capacity: int):
        cache = make_policy_cache(spec, model, capacity, kernel, make_policy(), tile_kv, ubatch)
        cache.compress_at = len(prompt) - 1
        made.append(cache)
        return cache

    def settle() -> None:
        for cache in made:
            kept.policy_s += cache.policy_s
        first = made[0]
        kept.context_tokens, kept.cells = first.compress_at, first.kept_cells_at
        kept.kept_bytes = first.kept_bytes_at

    return cache_of, settle

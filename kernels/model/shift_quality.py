"""The quality phase through llama.cpp's context shift: a chunk of text longer than the context
read teacher-forced through passkey.cpp's schedule (kernels/model/shift.py), every next-token
distribution computed over a shifted cache scored (docs/context-shift.md, "Under the quality
phase").

* The schedule is passkey.cpp's (b11434), the only llama.cpp tool that reads a text longer than
  its context: batches of n_batch (ga_w) fill n_ctx = cells - n_keep positions; before each
  further batch the n_batch positions after n_keep are removed and the rest moved back, their
  keys re-rotated in the cache's own format (ShiftCache.kshift). llama-cli cannot read such a
  text (tools/completion/completion.cpp: "prompt is too long" past n_ctx - 4; it shifts only
  while generating) and llama-perplexity never shifts (each chunk in its own context).
* Scored: the logits at chunk positions n_ctx .. len - 2 (targets n_ctx + 1 .. len - 1), every
  token read after the first shift; each of them sees at least n_ctx - n_batch positions. The
  tokens before it are read as a plain quality row reads them, so scoring them would only
  dilute what the shift costs.
* Two float32 references of the same chunks: `shifted`, through the same schedule (a quality
  row's KL against it measures the format, not the edit), and `unshifted`, a context holding
  the whole chunk read in the same batches (no edit): the shifted float32 cache against it is
  what the shift itself costs (shift_kl, shift_delta_ppl, ppl_noshift).
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import numpy as np

from kvbench.kernels.model import meter, quality
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.run import check_finite, forward
from kvbench.kernels.model.shift import Schedule, ShiftCache, batches, edit_before, rope_params


def scored_positions(sch: Schedule, n_tokens: int) -> range:
    """The chunk positions whose logits a shifted quality row scores (module docstring)."""
    return range(sch.n_ctx, n_tokens - 1)


def read_scored(model, cache, chunk: list[int], sch: Schedule, ubatch: int,
                edit: bool = True) -> Iterator[mx.array]:  # fmt: skip
    """float32 log-probabilities [n_i, vocab] at the scored positions, one evaluated array per
    micro-batch of `ubatch` tokens inside each of passkey.cpp's batches that holds scored
    positions. `edit`: the shifts made before their batches (a ShiftCache); False: the same
    batches into a cache that holds the whole chunk (the unshifted reference)."""
    if reason := sch.overrun(len(chunk)):
        raise ValueError(reason)
    n, first = len(chunk), sch.n_ctx
    for start, what in batches(sch, n):
        if edit:
            edit_before(cache, start, what, sch)
        end = min(start + sch.n_batch, n)
        for s in range(start, end, ubatch):
            e = min(s + ubatch, end)
            lo = min(max(first - s, 0), e - s)  # logits only where they are scored
            with meter.timed("prefill", e - s):
                logits = forward(model, mx.array([chunk[s:e]]), cache, logits_from=lo)[0]
                mx.eval(logits, cache.arrays())
            rows = logits[: min(e, n - 1) - max(s, first)]  # the last position has no target
            if rows.shape[0] > 0:
                lp = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
                mx.eval(lp)
                yield lp


def pieces_through(sch: Schedule, edits: list | None = None):
    """quality.quality's `pieces` for a cache read through the shift: a ShiftCache over a cache
    of the schedule's cells in the spec's format; each chunk's edit counts appended to `edits`
    (context_shifts, rotated, ..., n_past: positions held at the chunk's end, cells)."""

    def pieces(model, chunk, spec, kernel="reference", ubatch=None, tile_kv=None, saturated=None):
        inner = make_cache(spec, model.config, sch.n_cells, kernel, tile_kv)
        cache = ShiftCache(inner, rope_params(model.net), sch.div_sign)
        yield from read_scored(model, cache, chunk, sch, ubatch or sch.n_batch)
        if edits is not None:
            edits.append({**cache.counts, "n_past": cache.offset, "cells": sch.n_cells})
        if saturated is not None:
            saturated.append(cache.saturated())

    return pieces


def unshifted_pieces(sch: Schedule):
    """quality.quality's `pieces` for the unshifted reference: a cache of the chunk's length,
    the same batches, no edit."""

    def pieces(model, chunk, spec, kernel="reference", ubatch=None, tile_kv=None, saturated=None):
        cache = make_cache(spec, model.config, len(chunk), kernel, tile_kv)
        yield from read_scored(model, cache, chunk, sch, ubatch or sch.n_batch, edit=False)

    return pieces


def reference_pieces(model, chunks: list[list[int]], sch: Schedule, ubatch: int,
                     shifted: bool = True) -> list[list[mx.array]]:  # fmt: skip
    """The float32 cache's log-probabilities of every chunk at the scored positions, kept as
    read: through the shift (shifted) or in a context holding the chunk."""
    read = pieces_through(sch) if shifted else unshifted_pieces(sch)
    what = "the float32 cache" + ("" if shifted else " without a shift")
    out = []
    for i, c in enumerate(chunks):
        pieces, at = [], sch.n_ctx
        for lp in read(model, c, quality.REFERENCE_SPEC, "reference", ubatch):
            pieces.append(check_finite(lp, f"{what}, chunk {i}", at))
            at += lp.shape[0]
        out.append(pieces)
    return out


def shift_cost(chunks: list[list[int]], shifted: list, unshifted: list, sch: Schedule) -> dict:
    """What the shift itself costs over the scored tokens, both caches float32: ppl_noshift
    (the unshifted reference's perplexity), shift_delta_ppl (the shifted one's less it) and
    shift_kl (mean KL(unshifted || shifted) of the next-token distributions, nats)."""
    stats, nll = [], []
    for chunk, a, b in zip(chunks, unshifted, shifted):
        tg = quality.targets_of(chunk, sch.n_ctx)
        ref, lp = mx.concatenate(a), mx.concatenate(b)
        stats.append(quality.token_stats(ref, lp, tg))
        nll.append(np.array(quality.nll_of(ref, tg)))
    s = quality.summarize(stats, np.concatenate(nll))
    return {"ppl_noshift": s["ppl_ref"], "shift_delta_ppl": s["delta_ppl"],
            "shift_kl": s["kl_mean"]}  # fmt: skip

"""The quality cost of a KV cache configuration on a real model.

Measured as llama.cpp's `llama-perplexity` does: the token stream is cut into chunks of
`context_len` tokens, each chunk's first token replaced by BOS where the vocabulary adds one
(chunks); each chunk starts from an empty cache, is fed in micro-batches of
`ubatch` tokens (K/V stored in the cache's format on write, attention over the stored cache;
the engine's ubatch is 512, as llama-perplexity's: it decodes a chunk in batches of n_batch
2048 tokens that llama_decode splits into ubatches of n_ubatch 512, common/common.h b11434),
and only the second half of each chunk is scored (logits at positions context_len/2 ..
context_len-2 predict the next token), so every scored token sees at least half a context.
(A chunk read through a context shift, kernels/model/shift_quality.py, is scored from the
first token read after the shift instead.)
The float32 cache of the same model is the reference: per scored token, the KL divergence
KL(p_ref || p) of the next-token distributions, whether the top-1 tokens agree, and the
negative log-likelihood of the true next token. ppl = exp(mean nll). `quality` hands back each
scored token's nll and kl too when asked (`per_token`), so two configurations that score the
same tokens can be compared token by token.

Position buckets: the scored half of every chunk is cut into POS_BUCKETS equal runs of
positions (bucket b of m scored tokens holds scored index i with i * POS_BUCKETS // m == b,
chunk position context_len/2 + i), pooled over chunks: kl_pos1 .. kl_pos4, top1_pos1 ..
top1_pos4 and n_pos1 .. n_pos4 (tokens per bucket) show whether a format's error grows with
depth.
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import numpy as np

from kvbench.kernels.model import meter
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import Model
from kvbench.kernels.model.run import check_finite, forward
from kvbench.kernels.model.spec import CacheSpec

REFERENCE_SPEC = CacheSpec("fp32")


# ---- running the model over chunks -----------------------------------------------------------


def chunks(
    tokens: list[int], context_len: int, n_chunks: int | None = None, bos_id: int | None = None
) -> list[list[int]]:
    """Consecutive chunks of context_len tokens (the last partial one dropped). With bos_id
    (a vocabulary that adds BOS), each chunk's first token is overwritten by BOS, as
    llama-perplexity does (tools/perplexity/perplexity.cpp, b11434: the text is tokenized once
    with its BOS, cut into n_ctx pieces, and `tokens[start] = bos` before each chunk's first
    batch): the token there is replaced, not shifted, and never scored (targets start at
    context_len/2 + 1)."""
    if context_len < 4:
        raise ValueError(f"context_len {context_len} must be >= 4")
    n = len(tokens) // context_len if n_chunks is None else n_chunks
    if n < 1 or n * context_len > len(tokens):
        raise ValueError(f"text has {len(tokens)} tokens: fewer than {n} x {context_len}")
    out = [tokens[i * context_len : (i + 1) * context_len] for i in range(n)]
    return out if bos_id is None else [[bos_id, *c[1:]] for c in out]


def piece_logprobs(
    model: Model,
    chunk: list[int],
    spec: CacheSpec,
    kernel="reference",
    ubatch=None,
    tile_kv=None,
    saturated: list | None = None,
) -> Iterator[mx.array]:
    """float32 log-probabilities at the scored positions of one chunk, one evaluated array
    [n_i, vocab] per micro-batch of `ubatch` tokens (None: the chunk in one forward) that holds
    scored positions, yielded in order as each is computed: together the n_scored rows. The
    cache's window rings hold what one micro-batch writes (make_cache max_step). The K/V
    elements the cache stored saturated (FP8) appended to `saturated` when given, once the
    last piece is taken. A consumer that keeps none holds one piece at a time (Gemma at 8K:
    all 4,095 rows x 262,144 vocabulary are 4.3 GB)."""
    n = len(chunk)
    first = n // 2
    step = min(ubatch or n, n)
    cache = make_cache(spec, model.config, n, kernel, tile_kv, max_step=step)
    for s in range(0, n, step):
        piece = mx.array([chunk[s : s + step]])
        start = max(first - s, 0)  # logits only where they are scored
        with meter.timed("prefill", piece.shape[1]):
            logits = forward(model, piece, cache, logits_from=min(start, piece.shape[1]))[0]
            mx.eval(logits, cache.arrays())
        rows = logits[: n - 1 - max(s, first)]  # the chunk's last position has no target
        if rows.shape[0]:
            lp = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
            mx.eval(lp)
            yield lp
    if saturated is not None:
        saturated.append(cache.saturated())


def chunk_logprobs(model: Model, chunk: list[int], spec: CacheSpec, *args, **kw) -> mx.array:
    """float32 log-probabilities [n_scored, vocab] at the scored positions of one chunk
    (piece_logprobs with the same arguments, its pieces joined)."""
    return mx.concatenate(list(piece_logprobs(model, chunk, spec, *args, **kw)))


def token_stats(ref_lp: mx.array, lp: mx.array, targets: list[int]) -> dict:
    """Per scored token: kl(ref || this), top-1 agreement, nll of the target (numpy arrays)."""
    kl = mx.sum(mx.exp(ref_lp) * (ref_lp - lp), axis=-1)
    agree = mx.argmax(ref_lp, axis=-1) == mx.argmax(lp, axis=-1)
    nll = nll_of(lp, targets)
    mx.eval(kl, agree, nll)
    return {"kl": np.array(kl), "agree": np.array(agree), "nll": np.array(nll)}


def nll_of(lp: mx.array, targets: list[int]) -> mx.array:
    """Negative log-likelihood of each target under log-probabilities lp [n, vocab] (lazy)."""
    return -mx.take_along_axis(lp, mx.array(targets)[:, None], axis=-1)[:, 0]


def first_scored(chunk: list[int], first: int | None = None) -> int:
    """The first chunk position whose logits are scored: `first`, else the chunk's middle."""
    return len(chunk) // 2 if first is None else first


def targets_of(chunk: list[int], first: int | None = None) -> list[int]:
    return chunk[first_scored(chunk, first) + 1 :]


def reference_run(model: Model, token_chunks: list[list[int]], ubatch=None) -> list[mx.array]:
    """The float32-cache log-probabilities of every chunk (computed once, reused per format)."""
    return [mx.concatenate(p) for p in reference_pieces(model, token_chunks, ubatch)]


def reference_pieces(
    model: Model, token_chunks: list[list[int]], ubatch=None
) -> list[list[mx.array]]:
    """reference_run's log-probabilities kept as piece_logprobs gives them (no copy of a whole
    chunk's rows); quality() takes either."""
    out = []
    for i, c in enumerate(token_chunks):
        pieces, at = [], len(c) // 2
        for lp in piece_logprobs(model, c, REFERENCE_SPEC, "reference", ubatch):
            pieces.append(check_finite(lp, f"the float32 cache, chunk {i}", at))
            at += lp.shape[0]
        out.append(pieces)
    return out


def rows_of(ref: mx.array | list[mx.array], at: int, m: int) -> mx.array:
    """Rows at .. at+m-1 of a chunk's reference: one array, or its pieces end to end."""
    if not isinstance(ref, list):
        return ref[at : at + m]
    out, start = [], 0
    for p in ref:
        lo, hi = max(at - start, 0), min(at + m - start, p.shape[0])
        if lo < hi:
            out.append(p[lo:hi])
        start += p.shape[0]
    return out[0] if len(out) == 1 else mx.concatenate(out)


POS_BUCKETS = 4


def position_buckets(stats: list[dict], n_buckets: int = POS_BUCKETS) -> dict:
    """kl_posB, top1_posB, n_posB (B = 1..n_buckets) over each chunk's scored tokens split
    into n_buckets equal runs of positions (index i of m in bucket i * n_buckets // m)."""
    kl = [[] for _ in range(n_buckets)]
    agree = [[] for _ in range(n_buckets)]
    for s in stats:
        m = len(s["kl"])
        which = np.arange(m) * n_buckets // m
        for b in range(n_buckets):
            kl[b].append(s["kl"][which == b])
            agree[b].append(s["agree"][which == b])
    out = {}
    for b in range(n_buckets):
        k, a = np.concatenate(kl[b]), np.concatenate(agree[b])
        n = int(k.size)
        out[f"kl_pos{b + 1}"] = float(k.mean()) if n else None
        out[f"top1_pos{b + 1}"] = float(a.mean()) if n else None
        out[f"n_pos{b + 1}"] = n
    return out


def sem(x: np.ndarray) -> float:
    """Standard error of the mean over scored tokens, as llama-perplexity states its ± (its
    mean_and_uncertainty: sqrt(var / (n - 1)), 0 for 10 tokens or fewer)."""
    n = x.size
    var = float(np.mean(np.square(x, dtype=np.float64)) - np.mean(x, dtype=np.float64) ** 2)
    return float(np.sqrt(var / (n - 1))) if n > 10 and var > 0 else 0.0


def summarize(stats: list[dict], ref_nll: np.ndarray) -> dict:
    kl = np.concatenate([s["kl"] for s in stats])
    nll = np.concatenate([s["nll"] for s in stats])
    agree = np.concatenate([s["agree"] for s in stats])
    ppl, ppl_ref = float(np.exp(nll.mean())), float(np.exp(ref_nll.mean()))
    return {
        "ppl": ppl,
        "ppl_err": ppl * sem(nll),
        "ppl_ref": ppl_ref,
        "delta_ppl": ppl - ppl_ref,
        "ppl_ref_err": ppl_ref * sem(ref_nll),
        # paired: both perplexities score the same tokens, so their errors mostly cancel
        "delta_ppl_err": sem(ppl * nll - ppl_ref * ref_nll),
        "kl_mean": float(kl.mean()),
        "kl_err": sem(kl),
        "kl_p99": float(np.percentile(kl, 99)),
        "top1_agree": float(agree.mean()),
        "n_scored": int(kl.size),
        **position_buckets(stats),
    }


def quality(
    model: Model,
    token_chunks: list[list[int]],
    spec: CacheSpec,
    ref: list,
    kernel: str = "reference",
    ubatch: int | None = None,
    tile_kv: int | None = None,
    keep_tokens: bool = False,
    pieces=piece_logprobs,
    first: int | None = None,
) -> dict:
    """ppl, ppl_ref, delta_ppl, kl_mean, kl_p99, top1_agree, n_scored of `spec` against `ref`
    (reference_run or reference_pieces of the same chunks); with an FP8 format, kv_saturated:
    the K/V elements stored saturated over every chunk, layer and head; with keep_tokens,
    per_token (per_token: every scored token's values). Compared micro-batch by micro-batch as
    each is computed: one micro-batch's rows of this cache are held at once. `pieces`: where
    the log-probabilities come from (compress.pieces_under: under a cache policy; shift_quality:
    through a context shift); `first`: the first chunk position they score (None: its middle)."""
    stats, ref_nll, sat = [], [], []
    for i, (chunk, ref_lp) in enumerate(zip(token_chunks, ref)):
        tg, at, parts = targets_of(chunk, first), 0, []
        for lp in pieces(model, chunk, spec, kernel, ubatch, tile_kv, sat):
            m = lp.shape[0]
            check_finite(lp, f"the {spec.label} cache, chunk {i}", first_scored(chunk, first) + at)
            r = rows_of(ref_lp, at, m)
            parts.append(token_stats(r, lp, tg[at : at + m]))
            ref_nll.append(np.array(nll_of(r, tg[at : at + m])))
            at += m
        stats.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    out = summarize(stats, np.concatenate(ref_nll))
    if keep_tokens:
        out["per_token"] = per_token(token_chunks, stats, first)
    return out | ({"kv_saturated": sum(sat)} if spec.saturates else {})


def per_token(token_chunks: list[list[int]], stats: list[dict], first: int | None = None) -> dict:
    """Every scored token's values as arrays: chunk, position (the chunk position whose logits
    are scored, from `first`: quality's), token (the true next token's id), nll and kl (nats)."""
    parts = {"chunk": [], "position": [], "token": [], "nll": [], "kl": []}
    for i, (chunk, s) in enumerate(zip(token_chunks, stats)):
        at = first_scored(chunk, first)
        parts["chunk"].append(np.full(len(s["kl"]), i))
        parts["position"].append(np.arange(at, at + len(s["kl"])))
        parts["token"].append(np.array(targets_of(chunk, first)))
        parts["nll"].append(s["nll"])
        parts["kl"].append(s["kl"])
    return {k: np.concatenate(v) for k, v in parts.items()}

"""Sharded decode attention: partial attention with its log-sum-exp, and the exact combine.

Two ways to spread one decode step's KV cache over N ranks:
* context (sequence parallelism): rank r holds positions [p_r, p_{r+1}) of every KV head. It
  computes, for each query row, its partial output o_r = softmax(s_r) V_r over its own
  positions and lse_r = log sum_j exp(s_rj). The exact output over all positions is
  sum_r exp(lse_r - lse) o_r with lse = logsumexp_r lse_r (the flash-decoding combine).
  Two collectives do that: `gather` = all_gather of [o_r | lse_r] and the combine on every rank;
  `sum` = all_max of lse_r (the shift that keeps exp finite), then all_sum of
  [exp(lse_r - max) o_r | exp(lse_r - max)] and one division.
* heads (head parallelism): rank r holds KV heads [h_r, h_{r+1}) at every position and their
  G query heads each; its outputs are complete. `gather` = all_gather of the outputs (padded to
  the largest rank's head count, so uneven splits gather equal shapes) and a concatenation;
  `sum` = all_sum of the full [B, Hq, 1, D] output where each rank fills only its heads.
Splits are as even as they can be: the first n % N ranks get one more position (or KV head).
Partials travel in float32 (the combine is exact up to float32 rounding).
The pure math (`combine_lse`, `sum_parts`, `concat_heads`) takes stacked partials, so the
unit tests check it without ranks; `combine` runs it over a group of mx.distributed.
"""

from __future__ import annotations

import mlx.core as mx

BY = ("context", "heads")
COMBINES = ("gather", "sum")


def split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of each of `parts` near-equal slices of n (the first n % parts one longer)."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for r in range(parts):
        end = start + base + (1 if r < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def split_reason(by: str, parts: int, context_len: int, n_kv_heads: int) -> str | None:
    """Why `parts` ranks cannot split this cache `by` context or heads (a rank left empty)."""
    n = context_len if by == "context" else n_kv_heads
    what = "context_len" if by == "context" else "n_kv_heads"
    return None if parts <= n else f"{parts} shards by {by} leave a rank empty: {what}={n}"


def partial_attention(q, k, v, fmt, *, scale: float) -> tuple[mx.array, mx.array]:
    """Decode attention over the positions held here: (out [B, Hq, Lq, D] float32, normalized
    over these positions only; lse [B, Hq, Lq, 1] float32). Any format: K/V are decoded to the
    compute dtype, scores and softmax statistics are float32, GQA folded into rows."""
    act = fmt.compute_dtype
    kd, vd = fmt.decode(k, act), fmt.decode(v, act)  # [B, Hkv, Lk, D]
    b, hq, lq, d = q.shape
    hkv = kd.shape[1]
    group = hq // hkv
    qg = (q * scale).astype(act).reshape(b, hkv, group * lq, d)  # [B, Hkv, G*Lq, D]
    s = (qg @ kd.swapaxes(-1, -2)).astype(mx.float32)  # [B, Hkv, G*Lq, Lk]
    m = mx.max(s, axis=-1, keepdims=True)
    p = mx.exp(s - m)
    total = mx.sum(p, axis=-1, keepdims=True)
    out = (p.astype(act) @ vd).astype(mx.float32) / total  # [B, Hkv, G*Lq, D]
    lse = m + mx.log(total)
    return out.reshape(b, hq, lq, d), lse.reshape(b, hq, lq, 1)


def partial(q, k, v, fmt, *, mask=None, scale: float, tile_kv=None) -> mx.array:
    """The same computation on one device (the single-rank baseline of a sharded case)."""
    if mask is not None:
        raise ValueError("partial attention runs decode (no mask) only")
    return partial_attention(q, k, v, fmt, scale=scale)[0].astype(q.dtype)


def decode_only(fmt, problem, tile_kv) -> str | None:
    """KERNELS `fits`: the partial kernel runs decode steps (one query position) only."""
    return None if problem.q_len == 1 else "partial attention runs decode only"


# ---- the exact combine, on partials stacked along a leading rank axis ----------------------


def combine_lse(outs: mx.array, lses: mx.array) -> mx.array:
    """outs [N, ...,  D], lses [N, ..., 1] (float32) -> the exact output over all N slices."""
    top = mx.max(lses, axis=0)
    w = mx.exp(lses - top)  # [N, ..., 1]
    return mx.sum(w * outs, axis=0) / mx.sum(w, axis=0)


def sum_parts(out: mx.array, lse: mx.array, top: mx.array) -> mx.array:
    """One rank's addend for the `sum` combine: [exp(lse - top) out | exp(lse - top)]."""
    w = mx.exp(lse - top)
    return mx.concatenate([w * out, w], axis=-1)


def finish_sum(summed: mx.array) -> mx.array:
    """The all_sum of every rank's sum_parts -> the exact output."""
    return summed[..., :-1] / summed[..., -1:]


def concat_heads(gathered: mx.array, counts: list[int]) -> mx.array:
    """gathered [N, B, Hmax, Lq, D] (each rank's heads, padded to Hmax) -> [B, sum counts, ...]."""
    return mx.concatenate([gathered[r, :, :c] for r, c in enumerate(counts)], axis=1)


def pad_heads(out: mx.array, width: int) -> mx.array:
    """out [B, h, Lq, D] padded with zero heads to [B, width, Lq, D]."""
    b, h, lq, d = out.shape
    if h == width:
        return out
    return mx.concatenate([out, mx.zeros((b, width - h, lq, d), out.dtype)], axis=1)


def place_heads(out: mx.array, start: int, total: int) -> mx.array:
    """out [B, h, Lq, D] at heads [start, start + h) of a zero [B, total, Lq, D]."""
    b, h, lq, d = out.shape
    before = mx.zeros((b, start, lq, d), out.dtype)
    after = mx.zeros((b, total - start - h, lq, d), out.dtype)
    return mx.concatenate([before, out, after], axis=1)


# ---- the combine over a group of mx.distributed ranks ----------------------------------------


def _stack(x: mx.array, n: int) -> mx.array:
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])  # all_gather concatenates along axis 0


def combine_context(out, lse, how: str, group) -> mx.array:
    """The exact output over every rank's positions, from this rank's (out, lse)."""
    n = group.size()
    if how == "gather":
        both = mx.distributed.all_gather(mx.concatenate([out, lse], axis=-1), group=group)
        both = _stack(both, n)  # [N, B, Hq, Lq, D + 1]
        return combine_lse(both[..., :-1], both[..., -1:])
    top = mx.distributed.all_max(lse, group=group)
    return finish_sum(mx.distributed.all_sum(sum_parts(out, lse, top), group=group))


def combine_heads(out, how: str, group, heads: list[tuple[int, int]]) -> mx.array:
    """Every rank's query heads [B, Hq, Lq, D] from this rank's heads' outputs."""
    counts = [e - s for s, e in heads]
    if how == "gather":
        both = mx.distributed.all_gather(pad_heads(out, max(counts)), group=group)
        return concat_heads(_stack(both, group.size()), counts)
    start = heads[group.rank()][0]
    return mx.distributed.all_sum(place_heads(out, start, heads[-1][1]), group=group)


def sent_bytes(by: str, how: str, n: int, b: int, hq: int, d: int, max_q_heads: int) -> int:
    """Bytes one rank sends for one combine (one layer), modelled on ring collectives of float32
    payloads: all_gather of chunks S sends (n-1) S; all-reduce (all_sum, all_max) of a
    payload P sends 2 (n-1)/n P (reduce-scatter then all-gather). A model, not a wire count.
    max_q_heads: the largest rank's query heads (heads: the gathered chunk is padded to it)."""
    if n == 1:
        return 0
    rows = b * hq * 4  # one float32 per query row (decode: one query position)
    if by == "heads":
        if how == "gather":
            return (n - 1) * b * max_q_heads * d * 4
        return 2 * (n - 1) * rows * d // n
    if how == "gather":
        return (n - 1) * rows * (d + 1)
    return 2 * (n - 1) * rows // n + 2 * (n - 1) * rows * (d + 1) // n

"""residual: KIVI's fp16 residual (Liu et al. 2024, arXiv:2402.02750) as a selection of which
positions stay in full precision: the newest positions wait unquantized and are quantized
`recent_tokens` at a time when that many are pending (kernels/model/cache.py Stream asks
`flushed`); 0 quantizes every position on write. No position is evicted."""

from __future__ import annotations


def flushed(n_pending: int, recent_tokens: int) -> int:
    """How many of the n_pending oldest unquantized positions are quantized now: whole groups
    of recent_tokens (KIVI's residual), all with no residual."""
    if recent_tokens == 0:
        return n_pending
    return n_pending // recent_tokens * recent_tokens

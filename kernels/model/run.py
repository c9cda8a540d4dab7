"""Running the model over a kvbench cache: a forward pass, prefill, a decode step, greedy.

Every reader of the model (quality, retrieval, generate, capture, the engines) runs it through
these; kernels/model/seam.py is where the cache's kernel enters the mlx-lm model. prefill and
decode credit each evaluated pass to the open meters (kernels/model/meter.py: what a phase's
evidence cost); decode_step stays lazy for the callers that time it themselves.
"""

from __future__ import annotations

import mlx.core as mx

from kvbench.kernels.model import meter, seam
from kvbench.kernels.model.load import Model
from kvbench.kernels.model.protocol import ModelCache, StoredCache


def forward(model: Model, tokens: mx.array, cache: ModelCache, logits_from: int = 0) -> mx.array:
    """Logits [B, n - logits_from, vocab] of tokens [B, n] at positions cache.offset.. (lazy)
    through the mlx-lm model with `cache` (kernels/model/seam.py). The tokens before
    logits_from go through their own forward pass whose logits are never evaluated, so the
    output head runs only where logits are wanted."""
    n = tokens.shape[1]
    if logits_from >= n:
        return seam.forward(model, tokens, cache)[:, n:]
    if logits_from > 0:
        seam.forward(model, tokens[:, :logits_from], cache)
        tokens = tokens[:, logits_from:]
    return seam.forward(model, tokens, cache)


def check_finite(logits: mx.array, what: str, first: int = 0) -> mx.array:
    """logits [n, vocab] (or [vocab]) unchanged, or ValueError naming the first non-finite
    value and where it is: a NaN model, format or kernel gives an error row, never KL and
    perplexity computed over NaN (issue 35)."""
    finite = mx.isfinite(logits).reshape(-1)
    if bool(mx.all(finite).item()):
        return logits
    i = int(mx.argmin(finite.astype(mx.int32)).item())  # the first False
    vocab = logits.shape[-1]
    value = logits.reshape(-1)[i].item()
    raise ValueError(f"non-finite logits with {what}: {value} at position {first + i // vocab}, "
                     f"token {i % vocab}")  # fmt: skip


# ---- decode at depth -----------------------------------------------------------------------


def prefill(model: Model, cache: StoredCache, tokens: list[int], ubatch: int | None = None) -> None:
    """Fill `cache` with `tokens` (no logits kept), evaluated piece by piece."""
    step = ubatch or len(tokens)
    for s in range(0, len(tokens), step):
        piece = mx.array([tokens[s : s + step]])
        with meter.timed("prefill", piece.shape[1]):
            forward(model, piece, cache, logits_from=piece.shape[1])
            mx.eval(cache.arrays())


def decode_step(model: Model, cache: ModelCache, token: int) -> mx.array:
    """One whole-model decode step at depth cache.offset: logits [vocab] (lazy: the caller
    evaluates them, with cache.arrays(), inside its timer)."""
    return forward(model, mx.array([[token]]), cache)[0, -1]


def decode(model: Model, cache: StoredCache, token: int) -> mx.array:
    """decode_step, evaluated (logits and the cache's writes) and credited to the open meters."""
    with meter.timed("decode", 1):
        logits = decode_step(model, cache, token)
        mx.eval(logits, cache.arrays())
    return logits


def greedy(model: Model, cache: StoredCache, prompt: list[int], n_new: int) -> list[int]:
    """Greedy continuation of `prompt` (n_new tokens)."""
    with meter.timed("prefill", len(prompt)):
        logits = forward(model, mx.array([prompt]), cache, logits_from=len(prompt) - 1)[0, -1]
        mx.eval(logits, cache.arrays())
    out = []
    for _ in range(n_new):
        out.append(int(mx.argmax(logits).item()))
        logits = decode(model, cache, out[-1])
    return out

"""llama.cpp's own next-token distributions, read from the file `llama-perplexity
--kl-divergence-base FILE` writes, and greedy text from `llama-simple`.

The file (tools/perplexity/perplexity.cpp, b11434): the 8 bytes `_logits_`, int32 n_ctx, int32
n_vocab, int32 n_chunk, the n_chunk x n_ctx int32 tokens it evaluated (the text's tokens, BOS
first where the vocabulary adds one; each chunk's first token is overwritten by BOS only while
evaluating), then per chunk, per scored position (n_ctx/2 .. n_ctx-2), nv = 2*((n_vocab+1)/2)+4
uint16 values: two float32s (scale, min_log_prob) then one uint16 q per token, log p = scale * q
+ min_log_prob, where q = 0 lumps every token more than 16 nats under the top logit (their log
p is at most min_log_prob). So each distribution is llama.cpp's, rounded to 16 nats / 65535
(2.4e-4 nats); the argmax is exact up to ties within that step.

Nothing here imports the harness beyond the llama.cpp runner (paths in, numpy out).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvbench.peers.llamacpp import LlamaCppError, llamacpp_bin, missing_reason, run_tool

MAGIC = b"_logits_"


def read_kl_base(path: str | Path) -> dict:
    """The file as arrays: n_ctx, n_vocab, n_chunk, tokens [n_chunk, n_ctx] (int32) and
    logprobs(chunk) -> float32 [n_ctx - 1 - n_ctx // 2, n_vocab] (a memory map underneath);
    ValueError naming the file when it is not such a file."""
    path = Path(path)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if raw.size < 20 or bytes(raw[:8]) != MAGIC:
        raise ValueError(f"{path}: not a llama-perplexity --kl-divergence-base file")
    n_ctx, n_vocab, n_chunk = (int(x) for x in raw[8:20].view(np.int32))
    if n_ctx < 4 or n_vocab < 1 or n_chunk < 1:
        raise ValueError(f"{path}: n_ctx {n_ctx}, n_vocab {n_vocab}, {n_chunk} chunks: no data")
    tok_end = 20 + 4 * n_ctx * n_chunk
    nv, n_scored = 2 * ((n_vocab + 1) // 2) + 4, n_ctx - 1 - n_ctx // 2
    if raw.size != tok_end + 2 * nv * n_scored * n_chunk:
        raise ValueError(f"{path}: {raw.size} bytes, not what n_ctx {n_ctx}, n_vocab {n_vocab} "
                         f"and {n_chunk} chunks make")  # fmt: skip
    tokens = raw[20:tok_end].view(np.int32).reshape(n_chunk, n_ctx)
    body = raw[tok_end:].view(np.uint16).reshape(n_chunk, n_scored, nv)

    def logprobs(chunk: int) -> np.ndarray:
        rows = body[chunk]  # [n_scored, nv] uint16
        head = np.ascontiguousarray(rows[:, :4]).view(np.float32)  # [n_scored, 2]: scale, min
        q = rows[:, 4 : 4 + n_vocab].astype(np.float32)
        return q * head[:, :1] + head[:, 1:2]

    return {"n_ctx": n_ctx, "n_vocab": n_vocab, "n_chunk": n_chunk, "tokens": tokens,
            "logprobs": logprobs}  # fmt: skip


def agreement(base_lp: np.ndarray, lp: np.ndarray) -> dict:
    """Teacher-forced agreement of distributions `lp` [n, vocab] (log-probabilities) with
    llama.cpp's `base_lp` at the same positions: top-1 agreement (first index of the maximum
    on each side), KL(llama.cpp || lp) per token in nats summed as llama.cpp sums its own (over
    the tokens whose base log p is above -16, not renormalized: perplexity.cpp log_softmax), n."""
    top = np.argmax(base_lp, axis=-1) == np.argmax(lp, axis=-1)
    base = base_lp.astype(np.float64)
    kept = base > -16.0
    kl = np.sum(np.where(kept, np.exp(base) * (base - lp), 0.0), axis=-1)
    return {"top1_agree": float(top.mean()), "kl": kl, "n": int(top.size)}


# ---- llama-simple --------------------------------------------------------------------------------


def simple_command(binary: Path, model: Path, prompt: str, n_predict: int) -> list[str]:
    """llama-simple: the prompt tokenized with BOS where the vocabulary adds one, then n_predict
    greedy tokens with an f16 cache (its context's defaults), printed as text."""
    return [str(binary), "-m", str(model), "-n", str(n_predict), prompt]


def run_simple(model: Path, prompt: str, n_predict: int, timeout_s: float = 600) -> str:
    """llama.cpp's greedy continuation of `prompt` as text (what llama-simple printed after the
    prompt's own text); LlamaCppError when the binary is missing or its output does not start
    with the prompt."""
    binary = llamacpp_bin("llama-simple")
    if binary is None:
        raise LlamaCppError(missing_reason("llama-simple"))
    stdout, _ = run_tool(simple_command(binary, model, prompt, n_predict), timeout_s)
    at = stdout.find(prompt)
    if at < 0:
        raise LlamaCppError(f"llama-simple's output does not hold the prompt: {stdout[:200]!r}")
    return stdout[at + len(prompt) :].removesuffix("\n")


def tokens_to_difference(ours: list[str], theirs: str) -> int:
    """How many of our generated tokens (as text pieces) run before the first character where
    our text and llama.cpp's differ: the tokens whose whole text is a prefix of theirs."""
    text, n = "", 0
    for piece in ours:
        text += piece
        if not theirs.startswith(text):
            break
        n += 1
    return n

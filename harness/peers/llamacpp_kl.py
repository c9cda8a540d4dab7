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

import math
from pathlib import Path

import numpy as np

from kvbench.peers.llamacpp import LlamaCppError, llamacpp_bin, missing_reason, run_tool

MAGIC = b"_logits_"


def read_kl_base(path: str | Path) -> dict:
    """The file as arrays: n_ctx, n_vocab, n_chunk, tokens [n_chunk, n_ctx] (int32) and
    logprobs(chunk, rows=slice(None)) -> float32 [n_ctx - 1 - n_ctx // 2, n_vocab] (those rows
    of the scored positions; a memory map underneath);
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

    def logprobs(chunk: int, rows: slice = slice(None)) -> np.ndarray:
        rows = body[chunk, rows]  # [n_rows, nv] uint16
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


def token_values(base: dict, run: dict, block: int = 64) -> dict:
    """Per scored token of two read_kl_base files of the same tokens (llama.cpp's reference pass
    and a pass to judge, each saved with --kl-divergence-base): chunk, position, token (the true
    next token), nll (of `run`, from its saved log p) and kl (KL(base || run), summed as
    llama-perplexity sums it: over the tokens whose base log p is above -16, not renormalized;
    perplexity.cpp's KL log_softmax). Both sides are the files' 16-bit log-probabilities, so
    each value is llama.cpp's to within their step (2.4e-4 nats); a true token more than 16 nats
    under the top is read at the file's floor (an nll too small: `floored` marks these, and
    floored_nll_fix puts back what they lack). `block` positions at a time:
    a 262144-token vocabulary makes a chunk's distributions a gigabyte. ValueError when the two
    files do not hold the same context, vocabulary and tokens."""
    for key in ("n_ctx", "n_vocab", "n_chunk"):
        if base[key] != run[key]:
            raise ValueError(f"{key}: {base[key]} in the base file, {run[key]} in the run's")
    if not np.array_equal(base["tokens"], run["tokens"]):
        raise ValueError("the base file and the run's hold different tokens")
    n_ctx, first = base["n_ctx"], base["n_ctx"] // 2
    parts = {"chunk": [], "position": [], "token": [], "nll": [], "kl": [], "floored": []}
    for c in range(base["n_chunk"]):
        targets = base["tokens"][c, first + 1 :].astype(np.int64)  # [n_scored]
        for s in range(0, len(targets), block):
            rows = slice(s, s + block)
            b, r = base["logprobs"](c, rows).astype(np.float64), run["logprobs"](c, rows)
            kl = np.sum(np.where(b > -16.0, np.exp(b) * (b - r), 0.0), axis=-1)
            lp = np.take_along_axis(r, targets[s : s + block, None], axis=-1)[:, 0]
            parts["kl"].append(kl)
            parts["nll"].append(-lp.astype(np.float64))
            # q = 0 where the row spans 16 nats: at the file's floor, the true log p at or below
            # (a narrower row's floor is its smallest log p itself, saved exactly)
            floor = r.min(axis=-1)
            parts["floored"].append((lp <= floor) & (r.max(axis=-1) - floor > 15.99))
        parts["chunk"].append(np.full(len(targets), c))
        parts["position"].append(np.arange(first, n_ctx - 1))
        parts["token"].append(targets)
    return {k: np.concatenate(v) for k, v in parts.items()}


def floored_nll_fix(values: dict, ppl: float, atol: float = 2e-4) -> dict:
    """The per-token nll with the floored tokens' deficit put back: llama.cpp's perplexity `ppl`
    (as it printed it, from its exact logits) fixes the sum of every token's nll; the saved
    values fall short of it by what the floored tokens lack (each saved at the floor, above its
    true log p), and that deficit is shared equally among them (exact with one floored token,
    the usual case: 1 of 1,023 on SmolLM2 at 2K). ValueError when the saved values exceed the
    printed sum, or, with no floored token, miss it by more than `atol` nats a token."""
    nll, floored = values["nll"], values["floored"]
    deficit = nll.size * math.log(ppl) - float(nll.sum())
    if deficit < -atol * nll.size or (not floored.any() and abs(deficit) > atol * nll.size):
        off, k = -deficit / nll.size, int(floored.sum())
        raise ValueError(f"the saved log p's mean nll is {off:+.3g} nats a token off the "
                         f"printed ppl {ppl} ({k} floored tokens)")  # fmt: skip
    if floored.any():
        nll = nll + np.where(floored, deficit / floored.sum(), 0.0)
    return {**values, "nll": nll}


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

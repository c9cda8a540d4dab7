"""llama.cpp's passkey prompt, exactly (task `passkey-llamacpp`): so that kvbench and
`llama-passkey` answer the same prompt.

examples/passkey/passkey.cpp (llama.cpp b11434) builds one string: its instruction, then
`n_junk` repetitions of its filler sentence, the needle placed before repetition `i_pos`,
then its question; no chat template; tokenized whole with the vocabulary's special tokens
(common_tokenize(ctx, prompt, true): a BOS where the vocabulary adds one, as Gemma's does and
SmolLM2's does not); greedy decoding of at most 16 tokens. Its key is
`rand() % 50000 + 1`, never seeded: with `--pos` given, the first rand() of the C library,
which glibc answers 39384 (LLAMACPP_KEY; another C library gives another key, and the peer
reads the key llama-passkey prints).

kvbench fits the prompt to `context_len` as llama-passkey's `--junk` would have to be chosen:
the most repetitions whose tokens plus the 16 generated ones fit, found by tokenizing the
whole prompt (a binary search). The needle goes before repetition round(depth x n_junk)
(at most n_junk - 1, so depth 1 still holds the key); trial i moves it i repetitions on
(modulo n_junk), which `--pos` reproduces.
"""

from __future__ import annotations

import functools

from kvbench.kernels.model import retrieval
from kvbench.kernels.model.retrieval import Prompt, encode

TASK = "passkey-llamacpp"
LLAMACPP_KEY = "39384"  # glibc: rand() % 50000 + 1 on the first call (passkey.cpp, --pos given)
N_PREDICT = 16  # passkey.cpp's n_predict
PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
SUFFIX = " What is the pass key? The pass key is"
JUNK = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."


def text(n_junk: int, i_pos: int, key: str = LLAMACPP_KEY) -> str:
    """passkey.cpp's prompt, character for character."""
    out = PREFIX
    for i in range(n_junk):
        if i % n_junk == i_pos:
            out += NEEDLE.format(key=key)
        out += JUNK
    return out + SUFFIX


def position(n_junk: int, depth: float, trial: int = 0) -> int:
    """`--pos` for a depth (0 = before the first repetition, 1 = before the last)."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth {depth} must be within 0..1")
    return (min(n_junk - 1, round(depth * n_junk)) + trial) % n_junk


def tokens(tokenizer, body: str) -> list[int]:
    """`body` tokenized as common_tokenize(ctx, body, add_special=true) does: BOS only where the
    vocabulary adds one (kvbench's tokenizer's own add_bos; a Hugging Face tokenizer's default
    special tokens)."""
    return list(tokenizer.encode(body))


def n_tokens(tokenizer, n_junk: int) -> int:
    return len(tokens(tokenizer, text(n_junk, 0)))


_FITS: dict[int, tuple[object, dict[int, int]]] = {}  # id(tokenizer) -> (it, {context_len: n})


def fit_junk(tokenizer, context_len: int) -> int:
    """The most repetitions whose prompt (BOS included) and N_PREDICT tokens fit context_len,
    searched once per (tokenizer, context_len): each step tokenizes a whole prompt, and every
    depth, trial, format and kernel of a suite asks again (a suite's validation took minutes)."""
    fits = _FITS.setdefault(id(tokenizer), (tokenizer, {}))[1]  # holding it: the id stays its
    if context_len not in fits:
        fits[context_len] = _search_junk(tokenizer, context_len)
    return fits[context_len]


def _search_junk(tokenizer, context_len: int) -> int:
    lo, hi = 0, 1
    while n_tokens(tokenizer, hi) + N_PREDICT <= context_len:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if n_tokens(tokenizer, mid) + N_PREDICT <= context_len else (lo, mid)
    if lo < 1:
        raise ValueError(f"context_len {context_len} leaves no room for one filler repetition")
    return lo


def prompt(tokenizer, context_len: int, depth: float, trial: int = 0) -> Prompt:
    """Trial `trial` of the task: its tokens, where the needle starts (the tokens of the text
    before it), the haystack's span, n_junk as `units`, the key as the answer."""
    n_junk = fit_junk(tokenizer, context_len)
    i_pos = position(n_junk, depth, trial)
    ids = tokens(tokenizer, text(n_junk, i_pos))
    needle_at = len(tokens(tokenizer, PREFIX + JUNK * i_pos))
    span = (len(tokens(tokenizer, PREFIX)), len(ids) - len(encode(tokenizer, SUFFIX, False)))
    return Prompt(ids, needle_at, span, n_junk, LLAMACPP_KEY, N_PREDICT)


def prompt_sizes(name: str, context_len: int, depth: float, trials: int) -> list[int]:
    """The token count of every trial's prompt (ValueError naming context_len when not one
    filler repetition fits), with the model's own tokenizer (retrieval.tokenizer_of); once per
    prompt: a suite's formats and kernels share it."""
    return list(_prompt_sizes(name, context_len, depth, trials))


@functools.cache
def _prompt_sizes(name: str, context_len: int, depth: float, trials: int) -> tuple[int, ...]:
    if name not in retrieval._TOKENIZERS:
        retrieval._TOKENIZERS[name] = retrieval.tokenizer_of(name)
    tokenizer = retrieval._TOKENIZERS[name][0]
    return tuple(len(prompt(tokenizer, context_len, depth, i).tokens) for i in range(trials))


def instruction_tokens(name: str) -> int:
    """The tokens of passkey.cpp's instruction (BOS included where the vocabulary adds one):
    kvbench's default n_keep for a shift of this prompt (passkey.cpp keeps `--keep`, 32 by
    default, which kvbench passes to llama-passkey)."""
    if name not in retrieval._TOKENIZERS:
        retrieval._TOKENIZERS[name] = retrieval.tokenizer_of(name)
    return len(tokens(retrieval._TOKENIZERS[name][0], PREFIX))

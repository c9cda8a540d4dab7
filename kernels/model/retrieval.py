"""Retrieval tasks generated offline by code (fixed seeds, no dataset, no network), and their
scoring: can the model, with its KV cache in a given format, find what was hidden in a long
context?

A trial is a prompt of at most `context_len` tokens (the answer's tokens included, as RULER
budgets them): an instruction, a haystack of repeated filler with the task's needles in it,
a question and the start of the answer; the model continues it greedily and the answer is
read from the continuation. The haystack is RULER's "repeat" noise, one line per repetition:
"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
The prompt is built in tokens (each piece tokenized on its own and the token lists joined), so
the needle sits exactly where `depth` asks: the needle starts after round(depth x units) of
the haystack's filler units, i.e. at `depth` of the haystack's tokens to within one unit.

Tasks (TASKS):
* passkey: a 5-digit key, "The pass key is K. Remember it. K is the pass key." (the wording of
  llama.cpp's examples/passkey: its instruction, needle, filler and question; kvbench puts one
  filler repetition per line), asked "What is the pass key? The pass key is".
* niah: RULER's niah_single_1 recipe: the needle "One of the special magic numbers for
  {word} is: {7-digit number}." (key an adjective-noun pair, value a 7-digit number) in the
  repeated haystack; the answer starts "The special magic number for {word} mentioned in the
  provided text is".
* multikey: the same needle among N_DISTRACTORS needles of other keys (other numbers) at
  seeded random depths (RULER's multi-key variant with distractors in a repeated haystack);
  only the queried key's number counts.
* vartrack: RULER's variable tracking: a chain "VAR A = 12345", "VAR B = VAR A ", ... of
  VT_HOPS hops; its first line at `depth`, the other lines at seeded random depths after it;
  the answer is every variable that holds the value (all must be named).

Scoring is exact match: the first run of digits in the continuation equals the number (passkey,
niah, multikey), or every chain variable appears among its upper-case words (vartrack, as
RULER's string_match_all). `summarize` returns counts; the instrument puts the 95% Wilson
interval on them (harness/stats.py).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
)
ADJECTIVES = (
    "amber", "brave", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy", "jolly",
    "keen", "lively", "mellow", "nimble", "odd", "proud", "quiet", "rapid", "silent", "tidy",
)  # fmt: skip
NOUNS = (
    "anchor", "badger", "candle", "dolphin", "engine", "falcon", "garden", "harbor", "island",
    "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pebble", "quarry", "river",
)  # fmt: skip
N_DISTRACTORS = 3  # multikey: needles of other keys beside the queried one
VT_HOPS = 4  # vartrack: VAR B = VAR A, ... after the value line


@dataclass(frozen=True)
class Trial:
    """One generated trial: the pieces of its prompt and its truth."""

    task: str
    intro: str
    needles: tuple[str, ...]  # needles[0] is placed at `depth`; the others at `where`
    where: tuple[float, ...]  # the other needles' depths (fractions of the haystack)
    question: str
    prefix: str  # the start of the answer, after the question (and the chat turn change)
    answer: str  # the truth: a number, or space-separated variable names (vartrack)
    gen_tokens: int  # tokens to generate for the answer


def _word(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def passkey(rng: random.Random) -> Trial:
    key = str(rng.randint(10000, 99999))
    intro = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and "
        "memorize them. I will quiz you about the important information there.\n"
    )
    needle = f"The pass key is {key}. Remember it. {key} is the pass key.\n"
    question, prefix = "What is the pass key?", "The pass key is"
    return Trial("passkey", intro, (needle,), (), question, prefix, key, 8)


NIAH_INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize "
    "it. I will quiz you about the numbers afterwards.\n"
)


def _niah_parts(word: str, value: str) -> tuple[str, str, str]:
    needle = f"One of the special magic numbers for {word} is: {value}.\n"
    question = f"What is the special magic number for {word} mentioned in the provided text?"
    prefix = f"The special magic number for {word} mentioned in the provided text is"
    return needle, question, prefix


def niah(rng: random.Random) -> Trial:
    word, value = _word(rng), str(rng.randint(10**6, 10**7 - 1))
    needle, question, prefix = _niah_parts(word, value)
    return Trial("niah", NIAH_INTRO, (needle,), (), question, prefix, value, 12)


def multikey(rng: random.Random) -> Trial:
    words: list[str] = []
    while len(words) < 1 + N_DISTRACTORS:
        w = _word(rng)
        if w not in words:
            words.append(w)
    values = [str(rng.randint(10**6, 10**7 - 1)) for _ in words]
    needle, question, prefix = _niah_parts(words[0], values[0])
    others = tuple(_niah_parts(w, v)[0] for w, v in zip(words[1:], values[1:]))
    where = tuple(rng.random() for _ in others)
    needles = (needle, *others)
    return Trial("multikey", NIAH_INTRO, needles, where, question, prefix, values[0], 12)


def vartrack(rng: random.Random) -> Trial:
    names: list[str] = []
    while len(names) < VT_HOPS + 1:
        n = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if n not in names:
            names.append(n)
    value = str(rng.randint(10000, 99999))
    lines = [f"VAR {names[0]} = {value}\n"]
    lines += [f"VAR {names[j + 1]} = VAR {names[j]}\n" for j in range(VT_HOPS)]
    intro = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
    question = (
        f"Question: Find all variables that are assigned the value {value} in the text above."
    )
    prefix = (
        f"Answer: According to the chain(s) of variable assignment in the text above, "
        f"{VT_HOPS + 1} variables are assigned the value {value}, they are:"
    )
    return Trial("vartrack", intro, tuple(lines), (), question, prefix, " ".join(names), 24)


TASKS: dict[str, Callable[[random.Random], Trial]] = {
    "passkey": passkey,
    "niah": niah,
    "multikey": multikey,
    "vartrack": vartrack,
}


def make_trial(task: str, seed: int) -> Trial:
    """Trial number `seed` of `task` (deterministic: random.Random(f"{task}:{seed}"))."""
    if task not in TASKS:
        raise ValueError(f"unknown retrieval task {task!r}; known: {', '.join(TASKS)}")
    return TASKS[task](random.Random(f"{task}:{seed}"))


# ---- prompts in tokens ---------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    needle_at: int  # token index where needles[0] starts
    haystack: tuple[int, int]  # [start, end) token span of the haystack (needles included)
    units: int  # filler units in the haystack
    answer: str
    gen_tokens: int


def encode(tokenizer, text: str, first: bool) -> list[int]:
    """Token ids of `text`; BOS only on the prompt's first piece, and there only where the
    vocabulary adds one (the tokenizer's own rule: SmolLM2's GGUF adds none, Gemma's does)."""
    try:
        return list(tokenizer.encode(text, add_bos=None if first else False))
    except TypeError:  # a Hugging Face / mlx-lm tokenizer
        return list(tokenizer.encode(text, add_special_tokens=first))


def _later_depths(task: str, depth: float, n: int, seed: int) -> list[float]:
    """vartrack: the chain's later lines at sorted seeded depths in [depth, 1]."""
    rng = random.Random(f"{task}:{seed}:where")
    return sorted(depth + (1 - depth) * rng.random() for _ in range(n))


def build_prompt(
    trial: Trial,
    tokenizer,
    context_len: int,
    depth: float,
    seed: int = 0,
    chat: tuple[str, str] = ("", ""),
) -> Prompt:
    """The trial's prompt in at most context_len - gen_tokens tokens (room for the answer):
    chat[0] + intro (the tokenizer's BOS only without a chat template, which holds its own),
    the haystack (filler units, needles between them), the question, chat[1] (or a space) and
    the answer's start. needles[0] goes after round(depth x units) units; the others at their
    own depths (vartrack: seeded, after the first)."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth {depth} must be within 0..1")
    head = encode(tokenizer, chat[0] + trial.intro, not chat[0])  # a template starts itself
    tail = encode(tokenizer, trial.question + (chat[1] or " ") + trial.prefix, False)
    unit = encode(tokenizer, FILLER, False)
    needles = [encode(tokenizer, n, False) for n in trial.needles]
    fixed = len(head) + len(tail) + sum(map(len, needles)) + trial.gen_tokens
    units = (context_len - fixed) // len(unit)
    if units < 1:
        raise ValueError(f"context_len {context_len} leaves no room for a haystack ({fixed} "
                         f"tokens of instruction, needles, question and answer)")  # fmt: skip
    where = list(trial.where)
    if trial.task == "vartrack":
        where = _later_depths(trial.task, depth, len(needles) - 1, seed)
    slots = [round(depth * units)] + [round(w * units) for w in where]
    tokens, needle_at = list(head), -1
    placed = sorted(range(len(needles)), key=lambda i: (slots[i], i))
    k = 0
    for u in range(units + 1):
        while k < len(placed) and slots[placed[k]] == u:
            if placed[k] == 0:
                needle_at = len(tokens)
            tokens += needles[placed[k]]
            k += 1
        if u < units:
            tokens += unit
    span = (len(head), len(tokens))
    tokens += tail
    return Prompt(tokens, needle_at, span, units, trial.answer, trial.gen_tokens)


# ---- scoring -------------------------------------------------------------------------------


def extract(task: str, text: str) -> str | None:
    """The answer read from a continuation: the first run of digits, or (vartrack) the
    upper-case 5-letter words in order, space-separated; None when there is none."""
    if task == "vartrack":
        found = re.findall(r"\b[A-Z]{5}\b", text)
        return " ".join(found) if found else None
    m = re.search(r"\d+", text)
    return m.group(0) if m else None


def correct(task: str, got: str | None, truth: str) -> bool:
    """Exact match: the same number; for vartrack every chain variable named."""
    if got is None:
        return False
    if task == "vartrack":
        return set(truth.split()) <= set(got.split())
    return got == truth


def stop_early(task: str, text: str) -> bool:
    """The answer is complete: digits followed by something else (numeric tasks)."""
    return task != "vartrack" and re.search(r"\d+\D", text) is not None


def summarize(task: str, got: list[str | None], ref: list[str | None], truth: list[str]) -> dict:
    """Row columns of a format's trials: accuracy against the truth and agreement with the
    float32-cache answers of the same prompts, as counts and rates (the intervals: the
    instrument's)."""
    n = len(truth)
    hits = sum(correct(task, g, t) for g, t in zip(got, truth))
    ref_hits = sum(correct(task, r, t) for r, t in zip(ref, truth))
    same = sum(g == r for g, r in zip(got, ref))
    return {
        "n_trials": n,
        "n_correct": hits,
        "accuracy": hits / n,
        "ref_accuracy": ref_hits / n,
        "n_ref_agree": same,
        "ref_agree": same / n,
    }


# ---- the chat template and the model ---------------------------------------------------------

SLOT = "\x00"  # a user message that no template contains: where the prompt's body goes


def chat_frame(tokenizer, metadata: dict | None = None) -> tuple[str, str]:
    """(text before the user's message, text after it up to the assistant's answer) of the
    model's chat template, or ("", "") when it has none: the tokenizer's apply_chat_template
    (mlx-lm / Hugging Face), else the GGUF's `tokenizer.chat_template` rendered with jinja2."""
    messages = [{"role": "user", "content": SLOT}]
    if hasattr(tokenizer, "apply_chat_template"):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        template = (metadata or {}).get("tokenizer.chat_template")
        if not isinstance(template, str) or not template:
            return "", ""
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        names = (metadata or {}).get("tokenizer.ggml.tokens") or []
        special = {}
        for key in ("bos", "eos"):
            i = (metadata or {}).get(f"tokenizer.ggml.{key}_token_id")
            if i is not None and int(i) < len(names):
                special[f"{key}_token"] = str(names[int(i)])
        text = env.from_string(template).render(
            messages=messages, add_generation_prompt=True, **special
        )
    if SLOT not in text:
        return "", ""
    before, after = text.split(SLOT, 1)
    return before, after


def greedy_answer(model, cache, tokenizer, prompt: Prompt, task: str, ubatch: int = 512) -> str:
    """The greedy continuation's text (at most prompt.gen_tokens tokens, stopped once a numeric
    answer is complete or at an end-of-generation token, which the text leaves out), with
    `cache` (empty, capacity >= len(prompt.tokens) + gen_tokens)."""
    import mlx.core as mx

    from kvbench.kernels.model.run import check_finite, decode, prefill
    from kvbench.kernels.model.tokenizer import eog_ids

    prefill(model, cache, prompt.tokens[:-1], ubatch)
    token, out, eog = prompt.tokens[-1], [], eog_ids(tokenizer)
    for _ in range(prompt.gen_tokens):
        logits = check_finite(decode(model, cache, token), "greedy decoding",
                              len(prompt.tokens) - 1 + len(out))  # fmt: skip
        token = int(mx.argmax(logits).item())
        if token in eog:  # the model ended its turn (llama.cpp's and kvpress's stop)
            break
        out.append(token)
        if stop_early(task, tokenizer.decode(out)):
            break
    return tokenizer.decode(out)


def tokenizer_of(name: str):
    """(tokenizer, GGUF metadata) of the model `name` names, read without its weights (what a
    suite's retrieval cases are checked with before anything loads)."""
    from types import SimpleNamespace

    from kvbench.kernels.model.load import ModelError
    from kvbench.kernels.model.source import gguf_fields, model_file
    from kvbench.kernels.model.tokenizer import load_tokenizer

    path = model_file(name)
    md = {} if path.is_dir() else gguf_fields(path)[0]  # read once with the model's shape
    try:
        return load_tokenizer(SimpleNamespace(metadata=md, path=str(path))), md
    except (ValueError, OSError) as e:
        raise ModelError(str(e).splitlines()[0]) from None


_TOKENIZERS: dict = {}


def prompt_sizes(name: str, task: str, context_len: int, depth: float, trials: int,
                 seed: int) -> list[int]:  # fmt: skip
    """The token count of every trial's prompt, built as the retrieval engine builds them
    (ValueError naming context_len when one leaves no room for a haystack); once per prompt:
    a suite's formats and kernels share it."""
    return list(_prompt_sizes(name, task, context_len, depth, trials, seed))


@functools.cache
def _prompt_sizes(name: str, task: str, context_len: int, depth: float, trials: int,
                  seed: int) -> tuple[int, ...]:  # fmt: skip
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = tokenizer_of(name)
    tokenizer, md = _TOKENIZERS[name]
    chat = chat_frame(tokenizer, md)
    return tuple(
        len(build_prompt(make_trial(task, seed + i), tokenizer, context_len, depth, seed + i,
                         chat).tokens)
        for i in range(trials)
    )  # fmt: skip

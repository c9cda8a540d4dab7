"""The checks of what a model phase reads, before anything runs: its text (a readable file
holding enough tokens, or the default text), a context within the model's trained length
unless asked beyond it, and retrieval prompts that fit their context (built with the model's
own tokenizer, no weights loaded). suite/validate.py check_model calls them."""

from __future__ import annotations

import os
from functools import lru_cache

from kvbench.case import Case
from kvbench.errors import SuiteError
from kvbench.files import not_regular, read_text
from kvbench.kernels.model.fetch import MODELS
from kvbench.kernels.model.passkey import TASK as PASSKEY_LLAMACPP

CHUNKED = ("quality", "generate")  # phases that cut the text into chunks of context_len


MIN_CHUNK = 4  # kernels/model/quality.py chunks(): a chunk is scored from its middle on


TEXT_LIMIT_BYTES = 256 * 2**20  # a text file kvbench tokenizes: far above any corpus it scores


SPECIAL_TOKENS = 2  # BOS/EOS a tokenizer may add beyond one token per byte at most


@lru_cache(maxsize=64)
def _text_bytes(text_path: str, mtime_ns: int) -> int:
    """The UTF-8 bytes of a readable, non-empty text file (SuiteError otherwise)."""
    del mtime_ns  # part of the cache key only: an edited file is read again

    def refuse(_file, _key, reason):
        return SuiteError(text_path, "text", reason)

    body = read_text(text_path, "text", limit_bytes=TEXT_LIMIT_BYTES, error=refuse)
    if not body.strip():
        raise SuiteError(text_path, "text", "empty (no text to score)")
    return len(body.encode("utf-8"))


def check_context_limit(path: str, case: Case) -> None:
    """A context_len past the model's trained length only when asked for (context_limit:
    beyond). A registered model not fetched yet is checked when its engine loads it."""
    from kvbench.kernels.model.fetch import model_path
    from kvbench.kernels.model.load import ModelError
    from kvbench.kernels.model.source import model_shape

    if case.model in MODELS and model_path(case.model) is None:
        return
    try:
        trained = model_shape(case.model).trained_context
    except ModelError as e:
        raise SuiteError(path, "model", str(e)) from None
    positions = case.context_len + (case.gen_tokens if case.phase == "generate" else 0)
    beyond = case.context_limit == "beyond" or case.kv_edit != "none"  # an edit: model_edit.py
    if trained and positions > trained and not beyond:
        held = "" if positions == case.context_len else f" + gen_tokens = {positions:,}"
        why = (f"{case.context_len}{held} is past {case.model}'s trained length {trained}; "
               "set context_limit: beyond to run it anyway (the row says so)")  # fmt: skip
        raise SuiteError(path, "context_len", why)


@lru_cache(maxsize=1)
def _default_text_bytes() -> int:
    from kvbench.kernels.model.text import default_text

    return len(default_text().encode("utf-8"))


def check_default_text(path: str, case: Case) -> None:
    """The default text holds enough tokens for context_len x chunks (at most one a byte)."""
    n = _default_text_bytes()
    need = case.context_len * (case.chunks if case.phase in CHUNKED else 1)
    if n + SPECIAL_TOKENS < need:
        what = "context_len x chunks" if case.phase in CHUNKED else "context_len"
        why = (f"the default text ({n:,} bytes) holds at most {n + SPECIAL_TOKENS:,} tokens; "
               f"phase {case.phase} needs {what} = {need:,}: give a longer text: file")  # fmt: skip
        raise SuiteError(path, "text", why)


def check_text(path: str, case: Case) -> None:
    """The text of a model phase: a regular UTF-8 text file holding enough tokens (a token
    covers at least one byte, so n bytes hold at most n + 2 tokens)."""
    why = not_regular(case.text)
    if why is not None:
        raise SuiteError(path, "text", f"{case.text}: {why}, not a text file")
    try:
        n = _text_bytes(case.text, os.stat(case.text).st_mtime_ns)
    except SuiteError as e:
        raise SuiteError(path, "text", f"{case.text}: {e.reason}") from None
    need = case.context_len * (case.chunks if case.phase in CHUNKED else 1)
    if n + SPECIAL_TOKENS < need:
        what = "context_len x chunks" if case.phase in CHUNKED else "context_len"
        most = n + SPECIAL_TOKENS
        why = (
            f"{n:,} bytes hold at most {most:,} tokens; phase {case.phase} needs {what} = {need:,}"
        )
        raise SuiteError(path, "text", f"{case.text}: {why}")


def check_retrieval(path: str, case: Case) -> list[int] | None:
    """Every trial's prompt fits context_len (instruction, needles, question and answer leave
    room for a haystack), built with the model's own tokenizer, no weights loaded; their token
    counts. A registered model not fetched yet is checked when its engine builds the prompts."""
    from kvbench.kernels.model.fetch import model_path
    from kvbench.kernels.model.load import ModelError
    from kvbench.kernels.model.passkey import prompt_sizes as passkey_sizes
    from kvbench.kernels.model.retrieval import prompt_sizes

    if case.model in MODELS and model_path(case.model) is None:
        return None
    try:
        if case.task == PASSKEY_LLAMACPP:  # llama.cpp's own prompt (kernels/model/passkey.py)
            return passkey_sizes(case.model, case.context_len, case.depth, case.trials)
        return prompt_sizes(case.model, case.task, case.context_len, case.depth,
                            case.trials, case.seed)  # fmt: skip
    except (ModelError, ValueError) as e:
        raise SuiteError(path, "context_len", str(e)) from None

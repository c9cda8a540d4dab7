"""kv_edit shift / self-extend on a real model: the suite's checks and the schedule a case runs
(kernels/model/shift.py: llama.cpp's context shift and self-extend as its passkey example runs
them; docs/context-shift.md). Phase retrieval runs either on passkey.cpp's prompt; phase
quality reads a text through the shift (kernels/model/shift_quality.py).

The context is sized by a trained length, n_ctx_train: the model's own, or `context_limit: N`
(the value llama-passkey is given with --override-kv). A case is refused, in one line, where
the edit would not run as asked: a prompt or chunk that fits the context (no shift happens;
self-extend has nothing to extend), ga_w not a multiple of ga_n, a context whose batches would
overrun it (kernels/model/shift.py Schedule.overrun), a cache the edit cannot move (one plain
format for K and V), a cache policy beside it, a phase other than retrieval or quality
(self-extend: retrieval only), llama-perplexity as the kernel, or a model with sliding-window
layers under self-extend in their rings (a shift moves rings: class Rings in
kernels/model/shift.py; self-extend needs `swa_cache: full`, every cell kept and the window a
mask by position, as llama.cpp's --swa-full: its own rings fail to find a slot once grouped).
"""

from __future__ import annotations

from types import SimpleNamespace

from kvbench.case import Case
from kvbench.errors import SuiteError
from kvbench.kernels.model.shift import DIV_SIGNS, N_PREDICT, Schedule

MODEL_EDITS = ("shift", "self-extend")
SWA_CACHES = ("ring", "full")  # a window layer's cells: its ring, or all (llama.cpp --swa-full)
EDIT_PHASES = ("retrieval", "quality")  # self-extend: retrieval only
# n_keep of a quality row that leaves it empty: passkey.cpp's --keep default (its schedule is
# the one replayed; examples/passkey/passkey.cpp: params.n_keep = 32), the text's first tokens
QUALITY_KEEP = 32
__all__ = ["DIV_SIGNS", "MODEL_EDITS", "SWA_CACHES", "check_case", "schedule_of", "edit_of"]
WORDS = ("trained", "beyond")


def context_limit(v) -> str | None:
    """The axis check: trained, beyond or a positive integer."""
    if v in WORDS or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        return None
    if isinstance(v, str) and v.isdigit() and int(v) > 0:
        return None
    return f"must be trained, beyond or a positive integer (a trained length), got {v!r}"


def optional_non_negative_int(v) -> str | None:
    """The n_keep check: empty (the instruction) or a count of positions, 0 included."""
    ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
    return None if ok else f"must be empty or a non-negative integer, got {v!r}"


def numeric_limit(case: Case) -> int | None:
    """context_limit as a number, or None (trained / beyond)."""
    v = case.context_limit
    return None if v in WORDS else int(v)


def n_ctx_train(case: Case, trained: int | None) -> int:
    """The trained length the context is sized by: context_limit N, else the model's."""
    limit = numeric_limit(case)
    if limit is None and not trained:
        raise ValueError(f"{case.model} states no trained length: set context_limit: N")
    return limit if limit is not None else trained


def schedule_of(case: Case, trained: int | None, n_keep: int) -> Schedule:
    """The case's Schedule; n_keep: the case's, else the prompt's instruction (the caller's)."""
    keep = case.n_keep if case.n_keep is not None else n_keep
    ga_n = case.ga_n if case.kv_edit == "self-extend" else 1
    sign = case.div_sign if case.kv_edit == "self-extend" else "llama.cpp"
    full = case.swa_cache == "full"
    return Schedule(n_ctx_train(case, trained), keep, case.ga_w, ga_n, sign, full)


EDIT_AXES = ("kv_edit", "context_limit", "ga_n", "ga_w", "n_keep", "div_sign", "swa_cache",
             "phase")  # fmt: skip


def edit_of(case: Case) -> tuple | None:
    """The case's edit axes (EDIT_AXES' values; a key the float32 reference shares), or None."""
    if case.kv_edit == "none" or case.phase not in EDIT_PHASES:
        return None
    return tuple(getattr(case, a) for a in EDIT_AXES)


def default_keep(phase: str, tokenizer) -> int:
    """n_keep where a case leaves it empty: quality's QUALITY_KEEP; retrieval's, the tokens of
    passkey.cpp's instruction (BOS included)."""
    if phase == "quality":
        return QUALITY_KEEP
    from kvbench.kernels.model.passkey import PREFIX, tokens

    return len(tokens(tokenizer, PREFIX))


def schedule_for(edit: tuple, name: str, model, tokenizer) -> Schedule:
    """schedule_of for edit_of's tuple on the loaded model `name` (n_keep, where the case leaves
    it empty: default_keep)."""
    fields = SimpleNamespace(model=name, **dict(zip(EDIT_AXES, edit)))
    keep = fields.n_keep if fields.n_keep is not None else default_keep(fields.phase, tokenizer)
    return schedule_of(fields, model.config.trained_context, keep)


def off_default(case: Case) -> list[str]:
    """The edit's own axes set on a case without a model edit."""
    got = [
        ("ga_n", case.ga_n != 1),
        ("ga_w", case.ga_w != 2048),
        ("n_keep", case.n_keep is not None),
        ("div_sign", case.div_sign != "exact"),
        ("swa_cache", case.swa_cache != "ring"),
    ]
    return [name for name, off in got if off]


def check_case(path: str, case: Case, sizes: list[int] | None) -> None:
    """A model case's kv_edit (or its axes without one): the task whose schedule it replays
    (llama.cpp's passkey example) or the text chunks read through it, against the model's shape
    and the prompts' token counts (sizes; quality: context_len, each chunk's; None: a
    registered model not fetched yet, checked when its engine runs)."""
    from kvbench.kernels.model.load import ModelError
    from kvbench.kernels.model.passkey import TASK, instruction_tokens
    from kvbench.kernels.model.source import model_shape

    if case.kv_edit == "none" or case.phase not in EDIT_PHASES:  # the edit's axes, its phase
        return check(path, case, None, [], 0)
    if case.phase == "quality":
        if fetched(case.model):
            try:
                shape = model_shape(case.model)
            except ModelError as e:
                raise SuiteError(path, "model", str(e)) from None
            check(path, case, shape, [case.context_len], QUALITY_KEEP)
        else:
            check(path, case, None, [], 0, context=False)
        return
    if case.task != TASK:
        why = f"a model's kv_edit replays llama.cpp's passkey example: task {TASK}"
        raise SuiteError(path, "kv_edit", why)
    if sizes is not None:
        check(path, case, model_shape(case.model), sizes, instruction_tokens(case.model))


def fetched(name: str) -> bool:
    """The model's shape can be read now (a registered model not fetched yet cannot: its engine
    checks the case when it loads it)."""
    from kvbench.kernels.model.fetch import MODELS, model_path

    return not (name in MODELS and model_path(name) is None)


def check(path: str, case: Case, shape, sizes: list[int], n_keep: int,
          context: bool = True) -> None:  # fmt: skip
    """A model case's kv_edit and its axes (module docstring); shape: the model's Shape, sizes:
    every trial's prompt tokens (quality: the chunk's), n_keep: the default n_keep (the
    instruction's tokens; quality's QUALITY_KEEP); context False: the model's shape is not known
    yet, its context not checked."""
    if case.kv_edit == "none":
        if off := off_default(case):
            raise SuiteError(path, off[0], "needs kv_edit shift or self-extend (a model's edit)")
        if numeric_limit(case) is not None:
            raise SuiteError(path, "context_limit", "a number sizes a kv_edit's context; "
                             "without one use trained or beyond")  # fmt: skip
        return
    if case.kv_edit not in MODEL_EDITS or case.phase not in EDIT_PHASES:
        raise SuiteError(path, "kv_edit", f"a model runs kv_edit {' or '.join(MODEL_EDITS)} "
                         f"in phase {' or '.join(EDIT_PHASES)}")  # fmt: skip
    if case.phase == "quality" and case.kv_edit != "shift":
        raise SuiteError(path, "kv_edit", "phase quality reads a text through a shift; "
                         "self-extend under quality is not built")  # fmt: skip
    if case.phase == "quality" and case.kernel == "llama.cpp":
        why = "llama-perplexity never shifts (a chunk a context): a shift runs on kvbench's"
        raise SuiteError(path, "kernel", f"{why} cache under quality")
    if case.policy != "none":
        raise SuiteError(path, "policy", "a cache policy beside a kv_edit is not built")
    if case.kv_edit == "shift":  # schedule_of runs a shift with ga_n 1 and no division
        for axis, default in (("ga_n", 1), ("div_sign", "exact"), ("swa_cache", "ring")):
            if getattr(case, axis) != default:
                raise SuiteError(path, axis, "self-extend's; a context shift does not read it")
    if case.v_dtype not in (None, case.kv_dtype) or case.k_axis != "token" or case.sink_tokens \
            or case.recent_tokens or case.window is not None:  # fmt: skip
        raise SuiteError(path, "kv_edit", "edits one plain cache: one format for K and V, "
                         "per-token, no sinks, window or residual")  # fmt: skip
    if not context:
        return
    _check_windows(path, case, shape)
    _check_context(path, case, shape, sizes, n_keep)


def _check_windows(path: str, case: Case, shape) -> None:
    """swa_cache full: self-extend on a model with sliding-window layers, which needs it."""
    if case.kv_edit == "self-extend" and any(shape.windows) and case.swa_cache != "full":
        raise SuiteError(path, "swa_cache", f"{case.model} has sliding-window layers: "
                         "self-extend groups positions their rings cannot take (llama.cpp "
                         "b11434's llama-passkey: 'failed to find a memory slot'); set "
                         "swa_cache: full (llama.cpp's --swa-full)")  # fmt: skip
    if case.swa_cache == "full" and not any(shape.windows):
        raise SuiteError(path, "swa_cache", f"{case.model} has no sliding-window layers")


def _check_context(path: str, case: Case, shape, sizes: list[int], n_keep: int) -> None:
    trained = shape.trained_context
    try:
        sch = schedule_of(case, trained, n_keep)
    except ValueError as e:
        key = "ga_w" if "ga_w" in str(e) else "context_limit"
        raise SuiteError(path, key, str(e)) from None
    limit = sch.n_ctx_train
    if case.kv_edit == "self-extend" and case.ga_n < 2:
        raise SuiteError(path, "ga_n", "self-extend groups positions: ga_n must be >= 2")
    if numeric_limit(case) is not None and trained and limit > trained:
        raise SuiteError(path, "context_limit", f"{limit} is past {case.model}'s trained "
                         f"length {trained}")  # fmt: skip
    if case.kv_edit == "shift":
        _check_shifts(path, case, sch, min(sizes))  # every trial shifts, not only the longest
    elif max(sizes) <= limit:
        raise SuiteError(path, "context_len", f"{max(sizes)} prompt tokens stay inside the "
                         f"trained length {limit}: nothing to extend (context_limit: N sizes "
                         "the context by a shorter one)")  # fmt: skip
    if sch.n_keep >= sch.n_ctx:
        raise SuiteError(path, "n_keep", f"{sch.n_keep}: the whole context of {sch.n_ctx}")
    for n in sizes:
        if reason := sch.overrun(n):
            raise SuiteError(path, "ga_w", reason)


def _check_shifts(path: str, case: Case, sch: Schedule, n_tokens: int) -> None:
    """A shift happens (and, under quality, a token is scored after it): a retrieval prompt of
    n_tokens shifts once it and the N_PREDICT answer positions pass n_ctx (passkey.cpp's
    closing shift); a quality chunk scores positions n_ctx .. n_tokens - 2
    (kernels/model/shift_quality.py), so it needs n_ctx + 2 tokens."""
    held = f"n_ctx {sch.n_ctx} positions (cells {sch.n_cells} - n_keep {sch.n_keep})"
    fix = "(context_limit: N sizes the context by a shorter trained length)"
    if case.phase == "quality" and n_tokens < sch.n_ctx + 2:
        raise SuiteError(path, "context_len", f"chunks of {n_tokens} tokens: a quality row "
                         f"scores the tokens read after a shift, and the context holds {held} "
                         f"before one, so a chunk needs {sch.n_ctx + 2} {fix}")  # fmt: skip
    if case.phase == "retrieval" and n_tokens + N_PREDICT <= sch.n_ctx:
        raise SuiteError(path, "context_len", f"{n_tokens} prompt tokens and {N_PREDICT} "
                         f"answer positions fit the context's {held}: no shift happens "
                         f"{fix}")  # fmt: skip

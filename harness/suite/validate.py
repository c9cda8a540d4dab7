"""Suite checks: each axis value on its own (CHECKS: the check each axis of kvbench.axes names,
resolved here), then each resolved Case's combination of axes (check_case, check_streams).
A problem raises SuiteError(file, key, reason)."""

from __future__ import annotations

import difflib

from kvbench.axes import TABLE, Axis
from kvbench.case import AXES, Case
from kvbench.errors import SuiteError
from kvbench.files import not_regular
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.attention.sharded import BY, COMBINES, split_reason
from kvbench.kernels.data import KV_DATA, load_kv_file
from kvbench.kernels.formats import fp8, rotation, turbo
from kvbench.kernels.formats.registry import FORMATS
from kvbench.kernels.model.fetch import MODELS
from kvbench.kernels.model.passkey import TASK as PASSKEY_LLAMACPP
from kvbench.kernels.model.policies import POLICIES, SCORERS
from kvbench.kernels.model.retrieval import TASKS as RETRIEVAL_TASKS
from kvbench.kernels.model.source import HF_ID, is_path_like
from kvbench.kernels.model.spec import AXES as K_AXES
from kvbench.kernels.model.spec import Q_QUANTS
from kvbench.kernels.stores.footprint import LAYOUTS
from kvbench.kernels.stores.paged import PAGE_SIZES
from kvbench.kernels.stores.workloads import ORDERS
from kvbench.peers.llamacpp_weights import PEER_WEIGHTS
from kvbench.peers.registry import EXTERNAL_PEERS, PEERS
from kvbench.suite import model_edit
from kvbench.suite.cache_spec import MODEL_PHASES, SERVE_PHASE, format_of, spec_of
from kvbench.suite.model_inputs import (
    CHUNKED,
    MIN_CHUNK,
    check_context_limit,
    check_default_text,
    check_retrieval,
    check_text,
)
from kvbench.suite.policy import check_policy
from kvbench.suite.presets import PRESETS

PHASES = ("decode", "prefill", *MODEL_PHASES)
SEED_MAX = 2**64 - 1  # mx.random.key takes an unsigned 64-bit seed
PAGE_READS = ("gather", "table")
KV_EDITS = ("none", "shift", "self-extend", "defrag")
WORKLOADS = ("none", "independent", "shared-prefix")
DECODE_ORDERS = ORDERS


# ---- value checks: each returns None when fine, else the reason -------------------------


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def positive_int(v) -> str | None:
    return None if is_int(v) and v > 0 else f"must be a positive integer, got {v!r}"


def optional_positive_int(v) -> str | None:
    return None if v is None else positive_int(v)


def non_negative_int(v) -> str | None:
    return None if is_int(v) and v >= 0 else f"must be a non-negative integer, got {v!r}"


def fraction(v) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1
    return None if ok else f"must be a number in [0, 1), got {v!r}"


def unit_interval(v) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
    return None if ok else f"must be a number in [0, 1], got {v!r}"


def optional_string(v) -> str | None:
    return None if v is None or (isinstance(v, str) and v) else f"must be a path, got {v!r}"


def nonempty_string(v) -> str | None:
    return None if isinstance(v, str) and v else f"must be a non-empty string, got {v!r}"


def kv_format(v) -> str | None:
    """A registered format; a TurboQuant name with a bit width or variant it cannot use says
    which (kernels/formats/turbo.py) instead of listing every format."""
    if isinstance(v, str) and v.startswith("tq") and v not in FORMATS:
        try:
            turbo.parse_name(v)
        except ValueError as e:
            return str(e)
    return one_of(tuple(FORMATS))(v)


def optional_format(v) -> str | None:
    return None if v is None else kv_format(v)


def positive_number(v) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    return None if ok else f"must be a positive number, got {v!r}"


def fp8_scale(v) -> str | None:
    try:
        fp8.parse_scale(v)
    except ValueError as e:
        return str(e).removeprefix("fp8_scale ")
    return None


def page_size(v) -> str | None:
    lo, hi = PAGE_SIZES
    ok = v is None or (is_int(v) and lo <= v <= hi)
    return None if ok else f"must be an integer from {lo} to {hi}, got {v!r}"


def model_name(v) -> str | None:
    """A preset, custom, or a real model's file, directory or Hugging Face repo id (resolved,
    with one line if it cannot be, when the suite's cases are built)."""
    if v in CHOICES["models"]:
        return None
    if isinstance(v, str) and v and (is_path_like(v) or HF_ID.match(v)):
        return None
    known = ", ".join(CHOICES["models"])
    hint = did_you_mean(v, CHOICES["models"])
    return (
        f"unknown value {v!r}; {hint}known: {known}, a .gguf file, a model directory or a repo id"
    )


LOOKALIKE = str.maketrans({"o": "0", "l": "1", "i": "1"})


def did_you_mean(v, choices) -> str:
    """'did you mean 'q4_0'? ' for a value close to one of `choices` (difflib), else ''."""
    names = [str(c) for c in choices]
    # letters typed for look-alike digits (q4_O, q8_O) first: difflib ties q4_0 and q4_1
    folded = str(v).lower().translate(LOOKALIKE)
    close = [c for c in names if c.lower().translate(LOOKALIKE) == folded]
    close = close or difflib.get_close_matches(str(v), names, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def one_of(choices) -> callable:
    def check(v) -> str | None:
        if v in choices:
            return None
        return f"unknown value {v!r}; {did_you_mean(v, choices)}known: {', '.join(choices)}"

    return check


# the value sets a "choice:NAME" check of the axis table names
CHOICES = {
    "models": (*PRESETS, "custom"),
    "phases": PHASES,
    "formats": tuple(FORMATS),
    "layouts": LAYOUTS,
    "kernels": (*KERNELS, *PEERS, *EXTERNAL_PEERS),
    "kv_data": tuple(KV_DATA),
    "workloads": WORKLOADS,
    "decode_orders": DECODE_ORDERS,
    "shard_by": BY,
    "combines": COMBINES,
    "k_axes": K_AXES,
    "page_reads": PAGE_READS,
    "kv_edits": KV_EDITS,
    "rotations": rotation.ROTATIONS,
    "k_orders": rotation.K_ORDERS,
    "q_quants": Q_QUANTS,
    "peer_weights": PEER_WEIGHTS,
    "retrieval_tasks": ("none", *RETRIEVAL_TASKS, PASSKEY_LLAMACPP),
    "div_signs": model_edit.DIV_SIGNS,
    "swa_caches": model_edit.SWA_CACHES,
    "policies": ("none", *POLICIES),
    "scorers": tuple(SCORERS),
}
NAMED_CHECKS = {
    "positive_int": positive_int,
    "optional_positive_int": optional_positive_int,
    "non_negative_int": non_negative_int,
    "fraction": fraction,
    "unit_interval": unit_interval,
    "optional_string": optional_string,
    "nonempty_string": nonempty_string,
    "optional_format": optional_format,
    "kv_format": kv_format,
    "page_size": page_size,
    "positive_number": positive_number,
    "fp8_scale": fp8_scale,
    "model_name": model_name,
    "context_limit": model_edit.context_limit,
    "optional_non_negative_int": model_edit.optional_non_negative_int,
}


def at_most(limit: int) -> callable:
    """A positive integer up to limit: a count a run multiplies (trials, generated tokens,
    chunks) past it never finishes (issue 35: trials 1e9 built 1e9 prompts first)."""

    def check(v) -> str | None:
        ok = is_int(v) and 0 < v <= limit
        return None if ok else f"must be a positive integer of at most {limit:,}, got {v!r}"

    return check


def resolve_check(name: str) -> callable:
    """The check function an axis names: a NAMED_CHECKS key, "choice:" + a CHOICES key, or
    "at_most:" + a limit."""
    kind, _, arg = name.partition(":")
    if kind == "at_most":
        return at_most(int(arg))
    return one_of(CHOICES[arg]) if kind == "choice" else NAMED_CHECKS[name]


def checks_for(table: tuple[Axis, ...]) -> dict:
    """Axis name -> its check; a check name that does not resolve raises KeyError at import."""
    return {a.name: resolve_check(a.check) for a in table}


CHECKS = checks_for(TABLE)
AXIS_DEFAULTS = {a.name: a.default for a in TABLE}


def check_axis(path: str, key: str, axis: str, value) -> None:
    if axis not in CHECKS:
        close = difflib.get_close_matches(str(axis), AXES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SuiteError(path, key, f"unknown axis {axis!r}; {hint}known: {', '.join(AXES)}")
    reason = CHECKS[axis](value)
    if reason:
        raise SuiteError(path, key, reason)


# ---- combinations of axes, on a resolved Case -------------------------------------------


def check_case(path: str, case: Case) -> None:
    """Combinations of axes: the format's group size vs head_dim, the K/V file vs the shape."""
    check_fp8_scale(path, case)
    try:
        fmt = format_of(case)
    except ValueError as e:
        raise SuiteError(path, "group_size", str(e)) from None
    try:
        fmt.nbytes(1, case.head_dim)
    except ValueError as e:  # a group that does not divide head_dim, or a head_dim it refuses
        raise SuiteError(path, "group_size" if case.group_size else "head_dim", str(e)) from None
    if case.group_size is not None and not fmt.quantized:
        # kept, it would change the case_id of a case that runs exactly as without it
        raise SuiteError(path, "group_size", f"{case.kv_dtype} has no scales: leave it out")
    if case.seed > SEED_MAX:
        raise SuiteError(
            path, "seed", f"must be at most {SEED_MAX} (a 64-bit key), got {case.seed}"
        )
    if case.kv_data == "file":
        if not case.kv_file:
            raise SuiteError(path, "kv_file", "kv_data=file needs kv_file (an .npz path)")
        why = not_regular(case.kv_file)
        if why is not None and not why.startswith("cannot"):  # np.load of a pipe blocks
            raise SuiteError(path, "kv_file", f"{case.kv_file}: {why}, not an .npz file")
        shape = (case.n_seqs, case.n_kv_heads, case.context_len, case.head_dim)
        try:
            load_kv_file(case.kv_file, shape)
        except ValueError as e:
            raise SuiteError(path, "kv_file", str(e)) from None
    check_rotation(path, case)
    if case.peer_weights != "gguf" and case.kernel != "llama.cpp":
        why = "only llama.cpp rows choose their weights (kvbench's model runs float32 ones)"
        raise SuiteError(path, "peer_weights", f"{why}, not kernel {case.kernel}")


def check_fp8_scale(path: str, case: Case) -> None:
    """fp8_scale: only with an FP8 format; calibrated / per_head only in the model phases (the
    scale is calibrated per layer, K and V apart, on a real model's first prefill)."""
    if case.fp8_scale == "one":
        return
    if not {case.kv_dtype, case.v_dtype} & set(fp8.KINDS):
        why = f"applies to {', '.join(fp8.KINDS)} (kv_dtype or v_dtype), not {case.kv_dtype}"
        raise SuiteError(path, "fp8_scale", why)
    if case.fp8_scale in ("calibrated", "per_head") and case.phase not in MODEL_PHASES:
        why = (f"{case.fp8_scale} is calibrated per layer, K and V apart, on a real model's "
               f"first prefill: a model phase ({', '.join(MODEL_PHASES)}) runs it; phase "
               f"{case.phase} takes one or a number")  # fmt: skip
        raise SuiteError(path, "fp8_scale", why)


ROTATED_ENGINE = "rotation runs in the model phases and the plain cache engine (layout "
ROTATED_ENGINE += "per-stream, no workload, "


def check_rotation(path: str, case: Case) -> None:
    """rotate_k / rotate_v: a Hadamard block (rot_block_k / rot_block_v, or llama.cpp's rule)
    that fits head_dim, on an engine that rotates; a block only beside its rotation."""
    for part in rotation.PARTS:
        axis, block_axis = f"rotate_{part}", f"rot_block_{part}"
        value, block = getattr(case, axis), getattr(case, block_axis)
        if value == "none":
            if block is not None:
                raise SuiteError(path, block_axis, f"set without {axis}: nothing is rotated")
            continue
        try:
            rotation.check(value, case.head_dim, block, part)
        except ValueError as e:
            raise SuiteError(path, axis if block is None else block_axis, str(e)) from None
        if case.phase in MODEL_PHASES:
            continue  # the model's cache stores rows rotated (kernels/model/cache.py); the
            # llama.cpp engine says which rotations llama.cpp runs (harness/engines/llamacpp.py)
        off = {
            "layout": case.layout != "per-stream",
            "workload": case.workload != "none",
            "shards": case.shards != 1,
            "kernel": case.kernel not in KERNELS,
        }
        bad = [k for k, v in off.items() if v]
        if bad:
            why = "one rank, a kvbench kernel, phase decode or prefill)"
            raise SuiteError(path, axis, f"{ROTATED_ENGINE}{why}; not with this {bad[0]}")


MODEL_AXES = ("v_dtype", "k_axis", "sink_tokens", "recent_tokens", "text", "chunks")
MODEL_AXES += ("k_order", "q_quant", "ga_n", "ga_w", "n_keep", "div_sign", "swa_cache")
PHASE_AXES = {  # axes that only some phases read (chunks and text are ignored by retrieval)
    "task": ("retrieval",), "depth": ("retrieval",), "trials": ("retrieval",),
    "gen_tokens": ("generate", SERVE_PHASE), "quantized_kv_start": ("generate",),
    "chunks": ("quality", "generate"),
    "text": ("quality", "generate", "model_decode", SERVE_PHASE),
}  # fmt: skip


def check_model(path: str, case: Case) -> None:
    """The model phases: a real model, one plain sequence, cache options that hold together;
    the cache options and text axes mean nothing elsewhere."""
    check_policy(path, case)
    if case.kv_data == "model" and case.model not in MODELS:
        known = ", ".join(MODELS)
        raise SuiteError(path, "kv_data", f"model captures a real model's K/V: model: {known}")
    for axis, phases in PHASE_AXES.items():
        if getattr(case, axis) != AXIS_DEFAULTS[axis] and case.phase not in phases:
            which = f"phase {phases[0]}" if len(phases) == 1 else f"phases {', '.join(phases)}"
            raise SuiteError(path, axis, f"only {which} use{'s' * (len(phases) == 1)} it, "
                             f"not {case.phase}")  # fmt: skip
    if case.phase == "retrieval" and case.task == "none":
        known = ", ".join((*RETRIEVAL_TASKS, PASSKEY_LLAMACPP))
        raise SuiteError(path, "task", f"phase retrieval needs a task ({known})")
    off = [a for a in MODEL_AXES if getattr(case, a) != AXIS_DEFAULTS[a]]
    if case.window is not None:  # a window keeps its sinks too (check_window)
        off = [a for a in off if a != "sink_tokens"]
    if case.phase not in MODEL_PHASES:
        if off:
            phases = ", ".join(MODEL_PHASES)
            raise SuiteError(path, off[0], f"only the model phases ({phases}) use it")
        return
    if case.model in PRESETS and case.model not in MODELS or case.model == "custom":
        known = ", ".join(MODELS)
        why = (
            f"phase {case.phase} runs a real model ({known}, a .gguf, a model directory, a repo id)"
        )
        raise SuiteError(path, "model", why)
    if case.phase == SERVE_PHASE:
        check_serve(path, case)
    elif case.n_seqs != 1 or case.workload != "none" or case.layout != "per-stream":
        raise SuiteError(path, "phase", f"{case.phase} runs one sequence, per-stream, no workload")
    if case.phase in CHUNKED and case.context_len < MIN_CHUNK:
        why = f"phase {case.phase} cuts the text into chunks of at least {MIN_CHUNK} tokens"
        raise SuiteError(path, "context_len", f"{case.context_len}: {why}")
    sizes = check_retrieval(path, case) if case.phase == "retrieval" else None
    if case.phase != "retrieval":  # its haystack is made by code, not read from a text
        check_text(path, case) if case.text != "default" else check_default_text(path, case)
    model_edit.check_case(path, case, sizes)
    check_key_order(path, case)
    check_context_limit(path, case)
    check_generate(path, case)
    try:
        formats = spec_of(case).formats()
    except ValueError as e:
        raise SuiteError(path, "k_axis", str(e)) from None
    for axis, fmt in zip(("kv_dtype", "v_dtype"), formats):
        try:  # V's format too: a head_dim it cannot pack failed only once the model had loaded
            fmt.nbytes(1, case.head_dim)
        except ValueError as e:
            raise SuiteError(path, axis, f"{fmt.name}: {e}") from None
    if case.window is not None and case.phase == "model_decode":
        why = "model_decode times the full cache; a sliding window runs in the other model phases"
        raise SuiteError(path, "window", why)
    if case.window is not None and not spec_of(case).plain:
        why = "a sliding window holds one plain format (no v_dtype, k_axis channel, recent_tokens)"
        raise SuiteError(path, "window", why)


SERVE_LAYOUTS = ("per-stream", "unified")


def check_serve(path: str, case: Case) -> None:
    """Phase serve (harness/engines/serve.py): n_seqs sequences through a per-stream or unified
    layout, each its own prompt or one shared (workload shared-prefix shares the whole prompt,
    llama-batched-bench -pps), one plain format, no policy, window or edit yet."""
    if case.layout not in SERVE_LAYOUTS:
        why = f"phase serve runs layouts {', '.join(SERVE_LAYOUTS)} (paged: not built here yet)"
        raise SuiteError(path, "layout", f"{case.layout}: {why}")
    if case.workload == "independent":
        why = "each sequence has its own prompt by default (none); shared-prefix shares one"
        raise SuiteError(path, "workload", f"independent: {why}")
    if case.workload == "shared-prefix" and case.n_seqs < 2:
        why = "shared-prefix: one sequence shares its prompt with none (n_seqs >= 2)"
        raise SuiteError(path, "workload", why)
    if case.workload == "shared-prefix" and case.prefix_frac:
        why = "phase serve shares the whole prompt (llama-batched-bench -pps): leave it out"
        raise SuiteError(path, "prefix_frac", why)
    if case.churn or case.decode_order != "interleaved":
        axis = "churn" if case.churn else "decode_order"
        raise SuiteError(path, axis, "phase serve decodes every sequence in every step")
    if case.gen_tokens < 1:
        raise SuiteError(path, "gen_tokens", "phase serve decodes at least one token")
    if not spec_of(case).plain:
        why = "phase serve stores one plain format (no v_dtype, k_axis channel, sinks, residual)"
        raise SuiteError(path, "kv_dtype", why)
    off = [a for a in ("policy", "kv_edit") if getattr(case, a) != AXIS_DEFAULTS[a]]
    off += ["window"] if case.window is not None else []
    if off:
        raise SuiteError(path, off[0], "phase serve runs the full cache (not built with it yet)")


def check_key_order(path: str, case: Case) -> None:
    """q_quant twins llama.cpp's arithmetic, so its keys must be in llama.cpp's channel order for
    the model: GGUF's interleaved one where the converter permuted the Q/K rows (llama), else
    the model's own (Gemma 3, Qwen2); a model not fetched yet is not checked here."""
    if case.q_quant == "none" or not model_edit.fetched(case.model):
        return
    from kvbench.kernels.model.load import llamacpp_key_order
    from kvbench.kernels.model.source import model_shape

    order = llamacpp_key_order(model_shape(case.model).arch)
    if case.k_order != order:
        raise SuiteError(path, "k_order", f"{case.k_order} with q_quant {case.q_quant}: "
                         f"llama.cpp's cache of {case.model} holds keys in order {order}, so "
                         "this is not its arithmetic")  # fmt: skip


def check_generate(path: str, case: Case) -> None:
    """quantized_kv_start takes effect only if the cache switches before the last decode step
    attends: the prompt's context_len - 1 positions are prefilled, then each of the gen_tokens
    steps attends and adds one, the switch checked after each; a start past
    context_len + gen_tokens - 2 never switches (the row would be fp16's under the format's
    name, issue 35)."""
    if case.phase != "generate" or not case.quantized_kv_start:
        return
    last = case.context_len + case.gen_tokens - 2
    if case.quantized_kv_start > last:
        why = (f"{case.quantized_kv_start} is past the last position the cache attends with "
               f"(context_len + gen_tokens - 2 = {case.context_len} + {case.gen_tokens} - 2 = "
               f"{last}): the {case.kv_dtype} cache would never be used")  # fmt: skip
        raise SuiteError(path, "quantized_kv_start", why)


def check_streams(path: str, case: Case) -> None:
    """Combinations of the many-sequence axes that cannot run (docs/streams.md)."""
    check_paged(path, case)
    check_window(path, case)
    check_edit(path, case)
    if case.phase == SERVE_PHASE:
        return  # its workload and layout: check_serve
    streams = case.workload != "none"
    if case.layout in ("unified", "paged") and not streams:
        why = "needs workload: independent or shared-prefix"
        raise SuiteError(path, "layout", f"{case.layout} {why}")
    off = [a for a in ("prefix_frac", "churn") if getattr(case, a)]
    off += ["decode_order"] if case.decode_order != "interleaved" else []
    if off and not streams:
        raise SuiteError(path, off[0], "needs workload: independent or shared-prefix")
    if streams and case.phase != "decode":
        raise SuiteError(path, "phase", f"workload {case.workload} runs decode only")
    if streams and case.kv_data == "file":
        why = "the streams engine needs K/V per token id, not a [n_seqs, Hkv, ctx, D] capture"
        raise SuiteError(path, "kv_data", f"file cannot feed workload {case.workload}: {why}")
    if case.workload == "shared-prefix" and not 0 < case.prefix_len < case.context_len:
        raise SuiteError(
            path,
            "prefix_frac",
            f"shared prefix of int({case.prefix_frac} * {case.context_len}) = "
            f"{case.prefix_len} tokens must be at least 1 and less than context_len",
        )
    if case.workload == "independent" and case.prefix_frac:
        raise SuiteError(path, "prefix_frac", "independent prompts share no prefix: use 0")
    gen = case.context_len - 1 - case.prefix_len
    if case.churn > case.n_seqs:
        raise SuiteError(path, "churn", f"{case.churn} is more than n_seqs={case.n_seqs}")
    if case.churn and gen < 4:
        raise SuiteError(path, "churn", f"needs >= 4 generated tokens per sequence, got {gen}")


SHARDED_KERNELS = ("partial",)  # kernels that return the log-sum-exp a sharded combine needs


def check_shards(path: str, case: Case) -> None:
    """Combinations a sharded case cannot run (docs/distributed.md)."""
    if case.shards == 1:
        return
    if case.kernel not in SHARDED_KERNELS:
        why = f"shards > 1 runs kernel {', '.join(SHARDED_KERNELS)} (partial attention + lse)"
        raise SuiteError(path, "kernel", f"{case.kernel}: {why}")
    for axis, ok in (("phase", "decode"), ("workload", "none"), ("layout", "per-stream")):
        if getattr(case, axis) != ok:
            raise SuiteError(path, axis, f"shards > 1 runs {axis} {ok} only")
    if case.window is not None:
        raise SuiteError(path, "window", "shards > 1 holds the whole context (no window)")
    reason = split_reason(case.shard_by, case.shards, case.context_len, case.n_kv_heads)
    if reason:
        raise SuiteError(path, "shards", reason)


def check_paged(path: str, case: Case) -> None:
    """page_size and page_read belong to layout paged; reading via the table needs tiled."""
    paged = case.layout == "paged"
    if paged and case.page_size is None:
        raise SuiteError(path, "page_size", "layout paged needs page_size (slots per page)")
    if not paged and case.page_size is not None:
        raise SuiteError(path, "page_size", f"only for layout paged, not {case.layout}")
    if case.page_read != "gather" and not paged:
        raise SuiteError(path, "page_read", f"only for layout paged, not {case.layout}")
    if case.page_read == "table" and case.kernel not in ("tiled", "metal", "cuda"):
        why = "reading through the block table is implemented in kernel tiled"
        raise SuiteError(path, "page_read", f"{why}; {case.kernel} runs with page_read: gather")


def check_window(path: str, case: Case) -> None:
    """layout window: one decode step over a ring of sinks + window (docs/layouts.md)."""
    if case.sink_tokens and case.window is None and case.phase not in MODEL_PHASES:
        raise SuiteError(path, "sink_tokens", "sinks need a window (window: N)")
    if case.layout != "window":
        return
    if case.window is None:
        raise SuiteError(path, "window", "layout window needs window (positions attended)")
    if case.workload != "none" or case.phase != "decode":
        key = "workload" if case.workload != "none" else "phase"
        raise SuiteError(path, key, "layout window runs the plain decode case (workload none)")


def check_edit(path: str, case: Case) -> None:
    """kv_edit: on a unified workload; shift / self-extend need room, defrag holes (churn)."""
    if case.kv_edit == "none" or case.phase in MODEL_PHASES:  # a model's: model_edit.py
        return
    if case.layout != "unified" or case.workload == "none":
        raise SuiteError(path, "kv_edit", "edits run on layout unified with a workload")
    if case.kv_edit == "defrag" and not case.churn:
        raise SuiteError(path, "kv_edit", "defrag needs holes: churn >= 1")
    if case.kv_edit != "defrag" and case.context_len - case.prefix_len < 16:
        raise SuiteError(path, "kv_edit", f"{case.kv_edit} needs 16 tokens past the prefix")

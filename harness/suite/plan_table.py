"""`kvbench plan` of several formats side by side, and the model's trained length (issue 44).

`plan --kv-dtype fp16,q8_0,q4_0` plans each format with the same shape, layout and context (or
budget) as suite/plan.py's make_plan and prints one row each: bits per element, bytes per
token, the cache's bytes and their share of fp16's (the saving). With `--budget`, the longest
context each format fits, beside the model's trained length where it is known (a context past
it is memory the model cannot use well: the answer says so instead of a bare number).
"""

from __future__ import annotations

from kvbench.errors import UserError
from kvbench.suite.presets import PRESETS

BASE = "fp16"  # the format savings are counted against (the usual unquantized cache)


def formats_of(text: str) -> list[str]:
    """`--kv-dtype` as a comma list, each named once."""
    names = [t.strip() for t in text.split(",")]
    if any(not n for n in names):
        raise UserError(f"--kv-dtype: an empty format in {text!r}")
    if len(set(names)) < len(names):
        raise UserError(f"--kv-dtype: a format is given twice: {text}")
    return names


def tokens_of(text: str | None) -> int | None:
    """`--context` in tokens: digits with an optional k/M/G (powers of 1024: 32k = 32,768)."""
    if text is None:
        return None
    from kvbench.axes import TABLE
    from kvbench.suite.cli_axes import parse_value

    axis = next(a for a in TABLE if a.name == "context_len")
    try:
        return parse_value(axis, text, "--context")
    except UserError as e:
        raise UserError(f"--context: {e.reason}") from None


def trained_context(model: str) -> int | None:
    """The model's trained length: a preset's recorded one, else a model file's metadata."""
    preset = PRESETS.get(model)
    if preset is not None:
        return preset.trained_context
    try:
        from kvbench.kernels.model.source import model_shape

        return model_shape(model).trained_context
    except Exception:  # noqa: BLE001 - a custom shape or an unreadable file: not known
        return None


def trained_note(model: str, context: int | None) -> str | None:
    trained = trained_context(model)
    if trained is None or context is None:
        return None if context is None else f"{model}: trained length not recorded here"
    if context > trained:
        return (f"{model} was trained for {trained:,} tokens: {context:,} is "
                f"{context / trained:.1f}x past it (memory the model cannot use well)")  # fmt: skip
    return f"{model} was trained for {trained:,} tokens ({context:,} is within it)"


def _gib(n: int) -> str:
    """GiB, or MiB under one GiB (a small model's cache reads 0.044 GiB otherwise)."""
    return f"{n / 2**30:,.3f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def side_by_side(plans: list, base) -> str:
    """One row per plan; `base`: fp16's plan of the same shape and context (or budget)."""
    budget = plans[0].budget_bytes
    head = ["format", "bits/elem", "B/token"]
    head += ["longest context", "x fp16's"] if budget else ["cache", "% of fp16", "saved"]
    rows = [head]
    for p in plans:
        row = [p.kv_dtype, f"{p.bits_per_elem:g}", f"{p.bytes_per_token:,}"]
        if budget:
            ctx, b = p.context_len, base.context_len
            row += ["any" if ctx is None else f"{ctx:,}", f"{ctx / b:.2f}x" if ctx and b else ""]
        else:
            share = p.total_bytes / base.total_bytes
            row += [
                _gib(p.total_bytes),
                f"{100 * share:.1f}%",
                _gib(base.total_bytes - p.total_bytes),
            ]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]  # fmt: skip
    return "\n".join(lines)


def header(p) -> str:
    where = f"budget {_gib(p.budget_bytes)}" if p.budget_bytes else f"context {p.context_len:,}"
    return (f"{p.model}: {p.n_layers} layers x {p.n_kv_heads} kv heads x head_dim {p.head_dim}; "
            f"{p.n_seqs} seq(s), {p.layout}, {where}; the cache a deployment holds (K and V, "
            "every layer, scales included)")  # fmt: skip

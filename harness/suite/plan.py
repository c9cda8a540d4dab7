"""`kvbench plan`: exact KV-cache bytes for a model shape, context, format and sequence count.

Nothing is allocated or measured: the figures come from each format's exact bytes formula
(kernels/formats/registry.py), split into K data, V data, scales and biases, per layer and for the
model.
Cells (positions x sequences of one layer's K) by layout, as kvbench's engines allocate them
(docs/streams.md, docs/layouts.md), for n_seqs sequences of `context` tokens, of which `prefix`
are one prompt shared by all:
* per-stream: n_seqs x context (one buffer per sequence, the cache engine's);
* unified: round_up(prefix + n_seqs x (context - prefix), 256) (one buffer, prefix once);
* paged: pages x page_size with pages = F + n_seqs x ceil((context - F x page_size) / page_size)
  and F = prefix // page_size full prefix pages stored once (a partly filled last prefix page is
  copied on write by every sequence but its last holder); block tables: n_seqs x
  ceil(context / page_size) int32, counted apart and in the total;
* window: n_seqs x (sinks + window), whatever the context.
bytes = 2 (K, V) x n_layers x cells x n_kv_heads x bytes_per_row(head_dim); a model with
sliding-window layers (Gemma 3: 15 of 18 layers a 512-position window), per-stream, counts each
layer at its own positions: a window layer holds min(context, window + sinks)
(kernels/stores/footprint.py layer_cells), as the model engine's rows count them.
`--budget` inverts that: the longest context whose cache (block tables included) fits, found by
search over the context (every layout's bytes grow monotonically with it); a window's bytes do
not grow, so a ring that fits fits any context.
Sharded over N ranks (`--shards N --shard-by context|heads`, docs/distributed.md; per-stream
only), the split is kernels/attention/sharded.py's: by context the fullest rank holds ceil(context
/ N)
positions of every KV head, by heads ceil(n_kv_heads / N) KV heads at every position;
`rank_bytes` is what that rank holds, and `--budget` is then each device's budget: the longest
context whose fullest rank fits.
It also prints the memory guard's figures (harness/run/memory.py: cache + source K/V +
transient against the memory available here) for a decode case of the shape with the layout's
cells, resolved by the same function as a case's (harness/suite/resolved.py of_shape), so the
guard refuses exactly what this says will not fit; query heads: the preset's or the model's,
or --n-q-heads for a custom shape (without it: GQA 1).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from kvbench.errors import UserError
from kvbench.kernels.attention.sharded import BY, split_bounds, split_reason
from kvbench.kernels.formats import fp8
from kvbench.kernels.formats.protocol import row_parts
from kvbench.kernels.formats.registry import FORMATS, get_format
from kvbench.kernels.stores.footprint import LAYOUTS, LayoutArgs, cache_bytes, row_bytes
from kvbench.kernels.stores.layouts import KV_PAD
from kvbench.kernels.stores.paged import PAGE_SIZES
from kvbench.suite import resolved
from kvbench.suite.presets import PRESETS

MAX_CONTEXT = 2**40  # the budget search stops here: a layout that still fits fits any context
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass(frozen=True)
class KVShape:
    model: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_q_heads: int | None = None  # the guard's transients; None: GQA 1 (n_kv_heads)
    windows: tuple = ()  # per layer None or (window, sinks): a model's sliding-window layers

    @property
    def q_heads(self) -> int:
        return self.n_q_heads or self.n_kv_heads


@dataclass(frozen=True)
class Plan:
    model: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    kv_dtype: str
    group_size: int | None
    scales: str  # scale granularity in words
    n_seqs: int
    layout: str
    context_len: int | None  # None: the budget holds any context (a window's ring)
    bits_per_elem: float
    bytes_per_token: int  # all layers, K and V, all sequences, per position
    layer: dict  # k_data, v_data, scales, biases, total (bytes, one layer)
    model_bytes: dict  # the same for all layers
    budget_bytes: int | None = None
    cells: int = 0  # positions x sequences of one layer's K (padding and copies included)
    pages: int | None = None  # paged: pages in the pool
    block_table_bytes: int = 0  # paged: int32 block tables, once for all layers
    total_bytes: int = 0  # model_bytes total + block tables
    layout_args: dict | None = None
    shards: int = 1
    shard_by: str = "context"
    rank_bytes: int | None = None  # all layers, K and V, held by the fullest rank
    rank_bytes_per_token: int | None = None  # the fullest rank's bytes per position it holds
    # the memory guard's figures (harness/run/memory.py) for a decode case of this shape: the
    # planned peak's parts, and the memory available here (None: unknown)
    run_bytes: dict | None = None
    available_bytes: int | None = None
    available_source: str | None = None
    n_q_heads: int | None = None  # the query heads the guard's figures count
    # a model's sliding-window layers (per-stream): positions each layer holds; `layer` above
    # is then a layer that keeps the whole context
    layer_positions: list | None = None
    fp8_scale: str = "one"  # FP8: the scale mode (or number) whose bytes are counted
    tensor_scale_bytes: int = 0  # FP8: bytes of one layer's K scale (and of its V's)


def parse_size(text: str) -> int:
    """'8GiB' -> 8 * 2**30, '16GB' -> 16e9, '1024' -> 1024 bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in UNITS:
        raise UserError(f"--budget: cannot read {text!r}; use e.g. 8GiB, 512MiB, 16GB or bytes")
    value = int(float(m.group(1)) * UNITS[unit])
    if value <= 0:
        raise UserError(f"--budget: must be positive, got {text!r}")
    return value


def _real_shape(model: str):
    from kvbench.kernels.model.load import ModelError
    from kvbench.kernels.model.source import HF_ID, is_path_like, model_shape

    if not (is_path_like(model) or HF_ID.match(model)):
        known = ", ".join(PRESETS)
        raise UserError(f"--model: unknown preset {model!r}; known: {known}, or a model file")
    try:
        return model_shape(model)
    except ModelError as e:
        raise UserError(f"--model: {e}") from None


def resolve_shape(
    model: str | None, n_layers, n_kv_heads, head_dim, n_q_heads: int | None = None
) -> KVShape:
    """A preset's shape with any explicit field overriding it, or a real model's (a .gguf, an
    mlx-lm directory, a Hugging Face repo id: its metadata's, no field may override it); the
    first three needed without a model; query heads: the model's, else given, else GQA 1."""
    base, windows = {}, ()
    given = {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "head_dim": head_dim}
    if n_q_heads is not None and n_q_heads <= 0:
        raise UserError(f"--n-q-heads: must be positive, got {n_q_heads}")
    if model:
        p = PRESETS.get(model) or _real_shape(model)
        base = {"n_layers": p.n_layers, "n_kv_heads": p.n_kv_heads, "head_dim": p.head_dim}
        windows = tuple(p.windows)
        q = p.n_q_heads if model in PRESETS else p.n_heads
        if model not in PRESETS and n_q_heads is not None and n_q_heads != q:
            raise UserError(f"--n-q-heads: {model}'s metadata sets {q}; leave it out")
        n_q_heads = n_q_heads or q
        override = next((k for k, v in given.items() if v is not None), None)
        if model not in PRESETS and override is not None:  # a real model's file (issue 35)
            raise UserError(
                f"--{override.replace('_', '-')}: {model}'s metadata sets its shape "
                f"({override} {base[override]}); leave it out beside a model file"
            )
    base.update({k: v for k, v in given.items() if v is not None})
    for key in given:
        if key not in base:
            raise UserError(f"--{key.replace('_', '-')}: needed without --model")
        if base[key] <= 0:
            raise UserError(f"--{key.replace('_', '-')}: must be positive, got {base[key]}")
    if n_q_heads is not None and n_q_heads % base["n_kv_heads"]:
        raise UserError(
            f"--n-q-heads: {n_q_heads} is not a multiple of the {base['n_kv_heads']} KV heads"
        )
    if windows and base["n_layers"] != len(windows):
        windows = ()  # --n-layers changed the model: its layer windows no longer apply
    return KVShape(model or "custom", **base, n_q_heads=n_q_heads, windows=windows)


def _format(kv_dtype: str, group_size: int | None, head_dim: int, fp8_scale="one"):
    if kv_dtype not in FORMATS:
        raise UserError(f"--kv-dtype: unknown {kv_dtype!r}; known: {', '.join(FORMATS)}")
    try:
        fp8.parse_scale(fp8_scale)
        if fp8_scale != "one" and kv_dtype not in fp8.KINDS:
            raise ValueError(f"applies to {', '.join(fp8.KINDS)}, not {kv_dtype}")
    except ValueError as e:
        raise UserError(f"--fp8-scale: {str(e).removeprefix('fp8_scale ')}") from None
    try:
        fmt = get_format(kv_dtype, group_size, fp8_scale)
        fmt.nbytes(1, head_dim)
    except ValueError as e:
        raise UserError(f"--group-size: {e}") from None
    return fmt


# what each stored array is in the plan's split; any other name is code data (ggml's q5 fifth
# bits `high`, TurboQuant's `codes` and QJL `signs`)
def check_layout(layout: str, la: LayoutArgs) -> None:
    """The layout's own arguments, and no others."""
    if layout not in LAYOUTS:
        raise UserError(f"--layout: unknown {layout!r}; known: {', '.join(LAYOUTS)}")
    lo, hi = PAGE_SIZES
    if (layout == "paged") != (la.page_size is not None):
        raise UserError("--page-size: needed with --layout paged, and only there")
    if layout == "paged" and not lo <= la.page_size <= hi:
        raise UserError(f"--page-size: must be from {lo} to {hi}, got {la.page_size}")
    if (layout == "window") != (la.window is not None):
        raise UserError("--window: needed with --layout window, and only there")
    if la.window is not None and la.window <= 0 or la.sinks < 0:
        raise UserError("--window / --sinks: must be positive / non-negative")
    if la.sinks and layout != "window":
        raise UserError("--sinks: only with --layout window")
    if la.prefix < 0 or (la.prefix and layout not in ("unified", "paged")):
        raise UserError("--prefix: a non-negative token count, with --layout unified or paged")


def total_bytes(shape: KVShape, fmt, layout: str, n_seqs: int, ctx: int, la: LayoutArgs) -> int:
    return cache_bytes(fmt, fmt, layout, n_seqs, ctx, la, n_layers=shape.n_layers,
                       n_kv_heads=shape.n_kv_heads, head_dim=shape.head_dim,
                       windows=shape.windows)  # fmt: skip


def longest_fitting(bytes_at, lo: int, budget: int) -> int | None:
    """The largest context >= lo with bytes_at(context) <= budget (bytes grow with the context);
    None when MAX_CONTEXT still fits."""
    if bytes_at(lo) > budget:
        raise UserError(f"--budget: {budget} B is under the smallest cache ({bytes_at(lo)} B)")
    good = lo
    while bytes_at(min(2 * good, MAX_CONTEXT)) <= budget:
        if good >= MAX_CONTEXT:
            return None
        good = min(2 * good, MAX_CONTEXT)
    bad = 2 * good
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if bytes_at(mid) <= budget else (good, mid)
    return good


MAX_SEQS = 1 << 20  # the sequence search stops here


def most_sequences(shape: KVShape, fmt, layout: str, ctx: int, la: LayoutArgs, budget: int) -> int:
    """The most sequences of ctx tokens each whose cache fits `budget` bytes (every layer, K and
    V, the layout's padding; under unified a --prefix shared prompt is stored once): 0 when one
    does not fit (issue 53: the server's question). Bytes grow with the sequences."""
    bytes_at = lambda n: total_bytes(shape, fmt, layout, n, ctx, la)  # noqa: E731
    if bytes_at(1) > budget:
        return 0
    good = 1
    while 2 * good <= MAX_SEQS and bytes_at(2 * good) <= budget:
        good *= 2
    bad = 2 * good
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if bytes_at(mid) <= budget else (good, mid)
    return good


def fitting_line(shape: KVShape, kv_dtype: str, group_size, layout: str, ctx: int,
                 la: LayoutArgs, budget: int, fp8_scale="one") -> str:  # fmt: skip
    """One line: how many sequences of ctx tokens a format's cache holds within the budget."""
    check_layout(layout, la)
    if ctx <= 0:
        raise UserError(f"--context: must be positive, got {ctx}")
    fmt = _format(kv_dtype, group_size, shape.head_dim, fp8_scale)
    n = most_sequences(shape, fmt, layout, ctx, la, budget)
    shared = f", a {la.prefix}-token prompt shared" if la.prefix else ""
    used = total_bytes(shape, fmt, layout, max(n, 1), ctx, la)
    mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
    return (f"{kv_dtype:>10}: {n:,} sequences of {ctx:,} tokens fit in {mib(budget)} "
            f"({layout}{shared}; {max(n, 1)} hold {mib(used)})")  # fmt: skip


def _check_shards(shards: int, shard_by: str, n_kv_heads: int) -> None:
    if shards <= 0:
        raise UserError(f"--shards: must be positive, got {shards}")
    if shard_by not in BY:
        raise UserError(f"--shard-by: unknown {shard_by!r}; known: {', '.join(BY)}")
    if shard_by == "heads" and (reason := split_reason("heads", shards, 1, n_kv_heads)):
        raise UserError(f"--shards: {reason}")


def rank_token_bytes(shape: KVShape, fmt, n_seqs: int, shards: int, shard_by: str) -> int:
    """Bytes per held position of the fullest rank (all layers, K and V, all sequences)."""
    heads = shape.n_kv_heads
    if shard_by == "heads":
        heads = split_bounds(heads, shards)[0][1]  # the first ranks get the extra heads
    return row_bytes(
        fmt, n_seqs, n_layers=shape.n_layers, n_kv_heads=heads, head_dim=shape.head_dim
    )


def _context(context_len, budget_bytes, rank_per_token: int, shards: int, shard_by: str) -> int:
    """The case's context, or the longest whose fullest rank fits the (per-device) budget."""
    if context_len is not None and budget_bytes is not None:
        raise UserError("--budget: give --context or --budget, not both")
    if context_len is None:
        if budget_bytes is None:
            raise UserError("--context: give --context or --budget")
        held = budget_bytes // rank_per_token  # positions the fullest rank can hold
        if held == 0:
            raise UserError(f"--budget: {budget_bytes} B is under one token ({rank_per_token} B)")
        return held * shards if shard_by == "context" else held
    if context_len <= 0:
        raise UserError(f"--context: must be positive, got {context_len}")
    if shard_by == "context" and (reason := split_reason("context", shards, context_len, 1)):
        raise UserError(f"--shards: {reason}")
    return context_len


def make_plan(
    shape: KVShape,
    kv_dtype: str = "fp16",
    group_size: int | None = None,
    n_seqs: int = 1,
    context_len: int | None = None,
    budget_bytes: int | None = None,
    layout: str = "per-stream",
    layout_args: LayoutArgs | None = None,
    shards: int = 1,
    shard_by: str = "context",
    available: tuple[int, str] | None = None,
    fp8_scale="one",
) -> Plan:
    """Bytes at `context_len`, or at the longest context that fits `budget_bytes` (per device
    when sharded over `shards` ranks); `available`: the device's (bytes, source) the memory
    guard would check against (harness/run/memory.py available_bytes), None when unknown."""
    la = layout_args or LayoutArgs()
    check_layout(layout, la)
    if n_seqs <= 0:
        raise UserError(f"--n-seqs: must be positive, got {n_seqs}")
    _check_shards(shards, shard_by, shape.n_kv_heads)
    if shards > 1 and layout != "per-stream":
        raise UserError(f"--shards: sharding is planned for layout per-stream, not {layout}")
    if shards > 1 and shape.windows:
        raise UserError("--shards: a model with sliding-window layers is not planned sharded")
    fmt = _format(kv_dtype, group_size, shape.head_dim, fp8_scale)
    per_token = rank_token_bytes(shape, fmt, n_seqs, 1, "context")  # all layers, K and V
    rank_per_token = rank_token_bytes(shape, fmt, n_seqs, shards, shard_by)
    if shards > 1:
        context_len = _context(context_len, budget_bytes, rank_per_token, shards, shard_by)
    if context_len is not None and budget_bytes is not None and shards == 1:
        raise UserError("--budget: give --context or --budget, not both")
    if context_len is None:
        if budget_bytes is None:
            raise UserError("--context: give --context or --budget")
        bytes_at = lambda c: total_bytes(shape, fmt, layout, n_seqs, c, la)  # noqa: E731
        context_len = longest_fitting(bytes_at, la.prefix + 1, budget_bytes)
        if context_len is None and la.window is None:  # only a window's ring fits any context
            raise UserError(
                f"--budget: {budget_bytes:,} B holds more than {MAX_CONTEXT:,} tokens "
                "(the longest context plan searches); give --context instead"
            )
    elif context_len <= la.prefix:
        raise UserError(f"--context: must be more than the prefix ({la.prefix}), got {context_len}")
    # the bytes shown for an unbounded window: its ring at any context (here: one window)
    ctx = context_len if context_len is not None else la.sinks + la.window
    # the same resolution as a case's (suite/resolved.py): cells, block tables, planned peak
    common = dict(
        n_seqs=n_seqs,
        context_len=ctx,
        n_layers=shape.n_layers,
        n_q_heads=shape.q_heads,
        n_kv_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
    )
    res = resolved.of_shape(fmt, fmt, layout, la, **common, windows=shape.windows)
    # the guard's decode case (the cache engine) holds every layer whole, windows or not
    decode = resolved.of_shape(fmt, fmt, layout, la, **common) if res.layer_cells else res
    parts, tensor = row_parts(fmt, shape.head_dim), fmt.tensor_bytes(shape.n_kv_heads)
    layer = layer_bytes(res.cells * shape.n_kv_heads, parts, tensor)  # a layer of all cells
    per_layer = res.layer_cells or (res.cells,) * shape.n_layers
    each = [layer_bytes(c * shape.n_kv_heads, parts, tensor) for c in per_layer]
    model_bytes = {k: sum(e[k] for e in each) for k in layer}
    table = res.block_table_bytes
    assert res.cache_bytes == model_bytes["total"] + table, "the layer split lost bytes"
    held = split_bounds(ctx, shards)[0][1] if shard_by == "context" else ctx
    return Plan(
        model=shape.model,
        n_layers=shape.n_layers,
        n_kv_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
        kv_dtype=kv_dtype,
        group_size=group_size,
        scales=fmt.describe_scales(shape.head_dim),
        n_seqs=n_seqs,
        layout=layout,
        context_len=context_len,
        bits_per_elem=fmt.bits_per_elem(shape.head_dim),
        bytes_per_token=per_token,
        layer=layer,
        model_bytes=model_bytes,
        budget_bytes=budget_bytes,
        cells=res.cells,
        pages=res.pages,
        block_table_bytes=table,
        total_bytes=model_bytes["total"] + table,
        layout_args={k: v for k, v in asdict(la).items() if v},
        shards=shards,
        shard_by=shard_by,
        rank_bytes=held * rank_per_token if shards > 1 else None,
        rank_bytes_per_token=rank_per_token if shards > 1 else None,
        run_bytes=decode.planned,
        n_q_heads=shape.q_heads,
        available_bytes=available[0] if available else None,
        available_source=available[1] if available else None,
        layer_positions=[c // n_seqs for c in res.layer_cells] if res.layer_cells else None,
        fp8_scale=str(fp8_scale),
        tensor_scale_bytes=tensor,
    )


def layer_bytes(rows: int, parts: dict, tensor_bytes: int = 0) -> dict:
    """One layer's K data, V data, scales (per row, and a per-tensor scale of K and of V: FP8's
    float32 each), biases and total for `rows` rows of K (and of V)."""
    out = {
        "k_data": rows * parts["data"],
        "v_data": rows * parts["data"],
        "scales": 2 * (rows * parts.get("scales", 0) + tensor_bytes),
        "biases": 2 * rows * parts.get("biases", 0),
    }
    return {**out, "total": sum(out.values())}


def layout_line(plan: Plan) -> str | None:
    """What the layout holds, in words (None for per-stream)."""
    la = plan.layout_args or {}
    if plan.layout == "unified":
        prefix = la.get("prefix", 0)
        return f"unified: one buffer of {plan.cells:,} cells (padded to {KV_PAD}), prefix {prefix}"
    if plan.layout == "paged":
        return (
            f"paged: {plan.pages:,} pages of {la['page_size']} ({plan.cells:,} slots a layer), "
            f"block tables {plan.block_table_bytes:,} B (int32, once for all layers)"
        )
    if plan.layout == "window":
        ring = la.get("sinks", 0) + la["window"]
        return (
            f"window: {la.get('sinks', 0)} sinks + {la['window']} = {ring} cells per sequence; "
            "bytes do not grow with the context"
        )
    return None


def _human(n: int) -> str:
    return f"{n:>16,} B  {n / 2**20:>12,.2f} MiB  {n / 2**30:>9,.3f} GiB"


def render(plan: Plan) -> str:
    lines = [
        f"{plan.model}: {plan.n_layers} layers x {plan.n_kv_heads} kv heads x head_dim "
        f"{plan.head_dim}; {plan.kv_dtype} ({plan.scales}, {plan.bits_per_elem:g} bits/elem); "
        f"{plan.n_seqs} seq(s), {plan.layout}, context "
        + ("any" if plan.context_len is None else f"{plan.context_len:,}"),
    ]
    if layout_line(plan):
        lines.append(layout_line(plan))
    if plan.layer_positions:
        full = plan.context_len or 0
        short = sorted({p for p in plan.layer_positions if p < full})
        n_short = sum(p < full for p in plan.layer_positions)
        lines.append(
            f"sliding-window layers: {n_short} of {plan.n_layers} hold "
            f"{'/'.join(f'{p:,}' for p in short) or 'every'} positions here (min(context, "
            "window)); 'per layer' below is a layer that keeps the whole context"
        )
    if plan.tensor_scale_bytes:
        lines.append(
            f"fp8_scale {plan.fp8_scale}: {plan.tensor_scale_bytes:,} B for each layer's K and "
            f"as many for its V (float32{' per KV head' if plan.fp8_scale == 'per_head' else ''}"
            f"), {2 * plan.tensor_scale_bytes * plan.n_layers:,} B for the model, under scales"
        )
    if plan.shards > 1:
        lines.append(
            f"{plan.shards} ranks by {plan.shard_by}: the fullest rank holds "
            f"{plan.rank_bytes:,} B ({plan.rank_bytes / 2**30:.3f} GiB; "
            f"{plan.rank_bytes_per_token:,} B per position it holds)"
        )
    if plan.budget_bytes is not None and plan.context_len is None:
        lines.append(f"budget {plan.budget_bytes:,} B: the ring fits, so any context does")
    elif plan.budget_bytes is not None:
        each = " per device" if plan.shards > 1 else ""
        lines.append(
            f"budget {plan.budget_bytes:,} B{each} ({plan.budget_bytes / 2**30:.3f} GiB): longest "
            f"context that fits = {plan.context_len:,} tokens"
            + (
                f" ({plan.bytes_per_token:,} B per token, all layers and sequences)"
                if plan.layout == "per-stream" and not plan.layer_positions
                else ""
            )
        )
    for title, figures in (("per layer", plan.layer), ("model", plan.model_bytes)):
        lines.append(f"{title}:")
        for name, label in (
            ("k_data", "K"),
            ("v_data", "V"),
            ("scales", "scales"),
            ("biases", "biases"),
        ):
            if figures[name] or name in ("k_data", "v_data"):
                lines.append(f"  {label:<7}{_human(figures[name])}")
        lines.append(f"  {'total':<7}{_human(figures['total'])}")
    if plan.block_table_bytes:
        lines.append(f"  {'tables':<7}{_human(plan.block_table_bytes)}")
        lines.append(f"  {'all':<7}{_human(plan.total_bytes)}")
    return "\n".join(lines + _memory_lines(plan))


def _memory_lines(plan: Plan) -> list[str]:
    """The memory guard's view (harness/run/memory.py): what `kvbench run` would check."""
    r = plan.run_bytes
    lines = [
        f"kvbench's own run of a decode case with {plan.n_q_heads} query heads, not what a "
        "deployment needs (it adds a float32 source copy of K/V and the attention's "
        "transients; the memory guard of `kvbench run`, harness/suite/resolved.py"
        + ("; the cache engine holds every layer whole" if plan.layer_positions else "")
        + "):",
        f"  planned {_human(r['total'])}  (cache {r['cache']:,} + source K/V {r['source']:,} "
        f"+ transient {r['transient']:,})",
    ]
    if plan.available_bytes is None:
        return lines + ["  available here: unknown (no check)"]
    verdict = "fits" if r["total"] <= plan.available_bytes else "does not fit: skipped"
    lines.append(
        f"  available {_human(plan.available_bytes)}  ({plan.available_source}): {verdict}"
    )
    return lines


def to_json(plan: Plan) -> str:
    return json.dumps(asdict(plan), indent=2)

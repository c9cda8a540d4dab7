"""The axis table: every axis of a case, declared once.

A case axis is a knob a suite sets (model, context length, format, kernel, ...). Everything that
knows about axes derives from TABLE: the Case's fields (kvbench.case), the Record's case block and
so the CSV header (kvbench.store.schema), the value checks (kvbench.suite.validate resolves each
`check` name, since the choices live in kernels/ registries), case labels (kvbench.case.label_of),
the terminal summary's columns (kvbench.analysis.summary), the report's series names
(kvbench.report.common) and which rows the findings compare (each axis's role: workload, cache
choice or implementation detail; kvbench.analysis.findings.common). Adding an axis is one entry
here plus the engine code that reads it (docs/architecture.md). This module imports neither mlx
nor kernels/: store/, analysis/ and report/ read it.

The table's order is the CSV column order of the case block and the order of label parts.
Required axes have no default; `case_id` hashes the required axes and those set off their
default, so a new axis with a default leaves every existing case_id unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

# What an axis is to a comparison of rows (analysis/findings reads it): rows are compared only
# within one workload, and two rows that differ in a cache choice or an implementation detail
# are two configurations (never one configuration compared with itself).
ROLES = {
    "workload": "what is asked of the cache: the model's shape, context, sequences, data, task",
    "choice": "how the cache stores K/V: format, group, layout, pages, rotation, sinks, ranks",
    "detail": "how a stored cache is read or computed, the bytes unchanged: kernel, tile, ...",
}


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()  # the default of an axis every case must set (dataclasses' MISSING
# cannot serve: a dataclass field defaulting to MISSING has no default at all)


@dataclass(frozen=True)
class Axis:
    name: str
    type: str  # annotation text: "int", "str", "float", "int | None", ...
    default: object = REQUIRED
    check: str = ""  # a check by name, resolved in suite/validate.py ("positive_int", "choice:x")
    doc: str = ""  # one line, for humans
    label: str | None = None  # its part in a case label, e.g. "ctx{}"; None: not in labels
    always: bool = False  # label part shown even at the default
    column: str | None = None  # header of its column in the terminal summary; None: not shown
    hide_default: bool = False  # summary drops the column when every row holds the default
    series: str = "{}"  # its part in a report series name, e.g. "ctx {}"
    derive: Callable[[Mapping], object] | None = None  # derived axes: value from the others
    role: str = ""  # one of ROLES: what the axis is to a comparison of rows

    @property
    def required(self) -> bool:
        return self.default is REQUIRED and self.derive is None

    @property
    def is_int(self) -> bool:
        return self.type.startswith("int")


def _gqa(values: Mapping) -> int:
    return values["n_q_heads"] // values["n_kv_heads"]


# fmt: off
TABLE: tuple[Axis, ...] = (
    Axis("model", "str", check="model_name", label="{}", always=True, column="model",
         doc="model preset (shape of every layer), custom, or a real model: a GGUF file, an "
             "mlx-lm directory or a Hugging Face repo id (model phases)", role="workload"),
    Axis("n_layers", "int", check="positive_int", series="layers {}",
         doc="layers in the cache", role="workload"),
    Axis("n_q_heads", "int", check="positive_int", doc="query heads", role="workload"),
    Axis("n_kv_heads", "int", check="positive_int", doc="K/V heads", role="workload"),
    Axis("gqa_ratio", "int", check="positive_int", column="gqa", series="GQA {}", derive=_gqa,
         doc="derived: n_q_heads // n_kv_heads; a suite may give it instead of n_kv_heads",
         role="workload"),
    Axis("head_dim", "int", check="positive_int", series="D={}", doc="head dimension",
         role="workload"),
    Axis("phase", "str", "decode", "choice:phases", label="{}", always=True, column="phase",
         doc="decode (one new token) or prefill (the whole context)", role="workload"),
    Axis("context_len", "int", check="positive_int", label="ctx{}", always=True, column="ctx",
         series="ctx {}", doc="tokens in the cache (each sequence)", role="workload"),
    Axis("kv_dtype", "str", "fp16", "kv_format", label="{}", always=True, column="dtype",
         doc="cache format (kernels/formats/registry.py)", role="choice"),
    Axis("kernel", "str", "sdpa", "choice:kernels", label="{}", always=True, column="kernel",
         doc="attention kernel (kernels/attention/registry.py) or peer (harness/peers)",
         role="detail"),
    Axis("n_seqs", "int", 1, "positive_int", label="seqs{}", column="seqs", series="seqs {}",
         doc="sequences in the batch", role="workload"),
    Axis("tile_kv", "int | None", None, "optional_positive_int", label="tile{}", column="tile",
         series="tile {}", doc="KV tile of tiled kernels; empty: the kernel's default",
         role="detail"),
    Axis("layout", "str", "per-stream", "choice:layouts", label="{}", column="layout",
         hide_default=True, doc="per-stream buffers or one unified buffer (docs/streams.md)",
         role="choice"),
    Axis("workload", "str", "none", "choice:workloads", label="{}", column="workload",
         hide_default=True, doc="many-sequence workload: none, independent or shared-prefix",
         role="workload"),
    Axis("prefix_frac", "float", 0.0, "fraction", label="prefix{:g}", column="prefix",
         hide_default=True, doc="shared prefix = int(prefix_frac * context_len) tokens",
         role="workload"),
    Axis("decode_order", "str", "interleaved", "choice:decode_orders", label="{}",
         column="order", hide_default=True, doc="interleaved or sequential decode of the seqs",
         role="workload"),
    Axis("churn", "int", 0, "non_negative_int", label="churn{}", column="churn",
         hide_default=True, doc="sequences that finish and are replaced before the timed step",
         role="workload"),
    Axis("group_size", "int | None", None, "optional_positive_int", label="g{}", column="G",
         doc="quantization group size; empty: the format's default", role="choice"),
    Axis("kv_data", "str", "gaussian", "choice:kv_data", label="{}", column="data",
         hide_default=True, doc="K/V distribution (kernels/data.py)", role="workload"),
    Axis("seed", "int", 0, "non_negative_int", series="seed {}", doc="random seed of the K/V",
         role="workload"),
    Axis("kv_file", "str | None", None, "optional_string",
         doc=".npz of captured K/V, only for kv_data=file (kernels/data.py)", role="workload"),
    Axis("window", "int | None", None, "optional_positive_int", label="win{}", column="win",
         doc="attention window: the last `window` positions (layout window); empty: all",
         role="workload"),
    Axis("shards", "int", 1, "positive_int", label="{}-rank", column="shards", hide_default=True,
         series="{} ranks", doc="ranks the cache is sharded over (docs/distributed.md)",
         role="choice"),
    Axis("shard_by", "str", "context", "choice:shard_by", label="by-{}", column="by",
         hide_default=True, doc="split of the cache over the ranks: context (positions) or heads",
         role="choice"),
    Axis("combine", "str", "gather", "choice:combines", label="{}", column="combine",
         hide_default=True, doc="sharded combine: all_gather of partials, or all_sum (rescaled)",
         role="detail"),
    # a real model's cache options (the model engine, docs/quality.md); kv_dtype is K's format
    Axis("v_dtype", "str | None", None, "optional_format", label="V{}", column="V",
         hide_default=True, series="V {}", doc="V's format when it differs from K's (kv_dtype)",
         role="choice"),
    Axis("k_axis", "str", "token", "choice:k_axes", label="k{}", column="k-axis",
         hide_default=True, doc="key scales per token (a row) or per channel (KIVI)",
         role="choice"),
    Axis("sink_tokens", "int", 0, "non_negative_int", label="sink{}", column="sinks",
         hide_default=True, doc="the first positions always kept: a window's sinks, or kept "
         "in fp16 by a real model's quantized cache", role="choice"),
    Axis("recent_tokens", "int", 0, "non_negative_int", label="recent{}", column="recent",
         hide_default=True, doc="the newest positions, kept in fp16 and flushed in groups",
         role="choice"),
    Axis("text", "str", "default", "nonempty_string", label="text:{}", series="text {}",
         doc="quality, generate, model_decode: the text (a file path; default: docs/quality.md)",
         role="workload"),
    Axis("chunks", "int", 1, "at_most:10000", label="chunks{}", series="{} chunks",
         doc="quality, generate: chunks of context_len tokens (as llama-perplexity)",
         role="workload"),
    Axis("page_size", "int | None", None, "page_size", label="page{}", column="page",
         hide_default=True, doc="slots per page of layout paged (8-256; docs/layouts.md)",
         role="choice"),
    Axis("page_read", "str", "gather", "choice:page_reads", label="{}", column="read",
         hide_default=True, doc="paged: gather pages into a dense copy, or read via the table",
         role="detail"),
    Axis("kv_edit", "str", "none", "choice:kv_edits", label="{}", column="edit",
         hide_default=True, doc="unified: a timed shift, self-extend or defrag (docs/layouts.md)",
         role="workload"),
    Axis("rope_theta", "float", 10000.0, "positive_number", series="theta {:g}",
         doc="RoPE base of the keys a kv_edit re-rotates", role="workload"),
    # rotation before quantization (kernels/formats/rotation.py, docs/formats.md)
    Axis("rotate_k", "str", "none", "choice:rotations", label="rotK:{}", column="rotK",
         hide_default=True, series="rot K {}", doc="keys stored rotated (after RoPE): none "
         "or hadamard (q rotated once per step)", role="choice"),
    Axis("rotate_v", "str", "none", "choice:rotations", label="rotV:{}", column="rotV",
         hide_default=True, series="rot V {}", doc="values stored rotated: none or hadamard "
         "(the attention output rotated back once per step)", role="choice"),
    Axis("rot_block_k", "int | None", None, "optional_positive_int", label="rotKb{}",
         column="rotK-b", hide_default=True, series="rot K block {}",
         doc="K's Hadamard block (a power of two from 8 to head_dim); empty: llama.cpp's rule, "
             "the largest power of two dividing head_dim (a row records the block in effect)",
         role="choice"),
    Axis("rot_block_v", "int | None", None, "optional_positive_int", label="rotVb{}",
         column="rotV-b", hide_default=True, series="rot V block {}",
         doc="V's Hadamard block (a power of two from 8 to head_dim); empty: llama.cpp's rule, "
             "64 (a row records the block in effect)", role="choice"),
    Axis("k_order", "str", "hf", "choice:k_orders", label="k:{}", column="k-order",
         hide_default=True, doc="a real model's key channel order in its cache: hf (half-split) "
         "or gguf (interleaved, as llama.cpp stores keys)", role="detail"),
    Axis("q_quant", "str", "none", "choice:q_quants", label="q:{}", column="q-quant",
         hide_default=True, doc="a real model's queries rounded through q8_0 before the key dot "
         "product, as llama.cpp's CPU flash attention does against a quantized K", role="detail"),
    Axis("peer_weights", "str", "gguf", "choice:peer_weights", label="w:{}", column="peer-w",
         hide_default=True, doc="llama.cpp rows: the GGUF's weights as stored (gguf: products "
         "with q8-rounded activations) or dequantized to float32 first (f32: the float weights "
         "kvbench's model engine runs)", role="detail"),
    Axis("fp8_scale", "str", "one", "fp8_scale", label="fp8s:{}", column="fp8-scale",
         hide_default=True, doc="fp8_e4m3 / fp8_e5m2's float32 scale: one (1.0), a positive "
         "number, calibrated (vLLM's, per layer on the first prefill) or per_head",
         role="choice"),
    # the model's task phases (harness/engines/model_tasks.py, docs/quality.md)
    Axis("task", "str", "none", "choice:retrieval_tasks", label="{}", column="task",
         hide_default=True, doc="phase retrieval: passkey, niah, multikey or vartrack",
         role="workload"),
    Axis("depth", "float", 0.5, "unit_interval", label="depth{:g}", column="depth",
         hide_default=True, series="depth {:g}",
         doc="phase retrieval: the needle's place in the haystack (0 = start, 1 = end)",
         role="workload"),
    Axis("trials", "int", 1, "at_most:10000", label="trials{}", column="trials",
         hide_default=True, doc="phase retrieval: prompts generated (trial i seeded seed + i)",
         role="workload"),
    Axis("gen_tokens", "int", 32, "at_most:65536", label="gen{}", column="gen",
         hide_default=True, doc="phases generate and serve: tokens generated greedily after "
         "the prompt (serve: per sequence, llama-batched-bench's -ntg)",
         role="workload"),
    Axis("quantized_kv_start", "int", 0, "non_negative_int", label="qstart{}",
         column="qstart", hide_default=True,
         doc="phase generate: fp16 cache until this many positions are held (mlx-lm's)",
         role="choice"),
    Axis("context_limit", "str", "trained", "context_limit", label="ctx:{}",
         column="ctx-limit", hide_default=True,
         doc="a real model's context_len: within its trained length (trained), past it "
             "(beyond: asked for explicitly, and the row says so), or a number: the trained "
             "length a kv_edit's context is sized by (llama.cpp's n_ctx_train)", role="workload"),
    # llama.cpp's context shift and self-extend on a real model (kv_edit shift / self-extend in
    # phase retrieval, as its passkey example runs them: kernels/model/shift.py; a shift in
    # phase quality: kernels/model/shift_quality.py)
    Axis("ga_n", "int", 1, "positive_int", label="gan{}", column="ga_n", hide_default=True,
         series="ga_n {}", role="choice",
         doc="kv_edit self-extend on a model: the group factor (llama.cpp's --grp-attn-n)"),
    Axis("ga_w", "int", 2048, "positive_int", label="gaw{}", column="ga_w", hide_default=True,
         series="ga_w {}", doc="kv_edit on a model: passkey.cpp's batch (-b): self-extend's "
         "window and the positions a context shift discards", role="choice"),
    Axis("n_keep", "int | None", None, "optional_non_negative_int", label="keep{}",
         column="keep", hide_default=True, series="keep {}", doc="kv_edit shift on a model: the "
         "first positions never shifted out (llama.cpp's --keep); empty: the prompt's "
         "instruction (quality: 32, passkey.cpp's default)", role="choice"),
    Axis("div_sign", "str", "exact", "choice:div_signs", label="div:{}", column="div",
         hide_default=True, doc="kv_edit self-extend on a model: keys turned to their divided "
         "positions (exact) or as llama.cpp b11434's seq_div records it (llama.cpp: by old "
         "minus new)", role="detail"),
    Axis("swa_cache", "str", "ring", "choice:swa_caches", label="swa:{}", column="swa",
         hide_default=True, series="swa {}", doc="kv_edit self-extend on a model with "
         "sliding-window layers: ring (their cache of window + ubatch cells, which llama.cpp "
         "b11434 cannot group: 'failed to find a memory slot') or full (every cell kept, the "
         "window a mask by position: llama.cpp's --swa-full)", role="choice"),
    # which positions a real model's cache keeps (kernels/model/policies/, docs/policies.md)
    Axis("policy", "str", "none", "choice:policies", label="{}", column="policy",
         hide_default=True, series="{}", doc="model phases: the cache policy that selects the "
         "kept positions at the end of the context (none: every position)", role="choice"),
    Axis("compression_ratio", "float", 0.0, "fraction", label="cr{:g}", column="ratio",
         hide_default=True, series="ratio {:g}", doc="policy: the fraction of the context's "
         "positions removed (kvpress's definition; the question is never compressed)",
         role="choice"),
    Axis("kv_budget", "int | None", None, "optional_positive_int", label="kv{}",
         column="kv-budget", hide_default=True, series="budget {}",
         doc="policy: tokens kept per layer and KV head instead of compression_ratio",
         role="choice"),
    Axis("n_sink", "int", 4, "non_negative_int", label="nsink{}", column="n-sink",
         hide_default=True, doc="policy window / expected_attention: sink positions always "
         "kept (kvpress's n_sink)", role="choice"),
    Axis("obs_window", "int", 64, "positive_int", label="obsw{}", column="obs-win",
         hide_default=True, doc="policy snapkv / pyramidkv (and adakv over snapkv): the last "
         "queries whose attention scores (kvpress's window_size)", role="choice"),
    Axis("kernel_size", "int", 5, "positive_int", label="pool{}", column="pool",
         hide_default=True, doc="policy snapkv / pyramidkv: the average pool's width",
         role="choice"),
    Axis("scorer", "str", "snapkv", "choice:scorers", label="by:{}", column="scorer",
         hide_default=True, doc="policy pyramidkv / adakv: the scores they budget",
         role="choice"),
)
# fmt: on


def names(table: tuple[Axis, ...] = TABLE) -> tuple[str, ...]:
    return tuple(a.name for a in table)


def with_role(*roles: str, table: tuple[Axis, ...] = TABLE) -> tuple[str, ...]:
    """The names of the axes whose role is one of `roles`, in the table's order."""
    return tuple(a.name for a in table if a.role in roles)


def fields_of(table: tuple[Axis, ...] = TABLE) -> tuple[Axis, ...]:
    """The axes a Case stores (derived axes are computed from them)."""
    return tuple(a for a in table if a.derive is None)


def _given(value) -> bool:
    """Set in a row: not None, not NaN (a CSV's empty cell), not empty text."""
    return value is not None and value == value and value != ""


def _part(axis: Axis, value) -> str:
    if axis.is_int and isinstance(value, float) and value.is_integer():
        value = int(value)  # a CSV column with empty cells reads as float
    return axis.label.format(value)


def label_of(fields: Mapping, table: tuple[Axis, ...] = TABLE) -> str:
    """A short human name for a case from its fields (a Case's, or a result row where a missing
    or empty field means its default): the axes always shown, then the ones set off default."""
    parts = []
    for axis in table:
        if axis.label is None:
            continue
        value = fields.get(axis.name)
        if axis.always:
            parts.append(_part(axis, value if _given(value) else "?"))
        elif _given(value) and value != axis.default:
            parts.append(_part(axis, value))
    return " ".join(parts)

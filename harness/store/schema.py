"""The schema of a result row: the Record, whose fields are the CSV header in order (the head,
the case block, the measured columns), and the raw-sample columns. The case block is the axis
table (kvbench.axes), in the table's order. harness/store/writer.py writes rows of it; this
module imports neither mlx nor kernels/.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvbench.axes import TABLE, Axis


@dataclass(frozen=True)
class _Head:
    # identity
    run_id: str | None = None
    suite: str | None = None
    case_id: str | None = None
    status: str | None = None  # ok | error | skipped | partial
    error: str | None = None
    bench_name: str | None = None  # imported rows: the benchmark's own name (pytest-benchmark)


@dataclass(frozen=True)
class _CaseColumns:
    """The case block: one column per axis of kvbench.axes.TABLE (derived ones too), in the
    table's order, every one optional (tests/test_axes.py asserts the match)."""

    model: str | None = None
    n_layers: int | None = None
    n_q_heads: int | None = None
    n_kv_heads: int | None = None
    gqa_ratio: int | None = None
    head_dim: int | None = None
    phase: str | None = None
    context_len: int | None = None
    kv_dtype: str | None = None
    kernel: str | None = None
    n_seqs: int | None = None
    tile_kv: int | None = None
    layout: str | None = None
    workload: str | None = None
    prefix_frac: float | None = None
    decode_order: str | None = None
    churn: int | None = None
    group_size: int | None = None
    kv_data: str | None = None
    seed: int | None = None
    kv_file: str | None = None
    window: int | None = None
    shards: int | None = None
    shard_by: str | None = None
    combine: str | None = None
    v_dtype: str | None = None
    k_axis: str | None = None
    sink_tokens: int | None = None
    recent_tokens: int | None = None
    text: str | None = None
    chunks: int | None = None
    page_size: int | None = None
    page_read: str | None = None
    kv_edit: str | None = None
    rope_theta: float | None = None
    rotate_k: str | None = None
    rotate_v: str | None = None
    rot_block_k: int | None = None
    rot_block_v: int | None = None
    k_order: str | None = None
    q_quant: str | None = None
    peer_weights: str | None = None
    fp8_scale: str | None = None
    task: str | None = None
    depth: float | None = None
    trials: int | None = None
    gen_tokens: int | None = None
    quantized_kv_start: int | None = None
    context_limit: str | None = None
    ga_n: int | None = None
    ga_w: int | None = None
    n_keep: int | None = None
    div_sign: str | None = None
    swa_cache: str | None = None
    policy: str | None = None
    compression_ratio: float | None = None
    kv_budget: int | None = None
    n_sink: int | None = None
    obs_window: int | None = None
    kernel_size: int | None = None
    scorer: str | None = None


@dataclass(frozen=True)
class _Measured:
    # latency of one timed call (decode step over all layers, or the whole prefill)
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    iqr_ms: float | None = None
    cv: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    n_samples: int | None = None
    unstable: bool | None = None
    write_ms: float | None = None  # median of the write (and quantize) stage alone
    attend_ms: float | None = None  # median of the attention stage alone
    mask_ms: float | None = None  # median of the mask-building stage alone (unified layout)
    # sharded cases (docs/distributed.md), timed on rank 0: comm_ms = the combines alone
    comm_ms: float | None = None
    rank_kv_bytes: int | None = None  # K/V format bytes the fullest rank holds, all layers
    sent_bytes: int | None = None  # bytes one rank sends per step (ring model), all layers
    launch_backend: str | None = None  # mx.distributed backend of the ranks (ring, mpi, nccl)
    # traffic and throughput (explicit model, harness/engines/metrics.py)
    bytes_read: int | None = None
    bytes_written: int | None = None
    gbps: float | None = None
    peak_gbps: float | None = None
    peak_method: str | None = None
    pct_peak_bw: float | None = None
    flops: int | None = None
    tflops: float | None = None
    tokens_per_s: float | None = None
    # model_decode rows: how the step's one-token weight products ran: "blocked" (row blocks
    # the BLAS runs fast, kernels/model/matvec.py) or "gemm" (x @ W.T as mlx-lm writes it)
    matvec: str | None = None
    # model_decode rows: how the step's RoPE ran: "table" (cos and sin from a table,
    # kernels/model/rope.py) or "fast" (mx.fast.rope, on the CPU its fallback graph)
    rope: str | None = None
    # memory
    # kv_bytes: exact format bytes of the K/V the case holds: n_seqs x context_len for the
    # cache engine, the occupied cells for a workload
    kv_bytes: int | None = None
    bits_per_elem: float | None = None  # stored bits per K/V element, scales included
    # bits of one K/V element's code alone, scales excluded (from the format, kernels/ at run
    # time, so the report need not import kernels/; store/migrate_v1.py for older rows)
    data_bits: int | None = None
    alloc_bytes: int | None = None  # measured: active-memory growth when the cache is allocated
    peak_mem_bytes: int | None = None  # measured: peak above the pre-cache baseline (stages)
    fill_peak_bytes: int | None = None  # measured: peak above it while allocating + filling
    # the residency gate (harness/engines/residency.py): bytes the cache's arrays declare, and
    # active memory above the pre-cache baseline after the fill and after the timed stages
    cache_bytes: int | None = None
    resident_bytes: int | None = None
    resident_end_bytes: int | None = None
    # custom GPU kernels (metal, cuda): the launch as planned and its traffic model per step
    # (every layer; kernels/attention/gpu/traffic.py): how far it is from moving each byte once
    gpu_threads: int | None = None  # threads per threadgroup
    gpu_splits: int | None = None  # splits of the context (threadgroups per sequence x head)
    gpu_vec_bytes: int | None = None  # bytes per K/V vector load
    gpu_cores: int | None = None  # cores / SMs the split planner planned for
    kernel_read_bytes: int | None = None  # global bytes the kernels request (both launches)
    kernel_write_bytes: int | None = None  # global bytes they write (partials, output)
    kernel_min_bytes: int | None = None  # each K/V, scale, q and output byte moved once
    kernel_shared_bytes: int | None = None  # threadgroup-memory traffic
    traffic_excess: float | None = None  # (read + write) / min - 1
    # many-sequence layouts (docs/streams.md): cells per layer, bytes over all layers, K and V
    cells_alloc: int | None = None  # cells allocated (all streams)
    cells_used: int | None = None  # occupied cells at the timed step (a shared cell once)
    n_kv: int | None = None  # extent attended over (largest of the step's calls), padded
    bytes_alloc: int | None = None  # format bytes of cells_alloc
    bytes_used: int | None = None  # format bytes of cells_used
    kv_util: float | None = None  # cells_used / cells_alloc
    bytes_touched: int | None = None  # K/V bytes the step's attention covers (n_kv per seq)
    bytes_needed: int | None = None  # K/V bytes of each sequence's own cells only
    # paged layout (docs/layouts.md): pages per layer; the block table once for all layers
    pages_alloc: int | None = None  # pages in the pool
    pages_used: int | None = None  # pages held by some sequence at the timed step
    pages_cow: int | None = None  # pages copied on write (a partly shared last page)
    page_frag: float | None = None  # internal fragmentation: empty slots / slots of used pages
    block_table_bytes: int | None = None  # int32 block tables, n_seqs x the longest table
    edit_units: int | None = None  # kv_edit: keys re-rotated or cells moved by one edit
    # accuracy vs the float32 reference on the un-quantized K/V
    max_abs_err: float | None = None
    rel_err: float | None = None
    cosine: float | None = None
    kv_recon_err: float | None = None  # relative L2 error of decoded K/V vs the originals
    kv_saturated: int | None = None  # FP8: K/V elements beyond its largest value (stored as it)
    # quality on a real model (phase quality, harness/engines/model.py): the cache in the
    # case's format against a float32 cache over the same text, scored as llama-perplexity
    ppl: float | None = None  # perplexity with the case's cache
    ppl_err: float | None = None  # its standard error: ppl x that of the mean nll
    ppl_ref: float | None = None  # perplexity with a float32 cache
    delta_ppl: float | None = None  # ppl - ppl_ref
    ppl_ref_err: float | None = None  # ppl_ref's standard error (as ppl_err)
    # delta_ppl's standard error, paired over the same scored tokens (the delta method:
    # sem of ppl * nll - ppl_ref * nll_ref per token); far smaller than ppl_err's
    delta_ppl_err: float | None = None
    kl_mean: float | None = None  # mean KL divergence of next-token distributions (nats)
    kl_err: float | None = None  # standard error of kl_mean over the scored tokens
    kl_p99: float | None = None  # its 99th percentile over the scored tokens
    top1_agree: float | None = None  # fraction of scored tokens with the same top-1 token
    n_scored: int | None = None  # tokens scored
    # every chunk starts with BOS (its first token overwritten, as llama-perplexity does where
    # the vocabulary adds BOS); False: the chunks are plain slices of the text (no BOS added)
    chunk_bos: bool | None = None
    # tokens per forward pass of a model phase's prefill (its micro-batch: llama.cpp's
    # n_ubatch, 512 by default): quality, retrieval and generate rows, llama.cpp's quality rows
    ubatch: int | None = None
    # the same by position: the scored half of each chunk in 4 equal runs (1 = earliest)
    kl_pos1: float | None = None
    kl_pos2: float | None = None
    kl_pos3: float | None = None
    kl_pos4: float | None = None
    top1_pos1: float | None = None
    top1_pos2: float | None = None
    top1_pos3: float | None = None
    top1_pos4: float | None = None
    n_pos1: int | None = None  # tokens scored in each run, over all chunks
    n_pos2: int | None = None
    n_pos3: int | None = None
    n_pos4: int | None = None
    # phase retrieval (harness/engines/model_tasks.py): exact match of the greedy answer
    n_trials: int | None = None  # prompts generated and answered
    n_correct: int | None = None  # answers equal to the truth
    accuracy: float | None = None  # n_correct / n_trials
    accuracy_lo: float | None = None  # its 95% Wilson interval
    accuracy_hi: float | None = None
    ref_accuracy: float | None = None  # the float32 cache's accuracy on the same prompts
    n_ref_agree: int | None = None  # answers equal to the float32 cache's answer
    ref_agree: float | None = None  # n_ref_agree / n_trials
    ref_agree_lo: float | None = None  # its 95% Wilson interval
    ref_agree_hi: float | None = None
    prompt_tokens: int | None = None  # the longest prompt's tokens (answer room excluded)
    answer_texts: str | None = None  # every trial's continuation, a JSON list of strings
    # kv_edit shift / self-extend on a model (kernels/model/shift.py): context shifts made over
    # the trials (llama.cpp rows: llama-passkey's "shifting KV cache" lines) and the largest
    # position RoPE gave an answer's first token (n_past; kvbench rows)
    kv_shifts: int | None = None
    n_past: int | None = None
    # phase quality under kv_edit shift (kernels/model/shift_quality.py): the float32 cache read
    # through the shifts against one reading each chunk whole, over the scored tokens: its
    # perplexity (ppl_noshift), ppl_ref less it, and the mean KL (nats)
    ppl_noshift: float | None = None
    shift_delta_ppl: float | None = None
    shift_kl: float | None = None
    # phase generate: greedy continuation against the float32 cache's
    gen_first_diverge: float | None = None  # tokens before the first differing one (mean)
    gen_first_diverge_min: int | None = None  # the least over the prompts
    gen_agree: float | None = None  # fraction of positions with the same token
    gen_kl_mean: float | None = None  # teacher-forced KL along the reference continuation
    gen_kl_max: float | None = None
    gen_tokens_scored: int | None = None  # positions the KL rests on
    # what a model phase's evidence cost (quality, retrieval, generate: kernels/model/meter.py;
    # llama.cpp's quality rows: its log): the row's own passes, its float32 reference apart
    wall_s: float | None = None  # wall seconds of the row's passes and scoring
    prefill_tokens: int | None = None  # tokens through the model in batches (micro-batches)
    prefill_s: float | None = None  # seconds of those passes (graph, eval)
    prefill_tokens_per_s: float | None = None
    decode_tokens: int | None = None  # tokens through the model one at a time
    decode_s: float | None = None
    decode_tokens_per_s: float | None = None
    # wall seconds of the float32 reference (llama.cpp: the base pass) these figures are
    # against; computed once per process and shared by every row of the same chunks/prompts
    ref_wall_s: float | None = None
    # phase serve (harness/engines/serve.py, docs/serve.md): llama-batched-bench's figures under
    # its names: prompt tokens per sequence, generated tokens per sequence, parallel sequences,
    # its KV cells (pl*(pp + tg); a shared prompt: pp + pl*tg unified, pl*pp + pl*tg per-stream),
    # the prompts' and the decode steps' seconds and tokens per second (s_pp counts a shared
    # prompt once)
    pp: int | None = None
    tg: int | None = None
    pl: int | None = None
    # its N_KV, the cells its schedule requires: not n_kv (the padded extent a step attends over)
    n_kv_req: int | None = None
    t_pp: float | None = None
    s_pp: float | None = None
    t_tg: float | None = None
    s_tg: float | None = None
    t: float | None = None  # t_pp + t_tg, seconds
    s: float | None = None  # tokens decoded / t (a shared prompt once), llama-batched-bench's S
    tg_step_ms: float | None = None  # median of the decode steps (one token per sequence each)
    tg_step_p10_ms: float | None = None
    tg_step_p90_ms: float | None = None
    # the batch's truth: the first and last sequence alone through the single-sequence cache
    serve_max_abs_logit: float | None = None  # largest |logit| difference over their steps
    serve_greedy_agree: float | None = None  # least fraction of greedy choices equal
    # a cache policy's rows (kernels/model/compress.py): what it kept of the context
    context_tokens: int | None = None  # positions compressed (the context)
    kept_cells: int | None = None  # cells kept, every layer and KV head, after compression
    kept_layers: str | None = None  # each layer's cells (KV heads summed), "/"-joined
    kept_heads: str | None = None  # each head's cells, per layer, where a layer's heads differ
    kept_bytes: int | None = None  # format bytes of the kept cells (K, V) + the policy's state
    kept_bytes_per_token: float | None = None  # (kept_bytes - kept_ring_bytes) / context_tokens
    kept_ring_bytes: int | None = None  # of kept_bytes, the sliding-window layers' rings: fixed
    policy_s: float | None = None  # the policy's own cost: selection and gather, wall seconds
    # context
    commit: str | None = None
    dirty: bool | None = None
    branch: str | None = None
    timestamp: str | None = None
    host: str | None = None
    os: str | None = None
    device: str | None = None
    backend: str | None = None
    mlx_version: str | None = None
    kvbench_version: str | None = None
    schema_version: int | None = None
    # the BLAS under MLX's CPU matmuls (harness/blas.py, docs/blas.md): library and version
    # ("openblas 0.3.21 SkylakeX", "bundled": the wheel's reference BLAS, "platform": macOS'),
    # where it came from, and fp32 matmul GFLOP/s measured on MLX's CPU stream at the run's start
    blas: str | None = None
    blas_source: str | None = None
    blas_gflops: float | None = None
    peer_version: str | None = None  # peer kernels: their package and version ("mlx-lm 0.32.2")
    peer_kv_types: str | None = None  # llama.cpp rows: the K/V cache types it ran ("q8_0/q4_0")
    # llama.cpp quality rows: its reference (base) pass's K/V types ("f16/f16": with -fa an f32
    # cache is cast to f16 before the attention, src/llama-graph.cpp build_attn_mha)
    peer_ref_kv_types: str | None = None
    peer_threads: int | None = None  # llama.cpp rows: threads
    # llama.cpp rows: its own memory figures, from its log (MiB with 2 decimals: +-5 KiB)
    peer_kv_bytes: int | None = None  # its KV buffer (cells allocated, K and V)
    peer_compute_bytes: int | None = None  # its compute and output buffers
    peer_kv_cells: int | None = None  # KV cells it allocated (context padded)
    # "kvbench" (kvbench's own kernel) or "peer" (harness/peers/registry.py), recorded at run time
    # so
    # that analysis needs no copy of the peer registry; store/migrate_v1.py for older rows
    kernel_kind: str | None = None


def record_class(table: tuple[Axis, ...] = TABLE) -> type:
    """What the axis table implies a Record is (tests compare the declared Record with it, and
    check a made-up axis through it): the head columns, then one column per axis of `table`
    (derived ones too), then the measured columns; every field optional (an error row has no
    times)."""
    case_block = [(a.name, _optional(a.type), field(default=None)) for a in table]
    spec = [(f.name, f.type, field(default=None)) for f in dataclasses.fields(_Head)]
    spec += case_block
    spec += [(f.name, f.type, field(default=None)) for f in dataclasses.fields(_Measured)]
    cls = dataclasses.make_dataclass("Record", spec, frozen=True)
    cls.__module__ = __name__
    return cls


def _optional(annotation: str) -> str:
    return annotation if "None" in annotation else f"{annotation} | None"


@dataclass(frozen=True)
class Record(_Measured, _CaseColumns, _Head):
    """One CSV row: the head (identity), the case block, the measured columns, in that order
    (a dataclass collects its bases' fields from the last base to the first)."""


COLUMNS = tuple(f.name for f in dataclasses.fields(Record))
SAMPLE_COLUMNS = ("case_id", "stage", "round", "sample", "ms")
# metric -> the stage whose raw samples stand behind it (the metrics a rank test can judge)
METRIC_STAGE = {
    "median_ms": "step",
    "write_ms": "write",
    "attend_ms": "attend",
    "mask_ms": "mask",
    "comm_ms": "comm",
}


def make_record(**values) -> Record:
    """A Record from some of its fields; a key that is not a column raises (a forgotten column
    would otherwise vanish from the CSV)."""
    unknown = sorted(set(values) - set(COLUMNS))
    if unknown:
        raise TypeError(f"make_record: not Record columns: {', '.join(unknown)}")
    return Record(**values)

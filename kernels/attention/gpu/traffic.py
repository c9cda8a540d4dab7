"""Memory traffic of one flash-decode call (split kernel + combine kernel), from its launch plan.

A model counted from the kernels' loads and stores (kernels/attention/gpu/src/flash_decode_body.inc
and
flash_decode_combine.inc), in bytes per call (SI: divide by 1e9 for GB). Three levels:
- requested (`global_read_bytes`): what the load instructions ask of the memory system, each
  simdgroup-wide load counted once per distinct address (lanes of one instruction that read the
  same element coalesce): K/V rows once (one slot of one threadgroup loads a row for all G
  heads), the 4-bit group scales once per (row, instruction, group), q once per simdgroup
  (every simdgroup of every split loads its G rows), the partials the combine reads;
- unique (`unique_read_bytes`): each distinct byte read once: what DRAM moves if every repeated
  request hits a cache (q, scales); the partials are a real round trip through memory;
- `min_bytes`: what any decode kernel must move: K/V and their scales, q and the output once.
`global_write_bytes`: the partials and the output. `shared_bytes`: threadgroup memory written
and read by the merge of simdgroups (per thread; a read of one address by a whole simdgroup is
one broadcast transaction on both GPUs). params, scale and the strides are left out (a few
bytes per threadgroup, in constant / parameter memory). `excess` = (unique reads + writes) /
min_bytes - 1: how far the call is from moving each byte once if caches do their part;
`request_excess` the same with the requested reads. Not measured: no GPU ran these kernels.
"""

from __future__ import annotations

from kvbench.kernels.attention.gpu.launch import (
    ELEM_BYTES,
    FP8_CODES,
    HEAD_SCALE_BYTES,
    SCALE_BYTES,
    SIMD_WIDTH,
    LaneLayout,
    LaunchPlan,
    Problem,
)

F32_BYTES = 4


def scale_loads_per_row(lay: LaneLayout, group: int) -> int:
    """Distinct group scales the slot's load instructions request for one row: instruction i
    covers vectors j + LPR*i (j < LPR) and requests each group among them once."""
    return sum(
        len(
            {
                (j + lay.lanes_per_row * i) * lay.elems_per_vec // group
                for j in range(lay.lanes_per_row)
            }
        )
        for i in range(lay.vecs_per_lane)
    )


def _kv(problem: Problem, plan: LaunchPlan) -> dict:
    rows = problem.n_seqs * problem.n_kv_heads * problem.kv_len  # K rows (as many V rows)
    out = {"kv_read_bytes": 2 * rows * problem.row_bytes}
    if problem.kv_code == "dense":
        return out | {"scale_read_bytes": 0, "scale_min_bytes": 0}
    if problem.kv_code in FP8_CODES:  # K's and V's head scale, once per threadgroup (one address)
        n_tg = plan.threadgroups[0] * plan.threadgroups[1]
        out["scale_read_bytes"] = 2 * n_tg * HEAD_SCALE_BYTES
        return out | {"scale_min_bytes": 2 * problem.n_kv_heads * HEAD_SCALE_BYTES}
    loads = scale_loads_per_row(plan.layout, problem.scale_group)
    n_groups = problem.head_dim // problem.scale_group
    out["scale_read_bytes"] = 2 * rows * loads * SCALE_BYTES
    return out | {"scale_min_bytes": 2 * rows * n_groups * SCALE_BYTES}


def _partials(problem: Problem, plan: LaunchPlan) -> dict:
    r, s, d = problem.n_seqs * problem.n_q_heads, plan.n_splits, problem.head_dim
    d_steps = -(-d // SIMD_WIDTH)  # combine: each lane's output elements d = lane + 32 k
    return {
        "partial_write_bytes": r * s * (d + 2) * F32_BYTES,  # o_part, m_part, l_part
        # o_part once; m_part by the max and the denominator loops (lanes over splits) and once
        # per output-element step (all lanes read the same split: one address); l_part once
        "partial_read_bytes": r * s * (d + 2 + d_steps + 1) * F32_BYTES,
        "partial_unique_bytes": r * s * (d + 2) * F32_BYTES,
    }


def shared_traffic_bytes(problem: Problem, plan: LaunchPlan) -> int:
    """Threadgroup memory written + read by the merge of simdgroups, over all threadgroups:
    per head, N_SIMD*(D+2) floats written; every thread reads 2*N_SIMD floats (each simdgroup's
    m and l) and each output element N_SIMD (o of each simdgroup)."""
    n_simd, threads, d = plan.layout.n_simd, dict(plan.template)["THREADS"], problem.head_dim
    per_head = n_simd * (d + 2) + 2 * n_simd * threads + n_simd * d
    n_tg = plan.threadgroups[0] * plan.threadgroups[1]
    return n_tg * problem.group * per_head * F32_BYTES


def traffic_bytes(problem: Problem, plan: LaunchPlan) -> dict:
    """Bytes one call moves (see the module docstring): ints, and two float ratios."""
    kv, parts = _kv(problem, plan), _partials(problem, plan)
    q_min = problem.n_seqs * problem.n_q_heads * problem.head_dim * ELEM_BYTES[problem.dtype]
    n_tg = plan.threadgroups[0] * plan.threadgroups[1]
    q_read = n_tg * plan.layout.n_simd * problem.group * problem.head_dim
    t = {**kv, "q_read_bytes": q_read * ELEM_BYTES[problem.dtype], **parts}
    t["out_write_bytes"] = q_min  # [B*Hq, D] in the compute dtype
    t["global_read_bytes"] = (
        kv["kv_read_bytes"]
        + kv["scale_read_bytes"]
        + t["q_read_bytes"]
        + parts["partial_read_bytes"]
    )
    t["unique_read_bytes"] = (
        kv["kv_read_bytes"] + kv["scale_min_bytes"] + q_min + parts["partial_unique_bytes"]
    )
    t["global_write_bytes"] = parts["partial_write_bytes"] + q_min
    t["shared_bytes"] = shared_traffic_bytes(problem, plan)
    t["min_bytes"] = kv["kv_read_bytes"] + kv["scale_min_bytes"] + 2 * q_min
    t["excess"] = (t["unique_read_bytes"] + t["global_write_bytes"]) / t["min_bytes"] - 1
    t["request_excess"] = (t["global_read_bytes"] + t["global_write_bytes"]) / t["min_bytes"] - 1
    return t

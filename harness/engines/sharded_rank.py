"""One rank of a sharded case: the program `mlx.launch` starts N times (harness/engines/sharded.py).

    python -m kvbench.engines.sharded_rank SPEC OUT

Every rank generates the case's full K/V from its seed (the same on every rank), keeps its part
in a pre-allocated multi-layer cache in the case's format (kernels/stores/cache.py KVCache) and
fills
it: by context, rank r holds positions split_bounds(context_len, N)[r] of every KV head and the
last rank also owns the new token's position (context_len - 1), which it writes in every step;
by heads, rank r holds KV heads split_bounds(n_kv_heads, N)[r] at every position, their query
heads, and writes the new token's K/V for its heads. Per layer the decode step is: write
(owners), partial attention with its log-sum-exp over the local part
(kernels/attention/sharded.py), the
combine (a collective), and the next layer's query is the combined output (as the cache engine
chains layers), so every layer waits for its combine.

Stages, each timed on rank 0 by kvbench's timer (harness/timer.py) while every rank runs the
same calls; after each call all ranks learn rank 0's decision to go on or stop (an all_sum
outside the timed region), so they stay in lockstep:
* step: write + attend + combine, every layer;
* write: the owners' writes alone; attend: the local partial attention alone, layers chained
  through the local outputs; comm: the combines alone, layers chained through the combined
  outputs (the same payload shapes as the step's).
The check (first round): layer 0's combined output on rank 0 against the float32 reference over
the whole stored cache (parity gate), then accuracy against the float32 reference over the
un-quantized K/V. A rank that fails raises on every rank before any time is taken.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from kvbench import timer
from kvbench.case import Case
from kvbench.engines import residency
from kvbench.engines.contract import allocated
from kvbench.engines.parity import compare_outputs, parity_gate, recon_err
from kvbench.kernels.attention.registry import reference
from kvbench.kernels.attention.sharded import (
    combine_context,
    combine_heads,
    partial_attention,
    split_bounds,
)
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import KVCache
from kvbench.suite import resolved


@dataclass
class Part:
    """What this rank holds: its slices of positions, KV heads and query heads."""

    positions: tuple[int, int]
    kv_heads: tuple[int, int]
    q_heads: tuple[int, int]
    owns_new: bool  # writes the new token's K/V in every step


def part_of(case: Case, rank: int) -> Part:
    n, group = case.shards, case.n_q_heads // case.n_kv_heads
    if case.shard_by == "context":
        pos = split_bounds(case.context_len, n)[rank]
        everyone = (0, case.n_kv_heads)
        return Part(pos, everyone, (0, case.n_q_heads), pos[1] == case.context_len)
    h0, h1 = split_bounds(case.n_kv_heads, n)[rank]
    return Part((0, case.context_len), (h0, h1), (h0 * group, h1 * group), True)


class Rank:
    """This rank's cache and the stages of one sharded decode step."""

    def __init__(self, case: Case, group):
        self.case, self.group, self.rank = case, group, group.rank()
        self.fmt = fmt = resolved.of_case(case).k_fmt
        self.part = part = part_of(case, self.rank)
        b, hq, hkv, d, ctx = (
            case.n_seqs, case.n_q_heads, case.n_kv_heads, case.head_dim, case.context_len,
        )  # fmt: skip
        self.q32, self.k32, self.v32 = make_qkv(
            case.kv_data, (b, hq, 1, d), (b, hkv, ctx, d), case.seed, case.kv_file
        )
        act = fmt.compute_dtype
        self.q = self.q32.astype(act)
        (p0, p1), (h0, h1) = part.positions, part.kv_heads
        k = self.k32[:, h0:h1, p0:p1].astype(act)  # [B, local heads, local positions, D]
        v = self.v32[:, h0:h1, p0:p1].astype(act)
        mx.eval(self.q, k, v)
        self.local_kv = (k, v)  # alive while measuring: the baseline below counts them
        shape = (case.n_layers, b, h1 - h0, p1 - p0, d)
        self.cache, self.baseline, self.alloc_bytes = allocated(lambda: KVCache(fmt, *shape))
        held = p1 - p0 - (1 if part.owns_new else 0)
        self.cache.fill(k[:, :, :held], v[:, :, :held])  # every layer its own buffer
        self.k_new, self.v_new, self.pos = k[:, :, held:], v[:, :, held:], held
        self.scale = 1.0 / math.sqrt(d)
        self.heads = [
            (s * hq // hkv, e * hq // hkv) for s, e in split_bounds(hkv, case.shards)
        ]  # every rank's query heads (by heads)

    def local_query(self, q: mx.array) -> mx.array:
        s, e = self.part.q_heads
        return q[:, s:e]

    def attend(self, layer: int, q_local: mx.array):
        k, v = self.cache.view(layer, self.cache.size)
        return partial_attention(q_local, k, v, self.fmt, scale=self.scale)

    def combine(self, out: mx.array, lse: mx.array) -> mx.array:
        if self.case.shard_by == "context":
            return combine_context(out, lse, self.case.combine, self.group)
        return combine_heads(out, self.case.combine, self.group, self.heads)

    def write_layer(self, layer: int) -> None:
        if self.part.owns_new:
            self.cache.write(layer, self.k_new, self.v_new, self.pos)

    def step(self) -> list[mx.array]:
        q, outs = self.local_query(self.q), []
        for layer in range(self.cache.n_layers):
            self.write_layer(layer)
            outs.append(self.combine(*self.attend(layer, q)))
            q = self.local_query(outs[-1].astype(self.q.dtype))  # the next layer's query
        return outs + self.cache.arrays()

    def write(self) -> list[mx.array]:
        for layer in range(self.cache.n_layers):
            self.write_layer(layer)
        return self.cache.arrays()

    def attend_all(self) -> list[mx.array]:
        q, outs = self.local_query(self.q), []
        for layer in range(self.cache.n_layers):
            out, lse = self.attend(layer, q)
            outs += [out, lse]
            q = out.astype(self.q.dtype)  # local chain: no collective in this stage
        return outs

    def comm(self) -> list[mx.array]:
        out, lse = self.attend(0, self.local_query(self.q))
        mx.eval(out, lse)  # the partials are inputs here: only the combines are timed
        outs = []
        for _ in range(self.cache.n_layers):
            outs.append(self.combine(out, lse))
            out = self.local_query(outs[-1])  # chained, as the step's layers are
        return outs

    def check(self) -> dict:
        mx.eval(self.step())
        out = self.combine(*self.attend(0, self.local_query(self.q)))  # every rank: collective
        mx.eval(out)
        if self.rank != 0:
            return {}
        fmt, f32 = self.fmt, mx.float32
        k, v = (
            fmt.encode(self.k32.astype(fmt.compute_dtype)),
            fmt.encode(self.v32.astype(fmt.compute_dtype)),
        )  # the whole cache as the ranks store it (encoding is per row)
        ref = reference(self.q32, k, v, fmt, scale=self.scale)
        parity_gate(f"partial x{self.case.shards} by {self.case.shard_by}", out, ref, self.q.dtype)
        exact = reference(
            self.q32, {"data": self.k32}, {"data": self.v32}, get_format("fp32"), scale=self.scale
        )
        return {
            **compare_outputs(out, exact),
            "kv_recon_err": recon_err(
                (fmt.decode(k, f32), fmt.decode(v, f32)), (self.k32, self.v32)
            ),
        }


def agree_with(group, rank: int):
    """The stop decision every rank shares: rank 0's (an all_sum where only rank 0 votes)."""

    def agree(done: bool) -> bool:
        vote = mx.array(1.0 if done and rank == 0 else 0.0)
        return mx.distributed.all_sum(vote, group=group).item() > 0

    return agree


def all_ok(group, ok: bool) -> bool:
    return mx.distributed.all_sum(mx.array(0.0 if ok else 1.0), group=group).item() == 0


def measure(rank: Rank, plans: dict) -> dict[str, list[float]]:
    fns = {"step": rank.step, "write": rank.write, "attend": rank.attend_all, "comm": rank.comm}
    agree = agree_with(rank.group, rank.rank)
    samples = {}
    for stage, plan in plans.items():
        plan = dict(plan)
        timer.warm_up(fns[stage], plan.pop("warmup_s"), agree=agree)
        samples[stage] = timer.sample(fns[stage], agree=agree, **plan)
    return samples


def run(case: Case, group, spec: dict) -> dict:
    rank = Rank(case, group)
    accuracy, failure, filled = {}, None, None
    try:  # every rank's cache resident (engines/residency.py), then the parity check
        filled = residency.check(rank.cache.arrays, rank.baseline, "after the fill")
        if spec["check"]:
            accuracy = rank.check()
    except Exception as exc:  # tell the other ranks before they wait in a collective
        failure = exc
    if not all_ok(group, failure is None):
        raise failure or RuntimeError("another rank failed the check")
    mx.synchronize()
    mx.reset_peak_memory()
    samples = measure(rank, spec["plans"])
    mx.synchronize()
    peak = mx.get_peak_memory() - rank.baseline
    ended = residency.check(rank.cache.arrays, rank.baseline, "after the timed stages")
    return {
        "samples": samples,
        "accuracy": accuracy,
        "alloc_bytes": rank.alloc_bytes,
        "peak_mem_bytes": peak,
        "extra": residency.row_fields(filled, ended),  # rank 0's, as every figure
    }


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    mx.set_default_device(mx.gpu if spec["device"] == "gpu" else mx.cpu)
    group = mx.distributed.init(strict=True)
    case = Case(**spec["case"])
    try:
        result = run(case, group, spec)
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
        result = {"error": text, "kind": type(exc).__name__, "rank": group.rank()}
        if group.rank() != 0:  # rank 0 may never write: say it on stderr, end with failure
            print(f"kvbench rank {group.rank()}: {text}", file=sys.stderr, flush=True)
            return 1
    if group.rank() == 0:
        write_json(out_path, result)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

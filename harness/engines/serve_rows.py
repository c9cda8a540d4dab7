"""Phase serve's facts that both of its engines read: kvbench's (harness/engines/serve.py) and
llama.cpp's (harness/engines/llamacpp.py runs llama-batched-bench through `llamacpp_job`).

A case: pp = context_len prompt tokens per sequence, tg = gen_tokens, pl = n_seqs; workload
shared-prefix shares one prompt (llama-batched-bench -pps).
"""

from __future__ import annotations

from kvbench.case import Case
from kvbench.engines.contract import JobResult
from kvbench.kernels.model import serve
from kvbench.peers.llamacpp_batched import FIELDS, TOOL, run_batched
from kvbench.suite.cache_spec import SERVE_PHASE as PHASE

__all__ = ["PHASE", "TOOL", "held_cells", "llamacpp_job", "shared", "stream_cells"]


def shared(case: Case) -> bool:
    return case.workload == "shared-prefix" and case.n_seqs > 1


def _schedule(case: Case) -> tuple:
    return (case.context_len, case.gen_tokens, case.n_seqs, shared(case),
            case.layout == "unified")  # fmt: skip


def stream_cells(case: Case) -> int:
    """Cells one stream needs (kernels/model/serve.py stream_cells)."""
    return serve.stream_cells(*_schedule(case))


def held_cells(case: Case) -> int:
    """Cells held after the schedule: llama-batched-bench's N_KV (kernels/model/serve.py)."""
    return serve.cells_held(*_schedule(case))


def llamacpp_job(case: Case, gguf, types: tuple[str, str], env: dict, threads: int):
    """The llama.cpp engine's job for phase serve: llama-batched-bench on the same GGUF with
    the case's -npp/-ntg/-npl, -pps for a shared prompt, -kvu for unified, the K/V types,
    flash attention and threads; -c the cells the schedule holds (per-stream: pl streams of
    pp + tg). Its n_kv (n_kv_req) must be kvbench's (the same formula), else an error row."""

    def job(plans: dict, first: bool) -> JobResult:
        if not first:
            return JobResult({}, {})
        pp, tg, pl = case.context_len, case.gen_tokens, case.n_seqs
        ctx = pl * (pp + tg) if case.layout != "unified" else held_cells(case)
        got = run_batched(gguf, pp=pp, tg=tg, pl=pl, shared=shared(case),
                          unified=case.layout == "unified", ctx=ctx, type_k=types[0],
                          type_v=types[1], flash_attn=True, threads=threads, env=env)  # fmt: skip
        if got["n_kv_req"] != held_cells(case):
            raise ValueError(f"{got['n_kv_req']} KV cells from llama-batched-bench, "
                             f"{held_cells(case)} here")  # fmt: skip
        mem = got.pop("memory")
        fields = {k: got[k] for k in FIELDS.values()}
        compute = mem.get("compute_bytes", 0) + mem.get("output_bytes", 0) or None
        extra = {"peer_kv_types": "/".join(types), "peer_kv_bytes": mem.get("kv_bytes"),
                 "peer_kv_cells": mem.get("kv_cells"), "peer_compute_bytes": compute}  # fmt: skip
        return JobResult({}, fields, extra={k: v for k, v in extra.items() if v is not None})

    return job

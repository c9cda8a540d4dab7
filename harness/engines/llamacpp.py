"""The llama.cpp engine: llama.cpp itself (harness/peers/llamacpp.py; `make llamacpp` builds it) on
the same GGUF as kvbench's model engine, so its rows sit beside the `model_decode` and `quality`
rows of the same model, depth, text and K/V types (docs/peers.md).

* model_decode: `llama-bench -p 0 -n N -d context_len-1 -ctk K -ctv V -fa 1 -t T -r R`: a cached
  prompt of context_len - 1 tokens (untimed), then N decode steps; one sample per repetition =
  that repetition's time per token (llama-bench's samples_ns / N). Depth context_len - 1, as the
  model engine's step decodes the context_len-th token. Memory: llama.cpp's own figures from
  one more, untimed repetition with its log on (-v): peer_kv_bytes, peer_compute_bytes,
  peer_kv_cells; peak_mem_bytes their sum (its context's buffers, allocated up front).
* quality: `llama-perplexity -c context_len --chunks C` over the same text file, first with an
  f16 cache saving its log-probabilities (--kl-divergence-base, once per text, context and
  chunks), then with the case's K/V types against them (--kl-divergence): ppl, ppl_ref (the f16
  cache's), delta_ppl, kl_mean, kl_p99, top1_agree. llama-perplexity scores the second half of
  each chunk, as the model engine does; its reference is an f16 cache (peer_ref_kv_types: with
  -fa an f32 cache is cast to f16 before the attention, src/llama-graph.cpp, so an f32 base
  computes the same) and the logits of its base run are saved in 16 bits, where kvbench's
  reference is a float32 cache.
* peer_weights f32: llama.cpp runs the GGUF dequantized to float32 (harness/peers/
  llamacpp_weights.py, made once), the weights kvbench's model engine runs; on the GGUF as
  stored its products round activations to q8 and amplify any small change (docs/peers.md).
  Per-token values (the run's tokens file, store/tokens.py): llama-perplexity prints none, so
  the case's pass runs once more saving its own log-probabilities (--kl-divergence-base, a file
  removed once read), and each scored token's nll and KL(base || case) are read from the two
  files (peers/llamacpp_kl.py token_values), checked against the printed KL mean; a true token
  more than 16 nats under the top is saved at the file's floor, and its nll is put back from
  the printed perplexity (floored_nll_fix).
* retrieval, task passkey-llamacpp only: `llama-passkey --junk N --pos P` per trial
  (harness/peers/llamacpp_passkey.py), N and P those of kvbench's prompt of the same context,
  depth and trial (kernels/model/passkey.py), so both answer one prompt; its f16 cache's answers
  are the reference the agreement is counted against; every trial's answer text is kept
  (answer_texts), and prompt_tokens is llama.cpp's own count.
K/V types: kv_dtype (and v_dtype) mapped by harness/peers/llamacpp.py cache_type (fp16 -> f16,
int8/g32
-> q8_0, int4/g32 -> q4_0, affine4/g32 -> q4_1, ...); a format llama.cpp lacks is a skip.
Rotation: llama.cpp b11434 rotates quantized K/V by a Hadamard by default (PR #21038); a case's
rotate_k / rotate_v say which run it is: `none` runs with LLAMA_ATTN_ROT_DISABLE=1, `hadamard`
without it (harness/peers/llamacpp.py rotations; any other combination is a skip). Keys are in
the order llama.cpp's cache holds: rows record k_order gguf for llama-architecture models, hf
for the others (kernels/model/load.py llamacpp_key_order).
Threads: KVBENCH_LLAMACPP_THREADS (default 1: two threads on a loaded 2-core machine measured
under 1 token/s, docs/peers.md). The byte and FLOP model is the model engine's.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvbench.case import Case
from kvbench.engines import common
from kvbench.engines import serve_rows as serve
from kvbench.engines.contract import TOKENS, JobResult, State
from kvbench.kernels.formats.rotation import default_block
from kvbench.kernels.model import passkey
from kvbench.kernels.model.fetch import require_model
from kvbench.kernels.model.load import llamacpp_key_order
from kvbench.kernels.model.text import default_text, text_file
from kvbench.peers import llamacpp, llamacpp_kl
from kvbench.peers.llamacpp_passkey import TOOL, run_passkey
from kvbench.peers.llamacpp_perplexity import run_perplexity
from kvbench.peers.llamacpp_weights import weights_file
from kvbench.suite import model_edit
from kvbench.suite.resolved import Resolved

KERNEL = "llama.cpp"
N_GEN = 16  # decode steps per llama-bench repetition
MAX_REPS = 20


def claims(case: Case) -> bool:
    return case.kernel == KERNEL


def types_of(case: Case) -> tuple[str | None, str | None]:
    v = case.v_dtype or case.kv_dtype
    return llamacpp.cache_type(case.kv_dtype, case.group_size), llamacpp.cache_type(
        v, case.group_size
    )


def rotation_env(case: Case) -> dict:
    """LLAMA_ATTN_ROT_DISABLE=1 unless the case asks for a rotation: llama.cpp rotates
    quantized K/V by default, so a row that says `none` must turn it off."""
    asked = "hadamard" in (case.rotate_k, case.rotate_v)
    return {} if asked else {"LLAMA_ATTN_ROT_DISABLE": "1"}


def rotation_reason(case: Case) -> str | None:
    """Why llama.cpp cannot run the case's rotations (it rotates K and V together, in blocks
    of its own rule: kernels/formats/rotation.py default_block)."""
    for part, block in (("k", case.rot_block_k), ("v", case.rot_block_v)):
        rule = default_block(case.head_dim, part) if block is not None else None
        if block is not None and block != rule:
            return f"llama.cpp rotates {part.upper()} in blocks of {rule}, not {block}"
    type_k, type_v = types_of(case)
    disabled = bool(rotation_env(case))
    want = llamacpp.rotations(type_k, type_v, case.head_dim, disabled)
    if (case.rotate_k, case.rotate_v) == want:
        return None
    on = llamacpp.rotations(type_k, type_v, case.head_dim, False)
    return (
        f"llama.cpp rotates K/V {type_k}/{type_v} as rotate_k={on[0]}, rotate_v={on[1]} "
        "(or neither, with LLAMA_ATTN_ROT_DISABLE=1)"
    )


TOOLS = {"model_decode": "llama-bench", "quality": "llama-perplexity", "retrieval": TOOL,
         serve.PHASE: serve.TOOL}  # fmt: skip


def skip_reason(case: Case, backend: str) -> str | None:
    if case.phase not in TOOLS:
        return f"kernel {KERNEL} runs the phases {', '.join(TOOLS)}"
    if case.phase == "retrieval" and case.task != passkey.TASK:
        return f"llama.cpp's retrieval is {TOOL}: task {passkey.TASK} only"
    if case.k_axis != "token" or case.sink_tokens or case.recent_tokens:
        return "llama.cpp's cache has per-token blocks only (no channel keys, sinks or window)"
    for name in (case.kv_dtype, case.v_dtype or case.kv_dtype):
        reason = llamacpp.cache_type_reason(name, case.group_size)
        if reason:
            return reason
    if reason := rotation_reason(case):
        return reason
    return llamacpp.missing_reason(TOOLS[case.phase])


def threads() -> int:
    return int(os.environ.get("KVBENCH_LLAMACPP_THREADS", "1"))


@lru_cache(maxsize=4)
def text_path(text: str) -> Path:
    """The case's text as a file llama-perplexity reads (the default text written once)."""
    if text != "default":
        text_file(text)  # the same checks as the model engine's
        return Path(text)
    path = llamacpp.cache_root() / "texts" / "default.txt"
    body = default_text()
    if not path.is_file() or path.read_text(encoding="utf-8") != body:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    return path


@lru_cache(maxsize=16)
def bench_memory(gguf: Path, depth: int, type_k: str, type_v: str, env: tuple) -> dict:
    """llama.cpp's own memory figures for a decode case: one untimed repetition with its log
    on (-v), the same context; the timed runs stay exactly as they were, without the log."""
    [res] = llamacpp.run_bench(
        gguf, depth=depth, n_gen=N_GEN, type_k=type_k, type_v=type_v, flash_attn=True,
        threads=threads(), reps=1, env=dict(env), verbose=True,
    )  # fmt: skip
    return res.get("memory", {})


def memory_fields(mem: dict) -> tuple[dict, int | None]:
    """(row fields, peak_mem_bytes) from llama.cpp's figures: the peak is its context's buffers
    (KV, compute, output), which ggml allocates up front at their planned size."""
    fields = {
        "peer_kv_bytes": mem.get("kv_bytes"),
        "peer_compute_bytes": mem.get("compute_bytes", 0) + mem.get("output_bytes", 0) or None,
        "peer_kv_cells": mem.get("kv_cells"),
    }
    parts = [mem.get(k) for k in ("kv_bytes", "compute_bytes", "output_bytes")]
    peak = sum(p for p in parts if p) if mem.get("kv_bytes") else None
    return {k: v for k, v in fields.items() if v is not None}, peak


def decode_job(case: Case, gguf: Path):
    type_k, type_v = types_of(case)

    def job(plans: dict, first: bool) -> JobResult:
        step = plans.get("step", {})
        reps = max(1, min(MAX_REPS, step.get("max_samples", 5)))
        [res] = llamacpp.run_bench(
            gguf, depth=case.context_len - 1, n_gen=N_GEN, type_k=type_k, type_v=type_v,
            flash_attn=True, threads=threads(), reps=reps, env=rotation_env(case),
        )  # fmt: skip
        env = tuple(sorted(rotation_env(case).items()))
        mem = bench_memory(gguf, case.context_len - 1, type_k, type_v, env)
        fields, peak = memory_fields(mem)
        extra = {"peer_kv_types": f"{res.get('type_k')}/{res.get('type_v')}", **fields}
        return JobResult({"step": res["step_ms_samples"]}, {}, peak_mem_bytes=peak, extra=extra)

    return job


REF_KV = "f16"  # the base pass's cache: -ctk f32 with -fa is cast to f16 (llama-graph.cpp)


@lru_cache(maxsize=8)
def base_logits(
    gguf: Path, text: str, ctx: int, chunks: int, base_type: str = REF_KV
) -> tuple[Path, dict]:
    """The reference run (K/V cache type base_type) that saves the log-probabilities KL is
    measured against (once per process for a GGUF, text, context, chunks and type: every K/V
    type's row reads the same file)."""
    name = f"{gguf.stem}-{text_path(text).stem}-{ctx}x{chunks}"
    name += "" if base_type == "f16" else f"-{base_type}"  # f16: the file's name as before
    base = llamacpp.cache_root() / "kl" / f"{name}.kld"
    base.parent.mkdir(parents=True, exist_ok=True)
    common = dict(ctx=ctx, chunks=chunks, flash_attn=True, threads=threads())
    # written under this process's own name, then renamed: another process running the same
    # base at the same time (the name is shared through the cache) never reads a half-written
    # file, and a pass that has the file open keeps reading the one it opened
    part = base.with_name(f"{base.name}.{os.getpid()}.part")
    try:
        ref = run_perplexity(gguf, text_path=text_path(text), kl_base=part, type_k=base_type,
                             type_v=base_type, **common)  # fmt: skip
        os.replace(part, base)
    finally:
        part.unlink(missing_ok=True)
    return base, ref


def token_pass(gguf: Path, case: Case, base: Path, base_type: str) -> tuple[dict, dict | None]:
    """The case's pass once more, saving its own log-probabilities (--kl-divergence-base into
    the cache's kl/ folder; llama-perplexity prints no per-token values), read against the
    base's: (llamacpp_kl.token_values, what that pass printed). The file (as large as the
    base's) is removed once read. A case whose cache is the base's reads the base file alone."""
    type_k, type_v = types_of(case)
    if type_k == type_v == base_type:  # an unquantized cache: llama.cpp rotates none
        values = llamacpp_kl.token_values(*[llamacpp_kl.read_kl_base(base)] * 2)
        return values, None
    path = base.with_name(f"{base.stem}-{type_k}-{type_v}-{os.getpid()}.kld")
    try:
        got = run_perplexity(
            gguf, text_path=text_path(case.text), kl_base=path, ctx=case.context_len,
            chunks=case.chunks, type_k=type_k, type_v=type_v, flash_attn=True,
            threads=threads(), env=rotation_env(case),
        )  # fmt: skip
        values = llamacpp_kl.token_values(
            llamacpp_kl.read_kl_base(base), llamacpp_kl.read_kl_base(path)
        )
    finally:
        path.unlink(missing_ok=True)
    return values, got


def cost_fields(res: dict) -> dict:
    """The row's cost columns from a llama-perplexity result: the process's wall seconds and
    its own prefill timing (llamacpp_perplexity.pass_info: the first pass, the one it times; else
    perf_info's closing timings), with tokens per second."""
    out = {"wall_s": res["wall_s"]}
    for kind in ("prefill", "decode"):
        n, s = res.get(f"{kind}_tokens"), res.get(f"{kind}_s")
        out |= {f"{kind}_tokens": n, f"{kind}_s": s if n else None}
        out[f"{kind}_tokens_per_s"] = n / s if n and s else None
    return out


def quality_job(case: Case, gguf: Path):
    type_k, type_v = types_of(case)

    def job(plans: dict, first: bool) -> JobResult:
        if not first:
            return JobResult({}, {})
        base, ref = base_logits(gguf, case.text, case.context_len, case.chunks)
        got = run_perplexity(
            gguf, text_path=text_path(case.text), kl_base=base, kl=True, ctx=case.context_len,
            chunks=case.chunks, type_k=type_k, type_v=type_v, flash_attn=True, threads=threads(),
            env=rotation_env(case),
        )  # fmt: skip
        ppl_ref = got.get("ppl_base", ref["ppl"])
        accuracy = {
            "ppl": got["ppl"], "ppl_ref": ppl_ref, "delta_ppl": got["ppl"] - ppl_ref,
            "kl_mean": got["kl_mean"], "kl_p99": got.get("kl_p99"),
            "kl_err": got.get("kl_mean_err"), "ppl_err": got.get("ppl_err"),
            "top1_agree": got.get("same_top_p"),
            "n_scored": case.chunks * (case.context_len // 2 - 1),  # second half, less one
            # llama-perplexity starts every chunk with BOS where the GGUF's vocabulary adds one
            "chunk_bos": common.chunk_bos(case.model) is not None,
            # no -ub given: llama-perplexity's n_ubatch default (common/common.h), per chunk
            "ubatch": common.ubatch_of(case),
        }  # fmt: skip
        accuracy |= cost_fields(got) | {"ref_wall_s": ref["wall_s"]}
        values, again = token_pass(gguf, case, base, REF_KV)
        check_tokens(values, got, again)
        values = llamacpp_kl.floored_nll_fix(values, got["ppl"])
        accuracy[TOKENS] = {k: values[k] for k in ("chunk", "position", "token", "nll", "kl")}
        extra = {"peer_kv_types": f"{type_k}/{type_v}", "peer_ref_kv_types": f"{REF_KV}/{REF_KV}"}
        return JobResult({}, accuracy, extra=extra)

    return job


KL_ATOL = 2e-4  # nats: the saved log p's step is 16/65535 = 2.4e-4, its rounding half that


def check_tokens(values: dict, kl_run: dict, token_run: dict | None) -> None:
    """The per-token values are llama.cpp's: their mean KL is the KL pass's printed mean to
    within the 16-bit rounding of the saved log p (KL_ATOL), and the pass that saved them
    printed the KL pass's perplexity (the same computation twice). ValueError otherwise."""
    kl = float(np.mean(values["kl"]))
    if abs(kl - kl_run["kl_mean"]) > KL_ATOL:
        raise ValueError(f"per-token KL mean {kl:.6g}, llama-perplexity printed "
                         f"{kl_run['kl_mean']:.6g}: the saved values are not its")  # fmt: skip
    if token_run is not None and not math.isclose(token_run["ppl"], kl_run["ppl"], rel_tol=1e-4):
        raise ValueError(f"the per-token pass printed ppl {token_run['ppl']}, the KL pass "
                         f"{kl_run['ppl']}: not the same computation")  # fmt: skip


@lru_cache(maxsize=64)
def passkey_answer(gguf: Path, n_junk: int, i_pos: int, type_k: str, type_v: str, env: tuple,
                   edit: tuple = ()):  # fmt: skip
    """llama-passkey's answer; `edit`: edit_args' keyword arguments as pairs."""
    return run_passkey(gguf, n_junk=n_junk, i_pos=i_pos, type_k=type_k, type_v=type_v,
                       flash_attn=True, threads=threads(), env=dict(env), **dict(edit))  # fmt: skip


def edit_args(case: Case, model, tokenizer) -> tuple[tuple, object]:
    """llama-passkey's arguments for the case's kv_edit (suite/model_edit.py) as pairs, and the
    Schedule kvbench replays: --keep, -b, --grp-attn-n, --swa-full for swa_cache full and, for
    context_limit N, the GGUF's context_length overridden to N; ((), None) without an edit."""
    edit = model_edit.edit_of(case)
    if edit is None:
        return (), None
    sch = model_edit.schedule_for(edit, case.model, model, tokenizer)
    args = {"keep": sch.n_keep, "n_batch": sch.n_batch, "grp_attn_n": sch.ga_n}
    args |= {"swa_full": True} if sch.swa_full else {}
    if model_edit.numeric_limit(case) is not None:
        args["ctx_train"] = (model.metadata.get("general.architecture", "llama"), sch.n_ctx_train)
    return tuple(sorted(args.items())), sch


def check_context(run: dict, sch) -> None:
    """llama-passkey sized the context kvbench replays (its own log line), else ValueError: a
    row never pairs answers read through two different contexts."""
    got = (run.get("n_ctx"), run.get("n_kv_req"), run.get("n_batch"), run.get("n_grp"),
           run.get("swa_full", False))  # fmt: skip
    want = (sch.n_ctx, sch.n_cells, sch.n_batch, sch.ga_n, sch.swa_full)
    if got != want:
        raise ValueError(f"llama-passkey's context (n_ctx, cells, n_batch, n_grp, swa_full) "
                         f"{got}, kvbench's schedule {want}")  # fmt: skip


def passkey_cost(runs: list[dict]) -> dict:
    """A passkey row's cost columns: the llama-passkey processes' wall seconds, their prompts'
    tokens (prefill, which the tool does not time) and their answers' tokens and seconds by
    the tool's own clock (decode), with tokens per second. A run shared with an earlier row
    (the same prompt and cache: passkey_answer's cache) counts its first run's figures."""
    decode_n = sum(r.get("decode_tokens") or 0 for r in runs)
    decode_s = sum(r.get("decode_s") or 0.0 for r in runs)
    return {
        "wall_s": sum(r["wall_s"] for r in runs),
        "prefill_tokens": sum(r["prompt_tokens"] for r in runs),
        "decode_tokens": decode_n,
        "decode_s": decode_s if decode_n else None,
        "decode_tokens_per_s": decode_n / decode_s if decode_n and decode_s > 0 else None,
    }


def retrieval_job(case: Case, gguf: Path, edit: tuple = (), sch=None):
    type_k, type_v = types_of(case)
    env = tuple(sorted(rotation_env(case).items()))

    def job(plans: dict, first: bool) -> JobResult:
        if not first:
            return JobResult({}, {})
        key = (case.model, case.task, case.context_len, case.depth, case.trials, case.seed)
        runs, refs = [], []
        for i, p in enumerate(common.prompts_of(*key)):
            at = (gguf, p.units, passkey.position(p.units, case.depth, i))
            runs.append(passkey_answer(*at, type_k, type_v, env, edit))
            refs.append(passkey_answer(*at, "f16", "f16", (), edit))
        texts = [r["answer_text"] for r in runs]
        truth = [r["key"] for r in runs]
        row = common.answer_fields(case.task, texts, [r["answer_text"] for r in refs], truth)
        row["prompt_tokens"] = max(r["prompt_tokens"] for r in runs)
        row |= passkey_cost(runs) | {"ref_wall_s": sum(r["wall_s"] for r in refs)}
        if sch is not None:
            for r in runs + refs:
                check_context(r, sch)
            row |= {"kv_shifts": sum(len(r["shifts"]) for r in runs),
                    "cells_alloc": runs[0]["n_kv_req"]}  # fmt: skip
        return JobResult({}, row, extra={"peer_kv_types": f"{type_k}/{type_v}"})

    return job


JOBS = {"model_decode": decode_job, "quality": quality_job, "retrieval": retrieval_job}


def build(case: Case, r: Resolved) -> State:
    # peer_weights f32: the GGUF dequantized to float32 (harness/peers/llamacpp_weights.py)
    gguf = weights_file(require_model(case.model), case.peer_weights)
    model, tokenizer = common.model_of(case.model)
    info = llamacpp.build_info()
    extra = {"peer_version": f"llama.cpp {info.get('tag', info.get('version', '?'))}",
             "peer_threads": threads()}  # fmt: skip
    decode = case.phase == "model_decode"
    # a kv_edit: llama-passkey's arguments, kvbench's schedule; its n_keep in effect, seq_div's
    # sign as llama.cpp records it, the context's cells as the positions held
    edit, sch = edit_args(case, model, tokenizer)
    edited = {} if sch is None else {"n_keep": sch.n_keep}
    edited |= {"div_sign": "llama.cpp"} if sch is not None and sch.ga_n > 1 else {}
    order = llamacpp_key_order(model.config.arch)
    held = None if sch is None else min(case.context_len, sch.n_cells)
    if case.phase == "retrieval":
        job = retrieval_job(case, gguf, edit, sch)
    elif case.phase == serve.PHASE:  # llama-batched-bench (harness/engines/serve.py)
        job = serve.llamacpp_job(case, gguf, types_of(case), rotation_env(case), threads())
        held = serve.held_cells(case)
    else:
        job = JOBS[case.phase](case, gguf)
    return State(
        {"step": lambda: None} if decode else {},
        lambda: {},
        traffic=common.decode_traffic(case, model, r.spec) if decode else (0, 0),
        flops=common.decode_flops(case, model) if decode else None,
        kv_bytes=common.model_kv_bytes(case, r.spec, held),
        bits_per_elem=common.model_bits_per_elem(case, r.spec),
        baseline_bytes=None,  # llama.cpp's memory is not MLX's
        # llama.cpp's key order for the model, rotated in its own blocks
        effective={"k_order": order, **common.model_effective(case), **edited},
        extra=extra,
        job=job,
    )

"""The real-model phases and the model cache a case asks for (a CacheSpec from its axes).

Here, not in the model engine, so that validating a suite needs no engine: suite/validate.py
checks the spec's formats before anything runs, and the model engine builds the cache from it.
"""

from __future__ import annotations

from functools import cache

from kvbench.case import Case
from kvbench.kernels.formats.fp8 import KINDS as FP8_KINDS
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.formats.rotation import block_size
from kvbench.kernels.model.spec import CacheSpec

TASK_PHASES = ("retrieval", "generate")  # harness/engines/model_tasks.py
SERVE_PHASE = "serve"  # many sequences decoding together (harness/engines/serve.py)
MODEL_PHASES = ("quality", "model_decode", *TASK_PHASES, SERVE_PHASE)


def spec_of(case: Case) -> CacheSpec:
    return CacheSpec(
        k_dtype=case.kv_dtype,
        v_dtype=case.v_dtype,
        k_group=case.group_size,
        v_group=case.group_size if case.v_dtype else None,  # group_size: K's and V's
        k_axis=case.k_axis,
        # with a sliding window, sink_tokens are the window's sinks (engines/model.py windowed)
        sink_tokens=case.sink_tokens if case.window is None else 0,
        recent_tokens=case.recent_tokens,
        rotate_k=case.rotate_k,
        rotate_v=case.rotate_v,
        k_order=case.k_order,
        q_quant=case.q_quant,
        fp8_scale=case.fp8_scale,
        rot_block_k=case.rot_block_k,
        rot_block_v=case.rot_block_v,
    )


def rotation_blocks(case: Case) -> tuple[int | None, int | None]:
    """(K's, V's) Hadamard block in effect: the case's rot_block_k / rot_block_v, else
    llama.cpp's rule (kernels/formats/rotation.py default_block); None where not rotated."""
    return tuple(
        None if rot == "none" else block_size(case.head_dim, block, part)
        for rot, block, part in (
            (case.rotate_k, case.rot_block_k, "k"),
            (case.rotate_v, case.rot_block_v, "v"),
        )
    )


@cache
def _format(kv_dtype: str, group_size: int | None, fp8_scale):
    return get_format(kv_dtype, group_size, fp8_scale)


def format_of(case: Case):
    """The case's K format (kv_dtype at group_size, an FP8 format at fp8_scale), resolved once
    per (kv_dtype, group_size, fp8_scale)."""
    scale = case.fp8_scale if case.kv_dtype in FP8_KINDS else "one"
    return _format(case.kv_dtype, case.group_size, scale)


def v_format_of(case: Case):
    """The case's V format: v_dtype's (at group_size, an FP8 format at fp8_scale) when set,
    else K's."""
    if not case.v_dtype:
        return format_of(case)
    scale = case.fp8_scale if case.v_dtype in FP8_KINDS else "one"
    return _format(case.v_dtype, case.group_size, scale)

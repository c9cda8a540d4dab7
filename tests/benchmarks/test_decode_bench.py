"""A few representative decode steps as pytest-benchmark tests (`make bench-pytest`).

Each test times exactly what `kvbench run` times for the same case: the cache engine's "step"
(write the new token's K/V into every layer, attend over the whole cache), with `mx.eval` of
the outputs and `mx.synchronize()` inside the timed call; building and filling the cache, the
parity check and warm-up are outside it. The case's fields and the run context go into
`extra_info`, so `kvbench import` gives rows with the same case_id as `kvbench run`.
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

from kvbench.engines.cache import build
from kvbench.engines.contract import carrying
from kvbench.run.context import run_context
from kvbench.suite.suite import resolve

CASES = [
    {"model": "tiny", "context_len": 256, "kv_dtype": "fp16", "kernel": "sdpa"},
    {"model": "tiny", "context_len": 256, "kv_dtype": "fp32", "kernel": "sdpa"},
    {"model": "tiny", "context_len": 256, "kv_dtype": "fp16", "kernel": "ops"},
]
CONTEXT_KEYS = ("device", "backend", "mlx_version", "kvbench_version", "schema_version")


@pytest.mark.parametrize("combo", CASES, ids=lambda c: f"{c['kv_dtype']}-{c['kernel']}")
def test_decode_step(benchmark, combo):
    case = resolve("tests/benchmarks", combo)
    state = carrying(build)(case)
    state.check()  # parity gate: a wrong kernel is never timed
    step = state.stages["step"]

    def timed():
        mx.eval(step())
        mx.synchronize()

    ctx = run_context()
    benchmark.extra_info.update(
        case=dataclasses.asdict(case),
        case_id=case.case_id,
        **{k: ctx[k] for k in CONTEXT_KEYS},
    )
    benchmark.pedantic(timed, rounds=20, iterations=1, warmup_rounds=3)

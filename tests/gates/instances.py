"""Every kernel instantiation the shipped suites can launch, and the calls they make.

Instantiations come from suites/*.yaml: each case whose kernel is `metal` or `cuda` and that the
harness would run on that backend (harness skip_reason is None), called through the kernel
registry exactly as the cache engine calls it, on a cache built by kernels.cache.KVCache, plus
tiny shapes (fewer than 8 elements in some input: MLX passes those as Metal `constant` memory).
Nothing is evaluated: the arrays are lazy, so a 128K-token cache allocates nothing.

The custom-kernel factory (`mx.fast.cuda_kernel` / `mx.fast.metal_kernel`) is swapped for a
recorder while the wrapper runs, so the gate sees the name, header, source, inputs, template
and launch that kernels/attention/gpu/kernels.py really passes, whatever its algorithm.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx

from gates.cuda_wrap import Call, dtype_name
from kvbench.case import Case
from kvbench.engines import skip_reason
from kvbench.engines.common import call_problem
from kvbench.kernels.attention.gpu import encode as gpu_encode
from kvbench.kernels.attention.gpu import kernels as gpu_kernels
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import KVCache
from kvbench.suite.suite import expand, load_suite

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("cuda", "metal")
# (kv_dtype, group_size, head_dim, gqa, kv_len), one sequence and one kv head: dense D=4 L=1
# makes q, k and v 4 elements; 4-bit D=8 L=3 makes the packed k, v and per-row scales 3 words
# (B*Hkv*L < 8: MLX passes them as Metal `constant`); int4/32 with D=32 has 3 scales. FP8 D=4
# L=1: 4 bytes of K (padded to 8 by the wrapper) and one head scale (`constant`); iq4_nl D=32
# L=3: 3 block scales; FP8 and iq4_nl at D=128, GQA 4 and 8 (4- and 8-byte vectors); tq4_mse D=8
# L=3 (3 norms) and tq2_mse D=16 L=1 (4 bytes of codes), and both at D=128 GQA 4
TINY = [("fp16", None, 4, 1, 1), ("bf16", None, 4, 2, 1), ("fp32", None, 4, 1, 1),
        ("fp4", None, 8, 1, 3), ("int4", None, 8, 1, 3), ("int4", 32, 32, 2, 3),
        ("fp16", None, 64, 4, 3), ("fp8_e4m3", None, 4, 1, 1), ("fp8_e5m2", None, 8, 2, 1),
        ("iq4_nl", None, 32, 1, 3), ("fp8_e4m3", None, 128, 4, 3), ("fp8_e5m2", None, 128, 8, 3),
        ("iq4_nl", None, 128, 4, 3), ("iq4_nl", None, 128, 1, 3), ("tq4_mse", None, 8, 1, 3),
        ("tq2_mse", None, 16, 2, 1), ("tq4_mse", None, 128, 4, 3),
        ("tq2_mse", None, 128, 4, 3)]  # fmt: skip


# The quantize-on-write kernel (kernels/attention/gpu/encode.py), one instantiation per format
# (format, group_size, head_dim, n_kv_heads): Llama's 8 KV heads at D=128, fp4 per group of 32
# and int4 per row, and a tiny FP8 E5M2 row (D=4, one head: the inputs and the head scales under
# 8 elements, so Metal gets them as `constant`). Not from the suites: no suite writes through it
# yet (docs/kernels.md).
ENCODE = [("fp4", 32, 128, 8), ("int4", None, 128, 8), ("q4_0", None, 128, 8),
          ("q8_0", None, 128, 8), ("fp8_e4m3", None, 128, 8), ("fp8_e5m2", None, 4, 1)]  # fmt: skip


def encode_cases() -> list[tuple[str, tuple]]:
    return [("encode", spec) for spec in ENCODE]


def call_encode(backend: str, spec: tuple) -> list[mx.array]:
    """One new token of one layer encoded by the kernel (lazy arrays)."""
    name, group, d, hkv = spec
    fp8 = {"fp8_scale": 0.5} if name in gpu_encode.FP8 else {}
    fmt = get_format(name, group, **fp8)
    x = mx.zeros((1, hkv, 1, d), dtype=mx.float16)
    k, v = gpu_encode.encode_kv(backend, fmt, fmt, x, x)
    return [*k.values(), *v.values()]


def call_any(backend: str, case) -> object:
    """A suite / tiny Case through the attention kernel, or an ENCODE spec through the encoder."""
    if isinstance(case, tuple):
        return call_encode(backend, case)
    return call_kernel(backend, case)


def suite_cases(backend: str) -> list[tuple[str, Case]]:
    out = []
    for path in sorted((ROOT / "suites").glob("*.yaml")):
        for case in expand(load_suite(str(path))):
            if case.kernel == backend and skip_reason(case, backend) is None:
                out.append((path.stem, case))
    return out


def tiny_cases(backend: str) -> list[tuple[str, Case]]:
    out = []
    for kv_dtype, gs, d, gqa, kv_len in TINY:
        case = Case(
            model="tiny", n_layers=1, n_q_heads=gqa, n_kv_heads=1, head_dim=d, context_len=kv_len,
            kv_dtype=kv_dtype, group_size=gs, kernel=backend,
        )  # fmt: skip
        assert skip_reason(case, backend) is None, skip_reason(case, backend)
        out.append(("tiny", case))
    return out


def call_kernel(backend: str, case: Case) -> mx.array:
    """Call the case's kernel as the cache engine does (lazy arrays, nothing evaluated)."""
    fmt = get_format(case.kv_dtype, case.group_size)
    p = call_problem(case, fmt)
    q = mx.zeros((p.n_seqs, p.n_q_heads, p.q_len, p.head_dim), dtype=fmt.compute_dtype)
    cache = KVCache(fmt, 1, p.n_seqs, p.n_kv_heads, case.context_len, p.head_dim)
    k, v = cache.view(0, case.context_len)
    scale = 1.0 / math.sqrt(p.head_dim)
    return KERNELS[backend].fn(q, k, v, fmt, mask=None, scale=scale, tile_kv=case.tile_kv)


@contextmanager
def swapped_factory(attr: str, factory):
    original = getattr(mx.fast, attr)

    def clear():  # a cached real kernel object would bypass the recorder
        gpu_kernels.compiled.cache_clear()
        gpu_encode.compiled.cache_clear()

    clear()
    setattr(mx.fast, attr, factory)
    try:
        yield
    finally:
        setattr(mx.fast, attr, original)
        clear()


def _fake_outputs(kw: dict) -> list:
    return [mx.zeros(s, dtype=d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"])]


def record_cuda(case) -> list[Call]:
    """The cuda_kernel calls kernels/attention/gpu/ makes for `case` (a Case, or an ENCODE
    spec)."""
    calls: list[Call] = []

    def factory(name, input_names, output_names, source, header="", **_):
        def launch(*, inputs, template=(), output_dtypes, **kw):
            calls.append(
                Call(
                    name=name,
                    header=header,
                    source=source,
                    input_names=tuple(input_names),
                    inputs=tuple((dtype_name(a.dtype), a.ndim, a.size) for a in inputs),
                    output_names=tuple(output_names),
                    output_dtypes=tuple(dtype_name(d) for d in output_dtypes),
                    template=tuple(
                        (n, v if isinstance(v, int) else dtype_name(v)) for n, v in template
                    ),
                )  # fmt: skip
            )
            return _fake_outputs({**kw, "output_dtypes": output_dtypes})

        return launch

    with swapped_factory("cuda_kernel", factory):
        call_any("cuda", case)
    return calls


GENERATED = re.compile(r"Generated source code for `[^`]*`:\n```\n(.*?)\n```", re.S)


@contextmanager
def _stdout_to(path: str):
    """Redirect file descriptor 1 (MLX prints from C++) into `path`."""
    saved = os.dup(1)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def metal_sources(case) -> list[str]:
    """The exact Metal source(s) MLX generates for `case`: the wrapper's metal_kernel calls,
    traced through mx.export_function (allowed without Metal) with verbose=True."""
    real = mx.fast.metal_kernel

    def factory(*args, **kwargs):
        kernel = real(*args, **kwargs)
        return lambda **kw: kernel(**{**kw, "verbose": True})

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "stdout.txt")
        with swapped_factory("metal_kernel", factory), _stdout_to(log):
            mx.export_function(os.path.join(tmp, "f.mlxfn"), lambda: call_any("metal", case))
        return GENERATED.findall(Path(log).read_text())

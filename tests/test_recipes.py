"""The recipes of docs/architecture.md, followed literally in a scratch copy of the tree (a toy
format, layout and peer added exactly as each recipe says), then the checks each recipe names,
run on the copy (tests/recipe_copy.py). A step the recipe leaves out makes its test fail."""

from __future__ import annotations

from recipe_copy import insert_after, kvbench_in, pytest_in, recipe, result_rows, scratch_copy

# a toy format: int8 codes with one fp16 step per row (its scale array named "steps", so the
# recipe's PART_ROLE step is needed: without it the steps would count as data)
TOY_FORMAT = '''
"""toy8: symmetric int8 per row, one fp16 step per row (a recipe test's format)."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvbench.kernels.formats.protocol import Format


@dataclass(frozen=True)
class Toy8(Format):
    group_size: int | None = None
    name = "toy8"
    quantized = True
    compute_dtype = mx.float16
    data_bits = 8

    def alloc(self, shape):
        return {"data": mx.zeros(shape, mx.int8), "steps": mx.zeros((*shape[:-1], 1), mx.float16)}

    def encode(self, x):
        step = (mx.max(mx.abs(x), axis=-1, keepdims=True) / 127).astype(mx.float16)
        safe = mx.where(step == 0, mx.array(1, mx.float16), step)
        return {"data": mx.round(x / safe).astype(mx.int8), "steps": step}

    def decode(self, stored, dtype=None):
        out = stored["data"].astype(mx.float32) * stored["steps"].astype(mx.float32)
        return out.astype(dtype or self.compute_dtype)

    def nbytes(self, n_rows, head_dim):
        return n_rows * (head_dim + 2)

    def mx_quantize_args(self):
        return None

    def describe_scales(self, head_dim):
        return "per row"
'''
TOY_TEST = """
import numpy as np
import mlx.core as mx

from kvbench.kernels.formats.registry import get_format


def test_toy8_against_numpy_and_by_hand():
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    fmt = get_format("toy8")
    step = np.abs(x).max(axis=-1, keepdims=True) / 127
    step16 = step.astype(np.float16).astype(np.float32)
    want = np.round(x / step16) * step16
    got = np.array(fmt.decode(fmt.encode(mx.array(x)), mx.float32))
    assert np.allclose(got, want, atol=1e-6)
    assert fmt.nbytes(3, 64) == 3 * 64 + 3 * 2  # one byte per value, two per row's step
"""


def test_the_add_a_format_recipe_followed_literally(tmp_path):
    text = recipe("Add a format")
    for named in ("kernels/formats/<name>.py", "kernels/formats/registry.py", "`FORMATS`",
                  "`PART_ROLE`", "suites/tradeoff.yaml", "tests/test_<name>.py"):  # fmt: skip
        assert named in text, named
    root = scratch_copy(tmp_path)
    (root / "kernels/formats/toy8.py").write_text(TOY_FORMAT)  # 1.
    registry = root / "kernels/formats/registry.py"  # 2.
    insert_after(
        registry,
        "from kvbench.kernels.formats import",
        "from kvbench.kernels.formats import toy8\n",
    )
    insert_after(registry, '"fp8_e5m2": fp8.fp8_format("fp8_e5m2")', '    "toy8": toy8.Toy8,\n')
    protocol = root / "kernels/formats/protocol.py"  # 3.
    protocol.write_text(
        protocol.read_text().replace("PART_ROLE = {", 'PART_ROLE = {"steps": "scales", ')
    )
    suite = root / "suites/tradeoff.yaml"  # 4.
    suite.write_text(suite.read_text().replace("tq2_prod]", "tq2_prod, toy8]", 1))
    (root / "tests/test_toy8.py").write_text(TOY_TEST)  # 5.
    got = pytest_in(root, "tests/test_toy8.py", "tests/test_formats.py", "tests/test_quant.py",
                    "tests/test_tradeoff.py::test_the_tradeoff_suite_covers_every_format_of_the_registry",
                    "tests/test_resolved.py", "-rA",
                    "-k", "toy8 or covers or mx_quantize or describe or grid")  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    ran = got.stdout
    assert "PASSED tests/test_toy8.py::test_toy8_against_numpy_and_by_hand" in ran
    assert "test_every_format_implements_the_protocol[toy8]" in ran  # its data_bits held too
    assert "covers_every_format" in ran and "over_the_grid" in ran


TOY_STORE = '''
"""toy: one buffer per sequence under its own name (a recipe test's layout)."""


def toy_cells(n_seqs: int, ctx: int) -> int:
    return n_seqs * ctx
'''
TOY_ENGINE = '''
"""toy: a recipe test's engine: the full cache, one buffer per sequence, one decode step."""

from __future__ import annotations

import math

from kvbench.case import Case
from kvbench.engines import common, metrics
from kvbench.engines.contract import State, allocated
from kvbench.engines.parity import compare_outputs, parity_gate
from kvbench.kernels.attention.registry import KERNELS, reference
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.stores.cache import KVCache
from kvbench.suite import resolved
from kvbench.suite.resolved import Resolved


def claims(case: Case) -> bool:
    return case.layout == "toy"


def skip_reason(case: Case, backend: str) -> str | None:
    problem = common.problem_of(case, resolved.of_case(case).k_fmt)
    return common.kernel_reason(case, backend, problem)


def build(case: Case, r: Resolved) -> State:
    fmt, ctx = r.k_fmt, case.context_len
    q32, k32, v32 = make_qkv(case.kv_data, (case.n_seqs, case.n_q_heads, 1, case.head_dim),
                             (case.n_seqs, case.n_kv_heads, ctx, case.head_dim), case.seed)
    shape = (case.n_layers, case.n_seqs, case.n_kv_heads, ctx, case.head_dim)
    cache, baseline, alloc = allocated(lambda: KVCache(fmt, *shape))
    cache.fill(k32.astype(fmt.compute_dtype), v32.astype(fmt.compute_dtype))
    q, kernel = q32.astype(fmt.compute_dtype), KERNELS[case.kernel].fn
    scale = 1 / math.sqrt(case.head_dim)

    def step():
        return [kernel(q, *cache.view(i, ctx), fmt, mask=None, scale=scale, tile_kv=None)
                for i in range(case.n_layers)]

    def check():
        out = step()[0]
        parity_gate(case.kernel, out, reference(q32, *cache.view(0, ctx), fmt, scale=scale),
                    fmt.compute_dtype)
        exact = reference(q32, {"data": k32}, {"data": v32}, get_format("fp32"), scale=scale)
        return compare_outputs(out, exact)

    return State({"step": step}, check, traffic=metrics.traffic_bytes(case, fmt),
                 kv_bytes=metrics.kv_bytes(case, fmt), alloc_bytes=alloc, baseline_bytes=baseline,
                 cache=cache.arrays, effective=common.effective(case))
'''
TOY_LAYOUT_TEST = """
from kvbench.case import Case
from kvbench.engines import engine_for
from kvbench.kernels.formats.registry import get_format
from kvbench.suite.resolved import of_case


def test_toy_bytes_by_hand_and_against_the_engine():
    c = Case("tiny", 2, 8, 2, 64, 48, layout="toy", n_seqs=3, kv_dtype="fp16")
    want = 2 * 2 * 3 * 48 * 2 * 64 * 2  # K and V x layers x seqs x ctx x heads x D x 2 bytes
    assert of_case(c).cache_bytes == want
    assert engine_for(c).build(c).kv_bytes == want
"""
TOY_SUITE = """
name: toy
settings: {warmup_s: 0.0, min_samples: 3, max_samples: 3, budget_s: 0.05, rounds: 1}
fixed: {model: tiny, context_len: 32, n_seqs: 2, layout: toy}
sweep:
  kv_dtype: [fp16, int8]
  kernel: [sdpa, dequant_sdpa]
exclude:
  - {kv_dtype: fp16, kernel: dequant_sdpa}
  - {kv_dtype: int8, kernel: sdpa}
"""


def test_the_add_a_layout_recipe_followed_literally(tmp_path):
    text = recipe("Add a layout")
    named_files = (
        "kernels/stores/<layout>.py",
        "`FOOTPRINTS`",
        "harness/engines/<layout>.py",
        "`ENGINES`",
        "`ENGINE_FLOORS`",
        "`LAYOUTS`",
        "tests/test_<layout>.py",
    )
    for named in named_files:
        assert named in text, named
    root = scratch_copy(tmp_path)
    (root / "kernels/stores/toy.py").write_text(TOY_STORE)  # 1.
    footprint = root / "kernels/stores/footprint.py"
    insert_after(
        footprint,
        "from kvbench.kernels.stores.window import",
        "from kvbench.kernels.stores.toy import toy_cells\n",
    )
    insert_after(
        footprint,
        '"window": lambda n, ctx, la:',
        '    "toy": lambda n, ctx, la: {"cells": toy_cells(n, ctx)},\n',
    )
    (root / "harness/engines/toy.py").write_text(TOY_ENGINE)  # 2.
    engines = root / "harness/engines/__init__.py"
    insert_after(engines, "from kvbench.engines import (", "    toy,\n")
    line = '    "toy": Engine(toy.claims, toy.skip_reason, carrying(toy.build)),\n'
    engines.write_text(
        engines.read_text().replace('    "cache": Engine(', line + '    "cache": Engine(')
    )
    walls = root / "tests/test_walls.py"
    insert_after(walls, '"model_tasks": 3, "llamacpp": 3,', '    "toy": 3,\n')
    resolved_test = root / "tests/test_resolved.py"  # 4. (3: no arguments of its own)
    insert_after(resolved_test, '"window": ({"window": 64', '    "toy": ({}, None),\n')
    (root / "tests/test_toy.py").write_text(TOY_LAYOUT_TEST)
    (root / "suites/toy.yaml").write_text(TOY_SUITE)
    got = pytest_in(root, "tests/test_toy.py", "tests/test_walls.py", "tests/test_resolved.py",
                    "-rA", "-k", "toy or engine or grid")  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    assert (
        "PASSED tests/test_toy.py::test_toy_bytes_by_hand_and_against_the_engine" in got.stdout
    ), got.stdout[-2000:]
    assert "test_no_engine_imports_another_engine" in got.stdout
    run = kvbench_in(root, "run", "suites/toy.yaml", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = result_rows(tmp_path / "out")
    assert sorted(rows["status"]) == ["ok", "ok"] and set(rows["layout"]) == {"toy"}


TOY_PEER = '''
"""toy_numpy: a recipe test's peer: float64 numpy attention, one query head at a time."""

from __future__ import annotations

import numpy as np

from kvbench.peers.base import DecodeData, Preallocated


class ToyNumpy(Preallocated):
    def __init__(self, data: DecodeData):
        self.q = np.array(data.q, dtype=np.float64)
        super().__init__(data, np.array(data.k, np.float64), np.array(data.v, np.float64))

    def copy(self, a):
        return a.copy()

    def empty_like(self, a):
        return np.empty_like(a)

    def nbytes_of(self, a) -> int:
        return a.nbytes

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a, dtype=np.float32)

    def attend(self, layer: int, kv):
        k, v = kv
        b, hq, _, d = self.q.shape
        group = hq // k.shape[1]
        out = np.empty_like(self.q)
        for h in range(hq):
            s = self.q[:, h] @ k[:, h // group].swapaxes(-1, -2) * self.scale  # [B, 1, L]
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, h] = (p / p.sum(axis=-1, keepdims=True)) @ v[:, h // group]
        return out
'''
TOY_PEER_TEST = """
import numpy as np
import mlx.core as mx

from kvbench.kernels.attention.registry import reference
from kvbench.kernels.data import make_qkv
from kvbench.kernels.formats.registry import get_format
from kvbench.peers.base import DecodeData
from kvbench.peers.registry import PEERS


def test_toy_numpy_against_the_reference():
    q, k, v = make_qkv("gaussian", (1, 4, 1, 32), (1, 2, 24, 32), 0)
    data = DecodeData(q, k, v, n_layers=2, kv_dtype="fp32", scale=32 ** -0.5)
    peer = PEERS["toy_numpy"].make(data)
    got = np.asarray(peer.to_numpy(peer.attend(0, peer.write(0))))  # the 24th token written
    want = reference(q, {"data": k}, {"data": v}, get_format("fp32"), scale=32 ** -0.5)
    assert np.allclose(got, np.array(want), atol=1e-5)
"""
TOY_PEER_SUITE = """
name: toy-peer
settings: {warmup_s: 0.0, min_samples: 3, max_samples: 3, budget_s: 0.05, rounds: 1}
fixed: {model: tiny, context_len: 32, kv_dtype: fp32}
sweep:
  kernel: [sdpa, toy_numpy]
"""


def test_the_add_a_peer_recipe_followed_literally(tmp_path):
    text = recipe("Add a peer")
    for named in ("harness/peers/<name>.py", "`Preallocated`", "harness/peers/registry.py",
                  "`PEERS`", "tests/test_<name>.py", "`EXTERNAL_PEERS`"):  # fmt: skip
        assert named in text, named
    root = scratch_copy(tmp_path)
    (root / "harness/peers/toy_numpy.py").write_text(TOY_PEER)  # 1.
    registry = root / "harness/peers/registry.py"  # 2.
    insert_after(
        registry,
        "from kvbench.peers.numpy_ref import",
        "from kvbench.peers.toy_numpy import ToyNumpy\n",
    )
    insert_after(
        registry,
        '"numpy_ref": Peer(',
        '    "toy_numpy": Peer(ToyNumpy, "numpy", "numpy", ("fp32",), ("cpu",), False),\n',
    )
    (root / "tests/test_toy_numpy.py").write_text(TOY_PEER_TEST)  # 3.
    (root / "suites/toy-peer.yaml").write_text(TOY_PEER_SUITE)
    got = pytest_in(root, "tests/test_toy_numpy.py", "tests/test_walls.py", "-rA", "-k",
                    "toy or floor")  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    assert "PASSED tests/test_toy_numpy.py::test_toy_numpy_against_the_reference" in got.stdout
    run = kvbench_in(root, "run", "suites/toy-peer.yaml", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = result_rows(tmp_path / "out").set_index("kernel")
    assert (
        rows.loc["toy_numpy", "status"] == "ok" and rows.loc["toy_numpy", "kernel_kind"] == "peer"
    )
    assert rows.loc["toy_numpy", "rel_err"] < 1e-5  # its output against the float32 reference


TOY_POLICY = '''
"""oldest: a recipe test's policy: each KV head keeps the oldest positions of the context."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.kernels.model.policies.common import Budget, top
from kvbench.kernels.model.protocol import Observation


@dataclass
class Oldest:
    budget: Budget
    name: str = "oldest"
    decode: bool = False

    def observe(self, obs: Observation) -> None:
        return None

    def select(self, obs: Observation) -> np.ndarray:
        pos = obs.positions.astype(np.float32)  # [Hkv, m], -1 padding
        return top(np.where(pos < 0, -np.inf, -pos), self.budget.kept(obs.n_positions))

    def state_bytes(self) -> int:
        return 0
'''
TOY_POLICY_TEST = """
import numpy as np
from tiny_model import TINY, weights, write_gguf

from kvbench.kernels.model import policies as P
from kvbench.kernels.model.compress import kept_positions
from kvbench.kernels.model.load import load_model


def test_oldest_keeps_the_first_positions(tmp_path):
    model = load_model(write_gguf(tmp_path / "t.gguf", weights(seed=7)))
    toks = np.random.default_rng(0).integers(0, TINY["vocab"], 20).tolist()
    pol = P.make("oldest", P.Budget(compression_ratio=0.5))
    kept = kept_positions(model, toks, pol, ubatch=8)
    assert all(layer.tolist() == [list(range(10))] * layer.shape[0] for layer in kept)
"""


def test_the_add_a_model_cache_policy_recipe_followed_literally(tmp_path):
    text = recipe("Add a model-cache policy")
    for named in ("kernels/model/policies/<name>.py", "`CachePolicy`", "`POLICIES`", "`PARAMS`",
                  "tests/test_<name>_policy.py", "tests/test_policies.py"):  # fmt: skip
        assert named in text, named
    root = scratch_copy(tmp_path)
    (root / "kernels/model/policies/oldest.py").write_text(TOY_POLICY)  # 1.
    init = root / "kernels/model/policies/__init__.py"  # 2.
    insert_after(
        init,
        "from kvbench.kernels.model.policies.knorm import",
        "from kvbench.kernels.model.policies.oldest import Oldest\n",
    )
    insert_after(init, '    "adakv": AdaKV,', '    "oldest": Oldest,\n')
    insert_after(init, '    "adakv": ("scorer",', '    "oldest": (),\n')
    (root / "tests/test_oldest_policy.py").write_text(TOY_POLICY_TEST)  # 3.
    checks = ("tests/test_oldest_policy.py", "tests/test_policies.py", "tests/test_walls.py")
    got = pytest_in(root, *checks, "-rA", "-k", "oldest or every_policy or model")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    ran = got.stdout
    assert "PASSED tests/test_oldest_policy.py::test_oldest_keeps_the_first_positions" in ran
    assert "test_every_policy_is_a_cache_policy" in ran

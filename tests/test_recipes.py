"""The recipes of docs/architecture.md, followed literally in a scratch copy of the tree (a toy
format, layout and peer added exactly as each recipe says), then the checks each recipe names,
run on the copy (tests/recipe_copy.py). A step the recipe leaves out makes its test fail."""

from __future__ import annotations

from recipe_copy import insert_after, pytest_in, recipe, scratch_copy

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

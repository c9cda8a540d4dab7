"""ggml's own C as the oracle for every ggml format kvbench stores (kernels/formats/ggml.py).

tests/ggml_oracle.c is compiled against the ggml static libraries of the llama.cpp build in
kvbench's cache (`make llamacpp`; .ci/run builds it) and quantizes the same rows two ways:
ggml-base's `quantize_row_<type>_ref` (what GGUF files are made with) and ggml-cpu's
`from_float` (what llama.cpp's KV-cache writes call). kvbench's bytes must equal the first for
q4_0 ... q8_0 and iq4_nl, and the second for every type, q8_0's through the `q8_0_avx2` variant
(x86: ggml-cpu's AVX2 q8_0 rounds ties to even with 127 / absmax). Skipped, with the reason,
when the build or a C compiler is absent.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from test_ggml_formats import hard_rows, random_rows

from kvbench.kernels.formats.ggml import IQ4_NL_VALUES
from kvbench.kernels.formats.registry import get_format
from kvbench.kernels.model.fetch import model_path
from kvbench.peers.llamacpp_build import build_dir

TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"]
# kvbench's format that holds what each ggml quantizer writes
KVBENCH = {("q8_0", "cpu"): "q8_0_avx2"}
SOURCE = Path(__file__).with_name("ggml_oracle.c")


def _libs(root: Path) -> list[Path] | str:
    libs = [root / "build/ggml/src/libggml-cpu.a", root / "build/ggml/src/libggml-base.a"]
    missing = [p for p in (*libs, root / "src/ggml/include/ggml.h") if not p.is_file()]
    return (
        f"no llama.cpp build with ggml's libraries at {root} (make llamacpp)" if missing else libs
    )


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Path:
    root = build_dir()
    libs = _libs(root)
    if isinstance(libs, str):
        pytest.skip(libs)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the ggml oracle")
    exe = tmp_path_factory.mktemp("oracle") / "ggml_oracle"
    cmd = [cc, "-O1", f"-I{root / 'src/ggml/include'}", str(SOURCE), *map(str, libs)]
    cmd += ["-lstdc++", "-lm", "-lpthread", "-fopenmp", "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return exe


def ggml_bytes(exe: Path, name: str, mode: str, x: np.ndarray) -> np.ndarray:
    """ggml's blocks of every row of x [..., k] (one quantizer call per row): uint8 [rows, B]."""
    rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)
    head = f"{name} {mode} {rows.shape[1]} {rows.shape[0]}\n".encode()
    out = subprocess.run([exe], input=head + rows.tobytes(), capture_output=True, check=True)
    return np.frombuffer(out.stdout, dtype=np.uint8).reshape(rows.shape[0], -1)


def kvbench_bytes(name: str, x: np.ndarray) -> np.ndarray:
    fmt = get_format(name)
    blocks = np.array(fmt.to_blocks(fmt.encode(mx.array(x.astype(np.float32)))))
    return blocks.reshape(-1, blocks.shape[-2] * blocks.shape[-1])


def undefined_codes(name: str, x: np.ndarray) -> np.ndarray:
    """Mask of bytes ggml leaves undefined: iq4_nl's codes of an all-zero block (absmax under
    1e-15) that no earlier block of its row precedes with codes (ggml's uninitialised L)."""
    rows = x.reshape(-1, x.shape[-1])
    nb = rows.shape[1] // 32
    mask = np.zeros((rows.shape[0], nb, 18), dtype=bool)
    if name == "iq4_nl":
        zero = np.abs(rows.reshape(-1, nb, 32)).max(axis=-1) < 1e-15
        leading = np.cumprod(zero, axis=1).astype(bool)  # zero blocks before any non-zero one
        mask[..., 2:] = leading[..., None]
        return mask.reshape(rows.shape[0], -1)
    return np.zeros((rows.shape[0], 0), dtype=bool)


def edge_rows() -> np.ndarray:
    """hard_rows (test_ggml_formats) plus rows at iq4_nl's and q8_0's rounding edges: values on
    the codebook's midpoints after scaling, blocks under 1e-15 between others, integer halves
    (q8_0 ties), the extreme repeated."""
    rows = np.zeros((8, 128), dtype=np.float32)
    vals = np.array(IQ4_NL_VALUES, dtype=np.float32)
    mids = (vals[1:] + vals[:-1]) / 2  # first guess scale -127 / m: x = -mid * m / 127
    rows[0, :15] = -mids / 127 * 3.0
    rows[0, 15] = 3.0  # the signed extreme, so the first guess is d = 3 / -127
    rows[1, 32:64] = 1e-16  # under GROUP_MAX_EPS: d = 0, codes of the previous block
    rows[1, :32] = np.linspace(-2, 2, 32)
    rows[1, 64:] = np.linspace(5, -1, 64)
    rows[2] = np.arange(128) % 64 - 31.5  # q8_0: exact halves of d = 31.5 / 127 ...
    rows[3] = (np.arange(128) % 255 - 127) * 0.5  # ... and x * 127 / absmax on .5
    rows[4, :32] = 7.0  # a constant block
    rows[5] = np.random.default_rng(5).integers(-127, 128, 128) * 0.25
    rows[6, 96:] = -1e-3  # tiny, not zero
    rows[7, 64:96] = 1e-16  # zero first blocks, then a block under the threshold
    rows[7, 96:] = np.linspace(-1, 1, 32)
    hard = np.pad(hard_rows(), ((0, 0), (0, 64)))
    return np.concatenate([rows, hard]).astype(np.float32)


@lru_cache(maxsize=2)
def real_kv(name: str) -> np.ndarray:
    """A registered model's middle-layer K (post-RoPE) and V over 64 tokens of the default
    text: SmolLM2 [3, 64, 64] each, Gemma-3-270M [1, 64, 256] (8 blocks a row)."""
    from kvbench.kernels.model.capture import capture_kv
    from kvbench.kernels.model.load import load_model
    from kvbench.kernels.model.text import default_text
    from kvbench.kernels.model.tokenizer import load_tokenizer

    model = load_model(model_path(name))
    kv = capture_kv(model, load_tokenizer(model).encode(default_text())[:64])
    k, v = kv[len(kv) // 2]
    return np.concatenate([np.asarray(k), np.asarray(v)]).astype(np.float32)


REAL = {"real": "smollm2-135m", "real-gemma": "gemma3-270m"}
DATA = {
    "random": lambda: random_rows(1),
    "fp16": lambda: random_rows(2).astype(np.float16).astype(np.float32),  # what a cache feeds
    "edge": edge_rows,
    **{key: (lambda name=name: real_kv(name)) for key, name in REAL.items()},
}


@pytest.mark.parametrize("mode", ["ref", "cpu"])
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("data", list(DATA))
def test_bytes_equal_ggml(oracle, name, mode, data):
    if data in REAL and model_path(REAL[data]) is None:
        pytest.skip(f"{REAL[data]} not fetched (kvbench model fetch)")
    x = DATA[data]()
    want = ggml_bytes(oracle, name, mode, x)
    kv_name = KVBENCH.get((name, mode), name)
    got = kvbench_bytes(kv_name, x)
    assert got.shape == want.shape  # ggml_row_size of every row
    assert get_format(kv_name).nbytes(want.shape[0], x.shape[-1]) == want.size
    undefined = undefined_codes(name, x)
    if undefined.size:
        got, want = np.where(undefined, 0, got), np.where(undefined, 0, want)
    np.testing.assert_array_equal(got, want)


def test_llamacpp_q8_0_writes_differ_from_the_reference_and_q8_0_avx2_holds_them(oracle):
    """The two q8_0 quantizers disagree on ties (ref: roundf of x * (1 / d), away from zero;
    AVX2: round half to even of x * (127 / absmax)): kvbench's q8_0 is the first, q8_0_avx2
    the second, on exactly the bytes where they differ."""
    x = np.concatenate([edge_rows(), random_rows(2).reshape(-1, 128).astype(np.float16)])
    x = x.astype(np.float32)
    ref, cpu = (ggml_bytes(oracle, "q8_0", m, x) for m in ("ref", "cpu"))
    differ = ref != cpu
    assert differ.sum() > 0
    np.testing.assert_array_equal(kvbench_bytes("q8_0", x), ref)
    np.testing.assert_array_equal(kvbench_bytes("q8_0_avx2", x), cpu)


def test_iq4_nl_decode_is_ggmls_dequantize_of_its_bytes(oracle):
    """iq4_nl's values: d (float16) * IQ4_NL_VALUES[nibble], read here from ggml's own bytes
    (dequantize_row_iq4_nl), against kvbench's decode."""
    x = random_rows(3).reshape(-1, 128)
    blocks = ggml_bytes(oracle, "iq4_nl", "ref", x).reshape(len(x), 4, 18)
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)  # [rows, 4, 1]
    qs = blocks[..., 2:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)  # element j low nibble, j + 16 high
    want = (d * np.array(IQ4_NL_VALUES, dtype=np.float32)[codes]).reshape(len(x), 128)
    fmt = get_format("iq4_nl")
    got = np.array(fmt.decode(fmt.encode(mx.array(x)), mx.float32))
    np.testing.assert_array_equal(got, want)

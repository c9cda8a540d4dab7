"""llama.cpp's llama-passkey as a peer of kvbench's retrieval rows (task passkey-llamacpp,
kernels/model/passkey.py: the same prompt, built by the same rule).

llama-passkey (examples/passkey/passkey.cpp, b11434) takes `--junk N --pos P`, builds its prompt,
prefills it in batches of n_batch (-b, 2048), decodes greedily up to 16 tokens and prints them
on stdout; on stderr it logs "prompt tokens: T" and "passkey = K, inserted at position P / N".
The K/V cache types (-ctk / -ctv), flash attention and the rotation switch
(LLAMA_ATTN_ROT_DISABLE) are the other llama.cpp rows'.

Its context is set by the tool itself, whatever `-c` says: n_ctx = n_ctx_train x grp_attn_n +
n_keep cells, padded to a multiple of 256 by llama_context (src/llama-context.cpp). It fills
n_ctx - n_keep positions in batches of n_batch, then reads the rest of the prompt through its
context shift (seq_rm of n_batch positions after n_keep, seq_add of the later ones by -n_batch;
"shifting KV cache with N" on stderr) and shifts once more to leave room for its 16 answer
tokens. A shift at a length kvbench asks for needs a smaller n_ctx_train: `ctx_train` overrides
the GGUF's `<arch>.context_length` (--override-kv; for a model without YaRN scaling that value
sizes the context and nothing else). `--grp-attn-n G` turns on its self-extend (after each
batch, the last batch's positions are moved and divided by G: seq_add + seq_div); llama-passkey
takes no `--grp-attn-w` (common/arg.cpp lists it for llama-cli only): its window is n_batch,
asserted a multiple of G. n_keep is `--keep` (passkey.cpp's default 32, not its instruction's
token count). kernels/model/shift.py replays this schedule on kvbench's cache.
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
# its context as it set it (main's first log line) and each context shift's n_discard
CTX_RE = re.compile(r"n_ctx = (\d+), n_kv_req = (\d+), n_grp = (\d+), n_batch = (\d+)")
SHIFT_RE = re.compile(r"shifting KV cache with (\d+)")
# llama_kv_cache_iswa's warning when --swa-full took effect (its window layers keep every cell)
SWA_FULL_RE = re.compile(r"using full-size SWA cache")


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
    keep: int | None = None,
    n_batch: int | None = None,
    grp_attn_n: int = 1,
    ctx_train: tuple[str, int] | None = None,
    swa_full: bool = False,
) -> list[str]:
    """The command; keep, n_batch, grp_attn_n (self-extend), ctx_train ((GGUF architecture,
    n_ctx_train): the trained length the tool sizes its context by) and swa_full (--swa-full:
    sliding-window layers keep every cell) only when given."""
    cmd = [str(binary), "-m", str(model), "--junk", str(n_junk), "--pos", str(i_pos)]
    cmd += ["-ctk", type_k, "-ctv", type_v, "-fa", fa_flag(flash_attn), "-t", str(threads)]
    cmd += ["--keep", str(keep)] if keep is not None else []
    cmd += ["-b", str(n_batch)] if n_batch is not None else []
    cmd += ["--grp-attn-n", str(grp_attn_n)] if grp_attn_n != 1 else []
    if ctx_train is not None:
        cmd += ["--override-kv", f"{ctx_train[0]}.context_length=int:{ctx_train[1]}"]
    return cmd + (["--swa-full"] if swa_full else [])


def parse_passkey(stdout: str, stderr: str) -> dict:
    """The answer text (what it decoded, stdout), the key it hid, where, and its prompt's
    tokens; LlamaCppError when the log lacks them."""
    key, prompt = KEY_RE.search(stderr), PROMPT_RE.search(stderr)
    if key is None or prompt is None:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise LlamaCppError(f"{TOOL}: no passkey / prompt tokens line in its log: {tail}")
    decoded, ctx = DECODED_RE.search(stderr), CTX_RE.search(stderr)
    return {
        "answer_text": stdout.strip("\n"),
        "key": key.group(1),
        "i_pos": int(key.group(2)),
        "n_junk": int(key.group(3)),
        "prompt_tokens": int(prompt.group(1)),
        "decode_tokens": int(decoded.group(1)) if decoded else None,
        "decode_s": float(decoded.group(2)) if decoded else None,
        # its context (n_ctx: positions before a shift, n_kv_req: cells) and shifts made
        "n_ctx": int(ctx.group(1)) if ctx else None,
        "n_kv_req": int(ctx.group(2)) if ctx else None,
        "n_grp": int(ctx.group(3)) if ctx else None,
        "n_batch": int(ctx.group(4)) if ctx else None,
        "shifts": [int(n) for n in SHIFT_RE.findall(stderr)],
        "swa_full": SWA_FULL_RE.search(stderr) is not None,
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

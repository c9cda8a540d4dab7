"""llama.cpp's llama-batched-bench as the peer of kvbench's serve rows (harness/engines/serve.py).

llama-batched-bench (tools/batched-bench/batched-bench.cpp of b11434, the tree kvbench builds),
for one (pp, tg, pl): clears the memory; decodes pl prompts of pp random tokens (one prompt with
-pps) in batches of n_batch tokens, timed (t_pp); with -pps copies the prompt to the other
sequences (llama_memory_seq_cp; per-stream, one untimed dummy token applies the copy); then tg
steps of one token for each of the pl sequences, timed (t_tg). It prints, with
`--output-format jsonl`, one JSON line per test: pp, tg, pl, n_kv (the cells required:
pl*(pp + tg), or with -pps pp + pl*tg when unified (-kvu) and pl*pp + pl*tg per-stream), t_pp,
speed_pp (pp / t_pp with -pps, else pl*pp / t_pp), t_tg, speed_tg (pl*tg / t_tg), t, speed
(the tokens decoded over t: (pp with -pps, else pl*pp) + pl*tg) and its settings. A test whose
n_kv exceeds the context (-c) is skipped without a word, so a run that printed no line for the
test is an error here. Without -kvu each of the n_seq_max (= pl) sequences has its own stream
of -c / pl cells. Before the tests it decodes 16 tokens once (its warm-up).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvbench.peers.llamacpp import (
    LlamaCppError,
    fa_flag,
    llamacpp_bin,
    memory_info,
    missing_reason,
    run_tool,
)

TOOL = "llama-batched-bench"
# its JSON names -> the row's (llama-batched-bench's printed column names)
FIELDS = {
    "pp": "pp", "tg": "tg", "pl": "pl", "n_kv": "n_kv_req", "t_pp": "t_pp", "speed_pp": "s_pp",
    "t_tg": "t_tg", "speed_tg": "s_tg", "t": "t", "speed": "s",
}  # fmt: skip


def batched_command(binary: Path, model: Path, *, pp: int, tg: int, pl: int, shared: bool,
                    unified: bool, ctx: int, type_k: str = "f16", type_v: str = "f16",
                    flash_attn: bool | str = True, threads: int = 2,
                    verbose: bool = False) -> list[str]:  # fmt: skip
    """One (pp, tg, pl) test of llama-batched-bench, JSON lines out; verbose: its log on
    stderr (the buffer sizes memory_info reads)."""
    cmd = [str(binary), "-m", str(model), "-c", str(ctx), "-npp", str(pp), "-ntg", str(tg)]
    cmd += ["-npl", str(pl), "-ctk", type_k, "-ctv", type_v, "-fa", fa_flag(flash_attn)]
    cmd += ["-t", str(threads), "--output-format", "jsonl"]
    cmd += ["-v"] if verbose else []
    return cmd + (["-pps"] if shared else []) + (["-kvu"] if unified else [])


def parse_jsonl(text: str, pp: int, tg: int, pl: int) -> dict:
    """The test's line as row fields (FIELDS' names) plus its settings; LlamaCppError if none."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            test = json.loads(line)
        except ValueError:
            continue
        if (test.get("pp"), test.get("tg"), test.get("pl")) == (pp, tg, pl):
            out = {FIELDS[k]: test[k] for k in FIELDS}
            settings = ("n_kv_max", "n_batch", "n_ubatch", "flash_attn", "is_pp_shared",
                        "n_threads")  # fmt: skip
            return out | {k: test.get(k) for k in settings}
    raise LlamaCppError(f"{TOOL} printed no result for pp {pp}, tg {tg}, pl {pl} (a test "
                        "needing more cells than -c is skipped silently)")  # fmt: skip


# its verbose log's lines start with a time and a level ("0.00.123.034 I llama_kv_cache: ...")
LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ", re.M)


def log_memory(log: str, streams: int) -> dict:
    """memory_info of a verbose log (prefixes dropped); its cell count is per stream (b11434
    prints "size = 22.50 MiB ( 256 cells, 30 layers, 4/4 seqs)" for 4 streams of 256), made
    the cells of every stream."""
    mem = memory_info(LOG_PREFIX.sub("", log))
    if "kv_cells" in mem:
        mem["kv_cells"] *= streams
    return mem


def run_batched(model: Path, timeout_s: float = 1800, env: dict | None = None, **kwargs) -> dict:
    """Run one test (batched_command's keyword arguments): its fields, and under "memory"
    llama.cpp's buffers for the same context (log_memory), from one more untimed run of one
    prompt token and one step with its log on (the timed run stays without it)."""
    binary = llamacpp_bin(TOOL)
    if binary is None:
        raise LlamaCppError(missing_reason(TOOL))
    stdout, stderr = run_tool(batched_command(binary, model, **kwargs), timeout_s, env)
    out = parse_jsonl(stdout + "\n" + stderr, kwargs["pp"], kwargs["tg"], kwargs["pl"])
    small = {**kwargs, "pp": 1, "tg": 1, "verbose": True}
    _, log = run_tool(batched_command(binary, model, **small), timeout_s, env)
    out["memory"] = log_memory(log, 1 if kwargs["unified"] else kwargs["pl"])
    return out

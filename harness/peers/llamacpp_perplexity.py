"""llama.cpp's perplexity and KL divergence (llama-perplexity) as a peer of kvbench's quality rows.

Quality: `llama-perplexity -c ctx --chunks n` cuts the tokenized text (BOS first, where the
vocabulary adds one) into n chunks of ctx tokens, replaces each chunk's first token by BOS,
runs every chunk from an empty cache and scores only its second half: the logits at positions
ctx/2 .. ctx-2 predict the next token; PPL = exp(mean NLL), its ± is ppl x the standard error
of the mean NLL. `--kl-divergence-base FILE` saves the reference run's log-probabilities (and
tokens); a later run with `--kl-divergence` reads them and reports KL(base || this) per token
(mean ± error, percentiles) and "Same top p", the share of tokens whose argmax agrees.

Nothing here imports the harness beyond the llama.cpp runner (paths in, plain dicts out).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from kvbench.peers.llamacpp import (
    NUM,
    LlamaCppError,
    fa_flag,
    llamacpp_bin,
    missing_reason,
    run_tool,
)


def perplexity_command(
    binary: Path,
    model: Path,
    *,
    ctx: int,
    chunks: int,
    type_k: str = "f16",
    type_v: str = "f16",
    flash_attn: bool | str = True,
    threads: int = 2,
    text_path: Path | None = None,
    kl_base: Path | None = None,
    kl: bool = False,
) -> list[str]:
    """llama-perplexity over `chunks` chunks of `ctx` tokens of text_path.

    kl_base without kl: also save the log-probabilities there (the reference run);
    kl_base with kl: compare against them (the text and tokens come from that file)."""
    cmd = [str(binary), "-m", str(model), "-c", str(ctx), "--chunks", str(chunks)]
    cmd += ["-ctk", type_k, "-ctv", type_v, "-fa", fa_flag(flash_attn), "-t", str(threads)]
    if text_path is not None and not kl:
        # --no-escape: by default llama.cpp turns the text's \n, \" and \\ into newlines,
        # quotes and backslashes before tokenizing (common/arg.cpp); kvbench reads it as it is
        cmd += ["-f", str(text_path), "--no-escape"]
    if kl_base is not None:
        cmd += ["--kl-divergence-base", str(kl_base)]
    return cmd + (["--kl-divergence"] if kl else [])


FINAL_RE = re.compile(rf"Final estimate: PPL = {NUM} \+/- {NUM}")
CHUNK_RE = re.compile(rf"\[(\d+)\]{NUM},")
SETUP_RE = re.compile(r"over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)")
KV_RE = re.compile(rf"llama_kv_cache: size = +{NUM} MiB .*K \((\w+)\): +{NUM} MiB, V \((\w+)\)")
STAT_RE = re.compile(rf"^(?P<label>[^:\n]+?)\s*:\s*{NUM}(?:\s*±\s*{NUM})?\s*(%?)\s*$", re.M)
# kl-divergence summary lines -> result keys (labels with their runs of spaces collapsed)
KL_LABELS = {
    "Mean PPL(Q)": "ppl",
    "Mean PPL(base)": "ppl_base",
    "Mean PPL(Q)/PPL(base)": "ppl_ratio",
    "Mean PPL(Q)-PPL(base)": "ppl_delta",
    "Mean KLD": "kl_mean",
    "Maximum KLD": "kl_max",
    "99.9% KLD": "kl_p999",
    "99.0% KLD": "kl_p99",
    "Median KLD": "kl_median",
    "RMS Δp": "rms_dp",
    "Same top p": "same_top_p",
}


def setup_info(text: str) -> dict:
    """Chunking and the KV cache that actually ran, from the tool's log."""
    out = {}
    if m := SETUP_RE.search(text):
        keys = ("n_chunks", "n_ctx", "n_batch", "n_seq")
        out.update(zip(keys, (int(g) for g in m.groups())))
    if m := KV_RE.search(text):
        out.update(kv_cache_mib=float(m.group(1)), type_k=m.group(2), type_v=m.group(4))
    return out


def parse_perplexity(text: str) -> dict:
    """llama-perplexity's output -> ppl, ppl_err, per-chunk running ppl, chunking, cache types."""
    m = FINAL_RE.search(text)
    if m is None:
        raise ValueError("llama-perplexity output has no 'Final estimate: PPL = ...' line")
    out = {"ppl": float(m.group(1)), "ppl_err": float(m.group(2))}
    out["running_ppl"] = [float(v) for _, v in CHUNK_RE.findall(text)]
    return {**setup_info(text), **out}


def parse_kl(text: str) -> dict:
    """llama-perplexity --kl-divergence output -> ppl, ppl_base, kl_mean (± err), kl_p99,
    same_top_p (a fraction), ...; percentages become fractions."""
    out = {}
    for m in STAT_RE.finditer(text):
        key = KL_LABELS.get(" ".join(m.group("label").split()))
        if key is None:
            continue
        scale = 0.01 if m.group(4) == "%" else 1.0
        out[key] = float(m.group(2)) * scale
        if m.group(3) is not None:
            out[key + "_err"] = float(m.group(3)) * scale
    if "kl_mean" not in out:
        raise ValueError("llama-perplexity output has no 'Mean KLD' line (not a KL run?)")
    return {**setup_info(text), **out}


def run_perplexity(
    model: Path, timeout_s: float = 1800, save_to: Path | None = None, env=None, **kwargs
):
    """Run llama-perplexity (perplexity_command's keyword arguments) and parse what it printed
    (dict): parse_kl for a --kl-divergence run, parse_perplexity otherwise; save_to keeps the
    raw output (stdout, then stderr); env: variables for the tool."""
    binary = llamacpp_bin("llama-perplexity")
    if binary is None:
        raise LlamaCppError(missing_reason("llama-perplexity"))
    t0 = time.perf_counter()
    stdout, stderr = run_tool(perplexity_command(binary, model, **kwargs), timeout_s, env)
    wall_s = time.perf_counter() - t0  # the whole process: model load and tokenizing too
    text = stdout + "\n" + stderr
    if save_to is not None:
        Path(save_to).write_text(text)
    res = parse_kl(text) if kwargs.get("kl") else parse_perplexity(text)
    res.update(pass_info(text, res) or perf_info(text), wall_s=wall_s)
    # b11434 logs the cache's types only when verbose: else record the types it was given
    res.setdefault("type_k", kwargs.get("type_k", "f16"))
    res.setdefault("type_v", kwargs.get("type_v", "f16"))
    return res


# llama_perf_context_print (src/llama-context.cpp, b11434): batches of more than one token count
# as prompt eval, single-token batches as eval
PERF_RE = re.compile(rf"llama_perf_context_print: +(prompt eval|eval) time = +{NUM} ms / +(\d+) ")


# llama-perplexity's own clock (tools/perplexity/perplexity.cpp, b11434), printed at the default
# verbosity: its first pass (n_seq chunks of n_ctx tokens), from clearing the cache to the logits
PASS_RE = re.compile(rf"{NUM} seconds per pass")


def pass_info(text: str, setup: dict) -> dict:
    """prefill_s / prefill_tokens of llama-perplexity's first pass (the one it times: its n_seq
    chunks of n_ctx tokens; setup: setup_info's n_ctx, n_seq, n_chunks); {} without the line."""
    m = PASS_RE.search(text)
    if m is None or not {"n_ctx", "n_seq", "n_chunks"} <= set(setup):
        return {}
    tokens = setup["n_ctx"] * min(setup["n_seq"], setup["n_chunks"])
    return {"prefill_s": float(m.group(1)), "prefill_tokens": tokens}


def perf_info(text: str) -> dict:
    """prefill_s / prefill_tokens (its prompt eval) and decode_s / decode_tokens (its eval) from
    llama.cpp's closing timings; {} when it printed none."""
    out = {}
    for m in PERF_RE.finditer(text):
        kind = "prefill" if m.group(1) == "prompt eval" else "decode"
        out[f"{kind}_s"], out[f"{kind}_tokens"] = float(m.group(2)) / 1e3, int(m.group(3))
    return out

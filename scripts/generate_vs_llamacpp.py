"""kvbench's model with an fp16 cache beside llama.cpp's with an f16 cache, before any format
effect (issue #33 item 6; docs/peers.md "Truth"): how far the float-weights path (kvbench:
GGUF weights dequantized to float32, MLX) and llama.cpp's quantized-weights path agree.

* Teacher-forced, on the text: llama-perplexity (f16 cache) saves its next-token distributions
  at the scored half of each chunk (--kl-divergence-base; harness/peers/llamacpp_kl.py reads
  them); kvbench runs the same chunks (the tokens read back from that file, BOS first where the
  vocabulary adds one) with an fp16 cache; per scored position, whether the two top-1 tokens
  agree and KL(llama.cpp || kvbench).
* Greedy, on prompts: llama-simple's greedy continuation of each prompt (f16 cache) against
  kvbench's (fp16 cache, the same prompt ids: both tokenizers give the same ids); tokens to the
  first difference, counted in kvbench's tokens whose text is a prefix of llama.cpp's.

  .venv/bin/python scripts/generate_vs_llamacpp.py --model smollm2-135m --ctx 512 --chunks 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from kvbench.engines import model as model_engine
from kvbench.engines.llamacpp import base_logits
from kvbench.kernels.model import quality
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.fetch import require_model
from kvbench.kernels.model.run import greedy
from kvbench.kernels.model.spec import CacheSpec
from kvbench.kernels.model.text import default_text
from kvbench.peers.llamacpp_kl import agreement, read_kl_base, run_simple, tokens_to_difference

FP16 = CacheSpec("fp16")
BLOCK = 64  # positions per block when comparing distributions (a Gemma row is 1 MB)


def teacher_forced(name: str, ctx: int, chunks: int) -> dict:
    gguf = require_model(name)
    path, _ = base_logits(gguf, "default", ctx, chunks)
    base = read_kl_base(path)
    model, _ = model_engine.model_of(name)
    ours = model_engine.chunks_of(name, "default", ctx, chunks)
    bos = model_engine.chunk_bos(name)
    top, kl = [], []
    for c in range(chunks):
        theirs = [int(t) for t in base["tokens"][c]]
        chunk = theirs if bos is None else [bos, *theirs[1:]]
        assert chunk == ours[c], f"chunk {c}: llama.cpp's tokens differ from kvbench's"
        lp = np.array(quality.chunk_logprobs(model, chunk, FP16, "reference"))
        ref = base["logprobs"](c)
        for s in range(0, len(lp), BLOCK):
            got = agreement(ref[s : s + BLOCK], lp[s : s + BLOCK])
            top.append(got["top1_agree"] * got["n"])
            kl.append(got["kl"])
    kl = np.concatenate(kl)
    return {"n_scored": int(kl.size), "top1_agree": float(sum(top) / kl.size),
            "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99))}  # fmt: skip


def prompts(n: int, chars: int) -> list[str]:
    """n prompts: paragraphs of the default text of at least `chars` characters, cut to
    `chars` at a space, spread over the text."""
    paras = [p for p in default_text().split("\n\n") if len(p) >= chars]
    picks = [paras[i * len(paras) // n] for i in range(n)]
    return [p[:chars].rsplit(" ", 1)[0] for p in picks]


def pieces(tok, ids: list[int]) -> list[str]:
    """Each generated token's text (incremental decode: a token may end inside a character)."""
    out, prev = [], ""
    for i in range(len(ids)):
        text = tok.decode(ids[: i + 1])
        out.append(text[len(prev) :])
        prev = text
    return out


def greedy_runs(name: str, n_prompts: int, chars: int, n_new: int) -> list[dict]:
    gguf = require_model(name)
    model, tok = model_engine.model_of(name)
    rows = []
    for prompt in prompts(n_prompts, chars):
        ids = tok.encode(prompt)
        cache = make_cache(FP16, model.config, len(ids) + n_new, "reference", None)
        ours = greedy(model, cache, ids, n_new)
        theirs = run_simple(gguf, prompt, n_new)
        same = tokens_to_difference(pieces(tok, ours), theirs)
        rows.append({"prompt_tokens": len(ids), "tokens_to_difference": same, "n_new": n_new,
                     "kvbench": tok.decode(ours), "llama.cpp": theirs})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-chars", type=int, default=400)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = {"model": args.model, "ctx": args.ctx, "chunks": args.chunks}
    out["teacher_forced"] = teacher_forced(args.model, args.ctx, args.chunks)
    out["greedy"] = greedy_runs(args.model, args.prompts, args.prompt_chars, args.new)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1, ensure_ascii=False))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

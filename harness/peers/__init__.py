"""Peers room: yardsticks, other people's code measured beside kvbench's kernels.

registry.py (PEERS) over one module per peer: mlx_lm_caches.py (mlx-lm's caches), torch_sdpa.py,
numpy_ref.py, with base.py (what they share); llamacpp.py (llama.cpp's llama-bench as a peer, and
what its tools share), llamacpp_perplexity.py (llama-perplexity), llamacpp_kl.py,
llamacpp_passkey.py, llamacpp_build.py (building them from PyPI's sdist).
The engines that drive them are harness/engines/peers.py and harness/engines/llamacpp.py.
"""

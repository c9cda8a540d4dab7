"""Attention room: the kernel registry and every attention path kvbench times.

registry.py (KERNELS: reference, sdpa, ops, dequantizing and quantized paths, the GPU kernels),
tiled.py (flash-decoding in MLX ops), sharded.py (partial attention and exact combines). The GPU
sources, launch planning and traffic model live in gpu/.
"""

"""GPU room: the custom Metal and CUDA flash-decoding kernels and their launch planning.

kernels.py (mx.fast.metal_kernel / cuda_kernel wrappers), launch.py (tile, threads, splits per
device), device.py (device limits), emulate.py (numpy emulation of the lane layout),
traffic.py (bytes moved, counted from the kernels' loads and stores); sources in src/, metal/,
cuda/.
"""

"""What kvbench measures: cache formats, the full KV cache, attention kernels, K/V data.

This package never imports `harness` (the instrument): kernels know nothing of timing.
"""

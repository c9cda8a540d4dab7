"""kvbench's instrument: suites, cases, timing, metrics, records, compare and report."""

__version__ = "0.1.0"
# 2: data_bits and kernel_kind recorded per row (harness/store/migrate_v1.py fills v1 rows)
SCHEMA_VERSION = 2

import os as _os  # noqa: E402

# MLX's CUDA backend computes float32 matmuls in TF32 unless MLX_ENABLE_TF32=0 (measured on an
# H200, MLX 0.32.4: a 512x512 float32 matmul's relative error 2.9e-4 against float64 by default,
# 2.1e-7 with it off; the float32 kernels failed the 1e-4 parity gate). kvbench's fp32 is float32:
# set before mlx.core loads, whatever the caller's environment says.
_os.environ["MLX_ENABLE_TF32"] = "0"

# A fast BLAS under MLX's Linux CPU backend must be loaded before anything imports mlx.core
# (harness/blas.py); every kvbench module, kernels/ included, is imported through here.
from kvbench import blas as _blas  # noqa: E402

_blas.preload()

"""kvbench's instrument: suites, cases, timing, metrics, records, compare and report."""

__version__ = "0.1.0"
# 2: data_bits and kernel_kind recorded per row (harness/store/migrate_v1.py fills v1 rows)
SCHEMA_VERSION = 2

# A fast BLAS under MLX's Linux CPU backend must be loaded before anything imports mlx.core
# (harness/blas.py); every kvbench module, kernels/ included, is imported through here.
from kvbench import blas as _blas  # noqa: E402

_blas.preload()

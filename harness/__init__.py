"""kvbench's instrument: suites, cases, timing, metrics, records, compare and report."""

__version__ = "0.1.0"
# 2: data_bits and kernel_kind recorded per row (harness/store/migrate_v1.py fills v1 rows)
SCHEMA_VERSION = 2

import os as _os  # noqa: E402
import sys as _sys  # noqa: E402
from pathlib import Path as _Path  # noqa: E402


def _drop_source_root() -> None:
    """Take the repository root off sys.path, so `import kernels` never finds kernels/.

    `python -m kvbench`, `python -m pytest` and any subprocess started there put the working
    directory first on sys.path; from the repository root that makes its folder kernels/ (whose
    import name is `kvbench.kernels`) shadow PyPI's `kernels`, which transformers >= 5.25 imports
    when torch is present (issue 51: ImportError 'CUDAProperties' in 4 model tests). kvbench
    itself is found through its installed mapping, never through the root.
    """
    here = _Path(__file__).resolve().parent
    root = here.parent
    if here.name != "harness" or not (root / "kernels" / "__init__.py").is_file():
        return  # an installed copy (site-packages/kvbench): its neighbours are packages
    _sys.path[:] = [p for p in _sys.path if _Path(p or ".").resolve() != root]
    shadow = _sys.modules.get("kernels")
    if shadow is not None and _Path(getattr(shadow, "__file__", None) or ".").resolve() == (
        root / "kernels" / "__init__.py"
    ):
        raise ImportError(
            f"{root / 'kernels'} was imported as the top-level module `kernels` (it imports as "
            "kvbench.kernels): start Python with the repository root off sys.path "
            "(PYTHONSAFEPATH=1, or import kvbench first)"
        )


_drop_source_root()

# MLX's CUDA backend computes float32 matmuls in TF32 unless MLX_ENABLE_TF32=0 (measured on an
# H200, MLX 0.32.4: a 512x512 float32 matmul's relative error 2.9e-4 against float64 by default,
# 2.1e-7 with it off; the float32 kernels failed the 1e-4 parity gate). kvbench's fp32 is float32:
# set before mlx.core loads, whatever the caller's environment says.
_os.environ["MLX_ENABLE_TF32"] = "0"

# A fast BLAS under MLX's Linux CPU backend must be loaded before anything imports mlx.core
# (harness/blas.py); every kvbench module, kernels/ included, is imported through here.
from kvbench import blas as _blas  # noqa: E402

_blas.preload()

"""What kvbench measures: cache formats, the full KV cache, attention kernels, K/V data.

This package never imports `harness` (the instrument): kernels know nothing of timing.
"""

if __name__ == "kernels":  # found through a sys.path that starts at the repository root
    raise ImportError(
        f"{__file__} imported as the top-level module `kernels`, shadowing PyPI's `kernels` "
        "(transformers imports it): this folder imports as kvbench.kernels; run with the "
        "repository root off sys.path (PYTHONSAFEPATH=1) or import kvbench first"
    )

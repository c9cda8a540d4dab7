"""Migration for result files written before rows recorded data_bits and kernel_kind.

Rows written since carry both facts, taken from kernels/ at run time (harness/run/runner.py
`finish`): data_bits from the format (kernels/formats/protocol.py Format.data_bits), kernel_kind
from the
peer registry (harness/peers/registry.py kernel_kind). Rows of older files (schema version 1) have
them
empty; `with_v1_facts` fills those from the tables below, frozen as kernels/ stood then. Never
extend these tables: a format or peer added later only appears in rows that record the facts.
This module imports neither mlx nor kernels/ (the report and analysis read result files alone).
"""

from __future__ import annotations

import pandas as pd

# Format.data_bits of every kv_dtype at schema version 1 (frozen)
V1_DATA_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "affine8": 8}
V1_DATA_BITS |= {name: 4 for name in ("fp4", "int4", "mxfp4", "nvfp4", "affine4")}
# harness/peers/registry.py PEERS at schema version 1 (frozen)
V1_PEER_KERNELS = ("mlx_lm", "mlx_lm_quant", "mlx_lm_rotating", "torch_sdpa", "numpy_ref")


def _recorded(rows: pd.DataFrame, column: str) -> pd.Series:
    if column in rows.columns:
        return rows[column].astype(object)
    return pd.Series(None, index=rows.index, dtype=object)


def _v1_kind(kernel) -> str | None:
    if not isinstance(kernel, str):
        return None
    return "peer" if kernel in V1_PEER_KERNELS else "kvbench"


def with_v1_facts(rows: pd.DataFrame) -> pd.DataFrame:
    """rows with data_bits and kernel_kind: as recorded, else (older rows) from the frozen
    tables; a kv_dtype or kernel the tables do not know stays empty / None."""
    out = rows.copy()
    kv_dtype = _recorded(rows, "kv_dtype")
    frozen_bits = kv_dtype.map(lambda name: V1_DATA_BITS.get(name))
    out["data_bits"] = pd.to_numeric(_recorded(rows, "data_bits").fillna(frozen_bits))
    frozen_kind = _recorded(rows, "kernel").map(_v1_kind)
    out["kernel_kind"] = _recorded(rows, "kernel_kind").fillna(frozen_kind)
    return out

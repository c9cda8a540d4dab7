"""Per-token quality values: `<run_id>.tokens.csv` beside a run's results and samples files.

A quality row's mean figures (ppl, kl_mean) are means over its scored tokens; the file keeps
each scored token so that two rows scoring the same tokens (kvbench beside llama.cpp, or two
formats) can be compared token by token (analysis/truth.py: a paired bootstrap). One line per
scored token: case_id, chunk, position (the chunk position whose logits are scored, context_len/2
.. context_len-2; under a context shift, n_ctx .. context_len-2), token (the id of the true next
token, at position + 1), nll (its negative log-likelihood, nats) and kl (KL(reference || this)
of the next-token distributions, nats; each engine's own reference, as the row's kl_mean). The
file is written only by runs whose rows carry per-token values (the quality phase), each row's
lines before the row (store/writer.py). The samples file is not the place: its `ms` column
holds times, checked non-negative, and a per-token KL as llama.cpp sums it can be slightly
negative. This module imports neither mlx nor kernels/.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import UserError

TOKEN_COLUMNS = ("case_id", "chunk", "position", "token", "nll", "kl")
ARRAYS = TOKEN_COLUMNS[1:]  # what an engine hands over, one array each (same length)
SUFFIX = ".tokens.csv"


def tokens_path(csv_path: str | Path) -> Path:
    """`<run_id>.tokens.csv` beside `<run_id>.csv`."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.name[: -len(".csv")] + SUFFIX)


def token_rows(case_id: str, arrays: dict) -> list[tuple]:
    """The file's lines for one row from an engine's arrays (ARRAYS: chunk, position, token,
    nll, kl); ValueError when one is missing, their lengths differ or a value is not finite."""
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        raise ValueError(f"per-token values lack {', '.join(missing)}")
    cols = [np.asarray(arrays[k]) for k in ARRAYS]
    if len({c.shape for c in cols}) != 1 or cols[0].ndim != 1:
        raise ValueError(f"per-token arrays of shapes {[c.shape for c in cols]}: not one length")
    for name, c in zip(ARRAYS[3:], cols[3:]):
        if not np.isfinite(c).all():
            at = int(np.argmin(np.isfinite(c)))
            raise ValueError(f"per-token {name} is not finite at token {at}")
    ints = [c.astype(np.int64).tolist() for c in cols[:3]]
    floats = [c.astype(np.float64).tolist() for c in cols[3:]]
    return [(case_id, *t) for t in zip(*ints, *floats)]


def read_tokens(csv_path: str | Path) -> pd.DataFrame:
    """The per-token file beside a results CSV (empty, with the columns, when there is none);
    UserError naming the file, column and line when it is not such a file."""
    path = tokens_path(csv_path)
    if not path.is_file():
        return pd.DataFrame(columns=list(TOKEN_COLUMNS))
    try:
        df = pd.read_csv(path, dtype={"case_id": str})
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a per-token file ({type(e).__name__})") from None
    missing = [c for c in TOKEN_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path}: not a per-token file (no {', '.join(missing)} column)")
    for col in TOKEN_COLUMNS[1:]:
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(x)
        if bad.any():
            i = int(bad.nonzero()[0][0])
            raise UserError(f"{path}: {col}: not a number in data row {i + 1}: {df[col].iloc[i]!r}")
        df[col] = x.astype(np.int64) if col in ("chunk", "position", "token") else x
    return df


def of_case(tokens: pd.DataFrame, case_id: str) -> pd.DataFrame:
    """One row's tokens in file order (chunk, then position)."""
    return tokens[tokens["case_id"] == case_id].sort_values(["chunk", "position"], kind="stable")

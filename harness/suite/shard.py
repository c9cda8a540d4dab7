"""`kvbench run SUITE --shard i/n`: a deterministic, cost-balanced part of a suite's cases.

A sweep split over n hosts (a CI matrix, a job array: docs/distributed.md) runs every case
exactly once over i = 1..n, and every host computes the same split on its own from the suite
alone. Cost of a case ~ the bytes of its full cache (all layers, K and V, in its format: the
work of a decode step is proportional to them). Split: longest processing time first: cases in
decreasing cost (ties by case_id, so the order never depends on the suite's order of keys)
each go to the part with the least cost so far (ties: the lowest part). Each part keeps the
suite's order of its cases. The heaviest part exceeds the lightest by at most one case's cost.
"""

from __future__ import annotations

import re

from kvbench.case import Case
from kvbench.errors import UserError
from kvbench.kernels.stores.footprint import row_bytes
from kvbench.suite.cache_spec import format_of


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): part 2 of 4 (1-based)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise UserError(f"--shard: expected i/n with 1 <= i <= n, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def case_cost(case: Case) -> int:
    """Bytes of the case's full cache: 2 (K, V) x layers x format bytes of its rows."""
    return row_bytes(format_of(case), case.n_seqs * case.context_len, n_layers=case.n_layers,
                     n_kv_heads=case.n_kv_heads, head_dim=case.head_dim)  # fmt: skip


def assign(cases: list[Case], n: int) -> dict[str, int]:
    """case_id -> its part (0-based), longest processing time first."""
    loads = [0] * n
    parts = {}
    for case in sorted(cases, key=lambda c: (-case_cost(c), c.case_id)):
        part = min(range(n), key=lambda p: (loads[p], p))
        parts[case.case_id] = part
        loads[part] += case_cost(case)
    return parts


def shard_cases(cases: list[Case], i: int, n: int) -> list[Case]:
    """Part i (1-based) of n of the cases, in the suite's order."""
    parts = assign(cases, n)
    return [c for c in cases if parts[c.case_id] == i - 1]

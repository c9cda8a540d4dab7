"""The suite's answers, computed from result rows (pandas only; the report renders them): the
registry of finding topics. Each topic is one module of this package with its TOPIC name and
`find(rows) -> list[Finding]`; what topics share (the Finding record, the join of rows to
their baselines, configuration text) is common.py, the statistics harness/stats.py.

Each finding is one line with its numbers and the figure that shows it (its anchor in
brackets in each module's docstring). Adding a topic: a module here and one line in TOPICS.
This package imports neither mlx nor kernels/.
"""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings import (
    accuracy,
    attribution,
    budget,
    by_position,
    fastest,
    formats,
    generate,
    kv_share,
    layouts,
    memory,
    payoff,
    peers,
    quality,
    retrieval,
    tiles,
    tradeoff,
)
from kvbench.analysis.findings.common import Finding

# in the order the report lists them
MODULES = (fastest, formats, payoff, kv_share, layouts, tiles, peers, quality, tradeoff, budget,
           accuracy, retrieval, attribution, generate, by_position, memory)  # fmt: skip
TOPICS = {m.TOPIC: m.find for m in MODULES}

__all__ = ["TOPICS", "Finding", "findings"]


def findings(cur: pd.DataFrame) -> list[Finding]:
    """Every topic's findings, in TOPICS order."""
    return [f for topic in TOPICS.values() for f in topic(cur)]

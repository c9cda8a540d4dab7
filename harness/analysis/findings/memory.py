"""Topic "memory": per layout, exact, resident and peak bytes side by side
(analysis/memory.py) [residency]."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.findings.common import Finding
from kvbench.analysis.memory import memory_lines

TOPIC = "memory"


def find(cur: pd.DataFrame) -> list[Finding]:
    return [Finding(TOPIC, line, "residency", True) for line in memory_lines(cur)]

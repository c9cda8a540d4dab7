"""pyramidkv: PyramidKV (Cai et al. 2024, arXiv:2406.02069): SnapKV's scores (or any scorer's),
each layer's budget on a line from the most tokens at layer 0 to the fewest at the last layer,
the total that of a uniform budget; as kvpress's PyramidKVPress.get_layer_budget computes it
(kvpress/presses/pyramidkv_press.py, after KVCache-Factory's pyramidkv_utils.py):
max_capacity = window + n (1 - ratio), min = (max_capacity - window) / beta,
max = 2 (max_capacity - window) - min (clipped to n - window, min raised to match), layer i
keeps round(max - i (max - min) / (layers - 1)); where the pyramid does not fit
(n >= max >= min >= window fails) every layer keeps round(n (1 - ratio)). Once, at the end of
the context's prefill. Budgets are set by compression_ratio (the pyramid's definition).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.kernels.model.policies.common import Budget, top
from kvbench.kernels.model.protocol import Observation


def layer_budget(n: int, ratio: float, window: int, beta: int, layer: int, n_layers: int) -> int:
    """Tokens layer `layer` keeps of a context of n (Python float arithmetic, as kvpress)."""
    max_capacity = window + n * (1 - ratio)
    min_num = (max_capacity - window) / beta
    max_num = (max_capacity - window) * 2 - min_num
    if max_num >= n - window:
        max_num = n - window
        min_num = (max_capacity - window) * 2 - max_num
    if not (n >= max_num >= min_num >= window):
        return round(n * (1 - ratio))
    steps = (max_num - min_num) / (n_layers - 1)
    return round(max_num - layer * steps)


@dataclass
class PyramidKV:
    budget: Budget
    scorer: object  # a policy with score(obs) -> [Hkv, m] (snapkv by default)
    window: int = 64  # the pyramid's window_size (kvpress: SnapKV's)
    beta: int = 20
    name: str = "pyramidkv"
    decode: bool = False

    def __post_init__(self):
        if self.budget.compression_ratio is None:
            raise ValueError("pyramidkv: its layer budgets are set by compression_ratio")

    def observe(self, obs: Observation) -> None:
        self.scorer.observe(obs)

    def kept(self, layer: int, n_layers: int, n: int) -> int:
        ratio = self.budget.compression_ratio
        return layer_budget(n, ratio, self.window, self.beta, layer, n_layers)

    def select(self, obs: Observation) -> np.ndarray:
        n = self.kept(obs.layer, obs.n_layers, obs.n_positions)
        return top(self.scorer.score(obs), n)

    def state_bytes(self) -> int:
        return 0

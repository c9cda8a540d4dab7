"""Cache policies: which positions a model cache keeps (kernels/model/protocol.py CachePolicy),
one module per policy, each citing its paper and kvpress's press. POLICIES maps a name to its
maker, `make(name, budget, **params)` builds one; kernels/model/evicting.py is the cache that
asks it. docs/policies.md lists the parameters and what each row records."""

from __future__ import annotations

from kvbench.kernels.model.policies.adakv import AdaKV
from kvbench.kernels.model.policies.common import Budget
from kvbench.kernels.model.policies.expected_attention import ExpectedAttention
from kvbench.kernels.model.policies.h2o import H2O
from kvbench.kernels.model.policies.knorm import Knorm
from kvbench.kernels.model.policies.pyramidkv import PyramidKV
from kvbench.kernels.model.policies.snapkv import SnapKV
from kvbench.kernels.model.policies.tova import TOVA
from kvbench.kernels.model.policies.window import Window

SCORERS = {"snapkv": SnapKV, "knorm": Knorm, "expected_attention": ExpectedAttention, "tova": TOVA}
POLICIES = {
    "window": Window,
    "snapkv": SnapKV,
    "h2o": H2O,
    "tova": TOVA,
    "knorm": Knorm,
    "pyramidkv": PyramidKV,
    "expected_attention": ExpectedAttention,
    "adakv": AdaKV,
}
PARAMS = {  # each policy's parameters beside the budget (its dataclass fields, kvpress's defaults)
    "window": ("sinks",),
    "snapkv": ("window", "kernel_size"),
    "h2o": ("recent_share",),
    "tova": (),
    "knorm": (),
    "pyramidkv": ("scorer", "window", "beta", "kernel_size"),
    "expected_attention": ("n_sink", "n_future"),
    "adakv": ("scorer", "alpha", "window", "kernel_size"),
}
SCORER_PARAMS = ("window", "kernel_size")  # passed on to the inner scorer where it takes them


def make(name: str, budget: Budget, **params):
    """The policy `name` with `budget` and its parameters (an unknown name or parameter: a
    ValueError naming it)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    bad = set(params) - set(PARAMS[name])
    if bad:
        raise ValueError(f"policy {name} takes no {', '.join(sorted(bad))}")
    if name in ("pyramidkv", "adakv"):
        inner = params.pop("scorer", "snapkv")
        if inner not in SCORERS:
            raise ValueError(f"scorer {inner!r}: one of {', '.join(SCORERS)}")
        sub = {k: params.pop(k) for k in SCORER_PARAMS if k in params and inner == "snapkv"}
        if name == "pyramidkv" and "window" in sub:
            params["window"] = sub["window"]
        return POLICIES[name](budget, SCORERS[inner](budget, **sub), **params)
    return POLICIES[name](budget, **params)


def planned_cells(policy, n: int, n_layers: int, n_kv_heads: int) -> list[int]:
    """Cells each layer keeps of a context of n, its KV heads together: the budget per head
    times the heads (adakv moves cells between heads, never in or out of a layer), pyramidkv's
    layer line. The bytes formula the engine states before the run; the cache's kept_cells
    is what ran (tests hold them equal)."""
    if isinstance(policy, PyramidKV):
        return [policy.kept(i, n_layers, n) * n_kv_heads for i in range(n_layers)]
    return [policy.budget.kept(n) * n_kv_heads] * n_layers

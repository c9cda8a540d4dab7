"""The memory guard: a case whose planned bytes exceed the device's available memory is skipped
with the figures, before anything is allocated (a cache too big for memory segfaults or aborts
inside MLX, taking the whole run with it).

Planned bytes of a case (an estimate of its peak, from the shape alone; the case's Resolved,
harness/suite/resolved.py, which `kvbench plan` resolves the same way, so the two agree):
  * the cache: the format's exact bytes, all layers, K and V, in the cells its layout holds
    (kernels/stores/footprint.py: n_seqs x context_len for per-stream, the shared prefix once
    for unified and paged, sinks + window for window);
  * the source K/V the engine fills it from: one layer's K and V in float32 plus a copy in the
    compute dtype (kernels/data.py make_qkv, then astype);
  * the kernel's transient: dequantize-then-attend and the float32 reference of the parity check
    materialise one layer's K and V in float32, repeated over the query heads of each K/V head
    (an upper bound for a kernel that dequantizes to fp16 without repeating), and the attention
    scores and probabilities (float32, n_seqs x n_q_heads x query length x context).
Available memory: on a GPU backend MLX's device_info (Metal: max_recommended_working_set_size;
CUDA: free memory when reported), on the CPU backend the kernel's MemAvailable
(/proc/meminfo). When neither is known the guard stays open and says so nowhere: no figure is
invented. `kvbench plan` prints the same planned bytes against the same available memory.
A model-phase case plans its own parts (harness/suite/model_plan.py): the cache at its whole
capacity (generate: context_len + gen_tokens), the float32 reference, scores and kept logits.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from kvbench.case import Case
from kvbench.suite import resolved

PART_NAMES = {"source": "source K/V"}  # a planned part's name in a refusal, where not its key
DEVICE_KEYS = ("max_recommended_working_set_size", "free_memory", "memory_size", "total_memory")
MEMINFO = Path("/proc/meminfo")


def case_plan(case: Case) -> dict[str, int]:
    """The case's planned bytes: cache, source, transient, total (suite/resolved.py)."""
    return resolved.of_case(case).planned


def available_bytes() -> tuple[int, str] | None:
    """(bytes, where the figure comes from) for the default device, or None when unknown."""
    if mx.default_device().type != mx.DeviceType.cpu:
        try:
            info = mx.device_info()
        except Exception:  # an MLX without device_info for this backend
            info = {}
        for key in DEVICE_KEYS:
            if isinstance(info.get(key), int) and info[key] > 0:
                return info[key], f"mx.device_info()[{key!r}]"
    return meminfo_available()


def meminfo_available(path: Path = MEMINFO) -> tuple[int, str] | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        return None
    return None


def refusal(case: Case, available: tuple[int, str] | None = None) -> str | None:
    """Why the case is too big for this device's memory (its figures), or None."""
    return refusal_for_plan(case_plan(case), available or available_bytes())


def refusal_for_plan(plan: dict, available: tuple[int, str] | None) -> str | None:
    if available is None:
        return None
    limit, source = available
    if plan["total"] <= limit:
        return None
    parts = " + ".join(f"{PART_NAMES.get(k, k)} {v:,}" for k, v in plan.items() if k != "total")
    return (
        f"needs ~{plan['total']:,} B ({parts}), more than the {limit:,} B available "
        f"({source}); see `kvbench plan`"
    )

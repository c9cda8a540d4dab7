"""Suite checks of a cache policy (kernels/model/policies/, docs/policies.md): the phases that
run one (model_decode: the prefill-time policies only), the budget (compression_ratio or
kv_budget, within the context and above the sinks), the cache it composes with (one
per-token format: any kv_dtype and rotation, no separate V format, KIVI keys or fp16 regions,
no window layout), and each policy's own axes. A row never says a policy ran when it did not:
an axis a case's policy does not read is an error here."""

from __future__ import annotations

from kvbench.case import Case
from kvbench.errors import SuiteError
from kvbench.kernels.attention.registry import KERNELS
from kvbench.kernels.model.policies import POLICIES

PHASES = (
    "quality",
    "retrieval",
    "generate",
    "model_decode",
)  # the phases whose engines compress (engines/model*.py)
AXES = ("compression_ratio", "kv_budget", "n_sink", "obs_window", "kernel_size", "scorer")
DEFAULTS = {"compression_ratio": 0.0, "kv_budget": None, "n_sink": 4, "obs_window": 64,
            "kernel_size": 5, "scorer": "snapkv"}  # fmt: skip
SNAP = ("obs_window", "kernel_size")
TAKES = {  # the axes each policy reads beside its budget
    "window": ("n_sink",),
    "snapkv": SNAP,
    "h2o": (),
    "tova": (),
    "knorm": (),
    "pyramidkv": ("scorer", *SNAP),
    "expected_attention": ("n_sink",),
    "adakv": ("scorer", *SNAP),
}
# the cache options a policy does not compose with yet: a mixed spec (separate V format, KIVI
# keys, fp16 regions), and keys stored in another channel order or queries rounded (the
# policies' scores read keys and queries in the model's own basis)
SPEC_AXES = {"v_dtype": None, "k_axis": "token", "sink_tokens": 0, "recent_tokens": 0,
             "k_order": "hf", "q_quant": "none"}  # fmt: skip


def decode_time_reason(name: str) -> str:
    """Why model_decode refuses a policy that selects after every step (window, h2o, tova)."""
    once = ", ".join(n for n, p in POLICIES.items() if not p.decode)
    return (
        f"{name} selects again after every decode step (a decode-time policy): each step "
        "gathers the kept cells in place (and h2o adds to its scores), so rewinding the step's "
        "positions would not restore the cache it started from and every sample would time a "
        f"different cache; model_decode times the prefill-time policies ({once}), compressed "
        "once at the context's end"
    )


def compressed_tokens(case: Case) -> int:
    """Positions the policy compresses: the context half of a quality chunk (the second half,
    scored, is the continuation), a generate chunk but its last token, the depth a model_decode
    step decodes at (context_len - 1), at most the prompt in retrieval (its haystack's end)."""
    if case.phase in ("generate", "model_decode"):  # all but the token that follows
        return case.context_len - 1
    return case.context_len // 2 if case.phase == "quality" else case.context_len


def check_policy(path: str, case: Case) -> None:
    if case.policy == "none":
        off = [a for a in AXES if getattr(case, a) != DEFAULTS[a]]
        if off:
            raise SuiteError(path, off[0], "only with a cache policy (policy: ...)")
        return
    if case.phase not in PHASES:
        why = (
            f"a cache policy runs in phase {', '.join(PHASES)} (the model engine), not {case.phase}"
        )
        raise SuiteError(path, "policy", why)
    if case.phase == "model_decode" and getattr(POLICIES.get(case.policy), "decode", False):
        raise SuiteError(path, "policy", decode_time_reason(case.policy))
    if case.kernel not in KERNELS:
        raise SuiteError(path, "kernel", f"{case.kernel} cannot run a kvbench cache policy")
    for axis, default in SPEC_AXES.items():
        if getattr(case, axis) != default:
            why = f"a cache policy holds one per-token format; {axis} is not {default}"
            raise SuiteError(path, axis, why)
    if case.window is not None:
        raise SuiteError(path, "window", "a cache policy replaces the window; not both")
    check_budget(path, case)
    takes = reads(case)
    for axis in AXES[2:]:
        if getattr(case, axis) != DEFAULTS[axis] and axis not in takes:
            raise SuiteError(path, axis, f"policy {case.policy} does not read it")


def reads(case: Case) -> tuple[str, ...]:
    """The policy axes a case's policy reads (its scorer's too for pyramidkv and adakv)."""
    if case.policy in ("pyramidkv", "adakv"):
        return ("scorer", *SNAP) if case.scorer == "snapkv" else ("scorer",)
    return TAKES.get(case.policy, ())  # a policy added without axes reads only its budget


def check_budget(path: str, case: Case) -> None:
    n = compressed_tokens(case)
    if case.kv_budget is not None and case.compression_ratio:
        raise SuiteError(path, "kv_budget", "set compression_ratio or kv_budget, not both")
    if case.kv_budget is not None and case.policy == "pyramidkv":
        raise SuiteError(
            path, "kv_budget", "pyramidkv's layer budgets are set by compression_ratio"
        )
    if case.kv_budget is not None and case.kv_budget > n:
        raise SuiteError(
            path, "kv_budget", f"{case.kv_budget}: larger than the {n} tokens compressed"
        )
    sinks = case.n_sink if case.policy in ("window", "expected_attention") else 0
    kept = case.kv_budget if case.kv_budget is not None else int(n * (1 - case.compression_ratio))
    if kept < sinks:
        raise SuiteError(path, "kv_budget" if case.kv_budget else "compression_ratio",
                         f"{kept} tokens kept: fewer than the {sinks} sinks (n_sink)")  # fmt: skip
    window = case.obs_window if "obs_window" in reads(case) else 0
    if window and window >= n:
        raise SuiteError(
            path, "obs_window", f"{window}: not shorter than the {n} tokens compressed"
        )
    if window and kept <= window:  # SnapKV keeps its window first (policies/snapkv.py)
        raise SuiteError(path, "obs_window", f"{window}: the {kept} tokens kept fit in the "
                         "observation window, so no score would choose one; keep more tokens "
                         "or lower obs_window")  # fmt: skip

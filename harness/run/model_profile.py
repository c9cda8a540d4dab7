"""`kvbench profile` of a model case: where one whole-model step goes (issue #36).

The step is the model_decode phase's decode step at depth context_len - 1, or with `--ubatch N`
a prefill micro-batch of N tokens at depth context_len - N (engines/model_step.py). Every part
is timed on its own with kvbench's timer (warm-up, adaptive sampling, rounds, as `kvbench run`):
the cache write (quantize on write) and the attention over the stored cache (the case's kernel)
for every layer, and per layer kind where the model has several (Gemma's sliding and global
layers); the attention projections, the MLP and the output head (weight matmuls); the norms;
RoPE; the embedding lookup (kernels/model/parts.py replays each part's calls on the inputs it
had in the step). Their sum is set against the step; the difference is what no part holds
(elementwise glue between the parts) less what the parts count more than once (each part is its
own evaluation, the step one). The framework's cost is measured beside it: building the step's
graph (inside each step sample, by the step itself), one evaluation of one op, and a chain of as
many ops as the step's graph holds.
"""

from __future__ import annotations

import dataclasses

from kvbench import stats, timer
from kvbench.case import Case
from kvbench.engines import model as model_engine
from kvbench.run import runner
from kvbench.suite.resolved import of_case
from kvbench.suite.suite import Settings

PART_NAMES = {
    "write": "KV write (quantize on write), all layers",
    "attend": "attention over the stored cache, all layers",
    "proj": "attention projections q/k/v/o (matmuls)",
    "mlp": "MLP (matmuls)",
    "head": "output head (matmul)",
    "norm": "norms",
    "rope": "RoPE",
    "embed": "embedding lookup",
}


def measure(stages: dict, settings: Settings, step) -> dict[str, list[float]]:
    """Samples of every stage, rounds interleaved as the runner does; graph_build: the build
    time the step recorded in each of its sampled calls."""
    samples: dict[str, list[float]] = {s: [] for s in stages}
    samples["graph_build"] = []
    settings = dataclasses.replace(settings, stages=True)
    for round_no in range(settings.rounds):
        for stage, plan in runner.timer_plans(stages, settings, round_no).items():
            fn = stages[stage]
            timer.warm_up(fn, plan.pop("warmup_s"))
            step.built_ms.clear()
            new = timer.sample(fn, prior_ms=samples[stage], **plan)
            samples[stage] += new
            if stage == "step":
                samples["graph_build"] += step.built_ms[-len(new) :]
    return samples


def _row(name: str, xs: list[float], step_ms: float, label: str = "") -> dict:
    s = stats.summarize(xs)
    return {"stage": name, "label": label, "n": s["n_samples"], "median_ms": s["median_ms"],
            "ci_low_ms": s["ci_low_ms"], "ci_high_ms": s["ci_high_ms"], "min_ms": min(xs),
            "pct_of_step": 100 * s["median_ms"] / step_ms}  # fmt: skip


def breakdown(samples: dict[str, list[float]]) -> dict[str, list[dict]]:
    """The step; its parts with their sum and the difference; per layer kind; the framework."""
    step_ms = stats.summarize(samples["step"])["median_ms"]
    parts = [_row(p, samples[p], step_ms, PART_NAMES[p]) for p in PART_NAMES if p in samples]
    total = sum(r["median_ms"] for r in parts)
    diff = step_ms - total
    least = sum(r["min_ms"] for r in parts), min(samples["step"])
    summed = [
        {"stage": "sum", "label": "sum of the parts", "median_ms": total,
         "pct_of_step": 100 * total / step_ms, "min_ms": least[0]},
        {"stage": "difference", "median_ms": diff, "pct_of_step": 100 * diff / step_ms,
         "min_ms": least[1] - least[0],
         "label": "step - sum: elementwise glue no part holds (residual adds, activation "
                  "products, reshapes), less the evaluation floor counted once per part"},
    ]  # fmt: skip
    kinds = [_row(s, xs, step_ms) for s, xs in samples.items() if "[" in s and "ops]" not in s]
    frame = [_row("graph_build", samples["graph_build"], step_ms, "building the step's graph "
                  "(in each step sample)")]  # fmt: skip
    frame += [_row(s, xs, step_ms, _framework_label(s)) for s, xs in samples.items()
              if s == "eval_floor" or s.startswith("dispatch[")]  # fmt: skip
    return {"step": [_row("step", samples["step"], step_ms, "the whole step")],
            "parts": parts + summed, "kinds": kinds, "framework": frame}  # fmt: skip


def _framework_label(stage: str) -> str:
    if stage == "eval_floor":
        return "one evaluation of one op + synchronize (each timed call pays it)"
    return "a chain of one-element adds, as many ops as the step's graph"


def format_breakdown(case: Case, backend: str, n_new: int, table: dict) -> str:
    what = "decode step" if n_new == 1 else f"prefill micro-batch of {n_new} tokens"
    depth = case.context_len - n_new
    lines = [f"{case.case_id}  {case.label()}  (backend {backend})",
             f"{case.model}: one {what} at depth {depth}, every part timed on its own"]  # fmt: skip
    head = (f"{'part':<16} {'n':>4} {'median ms':>10} {'95% CI ms':>19} {'% step':>7} "
            f"{'min ms':>9}  what")  # fmt: skip
    for title, key in (("", "step"), ("", "parts"), ("per layer kind", "kinds"),
                       ("framework, measured on its own", "framework")):  # fmt: skip
        if not table[key]:
            continue
        lines += [title] if title else []
        lines += [head] if key == "step" else []
        for r in table[key]:
            ci = f"{r['ci_low_ms']:.4g} - {r['ci_high_ms']:.4g}" if "ci_low_ms" in r else ""
            cells = (
                f"{r['median_ms']:>10.4g} {ci:>19} {r['pct_of_step']:>6.1f}% {r['min_ms']:>9.4g}"
            )
            lines.append(f"{r['stage']:<16} {r.get('n', ''):>4} {cells}  {r['label']}")
    lines.append(
        "min ms: the least sample, what a part costs when nothing else interferes (on a "
        "shared machine the medians of parts timed at different moments need not add up)"
    )
    return "\n".join(lines)


def profile_model(case: Case, settings: Settings, backend: str, n_new: int = 1) -> str:
    """The breakdown of one model step of `case` as text."""
    state = model_engine.decode_state(case, of_case(case), n_new)
    step = state.profile
    stages = {"step": state.stages["step"], **step.parts()}
    samples = measure(stages, settings, step)
    return format_breakdown(case, backend, n_new, breakdown(samples))

"""A long-lived measuring process for the paired gate (harness/analysis/paired.py drives it).

Run as a script, never imported by kvbench itself: `python worker.py TREE SUITE [--device D]`
loads the kvbench code of the checkout at TREE (its harness/ and kernels/, in the layout of
that commit: installed-name layout `kvbench`, or the older top-level `harness`), expands SUITE
with that code and answers one JSON request per stdin line with one JSON line on stdout:

  {"op": "cases"}                     -> {"cases": [{"case_id": ..., "label": ...}, ...]}
  {"op": "build", "case_id", "warmup_s"} -> {"ok": true} | {"skip": reason} | {"error": text}
  {"op": "sample", "n": k}            -> {"ms": [k samples of the built case's step]}
  {"op": "drop"}                      -> {"ok": true} (frees the built case)
  {"op": "quit"}                      -> exits

`--cpu N` pins the worker (and every thread MLX starts) to CPU N. The driver pins both sides'
workers to the same CPU: on a shared machine, a process that the scheduler keeps on a busier
core is slower for seconds at a time (measured here: two identical workers differed by up to
6x for 3 s; pinned to one core, the same pairs agreed within 1.5% at load average 29), and
only a shared core makes that interference hit both members of a pair.

A build runs the tree's own engine (allocation, fill, parity check) once, then warms the step
up by time; samples are timed here, with the same loop for both sides (perf_counter around the
step, mx.eval of its outputs and a synchronize), so a change of the timer code is never a
change of the measured code. Anything the tree's code prints goes to stderr: stdout carries the
protocol alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

BLAS_FILE = Path(__file__).resolve().parents[1] / "blas.py"  # the driver's, not the tree's


def preload_blas() -> dict:
    """The BLAS the driver chose (KVBENCH_BLAS, set by kvbench.blas.child_env), loaded by this
    checkout's harness/blas.py, so a tree whose code chooses none (older) runs on it too."""
    spec = importlib.util.spec_from_file_location("kvbench_worker_blas", BLAS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.preload()


def load_tree(tree: Path) -> dict:
    """The functions the worker needs, from the kvbench code at `tree`."""
    room = next((r for r in ("suite", "spec") if (tree / "harness" / r).is_dir()), None)
    if room:  # harness/suite/ (harness/spec/ before it was renamed): kvbench.* by name
        for name, folder in (("kvbench", "harness"), ("kvbench.kernels", "kernels")):
            spec = importlib.util.spec_from_file_location(
                name, tree / folder / "__init__.py", submodule_search_locations=[str(tree / folder)]
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        from kvbench import engines as chooser
        from kvbench.run.context import backend_name, set_device

        suite = importlib.import_module(f"kvbench.{room}.suite")
        expand, load_suite = suite.expand, suite.load_suite

        try:  # the memory guard, in trees that have one
            from kvbench.run.memory import refusal as guard
        except ImportError:
            guard = None
    else:
        guard = None
        sys.path.insert(0, str(tree))  # before the restructure: top-level `harness`, `kernels`
        from harness import runner as chooser  # type: ignore[import-not-found]
        from harness.context import backend_name, set_device  # type: ignore[import-not-found]
        from harness.suite import expand, load_suite  # type: ignore[import-not-found]
    return dict(
        load_suite=load_suite,
        expand=expand,
        engine_for=chooser.engine_for,
        skip_reason=chooser.skip_reason,
        backend=backend_name,
        device=set_device,
        guard=guard or (lambda case: None),
    )


class Worker:
    def __init__(self, api: dict, suite: str):
        self.api = api
        self.cases = {c.case_id: c for c in api["expand"](api["load_suite"](suite))}
        self.step = None

    def cases_op(self, _req: dict) -> dict:
        return {"cases": [{"case_id": k, "label": c.label()} for k, c in self.cases.items()]}

    def build_op(self, req: dict) -> dict:
        self.step = None
        case = self.cases.get(req["case_id"])
        if case is None:
            return {"skip": "not a case of this suite at this commit"}
        reason = self.api["skip_reason"](case, self.api["backend"]()) or self.api["guard"](case)
        if reason:
            return {"skip": reason}
        state = self.api["engine_for"](case).build(case)
        if getattr(state, "job", None) is not None or "step" not in state.stages:
            return {"skip": "its stages run in other processes or it times nothing (not paired)"}
        state.check()  # the parity gate: a wrong kernel is an error, never a time
        self.step = state.stages["step"]
        start, calls = time.perf_counter(), 0
        while calls < 2 or time.perf_counter() - start < float(req.get("warmup_s", 0.1)):
            self.time_step()
            calls += 1
        return {"ok": True}

    def time_step(self) -> float:
        import mlx.core as mx

        t0 = time.perf_counter()
        out = self.step()
        if out is not None:
            mx.eval(out)
        mx.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def sample_op(self, req: dict) -> dict:
        if self.step is None:
            return {"error": "no case built"}
        return {"ms": [self.time_step() for _ in range(int(req.get("n", 1)))]}

    def drop_op(self, _req: dict) -> dict:
        import mlx.core as mx

        self.step = None
        mx.clear_cache()
        return {"ok": True}


def serve(worker: Worker, out) -> None:
    ops = {
        "cases": worker.cases_op,
        "build": worker.build_op,
        "sample": worker.sample_op,
        "drop": worker.drop_op,
    }
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "quit":
            return
        try:
            reply = ops[req["op"]](req)
        except Exception as exc:  # one case failing must not end the worker
            reply = {"error": f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def main(argv: list[str]) -> int:
    tree, suite = Path(argv[0]).resolve(), argv[1]
    cpu = option(argv, "--cpu")
    if cpu is not None:  # before mlx starts its threads: they inherit the affinity
        os.sched_setaffinity(0, {int(cpu)})
    preload_blas()  # before the tree's code imports mlx.core, after the pin (BLAS threads too)
    out, sys.stdout = sys.stdout, sys.stderr  # protocol on stdout, everything else on stderr
    try:
        api = load_tree(tree)
        api["device"](option(argv, "--device"))
        worker = Worker(api, suite)
    except Exception as exc:  # the tree's code or the suite does not load: say so, then end
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
        out.write(json.dumps({"error": text}) + "\n")
        out.flush()
        return 2
    serve(worker, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

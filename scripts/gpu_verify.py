"""`make gpu-verify`: verify kvbench's GPU paths on a Linux machine with an NVIDIA GPU, or a Mac
with Apple silicon, in one command within 10 minutes. Ran on an NVIDIA H200 (docs/kernels.md);
not yet on a Mac.

Steps, each timed and logged to OUT/gpu-verify-<stamp>.log, with a summary in
OUT/gpu-verify-<stamp>.json:
 1. venv: a fresh virtual environment in ${KVBENCH_CACHE:-~/.cache/kvbench}/gpu-verify, with
    the system's site-packages visible (an offline GPU machine's numpy, pandas, pyyaml, scipy,
    plotly, pytest serve as they are);
 2. mlx: MLX's GPU backend into it: from --wheels DIR (offline, --no-deps: the mlx and
    mlx-cuda-13 wheels, or the halves shared/gpu/prepare-mlx-cuda.sh makes; the machine's
    nvidia-* libraries and Python packages are used as they are), else from the index
    (mlx[cuda13] on Linux, mlx on macOS, within pyproject.toml's bound, and kvbench's
    dependencies);
 3. backend: MLX must see the GPU (mx.cuda / mx.metal);
 4. tests: KVBENCH_GPU=1 pytest -m gpu (tests/test_gpu_parity.py: every GPU kernel against the
    reference at realistic, sliced and tiny shapes);
 5. overhead: scripts/gpu_overhead.py (where a call's time goes: host build, eval, splits,
    the encoders, a whole decode step; before the suite, whose rows it explains);
 6. suite: kvbench run suites/gpu-verify.yaml --device gpu (stopped with SIGINT, keeping the
    completed rows, if the 10 minutes run out);
 7. copy: the copy-bandwidth probe (scripts/copy_bandwidth.py);
 8. report: kvbench report OUT --latest -> OUT/gpu-verify-<stamp>.html.
kvbench runs from this checkout (PYTHONPATH), not installed. --dry-run checks the plan and the
suite without a GPU. --python current skips step 1 and installs the wheels into the running
interpreter (an offline machine whose python already holds numpy, pandas, scipy, pytest: a venv
made from a venv does not see its packages); --budget-s and --suite size the run to a lease.
Each step after `backend` gets at most its share of the budget (STEP_SHARE), so a slow test
step cannot starve the suite, and a step past its share is stopped with SIGINT (kvbench run
keeps the rows it completed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 600
# the most of the budget left when a step starts that the step may take
# overhead 0.5: on the 2026-11-28 H200 its 0.3 (92 s) stopped it after its JIT compiles; alone it
# took 42 s on the warm machine (docs/kernels.md, second GPU run)
STEP_SHARE = {"tests": 0.4, "suite": 0.75, "overhead": 0.5, "copy": 0.5, "report": 1.0}
MLX_BOUND = ">=0.32,<0.33"  # pyproject.toml's bound, the versions the compile gates check


def gpu_kind() -> str | None:
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "metal"
    if platform.system() == "Linux" and (
        shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()
    ):
        return "cuda"
    return None


def wheel_files(dirs: list[Path], scratch: Path) -> list[Path]:
    """The *.whl in `dirs`, plus the CUDA wheel rejoined from prepare-mlx-cuda.sh's halves
    (part-a, part-b and the file `name` giving the wheel's file name)."""
    files = [w for d in dirs for w in sorted(d.glob("*.whl"))]
    parts = {p.name: p for d in dirs for p in d.iterdir() if p.name in ("part-a", "part-b", "name")}
    if {"part-a", "part-b", "name"} <= set(parts):
        joined = scratch / parts["name"].read_text().strip()
        joined.write_bytes(parts["part-a"].read_bytes() + parts["part-b"].read_bytes())
        files.append(joined)
    return files


def plan(
    kind: str,
    venv: Path | None,
    wheels: list[Path],
    out: Path,
    stamp: str,
    suite: str = "suites/gpu-verify.yaml",
    test_workers: int = 0,
) -> list[tuple]:
    """(step, argv, extra env) in order; argv[0] 'PY' is the interpreter that runs kvbench
    (the venv's, or with venv None the running one: no venv step)."""
    if wheels:
        mlx = ["PY", "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)]
    else:
        spec = f"mlx[cuda13]{MLX_BOUND}" if kind == "cuda" else f"mlx{MLX_BOUND}"
        deps = [
            "numpy",
            "pandas",
            "pyyaml",
            "plotly",
            "scipy",
            "pytest",
        ]  # pyproject's runtime + test
        mlx = ["PY", "-m", "pip", "install", "-q", spec, *deps]
    probe = "import mlx.core as mx; ok = mx.cuda.is_available() or mx.metal.is_available(); "
    probe += "print(mx.__version__, mx.default_device(), mx.device_info()); assert ok, 'no GPU'"
    make_venv = [sys.executable, "-m", "venv", "--clear", "--system-site-packages", str(venv)]
    return [
        *([("venv", make_venv, {})] if venv is not None else []),
        *([("mlx", mlx, {})] if venv is not None or wheels else []),
        ("backend", ["PY", "-c", probe], {}),
        (
            "tests",
            [
                "PY",
                "-m",
                "pytest",
                "-q",
                "-rfE",
                "--tb=line",
                *(["-n", str(test_workers)] if test_workers else []),
                "-p",
                "no:cacheprovider",
                "-m",
                "gpu",
                "tests/test_gpu_parity.py",
                f"--junitxml={out}/gpu-parity-{stamp}.xml",
            ],
            {"KVBENCH_GPU": "1"},
        ),  # fmt: skip
        # before the suite: where a call's fixed cost goes is the question the suite's rows need
        # answered (issue 45), and the suite keeps its completed rows if its share runs out
        ("overhead", ["PY", "scripts/gpu_overhead.py"], {}),
        (
            "suite",
            [
                "PY",
                "-m",
                "kvbench",
                "run",
                suite,
                "--out",
                str(out),
                "--device",
                "gpu",
            ],
            {},
        ),  # fmt: skip
        (
            "copy",
            ["PY", "scripts/copy_bandwidth.py", "--out", str(out / f"copy-bandwidth-{stamp}.json")],
            {},
        ),  # fmt: skip
        (
            "report",
            [
                "PY",
                "-m",
                "kvbench",
                "report",
                str(out),
                "--latest",
                "-o",
                str(out / f"gpu-verify-{stamp}.html"),
            ],
            {},
        ),  # fmt: skip
    ]


def _sigint_default() -> None:
    """In the step's process: SIGINT back to its default, so Python turns it into
    KeyboardInterrupt even when this script runs with SIGINT ignored (a background job of a
    non-interactive shell, nohup: the step would then run on past its budget until killed)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_step(argv: list[str], env: dict, log, timeout_s: float) -> int:
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_sigint_default)  # fmt: skip
    try:
        return proc.wait(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # kvbench run keeps the completed rows on Ctrl-C
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def execute(steps: list[tuple], py: str, out: Path, stamp: str, budget_s: float = 0) -> dict:
    """Run `steps` with `py` as PY, each within its share of what is left of the budget."""
    budget_s = budget_s or BUDGET_S
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    t0, summary = time.monotonic(), {"stamp": stamp, "steps": []}
    with open(out / f"gpu-verify-{stamp}.log", "w") as log:
        for name, argv, extra in steps:
            left = (budget_s - (time.monotonic() - t0)) * STEP_SHARE.get(name, 1.0)
            start = time.monotonic()
            print(f"gpu-verify: {name} ({left:.0f} s left)", file=sys.stderr, flush=True)
            log.write(f"\n==== {name}: {' '.join(argv)}\n")
            log.flush()
            rc = run_step([py if a == "PY" else a for a in argv], {**env, **extra}, log, left)
            summary["steps"].append(
                {"step": name, "rc": rc, "s": round(time.monotonic() - start, 1)}
            )
            if rc != 0 and name in ("venv", "mlx", "backend"):
                break  # nothing after them can run
    summary["total_s"] = round(time.monotonic() - t0, 1)
    summary["ok"] = all(s["rc"] == 0 for s in summary["steps"]) and len(summary["steps"]) == len(
        steps
    )
    return summary


def dry_run(steps: list[tuple], suite: str = "suites/gpu-verify.yaml") -> int:
    for name, argv, extra in steps:
        print(f"{name:8s} {' '.join(f'{k}={v}' for k, v in extra.items())} {' '.join(argv)}")
    venv_py = ROOT / ".venv" / "bin" / "python"  # `make install`'s venv, if any, has MLX
    py = str(venv_py) if venv_py.exists() else sys.executable
    check = [py, "-m", "kvbench", "run", suite, "--dry-run"]
    res = subprocess.run(check, cwd=ROOT, capture_output=True, text=True)
    lines = res.stdout.strip().splitlines()
    # the suite's summary ("N cases, ...") and whatever kvbench prints after it (its estimate)
    at = max((i for i, line in enumerate(lines) if " cases, " in line), default=len(lines) - 1)
    print("\n".join(lines[at:]) if res.returncode == 0 else res.stderr.strip())
    return res.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="verify kvbench's GPU paths (docs/kernels.md)")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--wheels", type=Path, action="append", default=[], help="offline wheels")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, check the suite")
    ap.add_argument("--python", choices=("venv", "current"), default="venv",
                    help="current: no venv, wheels into the running interpreter")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="whole run, seconds")
    ap.add_argument("--suite", default="suites/gpu-verify.yaml")
    ap.add_argument("--test-workers", type=int, default=0, help="pytest-xdist workers, if any")
    args = ap.parse_args(argv)
    kind = gpu_kind()
    if kind is None and not args.dry_run:
        print("gpu-verify: needs Linux with an NVIDIA GPU or a Mac with Apple silicon "
              f"(this is {platform.system()} {platform.machine()}); --dry-run checks the plan",
              file=sys.stderr)  # fmt: skip
        return 2
    cache = Path(os.environ.get("KVBENCH_CACHE") or Path.home() / ".cache" / "kvbench")
    venv, stamp = cache / "gpu-verify" / "venv", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    scratch = cache / "gpu-verify" / "wheels"
    scratch.mkdir(parents=True, exist_ok=True)
    wheels = wheel_files(args.wheels, scratch)
    own_venv = venv if args.python == "venv" else None
    steps = plan(kind or "cuda", own_venv, wheels, args.out, stamp, args.suite, args.test_workers)
    if args.dry_run:
        return dry_run(steps, args.suite)
    args.out.mkdir(parents=True, exist_ok=True)
    py = str(venv / "bin" / "python") if own_venv else sys.executable
    summary = execute(steps, py, args.out, stamp, args.budget_s)
    (args.out / f"gpu-verify-{stamp}.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

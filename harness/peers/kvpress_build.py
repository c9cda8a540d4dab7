"""Build NVIDIA kvpress's own environment: a virtualenv with kvpress (pinned, from PyPI), a CPU
torch and the `gguf` package, once, cached.

kvpress needs torch and pins `transformers<5.3`, so it cannot share kvbench's environment (the
default install has no torch: tests/test_no_torch.py). Like the llama.cpp build
(llamacpp_build.py) it lives outside the repository, in
`${KVBENCH_CACHE:-~/.cache/kvbench}/kvpress/<version>-<spec hash>/` (venv/, build.json,
build.log), so CI's fresh clones reuse it; a second run with the same pins returns at once.

torch is asked for as `torch==2.13.0+cpu`: a local `+cpu` version never resolves to the index's
default torch wheel, which brings several GB of CUDA packages (the reason the Makefile's
`peers` target pins the same). Where pip cannot find it, the build fails, build.json records
the reason and the kvpress tests skip with it; `make kvpress` still exits 0 unless --strict.
The side of the peer that runs inside this environment is harness/peers/side/kvpress_side.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# the build record is llama.cpp's peer's: the same file name, written atomically
from kvbench.peers.llamacpp_build import read_stamp, write_stamp  # noqa: F401 (kvpress.py reads it here)

VERSION = "0.5.5"  # kvpress on PyPI
TORCH = "torch==2.13.0+cpu"
# kvpress 0.5.5's own pin is transformers<5.3,>=4.56; gguf: transformers' GGUF loader needs it
EXTRAS = ("transformers<5.3", "gguf>=0.10")
STAMP = "build.json"
# The versions of kvpress's environment CI last passed with (`make lock` rewrites it): installs
# are held to them, so a new machine builds what was tested (issue 51). Absent outside a checkout.
LOCK = Path(__file__).resolve().parents[2] / "constraints" / "kvpress.txt"
PROBE = (
    "import json, kvpress, torch, transformers, gguf, importlib.metadata as m; "
    "print(json.dumps({'kvpress': m.version('kvpress'), 'torch': torch.__version__, "
    "'transformers': transformers.__version__, 'gguf': m.version('gguf'), "
    "'cuda': torch.version.cuda}))"
)


def cache_root() -> Path:
    return Path(os.environ.get("KVBENCH_CACHE") or Path.home() / ".cache" / "kvbench")


def requirements(version: str = VERSION, torch: str = TORCH) -> tuple[str, ...]:
    return (torch, f"kvpress=={version}", *EXTRAS)


def lock_text(lock: Path) -> str:
    return lock.read_text() if lock.is_file() else ""


def spec_hash(reqs: tuple[str, ...], python: str | None = None, lock: str = "") -> str:
    """Ten hex digits naming the environment: the interpreter, the platform, the pins, the lock."""
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    tag = f"{platform.system()}-{platform.machine()}-py{python}"
    return hashlib.sha256("\n".join((tag, *reqs, lock)).encode()).hexdigest()[:10]


def env_dir(version: str = VERSION, torch: str = TORCH) -> Path:
    """Where the environment for these pins lives (Path)."""
    tag = spec_hash(requirements(version, torch), lock=lock_text(LOCK))
    return cache_root() / "kvpress" / f"{version}-{tag}"


def env_python(directory: Path) -> Path:
    return directory / "venv" / "bin" / "python"


def is_built(stamp: dict | None) -> bool:
    return bool(stamp) and stamp.get("status") == "ok" and Path(stamp.get("python", "")).is_file()


class BuildError(RuntimeError):
    pass


def run_step(cmd: list[str], log) -> str:
    """Run one step with its output in the log; its stdout's last line (the probe's JSON)."""
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    log.write(done.stdout)
    if done.returncode != 0:
        raise BuildError(f"`{' '.join(cmd[:6])} ...` exited {done.returncode}")
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def install(directory: Path, reqs: tuple[str, ...], log, locked: bool = True) -> dict:
    """venv, torch first (alone, so nothing else can pull another build), then kvpress with
    torch held to the same pin, every package held to the lock where there is one; returns the
    probe's versions."""
    python = env_python(directory)
    if not python.is_file():
        run_step([sys.executable, "-m", "venv", str(directory / "venv")], log)
    held = ["-c", str(LOCK)] if locked and lock_text(LOCK) else []
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *held]
    run_step([*pip, reqs[0]], log)
    constraints = directory / "constraints.txt"
    constraints.write_text(reqs[0] + "\n")
    run_step([*pip, "-c", str(constraints), *reqs[1:]], log)
    try:
        return json.loads(run_step([str(python), "-c", PROBE], log))
    except ValueError as e:
        raise BuildError(f"the environment's probe printed no JSON ({e})") from None


def base_stamp(version: str, reqs: tuple[str, ...]) -> dict:
    return {"version": version, "requirements": list(reqs), "platform": platform.platform()}


def build(version: str = VERSION, torch: str = TORCH) -> dict:
    """Build once per pins; returns build.json's content (status ok / failed, with reason)."""
    directory = env_dir(version, torch)
    old = read_stamp(directory)
    if is_built(old):
        return old
    reqs = requirements(version, torch)
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "build.log"
    start = time.monotonic()
    with open(log_path, "a") as log:
        try:
            versions = install(directory, reqs, log)
        except (BuildError, OSError) as e:
            stamp = {**base_stamp(version, reqs), "status": "failed"}
            return write_stamp(directory, {**stamp, "reason": f"{e} (log: {log_path})"})
    stamp = {**base_stamp(version, reqs), "status": "ok", "versions": versions}
    stamp.update(python=str(env_python(directory)), seconds=round(time.monotonic() - start, 1))
    return write_stamp(directory, {**stamp, "log": str(log_path)})


def relock(version: str = VERSION, torch: str = TORCH) -> Path:
    """Resolve kvpress's environment afresh from its pins alone and write its versions to LOCK
    (`make lock`); raises BuildError when the install fails."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvpress-lock-") as tmp:
        with open(Path(tmp) / "build.log", "a") as log:
            install(Path(tmp), requirements(version, torch), log, locked=False)
        freeze = [str(env_python(Path(tmp))), "-m", "pip", "freeze", "--all"]
        frozen = subprocess.run(freeze, capture_output=True, text=True, check=True).stdout
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    LOCK.write_text(LOCK_HEADER + "\n".join(sorted(frozen.splitlines(), key=str.lower)) + "\n")
    return LOCK


LOCK_HEADER = "# kvpress's environment as CI last passed it; `make lock` rewrites this file\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build kvpress's own virtualenv (docs/peers.md)")
    parser.add_argument("--version", default=VERSION)
    parser.add_argument("--torch", default=TORCH, help=f"torch requirement (default {TORCH})")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the build fails")
    parser.add_argument("--relock", action="store_true", help=f"rewrite {LOCK.name} and stop")
    args = parser.parse_args(argv)
    if args.relock:
        print(f"kvpress lock written: {relock(args.version, args.torch)}")
        return 0
    stamp = build(args.version, args.torch)
    if stamp["status"] == "ok":
        took = f", built in {stamp['seconds']} s" if "seconds" in stamp else ""
        v = stamp["versions"]
        print(f"kvpress {v['kvpress']} (torch {v['torch']}, transformers {v['transformers']}"
              f"{took}): {env_dir(args.version, args.torch)}")  # fmt: skip
        return 0
    print(f"kvpress not built: {stamp['reason']}", file=sys.stderr)
    return 1 if args.strict else 0


if __name__ == "__main__":
    sys.exit(main())

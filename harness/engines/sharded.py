"""The sharded engine: one decode step with the KV cache spread over `shards` ranks.

The process boundary. MLX's collectives need one process per rank, started by MLX's launcher
(`mlx.launch`), so the ranks cannot live in the suite's process. `build(case, r)` prepares no
arrays: it returns a State whose `job` the runner calls once per round with each stage's timer
arguments. The job writes them with the case to a JSON spec in a temporary folder and runs

    mlx.launch -n N --backend ring --starting-port P -- python -m kvbench.engines.sharded_rank
        SPEC OUT

as a child process group (a wall-clock limit ends the whole group). Every rank builds its part
of the cache (harness/engines/sharded_rank.py); rank 0 runs the parity check and times every
stage with kvbench's own timer, the other ranks run the same calls in lockstep (rank 0 decides
when each loop ends), and rank 0 writes OUT: samples per stage, accuracy, memory and the
engine's fields as JSON, or an error. The job turns that into a JobResult and the runner into
the row, exactly as it does for a State timed in its own process.

Launcher settings come from the environment (docs/distributed.md): KVBENCH_LAUNCH_BACKEND
(unset: mlx.launch's default, nccl where CUDA is, else ring; or mpi, jaccl), KVBENCH_LAUNCH_HOSTFILE
(mlx.launch's --hostfile, for ranks on several machines), KVBENCH_LAUNCH_TIMEOUT_S (the limit).

Byte model: bytes_read / bytes_written are those of the whole step over all ranks (each K/V
byte is read once somewhere: the single-device model), so gbps is the ranks' aggregate rate;
rank_kv_bytes is the fullest rank's share; sent_bytes the combines' ring model
(kernels/attention/sharded.py sent_bytes) times the layers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import mlx.core as mx

from kvbench.case import Case
from kvbench.engines import common, metrics
from kvbench.engines.contract import JobResult, State
from kvbench.engines.parity import ParityError
from kvbench.kernels.attention.sharded import sent_bytes, split_bounds
from kvbench.kernels.stores.footprint import row_bytes
from kvbench.suite import resolved
from kvbench.suite.resolved import Resolved

STAGES = ("step", "write", "attend", "comm")
BACKENDS = ("ring", "mpi", "nccl", "jaccl", "jaccl-ring")  # mlx.launch --backend choices
STARTUP_S = 120  # launcher, interpreter and MLX start-up, cache build, parity check


def launch_backend() -> str:
    """KVBENCH_LAUNCH_BACKEND, else mlx.launch's own default: nccl where CUDA is, else ring."""
    given = os.environ.get("KVBENCH_LAUNCH_BACKEND")
    return given or ("nccl" if mx.cuda.is_available() else "ring")


def launcher() -> str | None:
    """MLX's launcher script beside this Python (its venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "mlx.launch"
    if beside.exists():
        return str(beside)
    from shutil import which

    return which("mlx.launch")


def claims(case: Case) -> bool:
    return case.shards > 1


def hostfile_ranks(path: str) -> int | None:
    """Ranks mlx.launch starts from a hostfile (one per host entry); None if unreadable."""
    try:
        return len(json.loads(Path(path).read_text())["hosts"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def skip_reason(case: Case, backend: str) -> str | None:
    if launch_backend() not in BACKENDS:
        return f"KVBENCH_LAUNCH_BACKEND={launch_backend()}: known {', '.join(BACKENDS)}"
    if launcher() is None:
        return "mlx.launch (MLX's launcher) is not installed beside this Python nor on PATH"
    hostfile = os.environ.get("KVBENCH_LAUNCH_HOSTFILE")
    if hostfile and hostfile_ranks(hostfile) != case.shards:
        n = hostfile_ranks(hostfile)
        names = "no readable host list" if n is None else f"{n} hosts"
        return f"KVBENCH_LAUNCH_HOSTFILE={hostfile} has {names}, the case {case.shards} shards"
    problem = common.problem_of(case, resolved.of_case(case).k_fmt)
    return common.kernel_reason(case, backend, problem)


def rank_bytes(case: Case, fmt) -> int:
    """K/V format bytes the fullest rank holds, all layers."""
    cells, heads = case.n_seqs * case.context_len, case.n_kv_heads
    if case.shard_by == "context":
        cells = case.n_seqs * split_bounds(case.context_len, case.shards)[0][1]
    else:
        heads = split_bounds(case.n_kv_heads, case.shards)[0][1]
    return row_bytes(fmt, cells, n_layers=case.n_layers, n_kv_heads=heads, head_dim=case.head_dim)


def step_sent_bytes(case: Case) -> int:
    """Bytes one rank sends for one step's combines (one per layer), ring model."""
    group = case.n_q_heads // case.n_kv_heads
    max_q = split_bounds(case.n_kv_heads, case.shards)[0][1] * group
    one = sent_bytes(
        case.shard_by, case.combine, case.shards, case.n_seqs, case.n_q_heads, case.head_dim,
        max_q if case.shard_by == "heads" else case.n_q_heads,
    )  # fmt: skip
    return case.n_layers * one


def build(case: Case, r: Resolved) -> State:
    """No arrays here: the ranks build the cache when the runner calls the job."""
    fmt = r.k_fmt
    return State(
        dict.fromkeys(STAGES),  # timed in the ranks
        check=_checked_in_job,
        traffic=metrics.traffic_bytes(case, fmt),
        kv_bytes=metrics.kv_bytes(case, fmt),
        baseline_bytes=None,  # this process holds no cache: the job reports rank 0's peak
        extra={
            "rank_kv_bytes": rank_bytes(case, fmt),
            "sent_bytes": step_sent_bytes(case),
            "launch_backend": launch_backend(),
        },
        job=partial(run_job, case),
    )


def _checked_in_job() -> dict:
    raise RuntimeError("a sharded case is checked inside its job (rank 0)")


def free_port(n: int, tries: int = 50) -> int:
    """A start port P with P..P+n-1 free on this host (the ring backend listens on P + rank)."""
    for _ in range(tries):
        start = random.randrange(20000, 60000 - n)
        if all(_bindable(start + i) for i in range(n)):
            return start
    raise RuntimeError(f"no {n} consecutive free TCP ports found for the ring backend")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def launch_command(case: Case, spec: Path, out: Path) -> list[str]:
    backend = launch_backend()
    cmd = [launcher(), "--backend", backend]
    hostfile = os.environ.get("KVBENCH_LAUNCH_HOSTFILE")
    cmd += ["--hostfile", hostfile] if hostfile else ["-n", str(case.shards)]
    if backend == "ring" and not hostfile:
        cmd += ["--starting-port", str(free_port(case.shards))]
    return cmd + ["--", sys.executable, "-m", "kvbench.engines.sharded_rank", str(spec), str(out)]


def time_limit_s(plans: dict) -> float:
    """The job's wall-clock limit: start-up plus ten times the stages' budgets (min_samples may
    overrun a budget); KVBENCH_LAUNCH_TIMEOUT_S overrides it."""
    given = os.environ.get("KVBENCH_LAUNCH_TIMEOUT_S")
    if given:
        return float(given)
    return STARTUP_S + 10 * sum(p["warmup_s"] + p["budget_s"] for p in plans.values())


def run_job(case: Case, plans: dict, check: bool) -> JobResult:
    """Launch the ranks for one round and read what rank 0 measured."""
    with tempfile.TemporaryDirectory(prefix="kvbench-ranks-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        device = "gpu" if mx.default_device() == mx.gpu else "cpu"
        fields = dataclasses.asdict(case)
        spec.write_text(
            json.dumps({"case": fields, "plans": plans, "check": check, "device": device})
        )
        log = run_ranks(launch_command(case, spec, out), time_limit_s(plans))
        if not out.exists():
            raise RuntimeError(f"rank 0 wrote no result ({case.shards} ranks): {log}")
        return job_result(json.loads(out.read_text()))


def run_ranks(cmd: list[str], limit_s: float) -> str:
    """Run the launcher as a new process group; on the limit end that group. The output's tail."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        text, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the ranks it started
        text, _ = proc.communicate()
        text = f"timed out after {limit_s:g} s; {text}"
    return " ".join((text or "").split())[-400:] or f"exit status {proc.returncode}"


def job_result(result: dict) -> JobResult:
    """Rank 0's JSON -> JobResult; an error there raises here (the case's error row)."""
    if "error" in result:
        kind = ParityError if result.get("kind") == "ParityError" else RuntimeError
        raise kind(f"rank {result.get('rank', 0)}: {result['error']}")
    return JobResult(
        samples=result["samples"],
        accuracy=result.get("accuracy", {}),
        alloc_bytes=result.get("alloc_bytes"),
        peak_mem_bytes=result.get("peak_mem_bytes"),
        extra=result.get("extra", {}),
    )

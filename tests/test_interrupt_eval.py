"""Signals while the main thread is inside one long MLX evaluation (harness/run/interrupt.py):
Python runs no signal handler until `mx.eval` returns, so a run inside a model's forward pass
used to ignore SIGTERM and two SIGINTs until SIGKILL. The child below is the run's signal
handling around an evaluation that takes minutes here (4,000 chained 1024 x 1024 matmuls); it
must say at once that it waits for the evaluation, and a second signal must end it at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

CHILD = """
import sys
import kvbench  # noqa: F401 - the BLAS MLX's CPU backend uses here
import mlx.core as mx
from kvbench.run import interrupt
eye = mx.eye(1024)
out = eye
for _ in range(4000):
    out = out @ eye
try:
    with interrupt.handling():
        print("evaluating", flush=True)
        mx.eval(out)
        print("returned", flush=True)
except interrupt.Interrupted as e:
    print("interrupted", flush=True)
    sys.exit(e.exit_code)
"""


def _lines(stream, into: list[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: into.extend(line.rstrip("\n") for line in stream))
    t.daemon = True
    t.start()
    return t


def _wait_for(lines: list[str], text: str, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if any(text in line for line in lines):
            return True
        time.sleep(0.05)
    return False


def test_a_second_signal_stops_a_run_inside_a_long_evaluation():
    cmd = [sys.executable, "-c", CHILD]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []
    readers = [_lines(proc.stdout, out), _lines(proc.stderr, err)]
    try:
        assert _wait_for(out, "evaluating", 120), (out, err)
        time.sleep(0.5)  # inside mx.eval now
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        said = _wait_for(err, "SIGTERM: the run stops when MLX's evaluation in progress", 30)
        assert said, f"no word of the waiting signal in 30 s: {err}"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(30)
        stopped_s = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    for r in readers:
        r.join(5)
    assert rc == 128 + signal.SIGTERM, (rc, out, err)
    assert out == ["evaluating"], out  # the evaluation never returned: cut, not waited for
    last = err[-1]
    assert "interrupted (SIGTERM) inside a computation that cannot be cut" in last, err
    assert "Traceback" not in "\n".join(err), err
    assert stopped_s < 60, stopped_s

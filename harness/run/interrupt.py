"""Signals during a run: SIGINT, SIGTERM and SIGHUP all stop it the same way.

The first signal raises `Interrupted` (a KeyboardInterrupt) where the run is, so the session
writes every completed round as partial rows and the CLI exits 128 + the signal number. Inside a
`deferred()` block (the commit of a finished round, the write of a row with its samples) the
first signal waits until the block ends, so a round or a row is never half recorded. A second
signal is only counted: the run is already stopping, and raising it would cut the writing of
the finished rounds short (a double Ctrl-C 10 ms apart used to lose every round of the run,
issue 27). A third signal raises at once, even inside such a block: the writer cuts a
half-written append back (harness/files.py), so what is on disk stays whole.

A signal is also remembered: `check()` raises for one that some library's bare `except:`
swallowed, so an early Ctrl-C can never be lost while the suite runs on.

Python runs a signal's handler only between bytecodes of the main thread, so none of the above
happens while the main thread is inside one long C call: MLX's `mx.eval` of a model's forward
pass (a quality chunk, a prefill piece at 8K under load) does not return for minutes, and until
it does every signal only waits (a SIGTERM and two SIGINTs once needed SIGKILL). MLX releases the
GIL while it evaluates, so a watcher thread hears each signal at once (`signal.set_wakeup_fd`):
when a signal has waited STUCK_S for its handler, the main thread is in such a call; the watcher
says so on stderr (the run stops when the evaluation returns), and on a second signal it ends
the process at once (`os._exit`, exit 128 + the first signal) unless a deferred block is being
written. Rows are written whole as cases finish, so what is on disk stays whole; only the case
in progress is lost, as it would be by the first signal.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state = {"count": 0, "signum": None, "defer": 0, "pending": False, "kept": None}
STUCK_S = 1.0  # a signal whose handler has not run this long: the main thread is in a C call


FORCE_COUNT = 3  # the signal that stops at once, even while the finished rounds are written


def _handler(signum, frame) -> None:
    _state["count"] += 1
    if _state["count"] == 1:
        _state["signum"] = signum
        if _state["defer"]:
            _state["pending"] = True  # raised when the deferred block ends
            return
    if 1 < _state["count"] < FORCE_COUNT:
        return  # already stopping: the finished rounds are being written (docstring)
    raise Interrupted(signum)


@contextmanager
def handling() -> Iterator[None]:
    """Install the handler for SIGINT, SIGTERM and SIGHUP; restore the previous ones after."""
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    _state.update(count=0, signum=None, defer=0, pending=False, kept=None)
    stop_watching = _watch()
    try:
        yield
    finally:
        if _state["count"]:
            # interrupted: the process is on its way out. Keep counting, so that a second signal
            # landing after this block (a double Ctrl-C) cannot kill it by the default handler
            # (exit by SIGINT, not 130) while it reports what it kept; a third still stops it
            _state.update(defer=0, pending=False)
            atexit.register(_ignore_at_exit)
        else:
            stop_watching()
            for s, h in previous.items():
                signal.signal(s, h)
            _state.update(count=0, signum=None, defer=0, pending=False, kept=None)


def _ignore_at_exit() -> None:
    """An interrupted process's last step: ignore our signals. CPython's finalization puts every
    Python-level handler back to the default (Modules/signalmodule.c, _PySignal_Fini) but leaves
    an ignored signal ignored, so a double Ctrl-C's second signal landing while the interpreter
    shuts down, after the CLI's last line, would otherwise kill it by SIGINT (exit -2, not 130)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def check() -> None:
    """Raise Interrupted if a signal came (and was swallowed somewhere) since `handling()`."""
    if _state["count"] and not _state["defer"]:
        raise Interrupted(_state["signum"])


def received() -> int:
    """How many signals came since `handling()`."""
    return _state["count"]


@contextmanager
def deferred() -> Iterator[None]:
    """A block the first signal does not cut (module docstring)."""
    _state["defer"] += 1
    try:
        yield
    finally:
        _state["defer"] -= 1
        if _state["pending"] and not _state["defer"]:
            _state["pending"] = False
            raise Interrupted(_state["signum"])


def on_hard_exit(kept) -> None:
    """kept() -> text: called by the watcher just before it ends the process (the run discards
    an empty claim and says what it keeps)."""
    _state["kept"] = kept


# ---- the watcher: signals that wait behind a long C call (module docstring) ----------------------


def _watch():
    """Start the watcher thread; returns the function that stops it (and restores the previous
    wakeup fd). Nothing is watched where the wakeup fd cannot be set (not the main thread)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(r)
        os.close(w)
        return lambda: None
    threading.Thread(target=_watcher, args=(r,), daemon=True, name="kvbench-signals").start()

    def stop() -> None:
        signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
        os.close(w)  # the watcher reads end-of-file and closes r

    return stop


def _watcher(r: int) -> None:
    arrived: list[tuple[float, int]] = []  # (monotonic time, signal number) of each of ours
    said = False
    while True:
        waiting = len(arrived) > _state["count"]  # a signal whose handler has not run yet
        if select.select([r], [], [], 0.1 if waiting else None)[0]:
            data = os.read(r, 64)
            if not data:
                os.close(r)
                return
            arrived += [(time.monotonic(), b) for b in data if b in SIGNALS]
        handled = _state["count"]
        if handled >= len(arrived) or time.monotonic() - arrived[handled][0] < STUCK_S:
            continue
        first = signal.Signals(arrived[0][1]).name
        if len(arrived) >= 2 and not _state["defer"]:
            _hard_exit(first, 128 + arrived[0][1])
        if not said:
            said = True
            _say(
                f"kvbench: {first}: the run stops when MLX's evaluation in progress returns "
                "(it cannot be cut); a second signal stops at once, keeping the rows written"
            )


def _hard_exit(name: str, code: int) -> None:
    try:
        kept = _state["kept"]() if _state.get("kept") else "the rows written before it are kept"
    except Exception as e:  # noqa: BLE001 - the exit must happen whatever the report does
        kept = f"the rows written before it are kept ({e})"
    _say(f"kvbench: interrupted ({name}) inside a computation that cannot be cut (MLX "
         f"evaluating): stopped at once; {kept}")  # fmt: skip
    os._exit(code)


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass

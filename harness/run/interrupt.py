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
"""

from __future__ import annotations

import signal
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


_state = {"count": 0, "signum": None, "defer": 0, "pending": False}


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
    _state.update(count=0, signum=None, defer=0, pending=False)
    try:
        yield
    finally:
        if _state["count"]:
            # interrupted: the process is on its way out. Keep counting, so that a second signal
            # landing after this block (a double Ctrl-C) cannot kill it by the default handler
            # (exit by SIGINT, not 130) while it reports what it kept; a third still stops it
            _state.update(defer=0, pending=False)
        else:
            for s, h in previous.items():
                signal.signal(s, h)
            _state.update(count=0, signum=None, defer=0, pending=False)


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

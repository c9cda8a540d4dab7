"""A one-line progress display with an ETA, on stderr (a line per step when not a terminal)."""

from __future__ import annotations

import sys
import time


class Progress:
    """`weights`: each step's estimated seconds in the order run (run/estimate.py), so a slow
    model case and a quick timed one count as what they cost; `estimate_s`: the whole run's
    estimate, the ETA before the first step ends (marked ~). Without them: steps are equal and
    the ETA waits for the first."""

    def __init__(self, total: int, stream=sys.stderr, clock=time.monotonic, weights=None,
                 estimate_s: float | None = None):  # fmt: skip
        self.total, self.stream, self.clock = max(total, 1), stream, clock
        self.done_n, self.t0, self.tty = 0, clock(), stream.isatty()
        ok = weights is not None and len(weights) == total and all(w > 0 for w in weights)
        self.weights, self.estimate_s = (list(weights) if ok else None), estimate_s

    def eta_s(self) -> float | None:
        elapsed = self.clock() - self.t0
        if not self.done_n:
            return None if self.estimate_s is None else max(self.estimate_s - elapsed, 0.0)
        if self.weights:
            done = sum(self.weights[: self.done_n])
            return elapsed / done * (sum(self.weights) - done)
        return elapsed / self.done_n * (self.total - self.done_n)

    def start(self, label: str) -> None:
        eta = self.eta_s()
        mark = "~" if not self.done_n else ""
        eta_txt = "ETA --:--" if eta is None else f"ETA {mark}{int(eta) // 60}:{int(eta) % 60:02d}"
        line = f"[{self.done_n + 1}/{self.total}] {label}  {eta_txt}"
        self._write("\r\033[K" + line[:150] if self.tty else line + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal (SIGHUP) must not end the run
            pass

    def note(self, line: str) -> None:
        """A warning line between progress lines (it clears the terminal's current line)."""
        self._write(("\r\033[K" if self.tty else "") + f"kvbench: warning: {line}\n")

    def done(self) -> None:
        self.done_n += 1

    def close(self) -> None:
        if self.tty:
            self._write("\n")

"""A one-line progress display with an ETA, on stderr (a line per step when not a terminal)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, stream=sys.stderr, clock=time.monotonic):
        self.total, self.stream, self.clock = max(total, 1), stream, clock
        self.done_n, self.t0, self.tty = 0, clock(), stream.isatty()

    def eta_s(self) -> float | None:
        if not self.done_n:
            return None
        return (self.clock() - self.t0) / self.done_n * (self.total - self.done_n)

    def start(self, label: str) -> None:
        eta = self.eta_s()
        eta_txt = "ETA --:--" if eta is None else f"ETA {int(eta) // 60}:{int(eta) % 60:02d}"
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

"""A model case's timed step and its parts (kernels/model/parts.py), for `kvbench profile`
(harness/run/model_profile.py).

The step is one forward pass of `n_new` tokens at depth context_len - n_new: a decode step
(n_new 1, the model_decode phase) or a prefill micro-batch (logits of every token, as
llama-perplexity computes them). Each call rewinds the cache first, so every sample is the
same pass at the same depth. The step records how long building its lazy graph took (from the
call to the graph's last node, before the timer evaluates it): `built_ms`, one per call, the
graph-build share of each step sample measured in the same call. The parts are captured from
one extra pass the first time they are asked for.
"""

from __future__ import annotations

import time

import mlx.core as mx

from kvbench.kernels.model import parts
from kvbench.kernels.model.run import decode_step, forward


class ModelStep:
    def __init__(self, model, cache, tokens: list[int]):
        self.model, self.cache, self.tokens = model, cache, tokens
        self.mark = cache.mark()
        self.built_ms: list[float] = []
        self._parts: dict | None = None

    def __call__(self) -> list[mx.array]:
        t0 = time.perf_counter()
        self.cache.rewind(self.mark)
        if len(self.tokens) == 1:  # every sample decodes the same context_len-th token
            out = [decode_step(self.model, self.cache, self.tokens[0]), *self.cache.arrays()]
        else:
            out = [forward(self.model, mx.array([self.tokens]), self.cache), *self.cache.arrays()]
        self.built_ms.append((time.perf_counter() - t0) * 1e3)
        return out

    def layer_kinds(self) -> dict[int, str]:
        windows = (
            getattr(self.model.config, "windows", None) or (None,) * self.model.config.n_layers
        )
        return {i: "sliding" if w else "global" for i, w in enumerate(windows)}

    def part(self, name: str):
        """A stage running part `name` (captured on its first call: the capture lands in the
        timer's warm-up, never in a sample)."""
        return lambda: self.parts()[name]()

    def parts(self) -> dict:
        """Each part of the step as a stage (kernels/model/parts.py), then the framework's own
        (one-op evaluation floor; dispatch of as many ops as the step's graph holds)."""
        if self._parts is None:
            self.cache.rewind(self.mark)
            got = parts.capture(self.model, self.cache, self.tokens)
            self.cache.rewind(self.mark)
            stages = parts.part_stages(self.cache, self.mark, got, self.layer_kinds())
            n_ops = parts.graph_ops(self())
            mx.eval(self.cache.arrays())
            self._parts = {**stages, **parts.framework(n_ops)}
        return self._parts

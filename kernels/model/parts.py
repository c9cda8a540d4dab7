"""The parts of one model forward pass, each runnable on its own, for a profile that measures
them rather than apportioning the whole (harness/run/model_profile.py times them with
kvbench's timer).

`capture` runs one forward pass of the step's tokens with every call of a part recorded, with
its inputs: each weight matmul (every nn.Linear / nn.QuantizedLinear call, sorted by where the
module sits: attention projections, MLP, output head; a tied head is the embedding's
`as_linear`), each norm (classes named ...Norm), each rotary embedding (classes named ...RoPE),
the embedding lookup, and each layer's cache write and read (kernels/model/protocol.py
PartedCache: attend = write, then read). Only the outermost recorded call counts (a part
calling another is not counted twice). The inputs are evaluated once; replaying a part runs
exactly that part's calls, for every layer, on the inputs they had in the step.

What no part holds: the elementwise glue between them (residual adds, the MLP's activation
product, reshapes and transposes, the embedding's scaling), and the framework's per-call and
per-op cost, which every part also carries for its own calls. The framework is measured on its
own (`framework`): one evaluation of one op (the floor each timed call pays), and a chain of as
many one-element ops as the step's graph holds primitives (`graph_ops`, counted from
mx.export_to_dot), i.e. the per-op scheduling cost at the step's op count.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from kvbench.kernels.model.run import forward

PARTS = ("write", "attend", "proj", "mlp", "head", "norm", "rope", "embed")
LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class Call:
    part: str
    layer: int | None
    fn: object  # the class's own (unwrapped) method
    module: object
    args: tuple
    kwargs: dict


@dataclass
class Captured:
    calls: list[Call] = field(default_factory=list)
    kv: list[tuple] = field(default_factory=list)  # (layer, q, k, v, scale) per layer


def part_of(path: str, module) -> str | None:
    """Which part a module's calls belong to (None: not a part)."""
    name = type(module).__name__
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        if path.endswith("lm_head"):
            return "head"
        return "mlp" if re.search(r"mlp|feed_forward", path) else "proj"
    if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
        return "embed"
    if name.endswith("Norm"):
        return "norm"
    if "RoPE" in name or "Rope" in name:
        return "rope"
    return None


def _layer(path: str) -> int | None:
    m = LAYER_RE.search(path)
    return int(m.group(1)) if m else None


def capture(model, cache, tokens: list[int]) -> Captured:
    """One forward pass of `tokens` at cache.offset with every part's calls recorded (the cache
    then holds them, advanced: rewind it). Raises when a module's class cannot be wrapped."""
    where = {}
    for path, m in model.net.named_modules():
        part = part_of(path, m)
        if part is not None:
            where[id(m)] = (part, _layer(path))
    got, depth = Captured(), [0]
    patched = []

    def wrap(cls, method: str, part_override: str | None = None):
        orig = getattr(cls, method)

        def recorder(self, *args, **kwargs):
            depth[0] += 1
            try:
                if depth[0] == 1 and id(self) in where:
                    part, layer = where[id(self)]
                    got.calls.append(Call(part_override or part, layer, orig, self, args, kwargs))
                return orig(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        patched.append((cls, method, cls.__dict__.get(method)))
        setattr(cls, method, recorder)

    classes = {type(m) for _, m in model.net.named_modules() if id(m) in where}
    try:
        for cls in classes:
            wrap(cls, "__call__")
            if issubclass(cls, (nn.Embedding, nn.QuantizedEmbedding)):
                wrap(cls, "as_linear", "head")
        orig_attend = cache.attend

        def attend(layer, q, k, v, scale):
            got.kv.append((layer, q, k, v, scale))
            return orig_attend(layer, q, k, v, scale)

        cache.attend = attend
        logits = forward(model, mx.array([tokens]), cache)
        mx.eval(logits, cache.arrays())
    finally:
        cache.__dict__.pop("attend", None)
        for cls, method, own in reversed(patched):
            if own is None:
                delattr(cls, method)
            else:
                setattr(cls, method, own)
    mx.eval([c.args for c in got.calls], [c.kwargs for c in got.calls], got.kv)
    return got


def replay(calls: list[Call]):
    """A function running `calls` on their recorded inputs: the outputs to evaluate."""

    def run() -> list:
        return [c.fn(c.module, *c.args, **c.kwargs) for c in calls]

    return run


def kv_stages(cache, mark, kv: list[tuple], kinds: dict[int, str]) -> dict:
    """write / attend over every layer, and per layer kind where the model has more than one
    (`kinds`: layer -> kind): write rewinds to `mark` and stores each layer's new K/V; attend
    rewinds to the state after those writes and runs each layer's read (the case's kernel over
    what the layer holds, the new positions included)."""
    cache.rewind(mark)
    for layer, _, k, v, _ in kv:
        cache.write(layer, k, v)
    mx.eval(cache.arrays())
    written = cache.mark()
    cache.rewind(mark)

    def write(rows):
        def run():
            cache.rewind(mark)
            for layer, _, k, v, _ in rows:
                cache.write(layer, k, v)
            return cache.arrays()

        return run

    def attend(rows):
        def run():
            cache.rewind(written)
            return [cache.read(layer, q, scale) for layer, q, _, _, scale in rows]

        return run

    out = {"write": write(kv), "attend": attend(kv)}
    if len(set(kinds.values())) > 1:
        for kind in sorted(set(kinds.values())):
            rows = [r for r in kv if kinds[r[0]] == kind]
            out[f"write[{kind}]"], out[f"attend[{kind}]"] = write(rows), attend(rows)
    return out


def part_stages(cache, mark, got: Captured, kinds: dict[int, str]) -> dict:
    """Every part as a function returning what to evaluate: the KV parts (kv_stages), then
    each recorded kind of call, replayed."""
    stages = kv_stages(cache, mark, got.kv, kinds)
    for part in PARTS[2:]:
        calls = [c for c in got.calls if c.part == part]
        if calls:
            stages[part] = replay(calls)
    return stages


def graph_ops(outputs: list) -> int:
    """Primitives in the lazy graph of `outputs` (unevaluated), from mx.export_to_dot."""
    buf = io.StringIO()
    mx.export_to_dot(buf, *outputs)
    return sum(1 for line in buf.getvalue().splitlines() if "shape=rectangle" in line)


def framework(n_ops: int) -> dict:
    """eval_floor: one evaluation of one one-element op (what each timed call pays at least);
    dispatch: a chain of n_ops one-element adds, built and evaluated (the per-op cost of the
    framework at the step's op count, with no arithmetic to speak of)."""
    one = mx.array([1.0])
    mx.eval(one)

    def eval_floor():
        return one + 1

    def dispatch():
        x = one
        for _ in range(n_ops):
            x = x + 1
        return x

    return {"eval_floor": eval_floor, f"dispatch[{n_ops} ops]": dispatch}

"""The model-cache protocol (kernels/model/protocol.py): every cache class of kernels/model/
declares the level it claims, member by member, with the protocol's arguments; and a class
with `attend` and `advance` that this file does not list fails (a new cache joins the check)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import mlx.core as mx
import pytest

import kvbench.kernels.model as room
from kvbench.kernels.model import capture, generate, shift
from kvbench.kernels.model.batched import SeqCache
from kvbench.kernels.model.cache import (
    LayeredCache,
    MixedCache,
    PlainCache,
    WindowCache,
    make_cache,
)
from kvbench.kernels.model.evicting import EvictingCache, WindowedEvictingCache
from kvbench.kernels.model.load import Shape
from kvbench.kernels.model.policies import Budget, make
from kvbench.kernels.model.protocol import (
    LEVELS,
    ModelCache,
    PartedCache,
    RewindableCache,
    StoredCache,
)
from kvbench.kernels.model.spec import CacheSpec
from kvbench.kernels.stores.layouts import Layout

SHAPE = Shape("llama", n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, vocab=64,
              trained_context=None)  # fmt: skip
WINDOWED = Shape("gemma3", n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, vocab=64,
                 trained_context=None, windows=((4, 0), None))  # fmt: skip


def build(cls):
    """One instance of each implementation, as the room makes it."""
    if cls is PlainCache:
        return make_cache(CacheSpec("int8"), SHAPE, 8)
    if cls is MixedCache:
        return make_cache(CacheSpec("int8", "int4"), SHAPE, 8)
    if cls is LayeredCache:
        return make_cache(CacheSpec("fp16"), WINDOWED, 8, max_step=2)
    if cls is WindowCache:
        return WindowCache(CacheSpec("fp16"), 2, 32, 4, 0, 2, "reference")
    if cls is EvictingCache:
        return EvictingCache(
            CacheSpec("int8"), SHAPE, 8, "reference", make("knorm", Budget(kv_budget=2))
        )
    if cls is WindowedEvictingCache:
        policy = make("knorm", Budget(kv_budget=2))
        return WindowedEvictingCache(CacheSpec("int8"), WINDOWED, 8, "reference", policy, None,
                                     WINDOWED.windows, 2)  # fmt: skip
    if cls is generate.DeferredCache:
        return generate.DeferredCache(CacheSpec("int8"), SHAPE, 8, start=2)
    if cls is capture._Tap:
        return capture._Tap(make_cache(CacheSpec("fp32"), SHAPE, 8))
    if cls is shift.ShiftCache:
        return shift.ShiftCache(make_cache(CacheSpec("int8"), SHAPE, 8), [(32, 1e4, 1.0)] * 2)
    if cls is SeqCache:
        return SeqCache(CacheSpec("int8"), SHAPE, Layout("unified", 2, 8), "reference")
    raise AssertionError(f"no builder for {cls.__name__}")


# each implementation and the level it claims
CLAIMS = {
    PlainCache: PartedCache,
    MixedCache: PartedCache,
    WindowCache: PartedCache,
    LayeredCache: PartedCache,
    EvictingCache: PartedCache,
    WindowedEvictingCache: PartedCache,
    generate.DeferredCache: StoredCache,
    capture._Tap: ModelCache,
    shift.ShiftCache: StoredCache,
    SeqCache: PartedCache,
}


def room_cache_classes() -> set[type]:
    """Every class defined in kernels/model/ that has `attend` and `advance` (LayerView, the
    mlx-lm side of the seam, has attend without advance)."""
    found = set()
    for info in pkgutil.iter_modules(room.__path__):
        mod = importlib.import_module(f"{room.__name__}.{info.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__ and hasattr(cls, "attend"):
                if hasattr(cls, "advance") and not getattr(cls, "_is_protocol", False):
                    found.add(cls)
    return found


def members(level) -> list[str]:
    """The methods a protocol level declares, its bases' included."""
    return [
        n
        for p in level.__mro__
        if p in LEVELS.values()
        for n, v in vars(p).items()
        if inspect.isfunction(v) and not n.startswith("_")
    ]


def test_every_cache_class_of_the_room_is_checked():
    assert room_cache_classes() == set(CLAIMS)


def test_members_of_each_level():
    assert members(ModelCache) == ["attend", "advance"]
    assert sorted(members(StoredCache)) == ["advance", "arrays", "attend"]
    assert sorted(members(RewindableCache)) == sorted(
        ["attend", "advance", "arrays", "mark", "rewind", "held_bytes", "saturated"]
    )
    assert set(members(PartedCache)) - set(members(RewindableCache)) == {"write", "read"}


@pytest.mark.parametrize("cls", list(CLAIMS), ids=lambda c: c.__name__)
def test_implementation_declares_its_level(cls):
    level = CLAIMS[cls]
    obj = build(cls)
    assert isinstance(obj, level) and isinstance(obj.offset, int) and obj.offset == 0
    for name in members(level):
        mine = inspect.signature(getattr(cls, name))
        theirs = inspect.signature(getattr(level, name))
        assert list(mine.parameters) == list(theirs.parameters), (cls.__name__, name)


@pytest.mark.parametrize("cls", list(CLAIMS), ids=lambda c: c.__name__)
def test_a_forward_step_through_the_protocol(cls):
    """attend on every layer, then advance: the output has q's shape, offset moves by n."""
    obj = build(cls)
    layers = 1 if cls is WindowCache else SHAPE.n_layers
    q = mx.random.normal((1, SHAPE.n_heads, 2, SHAPE.head_dim), key=mx.random.key(0))
    k = mx.random.normal((1, SHAPE.n_kv_heads, 2, SHAPE.head_dim), key=mx.random.key(1))
    for layer in range(layers):
        out = obj.attend(layer, q, k, k, SHAPE.head_dim**-0.5)
        assert out.shape == q.shape and out.dtype == mx.float32
    obj.advance(2)
    assert obj.offset == 2
    if isinstance(obj, RewindableCache):
        mark = obj.mark()
        held = obj.held_bytes()
        for layer in range(layers):
            obj.attend(layer, q[:, :, :1], k[:, :, :1], k[:, :, :1], SHAPE.head_dim**-0.5)
        obj.advance(1)
        obj.rewind(mark)
        assert obj.offset == 2 and obj.held_bytes() == held > 0


def test_a_class_missing_a_member_is_not_the_level():
    class Half:
        offset = 0

        def attend(self, layer, q, k, v, scale):
            return q

        def advance(self, n):
            pass

    assert isinstance(Half(), ModelCache)
    assert not isinstance(Half(), StoredCache) and not isinstance(Half(), RewindableCache)


@pytest.mark.parametrize("cls", [c for c, lv in CLAIMS.items() if lv is PartedCache],
                         ids=lambda c: c.__name__)  # fmt: skip
def test_write_then_read_is_attend(cls):
    """Two steps (2 tokens, then 1) through attend on one cache and through write + read on
    another: the same outputs to the bit (one computation, split in two calls)."""
    a, b = build(cls), build(cls)
    layers = 1 if cls is WindowCache else SHAPE.n_layers
    for n, seed in ((2, 0), (1, 3)):
        q = mx.random.normal((1, SHAPE.n_heads, n, SHAPE.head_dim), key=mx.random.key(seed))
        k = mx.random.normal((1, SHAPE.n_kv_heads, n, SHAPE.head_dim), key=mx.random.key(seed + 1))
        for layer in range(layers):
            want = a.attend(layer, q, k, 2 * k, 0.2)
            b.write(layer, k, 2 * k)
            assert mx.array_equal(b.read(layer, q, 0.2), want)
        a.advance(n)
        b.advance(n)

"""llama.cpp's context shift and self-extend on a model cache (kernels/model/shift.py).

The keys of the tiny model's first layer depend on the token and its position only (no earlier
layer mixes the context in), so after passkey.cpp's schedule every stored layer-0 key must be
the numpy RoPE (tests/tiny_model.py, float64) of that token's key at the position worked out by
hand from passkey.cpp's loops, whatever the edits did on the way."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from tiny_model import ROPE_BASE, TINY, project, rms, weights, write_gguf

from kvbench.kernels.formats.rotation import gguf_order, rotate
from kvbench.kernels.model import shift
from kvbench.kernels.model.cache import make_cache
from kvbench.kernels.model.load import load_model
from kvbench.kernels.model.spec import CacheSpec

WTS = weights(seed=3)
TOKENS = np.random.default_rng(7).integers(0, TINY["vocab"], 300).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_gguf(tmp_path_factory.mktemp("s") / "t.gguf", WTS))


def layer0_keys(tokens: list[int], positions) -> np.ndarray:
    """[Hkv, n, D] float64: each token's first-layer key turned by RoPE at `positions`."""
    lp = WTS["layers"][0]
    k = project(lp, rms(WTS["embed"][tokens].astype(np.float64), lp["attn_norm"]), "k",
                TINY["n_kv_heads"])  # fmt: skip
    d = k.shape[-1]
    inv = ROPE_BASE ** (-np.arange(0, d, 2) / d)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    a, b = k[..., : d // 2], k[..., d // 2 :]
    cos, sin = np.cos(ang), np.sin(ang)
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


FP32 = CacheSpec("fp32")


def run(tiny, sch: shift.Schedule, tokens: list[int], spec=FP32) -> shift.ShiftCache:
    inner = make_cache(spec, tiny.config, sch.n_cells, "reference")
    cache = shift.ShiftCache(inner, shift.rope_params(tiny.net), sch.div_sign)
    shift.read_prompt(tiny, cache, tokens, sch, ubatch=64)
    cache.kshift()  # the closing shift's rotation (the answer's first decode applies it)
    return cache


def stored_layer0(cache: shift.ShiftCache, spec: CacheSpec) -> np.ndarray:
    """[Hkv, n, D]: layer 0's held keys back in the model's basis and channel order."""
    inner = cache.inner
    n = inner.offset
    k = inner.fmt.decode({a: v[:, :, :n] for a, v in inner.kv.keys[0].items()}, mx.float32)
    rk, _, bk, _ = inner.rot
    k = rotate(k, rk, bk)
    if spec.k_order == "gguf":  # back from GGUF's interleaved order
        d = k.shape[-1]
        k = mx.take(k, mx.array([*range(0, d, 2), *range(1, d, 2)]), axis=-1)
    return np.array(k[0], dtype=np.float64)


def test_context_shift_keeps_n_keep_and_moves_the_rest_back(tiny):
    # context_limit 16, n_keep 4: 256 cells, n_ctx 252 = 6 batches of 42. By hand: tokens
    # 0..251 fill it; shift 1 drops positions 4..45 (tokens 4..45), tokens 46..251 move to
    # 4..209, tokens 252..293 land at 210..251; shift 2 drops tokens 46..87 and the last six
    # land at 210..215. n_past 216: the closing shift (216 - 252 + 16 < 0) does nothing.
    sch = shift.Schedule(16, 4, 42)
    assert (sch.n_cells, sch.n_ctx) == (256, 252)
    cache = run(tiny, sch, TOKENS)
    held = [*range(4), *range(88, 300)]
    want_pos = [t if t < 4 else t - 84 for t in held]
    assert cache.cells.pos.tolist() == want_pos and cache.offset == 216
    assert cache.counts["context_shifts"] == 2 and cache.counts["removed"] == 84
    got = stored_layer0(cache, CacheSpec("fp32"))
    np.testing.assert_allclose(got, layer0_keys([TOKENS[t] for t in held], want_pos), atol=2e-4)


def test_closing_shift_leaves_room_for_the_answer(tiny):
    # 252 tokens: the first loop fills n_ctx exactly; n_past 252 - 252 + 16 = 16 positions go
    sch = shift.Schedule(16, 4, 42)
    cache = run(tiny, sch, TOKENS[:252])
    assert cache.counts["context_shifts"] == 1 and cache.offset == 236
    assert cache.cells.pos.tolist() == list(range(236))


@pytest.mark.parametrize("sign", shift.DIV_SIGNS)
def test_self_extend_groups_every_batch_but_the_last(tiny, sign):
    # n_batch 8, ga_n 2, 20 tokens (by hand from passkey.cpp): before batch 8 positions 0..7
    # become p // 2; before batch 16 batch 8's positions 4..11 move by +4 and are halved. The
    # cells say p // 2 for p < 16 and 8 + (p - 16) after; the keys turn to those positions
    # (exact), or as llama-kv-cells.h pos_div records the shift (old - new, away from the new
    # position): token t < 16 turned to 2t - t // 2.
    sch = shift.Schedule(64, 4, 8, 2, sign)
    cache = run(tiny, sch, TOKENS[:20])
    cells = [p // 2 for p in range(16)] + [8 + p - 16 for p in range(16, 20)]
    assert cache.cells.pos.tolist() == cells and cache.offset == 12
    turned = cells if sign == "exact" else [2 * t - t // 2 for t in range(16)] + cells[16:]
    got = stored_layer0(cache, CacheSpec("fp32"))
    np.testing.assert_allclose(got, layer0_keys(TOKENS[:20], turned), atol=2e-4)


@pytest.mark.parametrize("fmt,tol", [("q8_0", 0.02), ("q4_0", 0.3)])
def test_a_quantized_rotated_key_is_turned_through_its_format(tiny, fmt, tol):
    """Hadamard-rotated, GGUF order (q4_0: packed, its stored width is not head_dim): decoded,
    rotated back, RoPE, rotated and encoded again (build_rope_shift); the keys stay within two
    roundings of the format of the truth."""
    spec = CacheSpec(fmt, rotate_k="hadamard", rotate_v="hadamard", k_order="gguf")
    sch = shift.Schedule(16, 4, 42)
    cache = run(tiny, sch, TOKENS, spec)
    held = [*range(4), *range(88, 300)]
    want = layer0_keys([TOKENS[t] for t in held], [t if t < 4 else t - 84 for t in held])
    got = stored_layer0(cache, spec)
    assert np.abs(got - want).max() / np.abs(want).max() < tol


def test_rope_by_composes_with_mlx_rope():
    x = mx.random.normal((1, 2, 5, 64), key=mx.random.key(0))
    at = lambda off: mx.fast.rope(x, 64, traditional=False, base=1e4, scale=1.0, offset=off)  # noqa: E731
    turned = shift.rope_by(at(30), np.full(5, -12), 64, 1e4, 1.0, interleaved=False)
    np.testing.assert_allclose(np.array(turned), np.array(at(18)), atol=1e-4)
    inter = shift.rope_by(gguf_order(at(30)), np.full(5, -12), 64, 1e4, 1.0, interleaved=True)
    np.testing.assert_allclose(np.array(inter), np.array(gguf_order(at(18))), atol=1e-4)


def test_cells_as_llama_cpp_defines_them():
    c = shift.Cells()
    c.append(0, 10)
    assert c.rm(2, 5).tolist() == [0, 1, 5, 6, 7, 8, 9]
    c.add(5, 100, -6)  # 5 moves below 0: removed, as pos_add does
    assert c.pos.tolist() == [0, 1, 0, 1, 2, 3] and c.shift.tolist() == [0, 0, -6, -6, -6, -6]
    c.div(0, 10, 2, "llama.cpp")  # shift += old - new (llama-kv-cells.h pos_div)
    assert c.pos.tolist() == [0, 0, 0, 0, 1, 1] and c.shift.tolist() == [0, 1, -6, -5, -5, -4]


def test_schedule_sizes_and_refusals():
    assert shift.Schedule(8192, 29).n_cells == 8448  # pad(8221, 256)
    assert shift.Schedule(8192, 29, 2048, 2).n_cells == 16640
    with pytest.raises(ValueError, match="ga_w 100 is not a multiple of ga_n 3"):
        shift.Schedule(256, 4, 100, 3)
    sch = shift.Schedule(256, 32, 240)  # n_ctx 480 = 2 x 240
    assert sch.overrun(800) is None
    assert "not a multiple of ga_w 256" in shift.Schedule(256, 32, 256).overrun(800)
    assert shift.Schedule(256, 32, 256).overrun(400) is None  # no shift due


def test_only_a_plain_cache_is_edited(tiny):
    mixed = make_cache(CacheSpec("int8", "int4"), tiny.config, 64, "reference")
    with pytest.raises(ValueError, match="one plain cache"):
        shift.ShiftCache(mixed, shift.rope_params(tiny.net))


def ring_run(tiny, window: int, tokens: list[int]):
    """The context-shift schedule above with layer 0 a sliding-window ring (Gemma 3's layers):
    ring cells in write order, their positions llama's."""
    from dataclasses import replace

    cfg = replace(tiny.config, windows=((window, 0),) + (None,) * (tiny.config.n_layers - 1))
    sch = shift.Schedule(16, 4, 42)
    inner = make_cache(FP32, cfg, sch.n_cells, "reference", max_step=64)
    cache = shift.ShiftCache(inner, shift.rope_params(tiny.net), sch.div_sign)
    shift.read_prompt(tiny, cache, tokens, sch, ubatch=64)
    cache.kshift()
    return cache, inner.stores[0]


@pytest.mark.parametrize("window", [32, 200])
def test_a_ring_takes_the_shift_by_position(tiny, window):
    # The schedule of the first test (tokens 4..87 dropped, the rest at t - 84). The ring has
    # window + 63 cells, token t in cell t % size: at window 32 (95 cells) it holds tokens
    # 205..299, all moved; at 200 (263 cells) tokens 37..299, those of 37..87 emptied by the
    # two seq_rm. Every held cell's key is the token's key at its new position, and the next
    # query sees the last `window` positions before n_past 216.
    cache, ring = ring_run(tiny, window, TOKENS)
    size = window + 63
    last = {c: max(t for t in range(300) if t % size == c) for c in range(size)}
    want = {c: -1 if 4 <= t < 88 else t - 84 for c, t in last.items()}
    assert ring.ring.pos.tolist() == [want[c] for c in range(size)]
    held = [c for c in range(size) if want[c] >= 0]
    k = ring.fmt.decode({n: a[:, :, held] for n, a in ring.kv.keys[0].items()}, mx.float32)
    np.testing.assert_allclose(np.array(k[0], np.float64),
                               layer0_keys([TOKENS[last[c]] for c in held],
                                           [want[c] for c in held]), atol=2e-4)  # fmt: skip
    from kvbench.kernels.model.policies.window import sees

    seen = np.array(ring.ring.pos)[sees(ring.ring.pos, [cache.offset], 0, window)[0]]
    assert sorted(seen.tolist()) == list(range(217 - window, 216))  # p > 216 - window, held


def softmax_over(store, cells: list[int], q) -> np.ndarray:
    """[Hkv, D] float64: one query's attention over `cells` of the store's layer 0 (numpy)."""
    kk, vv = (np.array(store.fmt.decode({a: x[:, :, cells] for a, x in s[0].items()},
                                        mx.float32)[0], np.float64)
              for s in (store.kv.keys, store.kv.values))  # fmt: skip
    w = np.einsum("hd,hnd->hn", np.array(q[0, :, 0], np.float64), kk) * q.shape[-1] ** -0.5
    w = np.exp(w - w.max(-1, keepdims=True))
    return np.einsum("hn,hnd->hd", w / w.sum(-1, keepdims=True), vv)


def test_a_ring_layers_next_token_sees_the_window_by_llama_position(tiny):
    # One more token through layer 0 after the shifts (window 32, n_past 216): it sees itself
    # and the 31 positions before it, 185..215, whatever order the ring wrote them in.
    cache, ring = ring_run(tiny, 32, TOKENS)
    h, d = tiny.config.n_kv_heads, tiny.config.head_dim
    q, k, v = (mx.random.normal((1, h, 1, d), key=mx.random.key(i)) for i in range(3))
    out = np.array(cache.attend(0, q, k, v, d**-0.5)[0, :, 0], np.float64)
    pos = np.array(ring.ring.pos)
    cells = np.flatnonzero((pos > 216 - 32) & (pos <= 216)).tolist()
    assert sorted(pos[cells].tolist()) == list(range(185, 217))
    np.testing.assert_allclose(out, softmax_over(ring, cells, q), atol=1e-4)


def test_a_full_window_layer_takes_self_extend_by_position(tiny):
    # llama.cpp's --swa-full: layer 0 a 24-position window that keeps every cell. Self-extend
    # (ga_n 2, batches of 64, keys turned exactly) packs two tokens a position, so the next
    # token sees more than 24 cells: every held cell whose position p has n_past - 24 < p,
    # checked against a numpy softmax over those cells' stored keys and values.
    from dataclasses import replace

    n = tiny.config.n_layers
    cfg = replace(tiny.config, windows=((24, 0),) + (None,) * (n - 1))
    sch = shift.Schedule(16, 4, 64, ga_n=2, div_sign="exact", swa_full=True)
    config, windows = shift.full_windows(cfg, sch.swa_full)
    assert windows == {0: 24} and config.windows is None
    inner = make_cache(FP32, config, sch.n_cells, "reference")
    cache = shift.ShiftCache(inner, shift.rope_params(tiny.net), sch.div_sign, windows)
    shift.read_prompt(tiny, cache, TOKENS[:200], sch, ubatch=64)
    cache.kshift()
    # resident after the fill, per layer: all 200 tokens' cells in the window layer too,
    # K and V x 2 KV heads x head_dim 64 x 4 bytes (fp32) each
    h, d = tiny.config.n_kv_heads, tiny.config.head_dim
    for layer in range(n):
        held = sum(a.nbytes for kv in inner.kv.view(layer, inner.offset) for a in kv.values())
        assert held == 200 * 2 * h * d * 4 == 200 * 2 * 2 * 64 * 4
    p, pos = cache.offset, cache.cells.pos.copy()
    cells = np.flatnonzero(pos > p - 24)
    assert len(cells) > 24  # grouped positions: the window holds more than 24 tokens
    np.testing.assert_allclose(
        stored_layer0(cache, FP32)[:, cells],
        layer0_keys([TOKENS[i] for i in cells], pos[cells]),
        atol=2e-4,
    )
    q, k, v = (mx.random.normal((1, h, 1, d), key=mx.random.key(i)) for i in range(3))
    out = np.array(cache.attend(0, q, k, v, d**-0.5)[0, :, 0], np.float64)
    sel = [*cells.tolist(), len(pos)]  # the held cells in the window, then the new one
    np.testing.assert_allclose(out, softmax_over(inner, sel, q), atol=1e-4)

"""llama.cpp's context shift and self-extend on a real model's cache, as its passkey example
schedules them (examples/passkey/passkey.cpp, b11434), so kvbench answers the prompt that
`llama-passkey` answers with the same cache edits.

* The context: n_cells = n_ctx_train x ga_n + n_keep, padded to a multiple of 256 (llama_context,
  src/llama-context.cpp); n_ctx = n_cells - n_keep positions are filled before a shift.
* Prefill in batches of n_batch (ga_w) tokens at positions n_past.. (n_past = the largest
  position held + 1, llama_memory_seq_pos_max). Self-extend (ga_n > 1): before each batch but
  the first, the last batch's positions [n_past - n_batch, n_past) move by ib x bd
  (seq_add) and [.. + ib x bd, n_past + ib x bd) are divided by ga_n (seq_div), ib the batch
  index less one, bd = (n_batch / ga_n)(ga_n - 1): every batch but the last ends at p // ga_n.
* Context shift, once n_ctx positions are held: before each further batch, positions
  [n_keep, n_keep + n_batch) are removed (seq_rm) and [n_keep + n_batch, n_ctx) move by
  -n_batch (seq_add); after the prompt, one more shift of n_past - n_ctx + 16 positions leaves
  room for the 16 answer tokens.
* Keys are stored after RoPE; an edit records each cell's shift (llama-kv-cells.h pos_add:
  shift += d) and, before the next batch, the K-shift rotates every stored key by its shift
  (src/llama-kv-cache.cpp build_rope_shift): an f16 K in place (RoPE on the f16 rows, rounded
  back to f16); a quantized K is dequantized to float32, rotated back by the Hadamard when K is
  stored rotated, rotated by RoPE, rotated forward again and re-quantized (ggml_cpy into K's
  type). kvbench does the same through the format: decode, un-rotate, RoPE, rotate, encode.
* Sliding-window layers (Gemma 3, llama_kv_cache_iswa): under a context shift their rings take
  the same edits (class Rings). Under self-extend a ring cannot: its cells are reused once the
  window masks them, and grouping moves positions back inside the window, so llama.cpp's
  find_slot finds no free cell ("failed to find a memory slot", b11434, every ga_n and batch
  tried). With --swa-full (Schedule.swa_full) a window layer keeps every cell, edited as the
  global layers are, and the window is a mask by position (llama_hparams::is_masked_swa: a key
  at p0 is hidden from a query at p1 when p1 - p0 >= n_swa).
* seq_div's sign. llama-kv-cells.h pos_div records shift += p_old - p_new, where pos_add
  records shift += d (= p_new - p_old): a divided key is rotated by +(p_old - p_new), away
  from its new position, not to it. `div_sign` "llama.cpp" replays that (the arithmetic
  llama-passkey runs); "exact" rotates each key to the position the cell says it holds.

A cell's position is bookkeeping apart from where it is stored: the cache wrapped (a
PlainCache: one format for K and V, per-token) holds the survivors compacted in position order,
and `offset`, what the model's RoPE reads for the next token, is n_past.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np

from kvbench.kernels.formats.rotation import rotate
from kvbench.kernels.model.policies.window import sees

PAD_CELLS = 256  # llama_context pads n_ctx to a multiple of 256 (src/llama-context.cpp)
N_PREDICT = 16  # passkey.cpp's answer room
DIV_SIGNS = ("llama.cpp", "exact")


@dataclass(frozen=True)
class Schedule:
    """passkey.cpp's context and batches: n_ctx_train (the trained length it sizes by), n_keep,
    n_batch (= ga_w, the self-extend window), ga_n, seq_div's sign and whether sliding-window
    layers keep every cell (llama.cpp's --swa-full)."""

    n_ctx_train: int
    n_keep: int
    n_batch: int = 2048
    ga_n: int = 1
    div_sign: str = "llama.cpp"
    swa_full: bool = False

    def __post_init__(self):
        if self.ga_n < 1 or self.n_batch % self.ga_n:
            raise ValueError(f"ga_w {self.n_batch} is not a multiple of ga_n {self.ga_n} "
                             "(passkey.cpp asserts n_batch % n_grp == 0)")  # fmt: skip
        if self.div_sign not in DIV_SIGNS:
            raise ValueError(f"div_sign must be one of {DIV_SIGNS}, got {self.div_sign!r}")

    @property
    def n_cells(self) -> int:
        need = self.n_ctx_train * self.ga_n + self.n_keep
        return -(-need // PAD_CELLS) * PAD_CELLS

    @property
    def n_ctx(self) -> int:
        """Positions held before passkey.cpp shifts (llama_n_ctx(ctx) - n_keep)."""
        return self.n_cells - self.n_keep

    def overrun(self, n_tokens: int) -> str | None:
        """Why passkey.cpp's loops cannot read n_tokens with this context, or None: its first
        loop fills whole batches while i < n_ctx, so when a shift is due, n_ctx must be a
        multiple of n_batch (else a batch runs past the cells and llama_decode fails, or the
        second loop reads tokens again)."""
        if n_tokens > self.n_ctx and self.n_ctx % self.n_batch:
            return (f"{n_tokens} tokens through a context of {self.n_cells} cells: n_ctx "
                    f"{self.n_ctx} (cells - n_keep {self.n_keep}) is not a multiple of ga_w "
                    f"{self.n_batch}; passkey.cpp's batches would overrun its cache")  # fmt: skip
        return None


class Cells:
    """Each held cell's position and pending shift, in storage order (llama-kv-cells.h for one
    sequence): seq_rm, seq_add and seq_div as llama.cpp defines them."""

    def __init__(self):
        self.pos = np.zeros(0, dtype=np.int64)
        self.shift = np.zeros(0, dtype=np.int64)

    def append(self, first: int, n: int) -> None:
        self.pos = np.concatenate([self.pos, np.arange(first, first + n)])
        self.shift = np.concatenate([self.shift, np.zeros(n, dtype=np.int64)])

    def n_past(self) -> int:
        return int(self.pos.max()) + 1 if len(self.pos) else 0

    def rm(self, p0: int, p1: int) -> np.ndarray:
        """Remove the cells at positions [p0, p1); returns the survivors' old indices."""
        keep = np.flatnonzero((self.pos < p0) | (self.pos >= p1))
        self.pos, self.shift = self.pos[keep], self.shift[keep]
        return keep

    def add(self, p0: int, p1: int, d: int) -> np.ndarray:
        """Positions [p0, p1) += d (a cell moved below 0 is removed, as pos_add does); returns
        the survivors' old indices."""
        sel = (self.pos >= p0) & (self.pos < p1)
        self.pos[sel] += d
        self.shift[sel] += d
        return self.rm(-(2**62), 0) if d < 0 else np.arange(len(self.pos))

    def div(self, p0: int, p1: int, g: int, sign: str) -> None:
        """Positions [p0, p1) //= g; the shift recorded as `sign` says (module docstring)."""
        sel = (self.pos >= p0) & (self.pos < p1)
        old = self.pos[sel]
        self.pos[sel] = old // g
        moved = self.pos[sel] - old
        self.shift[sel] += -moved if sign == "llama.cpp" else moved


def rope_params(net) -> list[tuple[int, float, float]]:
    """(dims, base, scale) of each layer's RoPE (mlx-lm's nn.RoPE, half-split rotation), the
    model's layers in order; ValueError for a RoPE kvbench cannot re-apply."""
    import mlx.nn as nn

    out = []
    for i, layer in enumerate(net.layers):
        r = getattr(getattr(layer, "self_attn", None), "rope", None)
        if not isinstance(r, nn.RoPE) or r.traditional or r.base is None:
            kind = type(r).__name__
            raise ValueError(f"layer {i}: RoPE {kind}: kvbench re-rotates mlx-lm's nn.RoPE "
                             "(half-split, a base) only")  # fmt: skip
        out.append((r.dims, float(r.base), float(r.scale)))
    return out


def rope_by(x: mx.array, delta: np.ndarray, dims: int, base: float, scale: float,
            interleaved: bool) -> mx.array:  # fmt: skip
    """x [1, H, n, D] float32 turned by RoPE through delta[n] positions: pair (i, i + dims/2)
    (interleaved: (2i, 2i + 1), GGUF's key order) by angle scale x delta x base^(-2i/dims)."""
    half = dims // 2
    inv = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)  # [dims/2]
    ang = (scale * np.asarray(delta, np.float64))[:, None] * inv[None, :]  # [n, dims/2]
    cos, sin = mx.array(np.cos(ang), mx.float32), mx.array(np.sin(ang), mx.float32)
    if interleaved:
        x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
    else:
        x1, x2 = x[..., :half], x[..., half:dims]
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if interleaved:  # back to (2i, 2i + 1) pairs
        turned = mx.stack([r1, r2], axis=-1).reshape(*x.shape[:-1], dims)
    else:
        turned = mx.concatenate([r1, r2], axis=-1)
    return mx.concatenate([turned, x[..., dims:]], axis=-1) if dims < x.shape[-1] else turned


def turn_keys(store, layers, idx: np.ndarray, delta: np.ndarray, ropes, interleaved: bool) -> None:
    """Rotate the keys of `store` (a PlainCache or WindowCache: .kv, .fmt, .rot) at cells `idx`
    by delta[i] positions (build_rope_shift, module docstring): decode, rotate back, RoPE,
    rotate, encode. `layers`: (the store's layer, the model's layer) pairs."""
    rk, _, bk, _ = store.rot
    fmt, kv, at = store.fmt, store.kv, mx.array(idx)
    for mine, model_layer in layers:
        parts = {n: mx.take(a, at, axis=2) for n, a in kv.keys[mine].items()}
        k = rotate(fmt.decode(parts, mx.float32), rk, bk)
        k = rope_by(k, delta, *ropes[model_layer], interleaved=interleaved)
        for name, part in fmt.encode(rotate(k, rk, bk)).items():
            kv.keys[mine][name][:, :, at] = part
        mx.eval(kv.layer_arrays(mine))


class Rings:
    """The sliding-window layers of a LayeredCache (kernels/model/cache.py WindowCache: a ring
    of cells chosen by write order) under llama.cpp's edits, as its SWA cache takes them
    (llama_kv_cache_iswa: seq_rm and seq_add on both caches, the SWA mask by position,
    p_q - p_k < n_swa): the rings' `pos` holds llama positions (-1: empty), an edit moves or
    empties cells and records their shift, and a ring's next write stays the next cell in write
    order. Every ring sees the same tokens, so the rings share one position array."""

    def __init__(self, stores: list[tuple[int, object]]):
        self.stores = stores  # (model layer, WindowCache)
        self.layers = {layer for layer, _ in stores}
        ring = stores[0][1].ring
        if any(w.ring.window != ring.window or w.ring.sinks for _, w in stores):
            raise ValueError("a shift of rings with sinks or unequal windows is not built")
        self.pos = ring.pos
        for _, w in stores:
            w.ring.pos = self.pos  # one array: an edit of it is every ring's
        self.shift = np.zeros(ring.size, dtype=np.int64)

    def write(self, w, k, v, n_past: int) -> None:
        """Store k, v in ring `w`'s next cells, which then hold positions n_past.. (llama's,
        not the ring's write count) and no pending shift."""
        n = k.shape[2]
        cells = [w.ring.cell_of(p) for p in range(w.ring.next, w.ring.next + n)]
        w.write(0, k, v)
        self.pos[cells] = np.arange(n_past, n_past + n)
        self.shift[cells] = 0

    def rm(self, p0: int, p1: int) -> None:
        gone = (self.pos >= p0) & (self.pos < p1)
        self.pos[gone], self.shift[gone] = -1, 0

    def add(self, p0: int, p1: int, d: int) -> None:
        sel = (self.pos >= p0) & (self.pos < p1)
        self.pos[sel] += d
        self.shift[sel] += d
        below = sel & (self.pos < 0)  # moved below 0: removed, as pos_add does
        self.pos[below], self.shift[below] = -1, 0

    def kshift(self, ropes, interleaved: bool) -> int:
        sel = np.flatnonzero(self.shift)
        if len(sel):
            for layer, w in self.stores:
                turn_keys(w, [(0, layer)], sel, self.shift[sel], ropes, interleaved)
        self.shift[:] = 0
        return len(sel) * len(self.stores)


def full_windows(config, swa_full: bool) -> tuple[object, dict]:
    """(the config a cache is made for, ShiftCache's `windows`): with swa_full, every layer a
    plain store (no ring) and {layer: window} of the sliding-window ones; else as they are."""
    if not swa_full:
        return config, {}
    got = {i: w for i, w in enumerate(config.windows or ()) if w}
    if any(sinks for _, sinks in got.values()):
        raise ValueError("swa_cache full with window sinks: not built")
    return replace(config, windows=None), {i: w for i, (w, _) in got.items()}


def parts_of(inner) -> tuple[list, list]:
    """(plain stores as (store, [(its layer, the model's layer)]), ring stores as (model layer,
    WindowCache)) of a PlainCache or a LayeredCache of PlainCache and WindowCache layers."""
    from kvbench.kernels.model.cache import LayeredCache, PlainCache, WindowCache

    why = ("a context shift or self-extend edits one plain cache: one format for K and V, "
           "per-token, no sinks or residual")  # fmt: skip
    if isinstance(inner, PlainCache):
        return [(inner, [(i, i) for i in range(inner.kv.n_layers)])], []
    if not isinstance(inner, LayeredCache):
        raise ValueError(why)
    plain, rings = [], []
    for i, s in enumerate(inner.stores):
        if isinstance(s, PlainCache):
            plain.append((s, [(0, i)]))
        elif isinstance(s, WindowCache):
            rings.append((i, s))
        else:
            raise ValueError(why)
    if not plain:
        raise ValueError("a cache of sliding-window layers only: nothing holds the context")
    return plain, rings


class ShiftCache:
    """A PlainCache (kernels/model/cache.py), or a LayeredCache of plain and sliding-window
    layers (Gemma 3), whose cells carry llama.cpp positions: writes land after the held cells,
    `offset` (RoPE's position of the next token) is n_past, and seq_rm / seq_add / seq_div edit
    the cells as llama.cpp does; `kshift` re-rotates the keys whose position moved (a
    StoredCache, kernels/model/protocol.py). The rings (class Rings) take seq_rm and seq_add;
    seq_div on them (self-extend) is refused. `windows` {model layer: window}: the plain stores
    of sliding-window layers that keep every cell (--swa-full), attended through the window as
    a mask by position."""

    def __init__(self, inner, ropes: list[tuple[int, float, float]], div_sign: str = "llama.cpp",
                 windows: dict | None = None):  # fmt: skip
        self.windows = windows or {}
        self.plain, ring_stores = parts_of(inner)
        self.where = {model: (s, mine) for s, layers in self.plain for mine, model in layers}
        self.rings = Rings(ring_stores) if ring_stores else None
        self.inner, self.cells, self.ropes, self.div_sign = inner, Cells(), ropes, div_sign
        first = self.plain[0][0]
        self.interleaved = first.spec.k_order == "gguf"
        head = {n: a[:, :, :1] for n, a in first.kv.keys[0].items()}  # one cell: its width
        head_dim = first.fmt.decode(head, mx.float32).shape[-1]  # (packed formats: not data's)
        if self.interleaved and any(d != head_dim for d, _, _ in ropes):
            raise ValueError("k_order gguf with a partial RoPE: not built")
        # cells removed, keys re-rotated (x layers), K-shifts applied, context shifts made
        self.counts = {"removed": 0, "rotated": 0, "kshifts": 0, "context_shifts": 0}

    @property
    def offset(self) -> int:
        return self.cells.n_past()

    def attend(self, layer: int, q, k, v, scale: float) -> mx.array:
        if layer in self.windows:
            return self._attend_window(layer, q, k, v, scale)
        if self.rings is None or layer not in self.rings.layers:
            return self.inner.attend(layer, q, k, v, scale)
        # a ring layer: the new cells hold llama's positions before the mask reads them, and the
        # mask's queries start at n_past (the ring itself counts writes)
        w = self.inner.stores[layer]
        self.rings.write(w, k, v, self.offset)
        w.offset = self.offset
        return w.read(0, q, scale)

    def _attend_window(self, layer: int, q, k, v, scale: float) -> mx.array:
        """A window layer that keeps every cell: the held cells' positions, then the new ones'
        (n_past..), each query seeing the positions p with q - window < p <= q."""
        (store, mine), n = self.where[layer], k.shape[2]
        store.write(mine, k, v)
        qpos = np.arange(self.offset, self.offset + n)
        pos = np.concatenate([self.cells.pos, qpos])
        return store.read_seen(mine, q, scale, mx.array(sees(pos, qpos, 0, self.windows[layer])))

    def advance(self, n: int) -> None:
        first = self.cells.n_past()
        self.inner.advance(n)
        self.cells.append(first, n)

    def arrays(self) -> list[mx.array]:
        return self.inner.arrays()

    def saturated(self) -> int:
        return self.inner.saturated()

    # ---- llama.cpp's edits -------------------------------------------------------------------

    def seq_rm(self, p0: int, p1: int) -> None:
        self._compact(self.cells.rm(p0, p1))
        if self.rings is not None:
            self.rings.rm(p0, p1)

    def seq_add(self, p0: int, p1: int, d: int) -> None:
        if d:
            self._compact(self.cells.add(p0, p1, d))
            if self.rings is not None:
                self.rings.add(p0, p1, d)

    def seq_div(self, p0: int, p1: int, g: int) -> None:
        if g != 1 and self.rings is not None:
            raise ValueError("self-extend on sliding-window layers is not built")
        if g != 1:
            self.cells.div(p0, p1, g, self.div_sign)

    def _compact(self, keep: np.ndarray) -> None:
        """The surviving cells moved to the front, in their order (llama.cpp leaves holes that
        later writes fill: the same cells at the same positions, another storage order)."""
        self.counts["removed"] += self.plain[0][0].offset - len(keep)
        for store, layers in self.plain:
            n_old = store.offset
            if len(keep) == n_old:
                continue
            idx, n, kv = mx.array(keep), len(keep), store.kv
            for mine, _ in layers:
                for stored in (kv.keys[mine], kv.values[mine]):
                    for name, a in stored.items():
                        stored[name][:, :, :n] = mx.take(a[:, :, :n_old], idx, axis=2)
            mx.eval(kv.arrays())
            store.offset = kv.offset = n

    def kshift(self) -> None:
        """Rotate every key with a pending shift by it (build_rope_shift, module docstring);
        the shifts then reset."""
        sel = np.flatnonzero(self.cells.shift)
        rotated = 0
        if len(sel):
            for store, layers in self.plain:
                turn_keys(store, layers, sel, self.cells.shift[sel], self.ropes, self.interleaved)
                rotated += len(sel) * len(layers)
            self.cells.shift[:] = 0
        if self.rings is not None:
            rotated += self.rings.kshift(self.ropes, self.interleaved)
        if rotated:
            self.counts["rotated"] += rotated
            self.counts["kshifts"] += 1


# ---- passkey.cpp's loops -------------------------------------------------------------------


def shift_out(cache: ShiftCache, n_keep: int, n_discard: int, n_ctx: int) -> None:
    """passkey.cpp's context shift: seq_rm [n_keep, n_keep + n_discard), seq_add the positions
    after it up to n_ctx by -n_discard."""
    cache.seq_rm(n_keep, n_keep + n_discard)
    cache.seq_add(n_keep + n_discard, n_ctx, -n_discard)
    cache.counts["context_shifts"] += 1


def group(cache: ShiftCache, i: int, sch: Schedule) -> None:
    """Self-extend before batch i (> 0): the last batch's positions compressed by ga_n."""
    ib, bd = i // sch.n_batch - 1, (sch.n_batch // sch.ga_n) * (sch.ga_n - 1)
    n_past = cache.offset
    cache.seq_add(n_past - sch.n_batch, n_past, ib * bd)
    cache.seq_div(n_past - sch.n_batch + ib * bd, n_past + ib * bd, sch.ga_n)


def batches(sch: Schedule, n_tokens: int) -> list[tuple[int, str | None]]:
    """passkey.cpp's batches over n_tokens: (first token, the edit made before it: "group",
    "shift" or None). The first loop fills n_ctx (self-extend between batches); the second
    shifts before each further batch."""
    out, i = [], 0
    while i < sch.n_ctx:
        out.append((i, "group" if i > 0 and sch.ga_n > 1 else None))
        if i + sch.n_batch >= n_tokens:
            break
        i += sch.n_batch
    return out + [(j, "shift") for j in range(sch.n_ctx, n_tokens, sch.n_batch)]


def edit_before(cache: ShiftCache, start: int, edit: str | None, sch: Schedule) -> None:
    """The edit passkey.cpp makes before the batch at `start`, then the K-shift of all edits
    pending (llama_decode applies it before the batch)."""
    if edit == "group":
        group(cache, start, sch)
    elif edit == "shift":
        shift_out(cache, sch.n_keep, sch.n_batch, sch.n_ctx)
    cache.kshift()


def read_prompt(model, cache: ShiftCache, tokens: list[int], sch: Schedule, ubatch: int):
    """The prompt through passkey.cpp's two loops (module docstring), each batch in micro-batches
    of `ubatch` after the K-shift of the edits before it; the last token's logits [vocab], taken
    before the closing shift that leaves room for the answer."""
    from kvbench.kernels.model.run import decode, prefill

    if reason := sch.overrun(len(tokens)):
        raise ValueError(reason)
    logits = None
    for start, edit in batches(sch, len(tokens)):
        edit_before(cache, start, edit, sch)
        piece = tokens[start : start + sch.n_batch]
        last = start + sch.n_batch >= len(tokens)
        prefill(model, cache, piece[:-1] if last else piece, ubatch)
        if last:
            logits = decode(model, cache, piece[-1])
    n_discard = cache.offset - sch.n_ctx + N_PREDICT
    if n_discard > 0:
        shift_out(cache, sch.n_keep, n_discard, sch.n_ctx)
    return logits


def greedy_answer(model, cache: ShiftCache, tokenizer, prompt, task: str, sch: Schedule,
                  ubatch: int = 512) -> str:  # fmt: skip
    """retrieval.greedy_answer's continuation, the prompt read as passkey.cpp reads it."""
    import mlx.core as mx

    from kvbench.kernels.model.retrieval import stop_early
    from kvbench.kernels.model.run import check_finite, decode
    from kvbench.kernels.model.tokenizer import eog_ids

    logits = read_prompt(model, cache, prompt.tokens, sch, ubatch)
    out: list[int] = []
    eog = eog_ids(tokenizer)
    for _ in range(prompt.gen_tokens):
        token = int(mx.argmax(check_finite(logits, "greedy decoding", cache.offset)).item())
        if token in eog:  # passkey.cpp stops at llama_vocab_is_eog
            break
        out.append(token)
        if stop_early(task, tokenizer.decode(out)):
            break
        cache.kshift()
        logits = decode(model, cache, token)
    return tokenizer.decode(out)

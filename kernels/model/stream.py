"""One layer's K or V of a mixed model cache (kernels/model/cache.py MixedCache): fp16 sinks,
a quantized body (per token, or per channel over groups of recent_tokens positions as KIVI's
keys), and KIVI's fp16 residual of the newest positions (kernels/model/spec.py CacheSpec)."""

from __future__ import annotations

import mlx.core as mx

from kvbench.kernels.model.policies.residual import flushed
from kvbench.kernels.model.spec import CacheSpec


class Stream:
    """One layer's K or V of a mixed spec: fp16 sinks, a quantized body, an fp16 residual."""

    def __init__(self, spec: CacheSpec, fmt, channel: bool, n_kv_heads, head_dim, capacity, role):
        self.fmt, self.channel, self.d, self.role = fmt, channel, head_dim, role
        self.n_saturated = mx.array(0, dtype=mx.int32)  # FP8: elements stored saturated
        self.s_max, self.r = spec.sink_tokens, spec.recent_tokens
        dense = (1, n_kv_heads, max(self.s_max, 1), head_dim)
        self.sink = mx.zeros(dense, dtype=mx.float16)
        self.resid = mx.zeros((1, n_kv_heads, max(self.r, 1), head_dim), dtype=mx.float16)
        if channel:  # [B, H, groups, D, R]: row = one channel over R positions
            self.body = fmt.alloc((1, n_kv_heads, capacity // self.r + 1, head_dim, self.r))
        else:
            self.body = fmt.alloc((1, n_kv_heads, capacity, head_dim))
        self.n_sink = self.n_body = self.n_resid = 0

    def write(self, x: mx.array) -> None:
        """Append x [1, H, n, D] (float32) after the positions already held. The first write
        (the prefill) calibrates a format whose scale is calibrated (FP8, as vLLM)."""
        self.fmt = self.fmt.calibrate(x, self.role)
        take = min(self.s_max - self.n_sink, x.shape[2])
        if take > 0:
            self.sink[:, :, self.n_sink : self.n_sink + take] = x[:, :, :take].astype(mx.float16)
            self.n_sink += take
            x = x[:, :, take:]
        if x.shape[2] == 0:
            return
        if self.r == 0:
            return self._flush(x)
        pending = mx.concatenate([self.resid[:, :, : self.n_resid].astype(x.dtype), x], axis=2)
        n_flush = flushed(pending.shape[2], self.r)  # KIVI's residual (policies/residual.py)
        if n_flush:
            self._flush(pending[:, :, :n_flush])
        tail = pending[:, :, n_flush:]
        self.resid[:, :, : tail.shape[2]] = tail.astype(mx.float16)
        self.n_resid = tail.shape[2]

    def _flush(self, x: mx.array) -> None:
        """Quantize x [1, H, m, D] into the body (m a multiple of recent_tokens if channel)."""
        m = x.shape[2]
        sat = self.fmt.saturated(x)
        if sat is not None:
            self.n_saturated = self.n_saturated + sat
        if self.channel:
            g0, ng = self.n_body // self.r, m // self.r
            b, h, _, d = x.shape
            rows = x.reshape(b, h, ng, self.r, d).swapaxes(-1, -2)  # [B, H, ng, D, R]
            for name, part in self.fmt.encode(rows).items():
                self.body[name][:, :, g0 : g0 + ng] = part
        else:
            for name, part in self.fmt.encode(x).items():
                self.body[name][:, :, self.n_body : self.n_body + m] = part
        self.n_body += m

    def dense(self, dtype: mx.Dtype) -> mx.array:
        """Every held position in order, decoded to `dtype`: [1, H, n, D]."""
        parts = [self.sink[:, :, : self.n_sink].astype(dtype)]
        if self.channel:
            ng = self.n_body // self.r
            body = self.fmt.decode({k: a[:, :, :ng] for k, a in self.body.items()}, dtype)
            b, h = body.shape[:2]
            parts.append(body.swapaxes(-1, -2).reshape(b, h, ng * self.r, self.d))
        else:
            body = {k: a[:, :, : self.n_body] for k, a in self.body.items()}
            parts.append(self.fmt.decode(body, dtype))
        parts.append(self.resid[:, :, : self.n_resid].astype(dtype))
        return mx.concatenate(parts, axis=2)

    def arrays(self) -> list[mx.array]:
        return [self.sink, self.resid, *self.body.values()]

    def held_bytes(self) -> int:
        """Bytes of the array slices that hold positions now (measured, not the formula)."""
        held = self.n_body // self.r if self.channel else self.n_body
        body = sum(a[:, :, :held].nbytes for a in self.body.values())
        fp16 = self.sink[:, :, : self.n_sink].nbytes + self.resid[:, :, : self.n_resid].nbytes
        return body + fp16

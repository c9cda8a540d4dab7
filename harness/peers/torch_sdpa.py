"""The torch_sdpa peer: torch's scaled_dot_product_attention over a preallocated torch cache."""

from __future__ import annotations

import numpy as np

from kvbench.peers.base import DecodeData, Preallocated


class TorchSdpa(Preallocated):
    """torch.nn.functional.scaled_dot_product_attention (enable_gqa=True) over a preallocated
    torch cache per layer, written by slice assignment. Work on CPU is synchronous; on CUDA
    each timed call ends with torch.cuda.synchronize()."""

    def __init__(self, data: DecodeData):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
        dt, dev = dtype[data.kv_dtype], torch.device(data.device)
        self.cuda = dev.type == "cuda"
        to = lambda a: torch.from_numpy(np.array(a)).to(dev, dt)  # noqa: E731
        self.q = to(data.q)
        super().__init__(data, to(data.k), to(data.v))
        self.done([])

    def copy(self, a):
        return a.clone()

    def empty_like(self, a):
        return self.torch.empty_like(a)

    def nbytes_of(self, a) -> int:
        return a.numel() * a.element_size()

    def to_numpy(self, a) -> np.ndarray:
        return a.float().cpu().numpy()

    def no_grad(self):
        return self.torch.no_grad()

    def attend(self, layer: int, kv):
        with self.no_grad():
            return self.F.scaled_dot_product_attention(
                self.q, *kv, scale=self.scale, enable_gqa=True
            )

    def done(self, outs: list):
        if self.cuda:
            self.torch.cuda.synchronize()
        return None

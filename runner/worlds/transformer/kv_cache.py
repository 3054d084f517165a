"""The inference engine's key/value cache: what makes autoregressive sampling cost O(T) per token
instead of re-running the whole prefix.

For every layer the cache holds the keys and values of every position written so far, in the
engine's storage (preallocated for the whole sequence, so memory is linear in its length and no
step allocates). A step writes its new positions at `length` and attends to `[0, length)`. The
trainer never uses a cache: it recomputes every position in one teacher-forced pass, which is one of
the routes by which the two compute the same logits differently (torchtune's modules/kv_cache.py is
the model for this class).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, N, H, max_len, hd]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, N, H, max_len, hd]
        self.max_len = max_len
        self.length = 0  # positions written by every layer so far

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions' [N, H, t, hd] keys and values; return all of them so far,
        [N, H, length + t, hd] each. The last layer's write advances `length`."""
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.max_len:
            raise ValueError(f"KV cache full: {stop} positions > max_len {self.max_len}")
        self.k[layer, :, :, start:stop] = k
        self.v[layer, :, :, start:stop] = v
        if layer == self.k.shape[0] - 1:
            self.length = stop
        return self.k[layer, :, :, :stop], self.v[layer, :, :, :stop]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

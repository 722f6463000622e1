"""The KV caches of the torch backend's fixed-shape path (lsp_server/backends/torch/model.py; docs/gpu.md):
`StaticKV`, preallocated buffers indexed by position, and `Graph`, one captured pass shape over them.

Left out on purpose: the passes themselves (model.py `_static_forward`, `_capture`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class StaticKV:
    """A KV cache in preallocated buffers indexed by position (gpt-fast style).

    keys[l], values[l]: [1, kv_heads, capacity, head_dim]. Slot j holds token j; `length`
    tokens are valid. A pass writes its rows at slots `write_pos` (set by the backend before
    the pass) and attends over the whole buffer under a mask that lets row i see slots up
    to its own position, so stale slots past `length` are never read before a later pass
    overwrites them: cropping is `length = keep`, nothing moves. Buffers keep their
    addresses (CUDA graphs captured over them stay valid) until `grow` replaces them.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device):
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.length = 0
        self.write_pos: torch.Tensor | None = None
        self.graphs: dict[int, "Graph"] = {}  # pass rows -> graph captured over these buffers
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        layers, kv_heads, head_dim = self.shape
        self.capacity = capacity
        # Zeros, not empty: a masked slot's value is multiplied by an exact 0 and must be finite.
        # One buffer for all layers (keys[l] is a view), so keeping a tree's path moves every layer at once.
        self.buffers = torch.zeros(2, layers, 1, kv_heads, capacity, head_dim, dtype=self.dtype, device=self.device)
        self.keys, self.values = list(self.buffers[0]), list(self.buffers[1])
        self.slots = torch.arange(capacity, device=self.device)

    def grow(self, capacity: int) -> None:
        """Room for `capacity` tokens: new buffers (what is held is copied), so captured graphs are dropped."""
        if capacity <= self.capacity:
            return
        old = self.buffers
        self._alloc(capacity)
        self.buffers[..., : old.shape[-2], :].copy_(old)
        self.graphs.clear()

    # -- what the transformers attention layers call -------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.write_pos, key_states.to(k.dtype))
        v.index_copy_(2, self.write_pos, value_states.to(v.dtype))
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, keep: int) -> None:
        self.length = min(self.length, max(0, keep))


@dataclass
class Graph:
    """One captured pass shape over one StaticKV's buffers: fill `ids` and `start`, replay, read `out`."""

    graph: object
    ids: torch.Tensor  # [1, rows] token ids
    start: torch.Tensor  # [1] position of row 0
    out: torch.Tensor  # [rows, vocab] float32 logits
    depth: torch.Tensor  # [rows] position of each row after `start` (a tree pass: its depth; tree.py)
    anc: torch.Tensor  # [rows, rows] which rows each row sees

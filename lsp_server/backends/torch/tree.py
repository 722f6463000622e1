"""Tree passes of the torch backend: a tree of draft tokens laid out in the rows of one pass,
and the accepted path's KV kept afterwards (lsp_server/backends/torch/model.py calls these).

A tree pass runs rows [root, node 1, ..., node n]; row j > 0 continues row parents[j] < j (the
root continues what the cache holds). Row j sits at position P + depth(j), P being the tokens
the cache held before the pass, and attends to the cache and to its own ancestors, itself
included, nothing else; its KV is written at slot P + j (row order). After the engine has
chosen the accepted path, `keep_rows` moves the KV of that path's rows to slots P, P + 1, ...
and drops the rest, so the cache holds what a chain pass over the same path would have left.

A chain (row j continues row j - 1) is the special case whose layout is the causal one:
depth(j) = j and every earlier row is an ancestor. Padding rows (the fixed pass shape) continue
the last real row as a chain; no real row sees them.

Left out on purpose: which tree to verify and what to accept (lsp_server/decoding/tree.py).
"""

from __future__ import annotations

from typing import Sequence

import torch


def check_parents(parents: Sequence[int]) -> list[int]:
    """The parents of a tree pass's rows, checked: row 0 (the root) has -1, row j > 0 one row before it."""
    parents = [int(p) for p in parents]
    if not parents or parents[0] != -1:
        raise ValueError("a tree pass starts with its root row (parent -1)")
    for j, p in enumerate(parents[1:], 1):
        if not 0 <= p < j:
            raise ValueError(f"row {j} of a tree pass must continue an earlier row, not {p}")
    return parents


def layout(parents: Sequence[int], rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth [rows] long, ancestors [rows, rows] bool) of a tree padded to `rows` rows:
    ancestors[i, j] is True when row i may see row j (j is i or one of its ancestors)."""
    par = list(parents) + [j - 1 for j in range(len(parents), rows)]
    depth = [0] * rows
    anc = torch.zeros(rows, rows, dtype=torch.bool)
    for j in range(rows):
        if j:
            depth[j] = depth[par[j]] + 1
            anc[j] = anc[par[j]]
        anc[j, j] = True
    return torch.tensor(depth, dtype=torch.long, device=device), anc.to(device)


def chain_layout(rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout of a chain (a plain or verify pass): depth j, every earlier row visible."""
    return (torch.arange(rows, device=device),
            torch.ones(rows, rows, dtype=torch.bool, device=device).tril())


def static_visible(slots: torch.Tensor, start: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """Which static-cache slots each row sees ([rows, capacity] bool): the slots before `start`
    and, of the pass's own slots start..start + rows - 1, its ancestors'. Reads no tensor value
    on the host (CUDA graphs capture it); for a chain it equals `slots <= start + row`."""
    rows = anc.shape[0]
    rel = slots - start  # [capacity]
    own = (rel >= 0) & (rel < rows)
    return (rel < 0)[None, :] | (anc[:, rel.clamp(0, rows - 1)] & own[None, :])


def dynamic_mask(held: int, anc: torch.Tensor) -> torch.Tensor:
    """The 4-D mask [1, 1, rows, held + rows] of a tree pass over a cache holding `held` tokens."""
    rows = anc.shape[0]
    seen = torch.ones(rows, held, dtype=torch.bool, device=anc.device)
    return torch.cat([seen, anc], dim=1)[None, None]


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as eager attention adds it (0 where visible, the dtype's minimum elsewhere)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)


def keep_rows(tensors: Sequence[torch.Tensor], start: int, rows: Sequence[int], dynamic: bool) -> list[torch.Tensor]:
    """Tensors [..., slots, dim] (keys or values; the static cache's one buffer of every layer)
    with the pass's rows at `rows` (offsets from `start`, increasing) moved to start, start + 1,
    ...: a static buffer in place (the same tensors), a dynamic cache's as new tensors ending there."""
    out = []
    for t in tensors:
        idx = torch.tensor([start + r for r in rows], dtype=torch.long).to(t.device, non_blocking=True)
        picked = t.index_select(-2, idx)
        if dynamic:
            out.append(torch.cat([t[..., :start, :], picked], dim=-2))
        else:
            t[..., start : start + len(rows), :].copy_(picked)
            out.append(t)
    return out

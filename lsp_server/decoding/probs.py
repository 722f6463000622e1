"""The one probability filter: temperature, top-k and top-p applied to logits.

Used by the engine for the target's p (accept.py) and by the draft model for its q
(drafters/model_drafter.py): the sampling acceptance rule is exact only if both sides filter
the same way (docs/design.md, "Exactness"). A leaf (torch only), so that the draft-model
drafter may import it and nothing else of the server (tests/test_architecture.py `ALLOWED`).
Left out on purpose: sampling itself and the acceptance rule (accept.py).
"""

from __future__ import annotations

import torch


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Softmax of logits / temperature after top-k and top-p filtering; rows sum to 1.

    logits: [n, V] -> [n, V] float32. top_k 0 and top_p 1 keep every token; top-p keeps
    the smallest set of tokens whose probabilities reach top_p.
    """
    x = logits.float() / max(temperature, 1e-6)
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_x, dim=-1) >= top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x)
    return torch.softmax(x, dim=-1)

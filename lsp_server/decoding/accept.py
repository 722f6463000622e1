"""The acceptance rule of one verify pass (Leviathan et al. 2023; docs/design.md, "Exactness"):
the engine (engine.py) passes the target's logits over a proposal and gets back how many drafts
survive and the token appended after them.

- greedy: a draft token survives while it equals the target's argmax; the argmax at the first
  mismatch (or after the last draft token) is appended for free;
- sampling, deterministic draft (n-gram, q one-hot on d): accept d with probability p(d); on
  rejection sample from p with d removed and renormalised; bonus token from p;
- sampling, draft model with distribution q: accept with min(1, p(d)/q(d)); on rejection sample
  from norm(max(p - q, 0)).
Temperature, top-k and top-p are applied to p first (lsp_server/decoding/probs.py, the one filter).
`sureness` reads from the same rows how sure the model was of the tokens they decided.
Left out on purpose: passes, caches, the loop (engine.py).
"""

from __future__ import annotations

import torch

from drafters.base import Proposal
from lsp_server.decoding.probs import filtered_probs
from lsp_server.decoding.types import DecodeOptions


def accept(logits: torch.Tensor, proposal: Proposal, opts: DecodeOptions,
           gen: torch.Generator | None) -> tuple[int, int]:
    """Apply the acceptance rule; returns (drafts accepted, token appended after them).

    logits: [k + 1, V]; proposal.tokens: k ids; proposal.probs: None (one-hot q) or
    k distributions [V] from a draft model.
    """
    draft = proposal.tokens
    if opts.greedy:
        # Greedy: keep drafts while they equal the target's argmax; the argmax at the
        # first mismatch (or after the last draft) comes for free.
        target = logits.argmax(dim=-1).tolist()
        n = 0
        while n < len(draft) and draft[n] == target[n]:
            n += 1
        return n, target[n]
    p = filtered_probs(logits, opts.temperature, opts.top_k, opts.top_p)  # [k + 1, V]
    for i, d in enumerate(draft):
        if proposal.probs is None:
            # q one-hot on d: accept with probability min(1, p(d) / 1) = p(d) ...
            ratio = float(p[i, d])
            residual = p[i].clone()
            residual[d] = 0.0  # ... else sample from p without d, renormalised.
        else:
            q = proposal.probs[i].to(p.device, torch.float32)
            # General rule: accept with min(1, p(d) / q(d)) ...
            ratio = float(p[i, d] / q[d]) if float(q[d]) > 0 else 1.0
            residual = torch.clamp(p[i] - q, min=0.0)  # ... else sample from norm(max(p - q, 0)).
        u = float(torch.rand((), generator=gen))
        if u < ratio:
            continue
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: the rejection had probability ~0
            residual = p[i]
        return i, int(torch.multinomial(residual, 1, generator=gen))
    # Every draft accepted: one bonus token from the target's next distribution.
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=gen))

def sureness(logits: torch.Tensor, new: list[int]) -> list[tuple[float, float]]:
    """(probability, lead over the runner-up) of each of `new` under the rows that decided it (row i
    decided new[i]: the accepted drafts, then the appended token). Read only: the output does not depend
    on it (docs/design.md, "What to show")."""
    p = torch.softmax(logits[: len(new)].float(), dim=-1)
    top = p.topk(2, dim=-1).values
    chosen = p[torch.arange(len(new)), torch.tensor(new, device=p.device)]
    return list(zip(chosen.tolist(), (top[:, 0] - top[:, 1]).tolist()))

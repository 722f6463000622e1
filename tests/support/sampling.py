"""Exact distributions by enumeration and a chi-square test: how the sampling tests (tests/decoding/
test_sampling.py, tests/drafters/test_model_drafter.py, tests/decoding/test_real_model.py) check
that speculative sampling draws from the distribution plain sampling draws from."""

from __future__ import annotations

import torch

from lsp_server.decoding.probs import filtered_probs

V = 8
LENGTH = 3
PROMPT = [1, 5, 2, 5, 2]
N = 1500  # draws per distribution test


def exact_distribution(lm, opts):
    """P(x1 x2 x3 | PROMPT) for every continuation, by enumeration."""
    dist = {}

    def walk(prefix, prob):
        if len(prefix) == LENGTH:
            dist[tuple(prefix)] = prob
            return
        logits = lm.forward(PROMPT + prefix, lm.new_cache(), last=1)
        p = filtered_probs(logits, opts.temperature, opts.top_k, opts.top_p)[0]
        for t in range(V):
            if p[t] > 0:
                walk(prefix + [t], prob * float(p[t]))

    walk([], 1.0)
    return dist


def chi_square_pvalue(counts, dist, n):
    """Goodness of fit of observed counts to `dist`; cells with expectation < 5 pooled."""
    stat, dof, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for seq, p in dist.items():
        exp = p * n
        obs = counts.get(seq, 0)
        if exp < 5:
            pooled_obs += obs
            pooled_exp += exp
            continue
        stat += (obs - exp) ** 2 / exp
        dof += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        dof += 1
    impossible = sum(c for s, c in counts.items() if s not in dist)
    if impossible:
        return 0.0
    dof -= 1
    # Survival function of chi-square with dof degrees of freedom.
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))

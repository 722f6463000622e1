"""Pricing weighted drafts (the suffix drafter's trees and chains): each node's chance of being
right, learned, and how many of the best-first nodes one pass should verify.

A weighted draft (`Proposal.weights`, drafters/base.py) gives each node the share of the
continuations seen after its parent that continue with it (frequency in the sources). A node is
accepted when it and every ancestor equal the target's tokens, so with c(j) the chance that node
j is right given its parent is, the expected tokens of a pass over the first n nodes are
E(n) = 1 + sum over those nodes of the product of c along the node's path. c is learned per key
(where the match was found: the context or elsewhere; first level or later; how long the match
was, first level only; the share's bucket) as a moving average, from every offered node whose
parent turned out right (`NodeScorer`), whether or not it was verified. The pass over n nodes
costs T(n + 1); the policy verifies the n with the most net tokens, E(n) - T(n + 1) / T(1)
(lsp_server/decoding/speculation.py, the same renewal-reward rule as for chains).

Pure Python: no torch, no LSP.
"""

from __future__ import annotations

from typing import Callable, Sequence

from drafters.base import Proposal

SHARES = (0.9, 0.6, 0.35, 0.15, 0.0)  # bucket lower bounds of a node's share
MATCHES = (16, 8, 4, 2, 0)  # bucket lower bounds of the match length (first level)


def depths(tree: Sequence[int]) -> list[int]:
    """1-based depth of every node of a tree given by parents (-1: the root)."""
    out: list[int] = []
    for p in tree:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def parents(proposal: Proposal) -> list[int]:
    """The proposal's tree, or the chain's parents."""
    n = len(proposal.tokens)
    return list(proposal.tree[:n]) if proposal.tree is not None else list(range(-1, n - 1))


class NodeRates:
    """c(key): a node's chance of being right given its parent is, per key (module docstring)."""

    RATE = 0.03  # weight of one observed node (trees offer many per pass)
    # Before any is observed: how often a continuation holds at all at that match length (first
    # level) or later on, times what the node's share buys. Fitted to the offline replay of the
    # default drafter on the tuning repositories' tasks (encode/httpx, pallets/click; docs/drafters.md):
    # a later node with a share of 0.9 or more was right 0.90 of the time, a first one after a
    # one-token match 0.50, after 2-3 tokens 0.81, after 8 or more 0.89 (context); a first node
    # found only outside the context about 0.6 times as often.
    HOLDS = {16: 0.95, 8: 0.94, 4: 0.86, 2: 0.85, 0: 0.55}
    HOLDS_LATER = 0.95
    SHARE = {0.9: 0.95, 0.6: 0.75, 0.35: 0.45, 0.15: 0.2, 0.0: 0.1}
    OTHER = 0.6  # a first node found only outside the context

    def __init__(self):
        self.rates: dict[tuple, float] = {}
        self.observed: dict[tuple, int] = {}

    @staticmethod
    def key(where: str, first: bool, match_len: int, share: float) -> tuple:
        s = next(b for b in SHARES if share >= b)
        m = next(b for b in MATCHES if match_len >= b) if first else -1
        return (where, first, m, s)

    def prior(self, key: tuple) -> float:
        where, first, m, s = key
        holds = self.HOLDS[m] if first else self.HOLDS_LATER
        return holds * self.SHARE[s] * (self.OTHER if first and where != "context" else 1.0)

    def rate(self, key: tuple) -> float:
        return self.rates.get(key, self.prior(key))

    def observe(self, key: tuple, right: bool) -> None:
        c = self.rate(key)
        self.rates[key] = c + self.RATE * ((1.0 if right else 0.0) - c)
        self.observed[key] = self.observed.get(key, 0) + 1

    def keys(self, proposal: Proposal) -> list[tuple]:
        where = "context" if proposal.source in ("context", "") else "other"
        weights = proposal.weights or []
        return [self.key(where, d == 1, proposal.match_len, weights[i] if i < len(weights) else 1.0)
                for i, d in enumerate(depths(parents(proposal)))]

    def path_probs(self, proposal: Proposal) -> list[float]:
        """Each node's chance of being accepted: the product of c along its path."""
        tree = parents(proposal)
        out: list[float] = []
        for i, key in enumerate(self.keys(proposal)):
            c = min(self.rate(key), 0.98)
            out.append(c * (out[tree[i]] if tree[i] >= 0 else 1.0))
        return out

    def snapshot(self) -> dict:
        def name(k):
            where, first, m, s = k
            return f"{where}/{'first' if first else 'later'}" + (f"/match>={m}" if first else "") + f"/share>={s}"
        return {"rates": {name(k): round(v, 3) for k, v in sorted(dict(self.rates).items(), key=str)},
                "observed": {name(k): c for k, c in sorted(dict(self.observed).items(), key=str)}}


def order_and_count(proposal: Proposal, probs: list[float], net: Callable[[float, int], float]) -> tuple[int, int]:
    """Order the nodes by their chance (parents stay before children: a child's chance is never
    above its parent's) and say how many of them to verify: (the n >= 0 with the most net(E(n), n),
    net(E(0), 0) = 0 by definition; the best n >= 1, 0 for an empty draft)."""
    n = len(proposal.tokens)
    order = sorted(range(n), key=lambda i: (-probs[i], i))
    if order != list(range(n)):
        tree = parents(proposal)
        pos = {old: new for new, old in enumerate(order)}
        proposal.tokens = [proposal.tokens[i] for i in order]
        proposal.tree = [pos[tree[i]] if tree[i] >= 0 else -1 for i in order]
        if proposal.weights is not None:
            proposal.weights = [proposal.weights[i] for i in order]
        probs = [probs[i] for i in order]
    best, best_net, pos, pos_net, total = 0, 0.0, 0, float("-inf"), 1.0
    for i, p in enumerate(probs, 1):
        total += p
        value = net(total, i)
        if value > best_net:
            best, best_net = i, value
        if value > pos_net:
            pos, pos_net = i, value
    return best, pos


class NodeScorer:
    """Scores every node of the weighted drafts offered in one generation against what the target
    produced: a node whose parent was right is observed right or wrong (lsp_server/decoding/speculation.py
    `Scorer` does the same for chains)."""

    def __init__(self, rates: NodeRates):
        self.rates = rates
        self.pending: list[tuple[list[int], list[int], list[int], list[tuple], int]] = []

    def offer(self, proposal: Proposal, at: int) -> None:
        if proposal.tokens:
            tree = parents(proposal)
            self.pending.append((list(proposal.tokens), tree, depths(tree), self.rates.keys(proposal), at))

    def settle(self, seq: Sequence[int], final: bool = False) -> None:
        keep = []
        for item in self.pending:
            tokens, tree, level, keys, at = item
            known = len(seq) - at
            if not final and max(level) > known and self._open(tokens, tree, level, seq, at, known):
                keep.append(item)
                continue
            right: list[bool] = []
            for i, tok in enumerate(tokens):
                parent_right = tree[i] < 0 or right[tree[i]]
                ok = parent_right and level[i] <= known and seq[at + level[i] - 1] == tok
                right.append(ok)
                if parent_right and level[i] <= known:
                    self.rates.observe(keys[i], ok)
        self.pending = keep

    @staticmethod
    def _open(tokens, tree, level, seq, at, known) -> bool:
        """Whether a node past the known tokens may still be observed (its path is right so far)."""
        right: list[bool] = []
        for i, tok in enumerate(tokens):
            ok = (tree[i] < 0 or right[tree[i]]) and level[i] <= known and seq[at + level[i] - 1] == tok
            right.append(ok)
            if level[i] > known and (tree[i] < 0 or right[tree[i]]):
                return True
        return False

"""Tree drafts: verifying several continuations in one target pass (greedy only).

A drafter may propose a tree (`Proposal.tree`, drafters/base.py): draft token i continues
draft token tree[i] (-1: the last token of the sequence), listed best first, each after its
parent, so that any prefix of the list is a tree too (the policy trims a tree that way,
lsp_server/decoding/speculation.py). One pass runs the root (the sequence's last token) and every node,
each row at its own depth's position and seeing only its ancestors (the backend's tree pass,
lsp_server/backends/base.py `trees`). Greedy acceptance walks down from the root: while a child
of the current row holds the target's argmax there, go to it. The accepted path is the longest
root-to-node path that matches the target's argmax chain, so the output is the target's own
(the same argument as for a chain: each accepted token is the argmax of a row whose inputs are
the accepted tokens before it).

After the pass the cache keeps the root, the accepted path and (for traces) the first rejected
child, moved to consecutive slots; to the engine the round then looks like a chain verify of
that path (`verify_tree` returns its rows), so the near-tie guard, the crop of the rejected
token and the statistics are the chain's.

Sampling is not done on trees: a tree proposal is verified as its main path (the first child at
every level) when the options sample, when token healing constrains the rows, or when the
backend has no tree pass (llama.cpp). Exact multi-candidate rejection sampling is left out.
"""

from __future__ import annotations

from typing import Sequence

from drafters.base import Proposal


def parents_of(proposal: Proposal) -> list[int] | None:
    """The tree of a proposal's draft tokens (trimmed to them), or None when it is a chain."""
    tree = proposal.tree
    if tree is None:
        return None
    tree = list(tree[: len(proposal.tokens)])
    return None if all(p == i - 1 for i, p in enumerate(tree)) else tree


def main_path(tokens: Sequence[int], tree: Sequence[int]) -> list[int]:
    """Indices of the main path: from the root, the first listed child at every level."""
    path, node = [], -1
    for i, p in enumerate(tree[: len(tokens)]):
        if p == node:
            path.append(i)
            node = i
    return path


def as_chain(proposal: Proposal) -> Proposal:
    """A tree proposal as its main path (a chain; the proposal itself when it is one)."""
    if proposal.tree is None:
        return proposal
    path = main_path(proposal.tokens, proposal.tree)
    proposal.tokens = [proposal.tokens[i] for i in path]
    if proposal.weights is not None:
        proposal.weights = [proposal.weights[i] for i in path]
    proposal.tree = None
    return proposal


def fit(proposal: Proposal, depth: int, nodes: int, trees: bool) -> Proposal:
    """A proposal within a pass's limits: a chain of at most `depth` tokens; a tree of at most
    `nodes` nodes (a prefix of its best-first list) and `depth` levels, or its main path where
    trees are not verified (`trees` False)."""
    if proposal.tree is not None and not trees:
        as_chain(proposal)
    if proposal.tree is None:
        proposal.tokens = proposal.tokens[:depth]
        return proposal
    keep, level = [], {-1: 0}
    for i, p in enumerate(proposal.tree[: min(len(proposal.tokens), len(proposal.tree))]):
        if p in level and level[p] < depth and len(keep) < nodes:
            level[i] = level[p] + 1
            keep.append(i)
    new = {old: j for j, old in enumerate(keep)}
    proposal.tokens = [proposal.tokens[i] for i in keep]
    proposal.tree = [new.get(proposal.tree[i], -1) for i in keep]
    if proposal.weights is not None:
        proposal.weights = [proposal.weights[i] for i in keep]
    return proposal


def verify_tree(lm, state, seq: list[int], tokens: Sequence[int], tree: Sequence[int], forward=None):
    """One tree pass over [seq[-1]] + tokens and greedy acceptance; (logits, draft, accepted, token).

    state: the engine's cache state (`ids`, `cache`; the cache holds seq[:-1]). Afterwards the
    cache holds seq[:-1], seq[-1] and `draft` (the accepted path, then the first rejected child
    if there is one), `forward(ids, cache, last)` runs the pass (default `lm.forward`; the engine's own
    counts stale passes and calls its hooks), `logits` are the rows of seq[-1] and of `draft` [len(draft) + 1, V], and
    `accepted` of draft's tokens were the target's argmax chain, `token` its argmax after them.
    """
    start = len(state.ids)
    rows = [-1, *[p + 1 for p in tree]]  # row j's parent row (row 0: seq[-1])
    lm.tree_next(state.cache, rows)
    logits = (forward or lm.forward)([seq[-1], *tokens], state.cache, last=len(tokens) + 1)
    target = logits.argmax(dim=-1).tolist()
    children: dict[int, list[int]] = {}
    for j in range(1, len(rows)):
        children.setdefault(rows[j], []).append(j)
    # Greedy: from the root, go to the child holding the argmax of the current row, while one does.
    path, row = [], 0
    while True:
        nxt = next((c for c in children.get(row, ()) if tokens[c - 1] == target[row]), None)
        if nxt is None:
            break
        path.append(nxt)
        row = nxt
    accepted, token = len(path), target[row]
    rejected = children.get(row, [])[:1]  # shown in traces as the draft that lost
    keep = [0, *path, *rejected]
    lm.keep_rows(state.cache, start, keep)
    draft = [tokens[r - 1] for r in keep[1:]]
    state.ids.append(seq[-1])
    state.ids.extend(draft)
    return logits[keep], draft, accepted, token

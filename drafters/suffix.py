"""The default drafter (`ngram`): suffix matches in every source, weighted, drafted as a tree.

Where today's lookup (drafters/ngram.py, the benchmark's `ngram-v1`) copies one continuation of
the longest n-gram (n >= 2) in the context, this drafter (docs/drafters.md, "Suffix trees of
drafts"):

1. matches the end of the context in every source at every length, down to one token: the
   context itself (prompt and generated tokens; its own index, matches up to CONTEXT_MAX
   tokens), the session's earlier generations (`memory`: what this drafter saw generated in
   earlier requests, kept up to `memory_tokens`), and the named sources of the n-gram drafter it
   wraps (the open buffers, priority 1, and accepted completions, priority 2; n >= 2 there);
2. weighs every match position by its source and by its length: WEIGHTS[source] times
   LENGTH_BASE ** (n - longest), for lengths down to `longest - BACKOFF`, so a longer match
   outweighs a shorter one and shorter ones still add the continuations they see;
3. builds the trie of the positions' continuations (up to k tokens) and lists its best nodes
   first: a node's score is its parent's times its share of the weight there (SuffixDecoding's
   frequency-weighted speculation tree, Oliaro et al. 2024), `max_nodes` at most. Each node's
   share goes out as `Proposal.weights`: the speculation policy prices and trims the tree
   (lsp_server/decoding/nodes.py) and the engine verifies it in one pass (lsp_server/decoding/tree.py), or
   its main path where trees are not verified (sampling; llama.cpp).

Each source is an `NGramIndex` (drafters/ngram.py): its sorted arrays are a suffix array of the
reversed stream cut at n_max tokens, so the positions of a match of any length up to n_max are
one binary search per three tokens, however long the stream. Matches longer than 6 tokens
bought no accepted tokens in the offline replay (docs/drafters.md), so the open buffers keep
the n-gram drafter's n_max = 6; the context's index goes to CONTEXT_MAX for the match length the
policy reads. Where the cursor split a token, the n-gram drafter's healed lookup is asked at a
generation's first step and wins when it covers more of the context (a chain, as there).

A generation is recognised by its context: a context that does not extend the last one starts
a new one, and the last one's generated tokens (with MEMORY_LEAD prompt tokens before them) go
into the memory once a generation with another prompt starts. `forget_memory()` empties it (the benchmark gives each system its own).

Left out on purpose: torch, LSP and tokenizers (ids; the wrapped drafter holds the text functions).
"""

from __future__ import annotations

import heapq
from typing import Sequence

from drafters.base import Proposal
from drafters.ngram import CONTEXT, NGramDrafter, NGramIndex, Query

MEMORY = "memory"
SEPARATOR = (1 << NGramIndex.BITS) - 2  # ends each remembered generation; no vocabulary has this id


class SuffixDrafter(NGramDrafter):
    """Weighted suffix matches over the context, earlier generations and the open buffers, as a tree.

    An NGramDrafter (its named sources, healing and `lookup`, today's chain lookup, are that
    class's), whose `propose` is the one of the module docstring."""

    CONTEXT_MAX = 12  # longest match looked up in the context and the memory
    BACKOFF = 3  # match lengths down to longest - BACKOFF contribute
    LENGTH_BASE = 4.0  # a match one token longer weighs this many times more
    WEIGHTS = {CONTEXT: 2.0, MEMORY: 0.5, 1: 0.45, 2: 0.35}  # by source (named sources: by priority)
    PER_LENGTH = 24  # match positions read per source and length (the latest ones)
    CANDIDATES = 96  # continuations in one trie at most (the heaviest)
    MEMORY_LEAD = 16  # prompt tokens remembered before a generation

    def __init__(self, *args, max_nodes: int = 15, memory_tokens: int = 8192, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_nodes = max_nodes
        self.memory_tokens = memory_tokens
        self.greedy = True
        self._suffix = NGramIndex(1, self.CONTEXT_MAX, max_tokens=1 << 30)  # the context, matched from one token
        self._memory = NGramIndex(1, self.CONTEXT_MAX, max_tokens=memory_tokens)
        self._held: list[int] = []  # the context `_suffix` holds
        self._start = 0  # length of the context at this generation's first step
        self._last: tuple[list[int], list[int]] | None = None  # (prompt, tokens) of the last generation

    def sharing(self) -> "SuffixDrafter":
        """Another drafter over the same named sources (the open buffers, the history) with a context
        and a memory of its own (the benchmark gives each system one)."""
        other = SuffixDrafter(self.n_min, self.n_max, self.max_candidates, self.max_tokens_per_source,
                              token_text=self.token_text, encode=self.encode, heal_back=self.heal_back,
                              max_nodes=self.max_nodes, memory_tokens=self.memory_tokens)
        other._sources = self._sources
        return other

    def lookup(self, context: Sequence[int], k: int) -> Proposal:
        """Today's lookup (drafters/ngram.py): one chain from the longest n-gram, n >= 2."""
        return NGramDrafter.propose(self, context, k)

    def set_options(self, options) -> None:
        """Sampling verifies chains only (lsp_server/decoding/tree.py): then no tree is built."""
        self.greedy = bool(getattr(options, "greedy", True))

    def forget_memory(self) -> None:
        """Drop the remembered generations (and the context's: the next one starts afresh)."""
        self._memory = NGramIndex(1, self.CONTEXT_MAX, max_tokens=self.memory_tokens)
        self._held, self._start, self._last = [], 0, None
        self._suffix.set_tokens([])

    def memory(self) -> list[int]:
        """The remembered generations, separated by SEPARATOR."""
        return self._memory.tokens

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        if k <= 0 or not context:
            return Proposal([])
        first = self._sync(context)
        longest, cands = self._matches(self._weighted_sources(), context)
        if first and self.heal_back and len(context) > self.n_min:
            healed = self._healed(context, k, longest)
            if healed is not None:
                return healed
        if not cands:
            return Proposal([])
        return self._tree(cands, k, longest)

    # -- sources -------------------------------------------------------------------------------
    def _sync(self, context: Sequence[int]) -> bool:
        """Bring the context index to `context`; True when it starts a new generation (then the
        last one is remembered)."""
        held = self._held
        n = len(held)
        if len(context) >= n and n and context[n - 1] == held[n - 1] and list(context[:n]) == held:
            if len(context) > n:
                more = list(context[n:])
                self._suffix.extend(more)
                held.extend(more)
            return False
        # The generation that just ended is remembered once the next one has another prompt: a
        # request repeated at the same place is the user asking again after dismissing it, and is
        # decoded as the first time (the one before is remembered then).
        done = [self._last] if self._last is not None else []
        if n > self._start:
            done.append((held[: self._start], held[max(0, self._start - self.MEMORY_LEAD) :]))
        self._last = None
        for prompt, tokens in done:
            if len(prompt) == len(context) and list(context) == prompt:
                self._last = (prompt, tokens)  # (the newest of them; they hold the same tokens)
            else:
                self._remember(tokens)
        self._suffix.set_tokens(context)
        self._held, self._start = list(context), len(context)
        return True

    def _remember(self, tokens: list[int]) -> None:
        self._memory.extend([t for t in tokens if 0 <= t < SEPARATOR] + [SEPARATOR])

    def _weighted_sources(self) -> list[tuple[str, float, int, NGramIndex]]:
        """(name, weight, shortest match, index) of every source."""
        out = [(CONTEXT, self.WEIGHTS[CONTEXT], 1, self._suffix)]
        if len(self._memory):
            out.append((MEMORY, self.WEIGHTS[MEMORY], 1, self._memory))
        for name, (prio, idx) in self._sources.items():
            out.append((name, self.WEIGHTS.get(prio, 0.3), idx.n_min, idx))
        return out

    def _matches(self, sources, context: Sequence[int]) -> tuple[int, list[tuple[float, int, str, NGramIndex]]]:
        """(longest match, [(weight, position, source, index)]) over every source."""
        found = []  # (source no, n, position)
        longest = 0
        queries: dict[tuple[int, int], Query] = {}  # one per index shape, asked of every index of that shape
        for i, (name, w, n_min, idx) in enumerate(sources):
            top = min(idx.n_max, len(context))
            query = queries.get((idx.n_min, idx.n_max))
            if query is None:
                query = queries[idx.n_min, idx.n_max] = Query(context[len(context) - top :], idx.n_min, idx.n_max)
            runs = idx.runs(query)
            seen: set[int] = set()
            own = 0  # this source's longest match
            for n in range(top, n_min - 1, -1):
                if n < max(longest, own) - self.BACKOFF:
                    break
                for p in idx.positions_in(runs.get(n), tuple(context[len(context) - n :]), self.PER_LENGTH):
                    if p not in seen:
                        seen.add(p)
                        found.append((i, n, p))
                        own = max(own, n)
            longest = max(longest, own)
        lo = max(1, longest - self.BACKOFF)
        cands = [(sources[i][1] * self.LENGTH_BASE ** (n - longest), p, sources[i][0], sources[i][3])
                 for i, n, p in found if n >= lo]
        if len(cands) > self.CANDIDATES:
            cands = heapq.nlargest(self.CANDIDATES, cands, key=lambda c: c[0])
        return longest, cands

    # -- the tree ------------------------------------------------------------------------------
    def _tree(self, cands, k: int, longest: int) -> Proposal:
        """Best-first nodes of the continuations' trie (module docstring, 3)."""
        root: list = [0.0, {}, ""]  # [weight, children by token, heaviest source]
        for w, p, name, idx in cands:
            node = root
            node[0] += w
            for tok in idx.continuation(p, k):
                if tok == SEPARATOR:
                    break
                child = node[1].get(tok)
                if child is None:
                    child = node[1][tok] = [0.0, {}, name]
                child[0] += w
                node = child
        limit = self.max_nodes if self.greedy else k
        tokens: list[int] = []
        tree: list[int] = []
        weights: list[float] = []
        heap: list = []
        order = 0

        def push(node, index: int, score: float) -> None:
            nonlocal order
            for tok, child in node[1].items():
                share = child[0] / node[0]
                heapq.heappush(heap, (-score * share, order, tok, child, index, share))
                order += 1

        push(root, -1, 1.0)
        source = ""
        while heap and len(tokens) < limit:
            neg, _, tok, child, parent, share = heapq.heappop(heap)
            if not self.greedy and parent != len(tokens) - 1:
                continue  # sampling: the main chain only
            if parent == -1 and not source:
                source = child[2]
            tokens.append(tok)
            tree.append(parent)
            weights.append(share)
            if _depth(tree, len(tokens) - 1) < k:
                push(child, len(tokens) - 1, -neg)
        return Proposal(tokens, source=source, match_len=longest, tree=tree, weights=weights)

    def _healed(self, context: Sequence[int], k: int, covered: int) -> Proposal | None:
        """The n-gram drafter's healed match (drafters/ngram.py), when it covers more of the
        context than `covered` tokens."""
        self._sync_context(context)
        self._runs = {}
        return self._heal(self._ordered_sources(), context, k, covered=covered)


def _depth(tree: list[int], i: int) -> int:
    d = 1
    while tree[i] >= 0:
        i = tree[i]
        d += 1
    return d

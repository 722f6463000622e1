"""The n-gram drafter as it was before issue 26 (dicts of lists per n), kept verbatim below this
docstring as the reference the array-backed drafters/ngram.py must equal draft for draft
(tests/drafters/test_ngram_reference.py). Do not improve it: its behaviour is the contract.

N-gram lookup drafting over the open buffers (docs/design.md, "Drafting").

Code repeats its identifiers, call shapes and boilerplate, so the next tokens are often
a copy of tokens that follow the same n-gram somewhere already seen: in the prompt, in
what has been generated so far, in another open buffer, or in a completion the user
accepted earlier.

Each source is an `NGramIndex`: a dict from n-gram (n_min..n_max tokens) to the
ascending positions of the token that follows it. A lookup is a few dict probes; a
buffer change re-indexes only from the first changed token on. Choosing among matches
is a fixed rule:

1. the longest n-gram (ending at the end of the context) that occurs anywhere wins;
2. the draft is then grown one token at a time, taking the continuation token that the
   most surviving match positions agree on (frequency);
3. ties go to proximity: the more trusted source first (context, then open buffers,
   then history), then the later position (in the context, nearer the cursor).

Draft length follows match length: a 2-gram match drafts at most 3 tokens, longer
matches up to k.

**Healing** (docs/drafters.md, "Healed lookup"): where the cursor splits a pre-token, the
context's last tokens are a split that never occurs in the buffers (`return self.` ends
in `.`, while every earlier `self.width` holds the token `.width`), so no n-gram matches
exactly where ghost text is asked for. Given the tokenizer's `token_text` and `encode`,
the drafter then also matches the context without its last m tokens (m = 1..heal_back)
and keeps the positions whose continuation token's text strictly extends the text of
those m tokens; the draft starts with the re-encoded rest of that token's text. A
proposal is only a proposal: the engine verifies it, so healing changes speed, never
output. Without the two functions the drafter stays tokenizer-free.

Left out on purpose: torch, LSP and tokenizers (plain lists of ints; text functions only
when injected).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

from drafters.base import Proposal

CONTEXT = "context"


class RefNGramIndex:
    """One token stream and its n-gram -> next-position table.

    `table[gram]` lists, in ascending order, every position p (< len(tokens)) such
    that tokens[p - len(gram):p] == gram; tokens[p] is the continuation. The last
    n-gram of the stream has no continuation and is not indexed, so a lookup can never
    match the context against itself past its end.
    """

    def __init__(self, n_min: int = 2, n_max: int = 6, max_tokens: int = 65536):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min = n_min
        self.n_max = n_max
        self.max_tokens = max_tokens
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def set_tokens(self, new: Sequence[int]) -> int:
        """Make the index describe `new`; returns how many positions were re-indexed.

        Work is proportional to the part of `new` after its common prefix with the old
        stream (an append costs only the appended tokens). Streams longer than
        max_tokens keep their last max_tokens tokens.
        """
        new = list(new[-self.max_tokens :]) if len(new) > self.max_tokens else list(new)
        old = self.tokens
        common = 0
        limit = min(len(old), len(new))
        if limit and old[:limit] == new[:limit]:
            common = limit
        else:
            while common < limit and old[common] == new[common]:
                common += 1
        # Entries whose continuation position p >= common may have changed: they sit
        # at the tail of each position list, so pop them from the end.
        for p in range(len(old) - 1, common - 1, -1):
            for n in range(self.n_min, min(self.n_max, p) + 1):
                gram = tuple(old[p - n : p])
                positions = self.table.get(gram)
                if positions and positions[-1] == p:
                    positions.pop()
                    if not positions:
                        del self.table[gram]
        self.tokens = new
        for p in range(common, len(new)):
            self._add(p)
        return max(0, len(new) - common)

    def extend(self, more: Sequence[int]) -> None:
        """Append tokens (the generated continuation grows this way)."""
        if len(self.tokens) + len(more) > self.max_tokens:
            self.set_tokens(self.tokens + list(more))
            return
        start = len(self.tokens)
        self.tokens.extend(more)
        for p in range(start, len(self.tokens)):
            self._add(p)

    def _add(self, p: int) -> None:
        toks = self.tokens
        for n in range(self.n_min, min(self.n_max, p) + 1):
            self.table.setdefault(tuple(toks[p - n : p]), []).append(p)

    def positions(self, gram: tuple[int, ...], limit: int) -> list[int]:
        """The last `limit` positions following `gram` (most recent last)."""
        found = self.table.get(gram)
        if not found:
            return []
        return found[-limit:]


class RefNGramDrafter:
    """Prompt-lookup drafting over the context plus any number of named sources."""

    name = "ngram"

    HEAL_CACHE = 1 << 16  # token texts and re-encoded rests kept (cleared when full)

    def __init__(self, n_min: int = 2, n_max: int = 6, max_candidates: int = 64, max_tokens_per_source: int = 65536,
                 token_text: Callable[[int], str] | None = None, encode: Callable[[str], list[int]] | None = None,
                 heal_back: int = 2):
        self.n_min = n_min
        self.n_max = n_max
        self.max_candidates = max_candidates
        self.max_tokens_per_source = max_tokens_per_source
        # Healing needs both text functions (the model's tokenizer); None: ids only.
        self.token_text = token_text
        self.encode = encode
        self.heal_back = heal_back if token_text is not None and encode is not None else 0
        self._texts: dict[int, str | None] = {}  # token -> its text; None when it is not whole UTF-8
        self._encoded: dict[str, list[int]] = {}  # rest of a token's text -> its ids
        self._context = RefNGramIndex(n_min, n_max, max_tokens=1 << 30)
        # name -> (priority, index); lower priority is more trusted. The context is 0.
        self._sources: dict[str, tuple[int, RefNGramIndex]] = {}

    # -- sources -----------------------------------------------------------------

    def set_options(self, options) -> None:
        """Lookup does not depend on the decoding options (drafters/base.py, `Drafter`)."""
    def update_source(self, name: str, tokens: Sequence[int], priority: int = 1) -> None:
        """Add or update a named buffer (priority 1) or history (priority 2) source."""
        if name == CONTEXT:
            raise ValueError(f"{CONTEXT!r} is the live context, not a named source")
        entry = self._sources.get(name)
        if entry is None:
            index = RefNGramIndex(self.n_min, self.n_max, self.max_tokens_per_source)
            self._sources[name] = (priority, index)
        else:
            index = entry[1]
            self._sources[name] = (priority, index)
        index.set_tokens(tokens)

    def forget_source(self, name: str) -> None:
        self._sources.pop(name, None)

    def source_names(self) -> list[str]:
        return list(self._sources)

    def source_tokens(self, name: str) -> list[int]:
        return list(self._sources[name][1].tokens)

    # -- lookup ------------------------------------------------------------------
    def _sync_context(self, context: Sequence[int]) -> None:
        indexed = self._context.tokens
        n = len(indexed)
        if len(context) >= n and (n == 0 or (context[n - 1] == indexed[n - 1] and list(context[:n]) == indexed)):
            if len(context) > n:
                self._context.extend(context[n:])
        else:
            self._context.set_tokens(context)

    def _ordered_sources(self) -> list[tuple[int, str, RefNGramIndex]]:
        ordered = [(0, CONTEXT, self._context)]
        ordered += sorted(
            ((prio, name, idx) for name, (prio, idx) in self._sources.items()),
            key=lambda t: t[0],
        )
        return ordered

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        if k <= 0 or len(context) < self.n_min:
            return Proposal([], source="", match_len=0)
        self._sync_context(context)
        sources = self._ordered_sources()
        # 1. longest match first.
        n, cands = 0, []
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):
            cands = self._candidates(sources, tuple(context[len(context) - n :]))
            if cands:
                break
        else:
            n = 0
        healed = self._heal(sources, context, k, covered=n) if self.heal_back else None
        if healed is not None:
            return healed
        if not cands:
            return Proposal([], source="", match_len=0)
        draft, source, agreement = self._grow(cands, min(k, self.draft_limit(n)))
        return Proposal(draft, source=source, match_len=n, agreement=agreement)

    def _candidates(self, sources, gram: tuple[int, ...]) -> list:
        """(rank, -position, name, index, position) of every continuation of `gram`, in proximity
        order (rank = order of trust; then the later position first)."""
        cands = []
        for rank, (_, name, idx) in enumerate(sources):
            for p in idx.positions(gram, self.max_candidates):
                cands.append((rank, -p, name, idx, p))
        cands.sort(key=lambda c: (c[0], c[1]))
        return cands

    def _grow(self, cands: list, limit: int, first: Callable[[int], list[int]] | None = None):
        """2. Grow a draft from the candidates by the most frequent continuation; 3. ties by
        proximity. `first` maps the token chosen at the first step to the draft tokens that
        stand for it (a healed match: the rest of its text). (draft, source, agreement)."""
        draft: list[int] = []
        alive = cands
        agreement = None
        step = 0
        while len(draft) < limit:
            counts: Counter[int] = Counter()
            first_seen: dict[int, int] = {}
            for i, (_, _, _, idx, p) in enumerate(alive):
                if p + step < len(idx.tokens):
                    tok = idx.tokens[p + step]
                    counts[tok] += 1
                    first_seen.setdefault(tok, i)
            if not counts:
                break
            tok = min(counts, key=lambda t: (-counts[t], first_seen[t]))
            if step == 0:
                agreement = counts[tok] / sum(counts.values())
            more = first(tok) if step == 0 and first is not None else [tok]
            if not more:  # a rest that encodes to nothing: the tokens after it would not follow
                break
            draft.extend(more)
            alive = [c for c in alive if c[4] + step < len(c[3].tokens) and c[3].tokens[c[4] + step] == tok]
            step += 1
        return draft[:limit], (alive[0][2] if alive else cands[0][2]), agreement

    # -- healing: the cursor split a pre-token ---------------------------------------------
    def _text(self, tid: int) -> str | None:
        """A token's text (cached: token_text may be slow); None for a token that is not whole
        UTF-8 (a byte of a longer character decodes to U+FFFD): never healed across."""
        if tid not in self._texts:
            if len(self._texts) >= self.HEAL_CACHE:
                self._texts.clear()
            try:
                text = self.token_text(int(tid))
            except Exception:  # an id the tokenizer does not know (a test's made-up one)
                text = None
            self._texts[tid] = text if isinstance(text, str) and text and "\ufffd" not in text else None
        return self._texts[tid]

    def _rest_ids(self, rest: str) -> list[int]:
        ids = self._encoded.get(rest)
        if ids is None:
            if len(self._encoded) >= self.HEAL_CACHE:
                self._encoded.clear()
            ids = self._encoded[rest] = list(self.encode(rest))
        return ids

    def _heal(self, sources, context: Sequence[int], k: int, covered: int) -> Proposal | None:
        """The healed match, when one covers more of the context's end than the exact match
        (`covered` tokens, 0 for none); else None.

        For m = 1..heal_back: the last m tokens' text `typed`; the longest n-gram (n_min..n_max)
        ending just before them whose continuation token's text starts with `typed` and is
        longer. It covers n + m tokens of the context (the last m by their text). The longest
        cover wins, then the smaller m; it must beat the exact match's n. `match_len` is n, the
        tokens matched as ids; `healed` is m.
        """
        best = None
        typed = ""
        for m in range(1, min(self.heal_back, len(context) - self.n_min) + 1):
            text = self._text(context[-m])
            if text is None:
                break
            typed = text + typed
            for n in range(min(self.n_max, len(context) - m), self.n_min - 1, -1):
                if n + m <= covered or (best is not None and n + m <= best[0] + best[1]):
                    break
                end = len(context) - m
                cands = [c for c in self._candidates(sources, tuple(context[end - n : end]))
                         if self._extends(c[3].tokens[c[4]], typed)]
                if cands:
                    best = (n, m, typed, cands)
                    break
        if best is None:
            return None
        n, m, typed, cands = best
        draft, source, agreement = self._grow(
            cands, min(k, self.draft_limit(n)), first=lambda tok: self._rest_ids(self._text(tok)[len(typed) :]))
        if not draft:
            return None
        return Proposal(draft, source=source, match_len=n, agreement=agreement, healed=m)

    def _extends(self, tid: int, typed: str) -> bool:
        text = self._text(tid)
        return text is not None and len(text) > len(typed) and text.startswith(typed)

    def draft_limit(self, match_len: int) -> int:
        """Longest draft worth proposing after a match of `match_len` tokens."""
        return 2 * match_len - 1

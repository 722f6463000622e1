"""N-gram lookup drafting over the open buffers (docs/design.md, "Drafting").

Code repeats its identifiers, call shapes and boilerplate, so the next tokens are often
a copy of tokens that follow the same n-gram somewhere already seen: in the prompt, in
what has been generated so far, in another open buffer, or in a completion the user
accepted earlier.

Each source is an `NGramIndex`: for every position, the n-grams (n_min..n_max tokens)
that end just before it, in sorted numpy arrays (22 bytes a token; a lookup is one binary
search per three tokens of the gram). Choosing among matches is a fixed rule:

1. the longest n-gram (ending at the end of the context) that occurs anywhere wins;
2. the draft is then grown one token at a time, taking the continuation token that the
   most surviving match positions agree on (frequency);
3. ties go to proximity: the more trusted source first (context, then open buffers,
   then history), then the later position (in the context, nearer the cursor).

Draft length follows match length: a 2-gram match drafts at most 3 tokens, longer up to k.

**Healing** (docs/drafters.md, "Healed lookup"): where the cursor splits a pre-token, the
context's last tokens are a split that never occurs in the buffers (`return self.` ends
in `.`, while every earlier `self.width` holds the token `.width`), so no n-gram matches
exactly where ghost text is asked for. Given the tokenizer's `token_text` and `encode`,
the drafter then also matches the context without its last m tokens (m = 1..heal_back)
and keeps the positions whose continuation token's text strictly extends the text of
those m tokens; the draft starts with the re-encoded rest of that token's text. A
proposal is only a proposal: the engine verifies it, so healing changes speed, never
output. Without the two functions the drafter stays tokenizer-free.

Left out on purpose: torch, LSP and tokenizers (ints; text functions only when injected).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import numpy as np

from drafters.base import Proposal

CONTEXT = "context"


class NGramIndex:
    """One token stream; `positions(gram, limit)`: the last `limit` positions p < len(tokens), in
    ascending order, with tokens[p - len(gram):p] == gram (tokens[p] continues it). The last
    n-gram has no continuation and is not indexed: the context never matches itself past its end.

    Array-backed (issue 26: the dict of lists per n it replaced held 300-400 bytes a token;
    tests/support/ngram_reference.py keeps it, and tests/drafters/test_ngram_reference.py
    shows the two draft alike). Each position p is one entry sorted by its *reversed*
    context: the key of level j packs tokens[p-3j-1], [p-3j-2], [p-3j-3] (21 bits each, id
    + 1; 0 before the stream's start) into a uint64; entries are sorted by (level keys, p).
    The entries whose last n tokens equal a gram are then one contiguous run for every n,
    found level by level by binary search: exact (no hashing), 8 bytes per level plus 2-4
    for p and 4 for the token (22 bytes a token for n_max = 6). A 4 KB bitset of the bigrams
    present lets a lookup skip a stream that lacks the gram's last two tokens.

    Appends (the context grows by generated tokens) and changes near the end go to a dict
    `tail` of the positions >= `_main` (at most TAIL_MAX, kept as the old index kept all); a
    larger change rebuilds the arrays (a numpy sort, O(N log N); 65,536 tokens in ~15 ms).
    """

    TAIL_MAX = 256  # positions kept in the dict tail before the arrays are rebuilt
    BITS = 21  # bits per token in a key: ids below 2**21 - 1 (every vocabulary of code models fits)

    def __init__(self, n_min: int = 2, n_max: int = 6, max_tokens: int = 65536):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min = n_min
        self.n_max = n_max
        self.max_tokens = max_tokens
        self._levels = -(-n_max // 3)
        self._toks, self._n = np.zeros(16, np.int32), 0  # the stream is _toks[:_n] (appends double it)
        self._keys: list[np.ndarray] = [np.zeros(0, np.uint64) for _ in range(self._levels)]
        self._pos = np.zeros(0, np.uint16)
        self._built = self._main = 0  # arrays built at len _built: positions 1.._built-1, valid below _main
        self._bigrams: bytes | None = None  # bitset of the arrays' last two tokens (None: no filter)
        self._tail: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return self._n

    @property
    def tokens(self) -> list[int]:
        return self._toks[: self._n].tolist()

    def token_at(self, p: int) -> int:
        return int(self._toks[p])

    def continuation(self, p: int, limit: int) -> list[int]:
        """tokens[p:p + limit]."""
        return self._toks[p : min(self._n, p + limit)].tolist()

    def nbytes(self) -> int:
        """Memory held, in bytes (the arrays; the tail's dict estimated)."""
        arrays = self._toks.nbytes + self._pos.nbytes + sum(k.nbytes for k in self._keys)
        arrays += 0 if self._bigrams is None else len(self._bigrams)
        return arrays + 160 * sum(len(v) for v in self._tail.values())

    def set_tokens(self, new: Sequence[int]) -> int:
        """Make the index describe `new` (its last max_tokens tokens); returns how many positions
        were re-indexed: the part after the common prefix with the old stream (into the tail
        while that is small; a larger change rebuilds the arrays)."""
        arr = np.asarray(new, dtype=np.int64).reshape(-1)[-self.max_tokens :]
        _check_ids(arr, self.BITS)
        old = self._toks[: self._n]
        limit = min(len(old), len(arr))
        diff = np.flatnonzero(old[:limit] != arr[:limit])
        common = int(diff[0]) if len(diff) else limit
        self._store(arr)
        self._main = min(self._main, common)
        self._drop_tail(common)
        if self._n - self._main > self.TAIL_MAX or self._built - self._main > max(self.TAIL_MAX, self._built // 4):
            self._build()  # (stale entries past a truncation are dropped here too)
        else:
            for p in range(common, self._n):
                self._add(p)
        return max(0, len(arr) - common)

    def extend(self, more: Sequence[int]) -> None:
        """Append tokens (the generated continuation grows this way)."""
        if self._n + len(more) > self.max_tokens:
            self.set_tokens(np.concatenate([self._toks[: self._n], np.asarray(more, np.int64)]))
            return
        arr = np.asarray(more, dtype=np.int64).reshape(-1)
        _check_ids(arr, self.BITS)
        start = self._n
        self._reserve(start + len(arr))
        self._toks[start : start + len(arr)] = arr
        self._n += len(arr)
        if self._n - self._main > self.TAIL_MAX:
            return self._build()
        for p in range(start, self._n):
            self._add(p)

    def compact(self) -> None:
        """Fold the tail into the arrays (the open buffers do it when they are idle)."""
        if self._tail or self._built != self._n or self._main != self._n:
            self._build()

    def _reserve(self, n: int) -> None:  # room for n tokens: doubling for appends
        if n > len(self._toks):
            self._toks = np.concatenate([self._toks[: self._n], np.zeros(max(n, 2 * len(self._toks)) - self._n, np.int32)])

    def _store(self, arr: np.ndarray) -> None:  # a new stream, in an array that fits it (buffers keep no slack)
        if len(arr) > len(self._toks) or len(self._toks) > 2 * len(arr) + 64:
            self._toks = np.zeros(len(arr) + 16, np.int32)
        self._toks[: len(arr)] = arr
        self._n = len(arr)

    def _add(self, p: int) -> None:
        lo = max(0, p - self.n_max)
        window = self._toks[lo:p].tolist()
        for n in range(self.n_min, min(self.n_max, p) + 1):
            self._tail.setdefault(tuple(window[len(window) - n :]), []).append(p)

    def _drop_tail(self, common: int) -> None:
        for gram in list(self._tail):
            positions = self._tail[gram]
            while positions and positions[-1] >= common:
                positions.pop()
            if not positions:
                del self._tail[gram]

    def _build(self) -> None:
        n = self._n
        self._tail = {}
        self._built = self._main = n
        pos = np.arange(1, max(n, 1), dtype=np.int64)
        t = self._toks[:n].astype(np.uint64) + np.uint64(1)
        keys = []
        for level in range(self._levels):
            key = np.zeros(len(pos), np.uint64)
            for j in range(3):
                d = 3 * level + j + 1  # key token j of this level is tokens[p - d]
                if d > self.n_max:
                    break
                col = np.zeros(len(pos), np.uint64)
                col[d - 1 :] = t[: max(0, n - d)]  # positions p >= d (pos[i] = i + 1)
                key |= col << np.uint64(self.BITS * (2 - j))
            keys.append(key)
        order = np.lexsort((pos, *reversed(keys)))
        self._keys, self._bigrams = [k[order] for k in keys], None
        self._pos = pos[order].astype(np.uint16 if n <= 1 << 16 else np.uint32)
        if self.n_min >= 2 and len(pos) > 64:
            h = _bigram_slots(self._keys[0] >> np.uint64(self.BITS))
            bits = np.zeros((1 << _BIGRAM_BITS) // 8, np.uint8)
            np.bitwise_or.at(bits, h >> 3, (np.uint8(1) << (h & 7).astype(np.uint8)))
            self._bigrams = bits.tobytes()

    def runs(self, query: "Query | Sequence[int]") -> dict[int, tuple[int, int]]:
        """n -> [lo, hi) of the array entries whose last n tokens are the query suffix's last n,
        for n up to min(len(suffix), n_max); it stops at the first n without entries (no longer
        gram can match then). At most one binary search per key level. The tail is not included."""
        if not isinstance(query, Query):
            query = Query(query, self.n_min, self.n_max, self.BITS)
        out: dict[int, tuple[int, int]] = {}
        if self._main == 0 or not len(self._pos) or not query.levels:
            return out
        slot, bits = query.slot, self._bigrams
        if slot is not None and bits is not None and not bits[slot >> 3] >> (slot & 7) & 1:
            return out
        lo, hi = 0, len(self._pos)
        for level, ns, values in query.levels:
            found = self._keys[level][lo:hi].searchsorted(values).tolist()
            for i, n in enumerate(ns):
                a, b = lo + found[2 * i], lo + found[2 * i + 1]
                if a >= b:
                    return out
                out[n] = (a, b)
            lo, hi = out[ns[-1]]
        return out

    def positions(self, gram: tuple[int, ...], limit: int) -> list[int]:  # (see the class docstring)
        return self.positions_in(self.runs(gram).get(len(gram)), gram, limit)

    def positions_in(self, run: tuple[int, int] | None, gram: tuple[int, ...], limit: int) -> list[int]:
        """positions(gram, limit), given the arrays' run of `gram` (from runs(); None: no entries)."""
        found: list[int] = []
        if run is not None:  # the arrays' part: every position of the run, less stale ones, the last `limit`
            sel = self._pos[run[0] : run[1]]
            if self._main < self._built:
                sel = sel[sel < self._main]
            if len(sel) > limit:
                sel = np.partition(sel, len(sel) - limit)[len(sel) - limit :]
            found = np.sort(sel).tolist()
        more = self._tail.get(gram)
        if more:
            found = found + more
        return found[-limit:]

    @property
    def table(self) -> dict[tuple[int, ...], list[int]]:
        """gram -> ascending positions, decoded from the arrays' keys and the tail (for tests)."""
        out: dict[tuple[int, ...], list[int]] = {}
        rows = list(zip(self._pos.tolist(), *(k.tolist() for k in self._keys)))
        for p, *keys in (r for r in rows if r[0] < self._main):
            rev = [(k >> (self.BITS * (2 - j))) & ((1 << self.BITS) - 1) for k in keys for j in range(3)]
            for n in (n for n in range(self.n_min, self.n_max + 1) if all(rev[:n])):
                out.setdefault(tuple(t - 1 for t in reversed(rev[:n])), []).append(p)
        for gram, ps in self._tail.items():
            out.setdefault(gram, []).extend(ps)
        return {g: sorted(ps) for g, ps in out.items()}


class Query:
    """The binary searches of every gram ending a suffix, prepared once and asked of every index
    (NGramIndex.runs): per key level, the n it settles and the key bounds of each."""

    __slots__ = ("levels", "slot")

    def __init__(self, suffix: Sequence[int], n_min: int, n_max: int, bits: int = NGramIndex.BITS):
        top = min(len(suffix), n_max)
        rev = [int(t) for t in suffix[len(suffix) - top :]][::-1]
        for i, tok in enumerate(rev):
            if not 0 <= tok < (1 << bits) - 1:  # an id no index holds: no gram through it matches
                top = i
                break
        self.levels: list[tuple[int, list[int], np.ndarray]] = []
        first = min(n_min, 3)  # level 0 narrows from its bigram (or 3-gram) for the levels below
        for level in range((top + 2) // 3):
            ns = list(range(max(first, 3 * level + 1), min(top, 3 * level + 3) + 1))
            values, base = [], sum((rev[i] + 1) << (bits * (2 - i + 3 * level)) for i in range(3 * level, (ns or [0])[0] - 1))
            for n in ns:  # the key of the gram's tokens 3 * level .. n - 1, one token more each n
                base += (rev[n - 1] + 1) << (bits * (2 - (n - 1 - 3 * level)))
                values += [base, base + (1 << (bits * (3 * level + 3 - n)))]
            if ns:
                self.levels.append((level, ns, np.array(values, np.uint64)))
        # The bigram filter's bit (indexes built with n_min >= 2 keep the filter).
        self.slot = _bigram_slot(((rev[0] + 1) << bits) | (rev[1] + 1)) if top >= 2 and n_min >= 2 else None


def _check_ids(arr: np.ndarray, bits: int) -> None:
    if len(arr) and (int(arr.min()) < 0 or int(arr.max()) >= (1 << bits) - 1):
        raise ValueError(f"token ids must be in [0, {(1 << bits) - 1}), got {int(arr.min())}..{int(arr.max())}")


_BIGRAM_BITS = 15  # the bigram filter: 2**15 bits (4 KB) per index


def _bigram_slot(packed: int) -> int:
    """The filter's bit for a packed bigram ((t[p-1] + 1) << 21 | (t[p-2] + 1)); as _bigram_slots."""
    return ((packed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> (64 - _BIGRAM_BITS)


def _bigram_slots(packed: np.ndarray) -> np.ndarray:  # noqa: D103 (the same for an array)
    return ((packed.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - _BIGRAM_BITS)).astype(np.int64)


class NGramDrafter:
    """Prompt-lookup drafting over the context plus any number of named sources."""

    name = "ngram"

    HEAL_CACHE = 1 << 16  # token texts and re-encoded rests kept (cleared when full)

    def __init__(self, n_min: int = 2, n_max: int = 6, max_candidates: int = 64, max_tokens_per_source: int = 65536,
                 token_text: Callable[[int], str] | None = None, encode: Callable[[str], list[int]] | None = None,
                 heal_back: int = 2):
        self.n_min, self.n_max = n_min, n_max  # the n-gram lengths matched, longest first
        self.max_candidates, self.max_tokens_per_source = max_candidates, max_tokens_per_source
        # Healing needs both text functions (the model's tokenizer); None: ids only.
        self.token_text = token_text
        self.encode = encode
        self.heal_back = heal_back if token_text is not None and encode is not None else 0
        self._texts: dict[int, str | None] = {}  # token -> its text; None when it is not whole UTF-8
        self._encoded: dict[str, list[int]] = {}  # rest of a token's text -> its ids
        self._context = NGramIndex(n_min, n_max, max_tokens=1 << 30)
        self._context_tokens: list[int] = []  # what _context holds, as a list (compared at every proposal)
        # name -> (priority, index); lower priority is more trusted. The context is 0.
        self._sources: dict[str, tuple[int, NGramIndex]] = {}
        self._runs: dict = {}  # per proposal: end -> Query; (rank, end) -> that source's runs there

    # -- sources -----------------------------------------------------------------

    def set_options(self, options) -> None:
        """Lookup does not depend on the decoding options (drafters/base.py, `Drafter`)."""

    def update_source(self, name: str, tokens: Sequence[int], priority: int = 1) -> None:
        """Add or update a named buffer (priority 1) or history (priority 2) source."""
        if name == CONTEXT:
            raise ValueError(f"{CONTEXT!r} is the live context, not a named source")
        entry = self._sources.get(name)
        index = entry[1] if entry is not None else NGramIndex(self.n_min, self.n_max, self.max_tokens_per_source)
        self._sources[name] = (priority, index)
        index.set_tokens(tokens)

    def forget_source(self, name: str) -> None:
        self._sources.pop(name, None)

    def source_names(self) -> list[str]:
        return list(self._sources)

    def source_tokens(self, name: str) -> list[int]:
        return self._sources[name][1].tokens

    def set_source_index(self, name: str, index: NGramIndex, priority: int = 1) -> None:
        """Install an index built elsewhere (lsp_server/completion/buffers.py builds them off the request path)."""
        if name == CONTEXT:
            raise ValueError(f"{CONTEXT!r} is the live context, not a named source")
        self._sources[name] = (priority, index)

    # -- lookup ------------------------------------------------------------------
    def _sync_context(self, context: Sequence[int]) -> None:
        indexed = self._context_tokens
        n = len(indexed)
        if len(context) >= n and (n == 0 or (context[n - 1] == indexed[n - 1] and list(context[:n]) == indexed)):
            if len(context) > n:
                more = list(context[n:])
                self._context.extend(more)
                indexed.extend(more)
        else:
            self._context.set_tokens(context)
            self._context_tokens = list(context)

    def _ordered_sources(self) -> list[tuple[int, str, NGramIndex]]:
        by_trust = sorted(((prio, name, idx) for name, (prio, idx) in self._sources.items()), key=lambda t: t[0])
        return [(0, CONTEXT, self._context), *by_trust]

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        if k <= 0 or len(context) < self.n_min:
            return Proposal([], source="", match_len=0)
        self._sync_context(context)
        sources = self._ordered_sources()
        self._runs = {}
        # 1. longest match first.
        n, cands = 0, []
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):
            cands = self._candidates(sources, context, len(context), n)
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

    def _candidates(self, sources, context: Sequence[int], end: int, n: int) -> list:
        """(rank, -position, name, index, position) of every continuation of the n-gram ending at
        `end` of the context, in proximity order (rank = order of trust; then the later position
        first). A source narrows its runs for all n ending there once per proposal."""
        cands = []
        gram = tuple(context[end - n : end])
        query = self._runs.get(end)
        if query is None:
            query = self._runs[end] = Query(context[max(0, end - self.n_max) : end], self.n_min, self.n_max)
        for rank, (_, name, idx) in enumerate(sources):
            runs = self._runs.get((rank, end))
            if runs is None:
                runs = self._runs[rank, end] = idx.runs(query)
            for p in idx.positions_in(runs.get(n), gram, self.max_candidates):
                cands.append((rank, -p, name, idx, p))
        cands.sort(key=lambda c: (c[0], c[1]))
        return cands

    def _grow(self, cands: list, limit: int, first: Callable[[int], list[int]] | None = None):
        """2. Grow a draft from the candidates by the most frequent continuation; 3. ties by
        proximity. `first` maps the token chosen at the first step to the draft tokens that
        stand for it (a healed match: the rest of its text). (draft, source, agreement)."""
        draft: list[int] = []
        # Each candidate's continuation, read once: a step never goes past `limit` tokens.
        conts = [idx.continuation(p, limit) for (_, _, _, idx, p) in cands]
        alive = list(range(len(cands)))
        agreement = None
        step = 0
        while len(draft) < limit:
            counts: Counter[int] = Counter()
            first_seen: dict[int, int] = {}
            for i, c in enumerate(alive):
                cont = conts[c]
                if step < len(cont):
                    tok = cont[step]
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
            alive = [c for c in alive if step < len(conts[c]) and conts[c][step] == tok]
            step += 1
        alive = [cands[c] for c in alive]
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
                cands = [c for c in self._candidates(sources, context, len(context) - m, n)
                         if self._extends(c[3].token_at(c[4]), typed)]
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

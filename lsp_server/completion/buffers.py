"""The open buffers the n-gram drafter copies from: their text, their tokens and the drafter's
index of them, within a memory budget (issue 26; the Completer's `set_buffer`, `forget_buffer`,
`accepted` and `history` delegate here).

- Tokens per block. A buffer's text is cut into blocks of about BLOCK_CHARS after line breaks
  between non-blank characters where it can (byte-level BPE pre-tokenizers such as Qwen's and
  GPT-2's never join the pieces on either side, so the blocks' tokens are those of the whole
  text; `block_starts`), and each block is tokenized on its own. An edit re-tokenizes only the blocks it touched: the
  common prefix and suffix of the old and new text are found by comparing slices, the blocks
  wholly inside them keep their tokens, and the index is updated from the first changed token
  (drafters/ngram.py). A text longer than `max_chars` is indexed as its head and tail (whole
  lines, `max_chars` in all), so an edit in the middle of a 5 MB file costs a compare of those.
- Off the request path. With `defer` (the server sets it), `set` only records the text; the
  work is done by `step()`, one slice at a time (at most SLICE_CHARS tokenized, or one index
  build), which the server's worker runs as idle work (lsp_server/lsp/idle.py): a request waits
  for at most one slice. Without `defer` (the command line, the benchmark) `set` indexes at
  once, as before.
- A memory budget. The index, tokens and block tables of the buffers together stay within
  `budget` bytes (the `index_memory_mb` setting): least recently used buffers beyond it are
  dropped from the index (their text is kept) and indexed again when they are edited or
  visited (`visit`, a request in them). The most recently used are indexed first.
- History: completions the user accepted, one source (priority 2) of at most `history_tokens`.

Left out on purpose: LSP (documents and their versions are lsp_server/lsp/documents.py's),
threads (every method runs on the caller's thread: the server's worker), the prompt.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from typing import Callable

import numpy as np

from drafters.ngram import NGramDrafter, NGramIndex

HISTORY = "history"  # the n-gram source of accepted completions (priority 2)
DEFAULT_BUDGET_MB = 64  # laptop-friendly: ~2.5M tokens of index (26 bytes a token)
BLOCK_CHARS = 4096  # a block is tokenized on its own
SLICE_CHARS = 16384  # tokenized per step at most, then one more block (tens of milliseconds on one core)
# Where byte-level pre-tokenizers (Qwen's, GPT-2's) never join the pieces on either side: after a
# line break between two non-blanks. Else after a line break before a non-break (safe for Qwen's).
_SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)")
_LINE_CUT = re.compile(r"\n(?=[^\r\n])")


class _Buffer:
    __slots__ = ("text", "region", "cuts", "tok_cuts", "tokens", "index", "wip", "state", "nbytes", "done")

    def __init__(self, text: str):
        self.text = text
        self.state = "pending"  # pending (to index) | indexed | evicted (over budget: waits for a visit)
        self.wip: dict | None = None  # an update under way (tokenized in slices)
        self.done: dict[str, np.ndarray] = {}  # block text -> tokens, of an update under way (kept if it restarts)
        self.nbytes = 0
        self.clear()

    def clear(self, keep_done: bool = False) -> None:
        """Drop everything but the text (and, with keep_done, the blocks an update under way tokenized)."""
        self.region = ""  # the indexed text (the text, or its head and tail)
        self.cuts = np.zeros(1, np.int64)  # block starts in region, then len(region)
        self.tok_cuts = np.zeros(1, np.int64)  # the same in tokens
        self.tokens = np.zeros(0, np.int32)
        self.index: NGramIndex | None = None
        self.wip = None
        self.done = self.done if keep_done else {}
        self.nbytes = 0


class OpenBuffers:
    """The open buffers (by name) and the n-gram drafter's sources made of them."""

    def __init__(self, encode: Callable[[str], list[int]], ngram: NGramDrafter, *, enabled: bool = True,
                 max_chars: int = 262144, budget: int = DEFAULT_BUDGET_MB << 20,
                 wanted: Callable[[], bool] | None = None):
        self.encode = encode
        self.ngram = ngram
        self._enabled = enabled  # False: a model that generates elsewhere (no drafting): texts only
        # Asked before any indexing work: False while no drafter would consult the index (the
        # Completer's `index_wanted`: drafting off, or no draft could pay on the pass costs).
        # The texts are still recorded; the buffers wait as pending until it says True.
        self.wanted = wanted
        self.was_wanted = enabled  # what `enabled` said last (stats read it from another thread)
        self.max_chars = max_chars
        self.budget = budget  # bytes
        self.defer = False  # True: `set` records only; `step()` does the work (the server's idle work)
        self._buffers: OrderedDict[str, _Buffer] = OrderedDict()  # least recently used first
        self._history: list[list[int]] = []
        self.counts = {"steps": 0, "indexings": 0, "evictions": 0, "tokenized_chars": 0, "max_step_ms": 0.0}

    @property
    def enabled(self) -> bool:
        """Whether indexing work runs now (on the caller's thread: the server's worker)."""
        self.was_wanted = self._enabled and (self.wanted is None or bool(self.wanted()))
        return self.was_wanted

    # -- the buffers ---------------------------------------------------------------------------------
    def set(self, name: str, text: str) -> None:
        """The buffer's text is now `text` (opened or edited): it is the most recently used."""
        b = self._buffers.get(name)
        if b is None:
            b = self._buffers[name] = _Buffer(text)
        else:
            self._buffers.move_to_end(name)
            if b.text is not text:
                b.text = text  # an update under way goes on if what it indexes did not change (_work)
                if b.state == "indexed":
                    b.state = "pending"
            if b.state == "evicted":
                b.state = "pending"
        if self.enabled and not self.defer:
            while b.state == "pending":
                self._work(name, b)

    def visit(self, name: str) -> None:
        """A request in this buffer: most recently used; indexed again if it was dropped."""
        b = self._buffers.get(name)
        if b is not None:
            self._buffers.move_to_end(name)
            if b.state == "evicted":
                b.state = "pending"

    def forget(self, name: str) -> None:
        self._buffers.pop(name, None)
        self.ngram.forget_source(name)

    def names(self) -> list[str]:
        return list(self._buffers)

    def tokens(self, name: str) -> list[int]:
        """The indexed tokens of a buffer ([] when not indexed)."""
        b = self._buffers.get(name)
        return [] if b is None else b.tokens.tolist()

    # -- work off the request path -------------------------------------------------------------------
    def pending(self) -> int:
        return sum(b.state == "pending" for b in self._buffers.values()) if self.enabled else 0

    def step(self) -> bool:
        """One slice of indexing work (the most recently used pending buffer first); False when
        there is nothing to do."""
        if not self.enabled:
            return False
        for name in reversed(self._buffers):
            b = self._buffers[name]
            if b.state == "pending":
                t0 = time.perf_counter()
                self._work(name, b)
                c = self.counts
                c["steps"] += 1
                c["max_step_ms"] = max(c["max_step_ms"], round((time.perf_counter() - t0) * 1000, 1))
                return True
        return False

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    def set_budget(self, budget: int) -> None:
        """A new budget in bytes (the setting changed); a smaller one drops buffers now."""
        if budget != self.budget:
            self.budget = budget
            self._evict(None)

    def stats(self) -> dict:
        """Counts for `ditto/stats` (read from another thread: one atomic copy of the buffers first)."""
        bufs = list(self._buffers.values())
        states = [b.state for b in bufs]
        return {"wanted": self.was_wanted, "buffers": len(states), "indexed": states.count("indexed"), "pending": states.count("pending"),
                "evicted": states.count("evicted"), "bytes": sum(b.nbytes for b in bufs), "budget_bytes": self.budget,
                "tokens": sum(len(b.tokens) for b in bufs), **self.counts}

    def _work(self, name: str, b: _Buffer) -> None:
        """Advance the buffer's update by one slice; the last slice installs the new index."""
        if b.wip is not None and b.wip["region"] != region_of(b.text, self.max_chars):
            b.wip = None  # the text changed where it is indexed: plan again (blocks tokenized stay in b.done)
        if b.wip is None:
            b.wip = self._plan(b)
            if b.wip is None:  # the indexed region did not change
                b.state, b.done = "indexed", {}
                return
        w = b.wip
        region, starts, done = w["region"], w["starts"], w["done"]
        chars = 0
        while len(done) < len(starts) - 1 and chars < SLICE_CHARS:
            a, z = starts[len(done)], starts[len(done) + 1]
            block = region[a:z]
            ids = b.done.get(block)
            if ids is None:
                ids = b.done[block] = np.asarray(self.encode(block) if block else [], np.int32)
                chars += len(block)
            done.append(ids)
        self.counts["tokenized_chars"] += chars
        if len(done) < len(starts) - 1:
            return  # more slices to come
        self._finish(name, b, w)

    def _plan(self, b: _Buffer) -> dict | None:
        """What to tokenize to bring the buffer to its text: the blocks the change touched."""
        region = region_of(b.text, self.max_chars)
        old = b.region
        if b.index is not None and (region is old or region == old):
            return None
        if b.index is None:
            old = ""
            b.clear(keep_done=True)
        d = _common_prefix(old, region)
        s = _common_suffix(old, region, min(len(old), len(region)) - d)
        cuts = b.cuts
        nblocks = len(cuts) - 1
        keep_a = max(0, int(np.searchsorted(cuts, d, "left")) - 1)  # blocks ending before d
        keep_b = int(np.searchsorted(cuts[:-1], len(old) - s, "right")) if nblocks else 0  # starting inside the suffix
        keep_b = max(keep_b, keep_a)
        delta = len(region) - len(old)
        a = int(cuts[keep_a]) if keep_a < len(cuts) else 0
        z = int(cuts[keep_b]) + delta if keep_b < nblocks else len(region)
        return {"region": region, "keep_a": keep_a, "keep_b": keep_b, "delta": delta,
                "starts": block_starts(region, a, z) if z > a else [a], "done": []}

    def _finish(self, name: str, b: _Buffer, w: dict) -> None:
        ka, kb, delta = w["keep_a"], w["keep_b"], w["delta"]
        middle = w["done"]
        lens = np.array([len(m) for m in middle], np.int64)
        tok_a = int(b.tok_cuts[ka]) if ka < len(b.tok_cuts) else 0
        tok_b = int(b.tok_cuts[kb]) if kb < len(b.cuts) - 1 else len(b.tokens)
        tokens = np.concatenate([b.tokens[:tok_a], *middle, b.tokens[tok_b:]]).astype(np.int32)
        tok_delta = len(tokens) - len(b.tokens)
        nblocks = len(b.cuts) - 1
        b.cuts = np.concatenate([b.cuts[:ka], np.asarray(w["starts"][:-1], np.int64),
                                 b.cuts[kb:nblocks] + delta, [len(w["region"])]])
        b.tok_cuts = np.concatenate([b.tok_cuts[:ka], tok_a + np.concatenate([[0], np.cumsum(lens)])[:-1],
                                     b.tok_cuts[kb:nblocks] + tok_delta, [len(tokens)]])
        b.tokens, b.region, b.wip, b.done = tokens, w["region"], None, {}
        if b.index is None:
            b.index = NGramIndex(self.ngram.n_min, self.ngram.n_max, self.ngram.max_tokens_per_source)
        b.index.set_tokens(tokens)  # from the first changed token on
        self.ngram.set_source_index(name, b.index)
        b.state = "indexed"
        copy = 0 if b.region is b.text else len(b.region) * (4 if not b.region.isascii() else 1)
        b.nbytes = b.index.nbytes() + tokens.nbytes + b.cuts.nbytes + b.tok_cuts.nbytes + copy
        self.counts["indexings"] += 1
        self._evict(name)

    def _evict(self, last: str | None) -> None:
        """Least recently used buffers out of the index until the rest fits the budget. When the
        one just indexed goes too, the pending ones used before it would as well: they wait."""
        total = self.nbytes()
        evicted_last = False
        for name in list(self._buffers):
            if total <= self.budget:
                break
            b = self._buffers[name]
            if b.state == "indexed":
                total -= b.nbytes
                b.clear()
                b.state = "evicted"
                self.ngram.forget_source(name)
                self.counts["evictions"] += 1
                evicted_last |= name == last
        if evicted_last:
            for name in self._buffers:
                if name == last:
                    break
                if self._buffers[name].state == "pending":
                    self._buffers[name].state = "evicted"

    # -- history: completions the user accepted ----------------------------------------------------------
    def accept(self, ids: list[int], limit: int) -> None:
        """Remember an accepted completion's tokens; the oldest go beyond `limit` tokens."""
        if not ids:
            return
        self._history.append(ids)
        while len(self._history) > 1 and sum(map(len, self._history)) > limit:
            self._history.pop(0)
        joined = [t for entry in self._history for t in entry][-limit:]
        self.ngram.update_source(HISTORY, joined, priority=2)

    def history(self) -> list[list[int]]:
        return list(self._history)


def region_of(text: str, limit: int) -> str:
    """What is indexed of `text`: all of it, or its first and last whole lines, `limit` characters at most."""
    if len(text) <= limit:
        return text
    half = limit // 2
    head = text.rfind("\n", 0, half) + 1 or half
    tail = text.find("\n", len(text) - half) + 1 or len(text) - half
    return text[:head] + text[max(tail, head) :]


def block_starts(text: str, a: int, z: int, size: int = BLOCK_CHARS) -> list[int]:
    """Block starts in text[a:z], then z: a cut near every `size` characters, after a line break
    between non-blanks (_SAFE_CUT), else before a line (_LINE_CUT), else a blank, else anywhere."""
    starts = [a]
    pos = a
    while z - pos > size:
        lo, hi = pos + size, min(z, pos + 4 * size)
        end = min(len(text), hi + 1)  # the lookahead sees one character more
        m = _SAFE_CUT.search(text, lo, end)
        if m is None and hi == z:
            break  # the rest is one block (at most 4 * size)
        m = m or _LINE_CUT.search(text, lo, end)
        cut = m.end() if m else (text.find(" ", lo, hi) + 1 or hi)
        if cut >= z:
            break
        starts.append(cut)
        pos = cut
    starts.append(z)
    return starts


def _common_prefix(a: str, b: str) -> int:
    """The length of the common prefix of a and b."""
    return _agreeing(lambda i, j: a[i:j] == b[i:j], min(len(a), len(b)))


def _common_suffix(a: str, b: str, limit: int) -> int:
    """The length of the common suffix of a and b, at most `limit`."""
    la, lb = len(a), len(b)
    return _agreeing(lambda i, j: a[la - j : la - i] == b[lb - j : lb - i], limit)


def _agreeing(same: Callable[[int, int], bool], n: int) -> int:
    """The length (at most n) of the run from offset 0 on which `same(i, j)` (offsets i..j agree) holds:
    blocks of 1K doubling to 64K characters compared at memory speed, then bisection in the first
    block that differs."""
    i, step = 0, 1024
    while i < n:
        j = min(n, i + step)
        if not same(i, j):
            lo, hi = i, j  # agree on [0, lo), not on [0, hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if same(lo, mid):
                    lo = mid
                else:
                    hi = mid
            return lo
        i, step = j, min(step * 2, 1 << 16)
    return n

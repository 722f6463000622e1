"""A file's prefix KV: one cache per open file that requests copy their start from (issue 40).

In prefix-suffix-middle order the prompt's prefix at any place of a file is a prefix of one
sequence, the file from its top (docs/design.md, "The whole file above the cursor"). A `PrefixKV`
holds the KV of that sequence as far as it was filled; `fill` extends it in the engine's whole
blocks (keeping the common prefix, so an edit costs the tokens from the first changed one on), and
`seed` starts a request's cache (the engine's per-key cache) from a copy of it, so the request
prefills only what is new. The copy covers whole blocks only (the backend's `reusable`), so what
follows is computed in the passes a fresh prefill runs: the tokens are those of a fresh prefill.

`PrefixPool` bounds them: tokens and MB over all files, the least recently used file's KV released
first. It holds them weakly: a `PrefixKV` belongs to its file's state (lsp_server/completion/files.py),
and goes with it when the file closes.

Left out on purpose: which tokens the sequence holds (lsp_server/completion/wholefile.py), when to
fill (lsp_server/lsp/idle.py), LSP.
"""

from __future__ import annotations

import threading
import weakref
from typing import Sequence

from lsp_server.decoding.types import Cancelled, DecodeOptions, RequestContext, Stats


class PrefixKV:
    """The KV of a file's sequence as far as it was filled (`ids`); `cache` is the backend's."""

    __slots__ = ("ids", "cache", "__weakref__")

    def __init__(self):
        self.ids: list[int] = []
        self.cache = None  # made on first fill


def common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class PrefixPool:
    """The bound over every file's prefix KV (module docstring)."""

    def __init__(self, lm, max_tokens: int = 16384, max_mb: float = 256.0):
        self.lm = lm
        self.max_tokens = max_tokens
        self.max_mb = max_mb
        self._kvs: dict[int, weakref.ref] = {}  # id -> PrefixKV, least recently used first
        self.evicted = 0  # files whose KV was released to stay within the bound

    def live(self) -> list[PrefixKV]:
        out = []
        for k, ref in list(self._kvs.items()):
            kv = ref()
            if kv is None:
                del self._kvs[k]
            else:
                out.append(kv)
        return out

    def tokens(self) -> int:
        return sum(len(kv.ids) for kv in self.live())

    def mb(self) -> float:
        return self.tokens() * self.lm.kv_bytes_per_token / 2**20

    def used(self, kv: PrefixKV) -> None:
        """`kv` was used now (filled or copied from): the last to be evicted."""
        self._kvs.pop(id(kv), None)
        self._kvs[id(kv)] = weakref.ref(kv)

    def room(self, kv: PrefixKV, tokens: int) -> int:
        """Make room for `kv` to hold `tokens` (releasing the least recently used others); the tokens it may hold."""
        self.used(kv)
        per = self.lm.kv_bytes_per_token / 2**20
        cap = self.max_tokens if per <= 0 else min(self.max_tokens, int(self.max_mb / per))
        others = [o for o in self.live() if o is not kv]
        while others and sum(len(o.ids) for o in others) + tokens > cap:
            self.release(others.pop(0))
            self.evicted += 1
        return max(0, min(tokens, cap - sum(len(o.ids) for o in others)))

    def release(self, kv: PrefixKV) -> None:
        if kv.cache is not None:
            self.lm.release(kv.cache)
        kv.cache, kv.ids = None, []

    def stats(self) -> dict:
        return {"files": len(self.live()), "tokens": self.tokens(), "mb": round(self.mb(), 1),
                "max_tokens": self.max_tokens, "max_mb": self.max_mb, "evicted": self.evicted}


def fill(engine, pool: PrefixPool, kv: PrefixKV, ids: Sequence[int], *, cancel: threading.Event | None = None,
         chunk: int = 32, ctx: RequestContext | None = None) -> Stats:
    """Make `kv` hold `ids` (as far as the pool allows): the common prefix kept in whole blocks, the rest
    prefilled in chunks of `chunk`, a set `cancel` checked between them (stop_reason "cancelled")."""
    stats = Stats()
    n = pool.room(kv, len(ids))
    if n < 2:
        return stats
    with engine.lock:
        if kv.cache is None:
            kv.cache = engine.lm.new_cache()
        try:
            engine.prefill(kv, [*ids[:n], 0], DecodeOptions(prefill_chunk=max(1, chunk)), stats, cancel, ctx)
        except Cancelled:
            stats.stop_reason = "cancelled"
        except BaseException:  # a failed pass may leave the cache half-written: never reused
            pool.release(kv)
            raise
    return stats


def seed(engine, key: str, kv: PrefixKV, prompt: Sequence[int], pool: PrefixPool | None = None) -> int:
    """Start the cache of `key` from a copy of `kv` where that keeps more of `prompt` than the cache of
    `key` does; the tokens copied (whole blocks), 0 when none."""
    want = list(prompt[:-1])
    with engine.lock:
        if kv.cache is None:
            return 0
        n = engine.lm.reusable(kv.cache, common(kv.ids, want), len(want))
        if n <= common(engine.cached_ids(key), want):
            return 0
        engine.adopt(key, kv.ids[:n], engine.lm.clone(kv.cache, n))
    if pool is not None:
        pool.used(kv)
    return n

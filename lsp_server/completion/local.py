"""`EngineGenerator`: Ditto's own engine (lsp_server/decoding/engine.py) as the Completer's generation
step (the `Generator` of lsp_server/backends/base.py).

It drafts (the drafters of drafters/), takes token healing's mask, and keeps each document's KV
cache in this process, so it can prefill a prompt ahead (`warm`), pause a generation at a
deadline and resume it. A remote engine's generator can do none of that
(lsp_server/backends/remote/generator.py); the Completer asks, never checks which it has.
Left out on purpose: prompts and stop rules (lsp_server/completion/).
"""

from __future__ import annotations

import threading
from typing import Callable

from lsp_server.backends.base import Generator
from lsp_server.completion.context import Prompt
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.healing import Healing
from lsp_server.decoding.prefix import PrefixPool, fill, seed
from lsp_server.decoding.types import Completion, DecodeOptions, Generated, RequestContext, Stats


class EngineGenerator(Generator):
    """Ditto's own engine: speculative decoding in-process, stopped by `done` between steps."""

    drafts = True
    constrains = True  # token healing's mask applies (lsp_server/decoding/healing.py)
    resumable = True

    def __init__(self, engine: Engine):
        self.engine = engine
        self.prefixes = PrefixPool(engine.lm)  # the bound over the files' prefix KVs (tokens, MB; LRU)

    @property
    def speculation(self):
        return self.engine.speculation

    def forget(self, key: str) -> None:
        self.engine.forget(key)

    @property
    def stale_passes(self) -> int:
        return self.engine.stale_passes

    def cache_stats(self) -> dict:
        return {"keys": len(self.engine.cached_keys()), "tokens": self.engine.cached_tokens(),
                "file_prefix": self.prefixes.stats()}

    def generate(self, prompt: Prompt, *, options: DecodeOptions, done: Callable[[str], bool], drafter=None,
                 cancel: threading.Event | None = None, cache_key: str | None = None,
                 constraint: Healing | None = None, pause: Callable[[list[int]], bool] | None = None,
                 ctx: RequestContext | None = None) -> Generated:
        decode = self.engine.lm.decode

        def stop(out: list[int]) -> int | None:
            return len(out) if done(decode(out)) else None

        completion = self.engine.generate(prompt.ids, drafter=drafter, options=options, stop=stop, cancel=cancel,
                                          cache_key=cache_key, constraint=constraint, pause=pause, ctx=ctx)
        return Generated(decode(completion.tokens), completion)

    def warm(self, ids: list[int], key: str, *, cancel: threading.Event | None = None, chunk: int = 32,
             ctx: RequestContext | None = None) -> Stats:
        return self.engine.warm(ids, key, cancel=cancel, chunk=chunk, ctx=ctx)

    def cached_ids(self, key: str) -> list[int]:
        return self.engine.cached_ids(key)

    def paused(self, key: str) -> bool:
        return self.engine.paused(key)

    def resume(self, key: str, *, pause: Callable[[list[int]], bool] | None = None,
               cancel: threading.Event | None = None, ctx: RequestContext | None = None) -> Completion | None:
        return self.engine.resume(key, pause=pause, cancel=cancel, ctx=ctx)

    def seed(self, key: str, prefix, ids: list[int]) -> int:
        return seed(self.engine, key, prefix, ids, self.prefixes)

    def fill(self, prefix, ids: list[int], *, cancel: threading.Event | None = None, chunk: int = 32,
             ctx: RequestContext | None = None) -> Stats:
        return fill(self.engine, self.prefixes, prefix, ids, cancel=cancel, chunk=chunk, ctx=ctx)

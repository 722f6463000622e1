"""The prompt of a completion at a place, its budget, and its KV made ahead of a request (`Prompts`).

- `prompt_for`: the prompt `complete` sends, built from the document, the file's prompt window
  (context.py), the other open buffers' texts (`texts`, the snippets' source), the definitions and
  recent edits the caller brings (`extras`, extras.py) and, once the file's prefix KV is filled, the
  whole file above the place (wholefile.py);
- the budget: the settings' own, or the one fitted to this machine (`fit`, fitting.py);
- token healing's table of the model's token bytes (`vocab_bytes`, lsp_server/decoding/healing.py);
- KV ahead of a request, as idle work: `warm` prefills the prompt a request there would send,
  `fill` fills the file's prefix KV (wholefile.py `next_fill`), `seed` starts a whole-file
  prompt's cache from a copy of it.

Left out on purpose: generating (the Completer's `complete`, place.py), drafting (drafting.py),
the prompt's layout itself (context.py), LSP and threads.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Callable

from lsp_server.completion.context import ContextBudget, Prompt, build_prompt
from lsp_server.completion.extras import PromptExtras
from lsp_server.completion.files import FileState, FileStates
from lsp_server.completion.fitting import Fit
from lsp_server.completion.settings import CompleterSettings
from lsp_server.completion.wholefile import WholeFile, next_fill, whole_prompt
from lsp_server.decoding.healing import VocabBytes
from lsp_server.decoding.types import RequestContext, Stats


class Prompts:
    """Prompts, budget and prompt KV of one Completer (module docstring).

    `files` are the per-file states the Completer keeps for callers that name files by key;
    `settings()` gives the Completer's own settings (what a call without its own falls back on).
    """

    def __init__(self, lm, generator, files: FileStates, settings: Callable[[], CompleterSettings]):
        self.lm = lm
        self.generator = generator
        self.files = files
        self.settings = settings
        self.texts: dict[str, str] = {}  # the open buffers' texts by name, as set: what snippets come from
        self.whole = WholeFile()  # the whole-file prompt's rules (wholefile.py)
        # The budget fitted to this machine (settings.budget None) and what it was fitted to (fitting.py, build.py).
        self.fit = Fit(ContextBudget.DEFAULT_TOTAL)
        self._vocab_bytes: VocabBytes | None = None

    def budget_for(self, settings: CompleterSettings) -> ContextBudget:
        """The prompt budget of `settings`: their own, or the one fitted to this machine."""
        return settings.budget or ContextBudget.scaled(self.fit.tokens, settings.snippets, settings.definitions_share,
                                                       settings.edits_share)

    def budget_report(self, settings: CompleterSettings | None = None) -> dict:
        """What `ditto/stats` and `complete --json` say of the budget of `settings` (default: the
        Completer's own): its size, and the costs it was fitted to (None when the settings gave it)."""
        s = settings or self.settings()
        return {"context_tokens": self.budget_for(s).total,
                "context_fitted_to": self.fit.costs if s.budget is None else None}

    def vocab_bytes(self) -> VocabBytes:
        """The model's token bytes indexed for token healing, built once (a 152k vocabulary: ~0.5 s)."""
        if self._vocab_bytes is None:
            self._vocab_bytes = VocabBytes(self.lm.token_bytes())
        return self._vocab_bytes

    def prompt_for(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str | None = None,
                   others: list[tuple[str, str]] | None = None, settings: CompleterSettings | None = None,
                   file: FileState | None = None, extras: PromptExtras | None = None) -> Prompt:
        """The prompt `complete` sends to the engine for this position (idle prefill warms this one).

        The typed text is healed (typed.py `healed_tail`): the prompt ends at the last token
        boundary before the cursor and the model writes the rest under a constraint
        (lsp_server/decoding/healing.py), so `e` can become `else` and the prompt stays the
        same while the user types inside a word. A generator that cannot be constrained (a
        remote engine) gets the trailing blanks healed only. The document's prompt window
        (context.py) is read and moved as for a completion. `extras`: the definitions and recent edits
        to offer (extras.py; taken when the place is new). The whole-file prompt has none.
        """
        if others is None:
            others = [(n, t) for n, t in self.texts.items() if n != name]
        heal = "token" if self.generator.constrains else "blanks"
        state = self.files.of(file, name or cache_key)
        s = settings or self.settings()
        if state is not None and s.whole_file and self.generator.resumable:
            # What the KV may lack: at most half the window's lines above, so a place costs no more than the window.
            rules = replace(self.whole, gap=min(self.whole.gap, max(32, self.budget_for(s).above // 2)))
            whole = whole_prompt(self.lm, text, line, col, state.prefix, path=name, window=state.window, heal=heal,
                                 rules=rules, block=self.lm.block)
            if whole is not None:
                return whole
        return build_prompt(self.lm, text, line, col, others=others, path=name,
                            budget=self.budget_for(s),
                            window=state.window if state is not None else None, heal=heal, extras=extras)

    def warm(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str,
             cancel: threading.Event | None = None, chunk: int = 32,
             others: list[tuple[str, str]] | None = None, settings: CompleterSettings | None = None,
             file: FileState | None = None, ctx: RequestContext | None = None,
             extras: PromptExtras | None = None) -> Stats:
        """Prefill the prompt of a completion at (line, col) without decoding (idle prefill).

        The same prompt `complete` would build, into the same cache: a request there then
        prefills nothing, and one that cancels this keeps what it finished (Engine.warm).
        """
        prompt = self.prompt_for(text, line, col, name=name, cache_key=cache_key, others=others, settings=settings,
                                 file=file, extras=extras)
        ids = prompt.ids
        cached = self.generator.cached_ids(cache_key) if line == 0 and prompt.stable_end > 0 else None
        if cached is not None and prompt.stable[: len(cached)] == cached:
            # Aimed at the first line of a document whose cache holds no place yet (didOpen aims there): warm
            # what the prompt of every place below the file's head starts with (head.py), not the prompt of
            # line 1, which holds no lines above. Once a place was asked, its cache serves the requests there.
            ids = [*prompt.stable, 0]  # (Engine.warm prefills all but the last id)
        self.seed(prompt, file, name or cache_key, cache_key)
        return self.generator.warm(ids, cache_key, cancel=cancel, chunk=chunk, ctx=ctx)

    # -- the whole file above the place (wholefile.py) ----------------------------------------------
    def seed(self, prompt: Prompt, file: FileState | None, key: str | None, cache_key: str | None) -> None:
        """A whole-file prompt: start the cache of `cache_key` from a copy of the file's prefix KV."""
        state = self.files.of(file, key)
        if prompt.whole and cache_key is not None and state is not None:
            self.generator.seed(cache_key, state.prefix.kv, prompt.ids)

    def fill(self, text: str, line: int, *, name: str | None = None, key: str | None = None,
             file: FileState | None = None, cancel: threading.Event | None = None, chunk: int = 32,
             ctx: RequestContext | None = None) -> Stats | None:
        """Fill the prefix KV of the file (idle work; wholefile.py `next_fill`), in chunks a set `cancel`
        stops; None where there is nothing to fill (no engine, no FIM, filled already)."""
        state = self.files.of(file, key or name)
        ids = next_fill(self.lm, self.whole, state.prefix, state.window, text, line, name) \
            if state is not None and self.lm.fim is not None and self.generator.resumable else None
        return None if ids is None else self.generator.fill(state.prefix.kv, ids, cancel=cancel, chunk=chunk, ctx=ctx)

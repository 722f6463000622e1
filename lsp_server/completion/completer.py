"""One completion from a document snapshot: prompt, drafter sources, engine, stop rules.

Shared by the command line (`ditto-lsp complete`, `trace`, `bench`) and the language
server, so that what a user reproduces from the terminal is what the editor got.

The Completer builds the prompt, serves type-through, applies the ghost-text stop rules
and keeps the statistics; only the generation step differs by where the model runs
(docs/team.md): a `Generator` (lsp_server/backends/base.py) gets the prompt and a
`done(text)` rule and returns the generated text. `EngineGenerator` (lsp_server/completion/local.py)
runs Ditto's own Engine (speculative decoding with the drafters); a remote engine's
`RemoteGenerator` (lsp_server/backends/remote/generator.py) streams over HTTP and closes the
stream once `done` says the suggestion has ended. The Completer asks the generator what it can
do (`drafts`, `constrains`, `resumable`), never which kind it is. Draft models are loaded
through the `load_model` callable the builder hands in (lsp_server/completion/build.py), never
imported here.

What a call needs comes with it: the request's settings (`settings`, else the Completer's own,
given at build), the file's state (`file`: its prompt window and place, lsp_server/completion/files.py;
else the Completer's own, by key) and whom the model's passes are for (`ctx`).
Left out on purpose: LSP types, threads and scheduling (lsp_server/lsp/).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

from lsp_server.backends.base import GeneratingModel, Generator
from lsp_server.completion.buffers import HISTORY  # noqa: F401  (the source's name)
from lsp_server.completion.drafting import Drafters
from lsp_server.completion.context import ContextBudget, Prompt, Window, build_prompt, split_at
from lsp_server.completion.files import FileState, FileStates
from lsp_server.completion.fitting import Fit
from lsp_server.completion.local import EngineGenerator
from lsp_server.completion.place import Place, Places, Suggestion, around_cursor
from lsp_server.completion.settings import CompleterSettings
from lsp_server.completion.wholefile import WholeFile, next_fill, whole_prompt
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.healing import Healing, VocabBytes
from lsp_server.decoding.types import DecodeOptions, Generated, RequestContext, Stats  # noqa: F401  (Generated: re-exported)


class Completer:
    """Holds the generation step and the n-gram index over other open buffers.

    A model that generates elsewhere (a remote engine) brings its own generator
    (`lm.generator()`); any other runs on `engine` (default: a new Engine).
    """

    def __init__(self, lm, engine: Engine | None = None, settings: CompleterSettings | None = None,
                 generator: Generator | None = None, load_model: Callable[..., object] | None = None):
        self.lm = lm
        if generator is None:
            generator = lm.generator() if isinstance(lm, GeneratingModel) else EngineGenerator(engine or Engine(lm))
        self.generator = generator
        self.engine = generator.engine  # None when the model runs elsewhere
        self.settings = settings or CompleterSettings()  # the defaults; a call may bring the request's own
        self._vocab_bytes: VocabBytes | None = None
        self.pass_costs: dict[int, float] | None = None  # T(n) in ms, when measured or read at build (build.py)
        self._buffers: dict[str, str] = {}
        # The drafters, draft models and the open buffers' index (drafting.py); load_model(spec, device=,
        # dtype=, backend=) -> a loaded model: how draft models are loaded.
        self.drafters = Drafters(lm, generator, lambda: self.settings, load_model)
        self.files = FileStates()  # per-file state of callers that name files by key (files.py)
        self.whole = WholeFile()  # the whole-file prompt's rules (wholefile.py)
        # The budget fitted to this machine (settings.budget None) and what it was fitted to (build.py).
        self.fit = Fit(ContextBudget.DEFAULT_TOTAL)  # the budget fitted to this machine (fitting.py)
        self.places = Places(generator, lm.decode)  # a place's life after its first answer (place.py)

    @property
    def continued(self) -> int:
        """Generations resumed after their deadline (idle work or a request; place.py)."""
        return self.places.continued

    @property
    def ngram(self):
        """The `ngram` drafter over the open buffers (drafters/suffix.py; drafting.py)."""
        return self.drafters.ngram

    @property
    def buffers(self):
        """The open buffers' tokens and the drafter's index of them (buffers.py; drafting.py)."""
        return self.drafters.buffers

    @property
    def _draft_models(self) -> dict:
        return self.drafters.models  # (tests plant a draft model here)

    @property
    def budget(self) -> ContextBudget:
        """The prompt budget of the Completer's own settings."""
        return self.budget_for(self.settings)

    def budget_for(self, settings: CompleterSettings) -> ContextBudget:
        """The prompt budget of `settings`: their own, or the one fitted to this machine."""
        return settings.budget or ContextBudget.scaled(self.fit.tokens, settings.snippets)

    def budget_report(self, settings: CompleterSettings | None = None) -> dict:
        """What `ditto/stats` and `complete --json` say of the budget of `settings` (default: the
        Completer's own): its size, and the costs it was fitted to (None when the settings gave it)."""
        s = settings or self.settings
        return {"context_tokens": self.budget_for(s).total,
                "context_fitted_to": self.fit.costs if s.budget is None else None}

    # -- other open buffers -------------------------------------------------------------
    def set_buffer(self, name: str, text: str) -> None:
        """A buffer's text, for the prompt's snippets and the drafter's index (lsp_server/completion/buffers.py:
        only the blocks an edit touched are tokenized again; indexed now, or by `self.buffers.step()`
        when the server defers it; within the index memory budget)."""
        self._buffers[name] = text
        self.buffers.set(name, text)

    def buffer_text(self, name: str) -> str | None:
        """The text the Completer holds for an open buffer (None when it is not open here)."""
        return self._buffers.get(name)

    def buffer_names(self) -> list[str]:
        return list(self._buffers)

    def forget_buffer(self, name: str, cache_key: str | None = None) -> None:
        """A buffer closed: its text, index, prompt window and model cache go (the cache is kept under
        `cache_key` where that is not the name: the server's document URI)."""
        self._buffers.pop(name, None)
        self.buffers.forget(name)
        self.generator.forget(name)
        if cache_key is not None and cache_key != name:
            self.generator.forget(cache_key)
        self.forget_window(name)

    # -- drafting (drafting.py) ------------------------------------------------------------------
    def drafting(self, drafter: str, options: DecodeOptions) -> None:
        """Say which drafter and options the next requests use (what `index_wanted` decides by),
        before any request made it so (the benchmark indexes as the server's idle work would)."""
        self.drafters.drafting(drafter, options)

    def index_wanted(self) -> bool:
        return self.drafters.index_wanted()

    def accepted(self, text: str, after: str = "", settings: CompleterSettings | None = None) -> None:
        self.drafters.accepted(text, after, settings)

    def history(self) -> list[str]:
        return self.drafters.history()

    def draft_model(self, spec: str | None = None):
        return self.drafters.draft_model(spec)

    def drafter_for(self, name: str | None, draft_model: str | None = None):
        return self.drafters.drafter_for(name, draft_model)

    def hybrids(self) -> list:
        return self.drafters.hybrids()

    # -- per-file state (files.py): prompt windows (context.py) and places ---------------------
    def window(self, key: str | None) -> Window | None:
        """The prompt-window state of the file named `key` (created on first use); None for no key."""
        state = self.files.of(None, key)
        return None if state is None else state.window

    def forget_window(self, key: str) -> None:
        state = self.files.peek(key)
        if state is not None:
            state.forget_window()

    def vocab_bytes(self) -> VocabBytes:
        """The model's token bytes indexed for token healing, built once (a 152k vocabulary: ~0.5 s)."""
        if self._vocab_bytes is None:
            self._vocab_bytes = VocabBytes(self.lm.token_bytes())
        return self._vocab_bytes

    # -- completion -----------------------------------------------------------------------
    def prompt_for(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str | None = None,
                   others: list[tuple[str, str]] | None = None, settings: CompleterSettings | None = None,
                   file: FileState | None = None) -> Prompt:
        """The prompt `complete` sends to the engine for this position (idle prefill warms this one).

        The typed text is healed (context.py `healed_tail`): the prompt ends at the last token
        boundary before the cursor and the model writes the rest under a constraint
        (lsp_server/decoding/healing.py), so `e` can become `else` and the prompt stays the
        same while the user types inside a word. A generator that cannot be constrained (a
        remote engine) gets the trailing blanks healed only. The document's prompt window
        (context.py) is read and moved as for a completion.
        """
        if others is None:
            others = [(n, t) for n, t in self._buffers.items() if n != name]
        heal = "token" if self.generator.constrains else "blanks"
        state = self.files.of(file, name or cache_key)
        s = settings or self.settings
        if state is not None and s.whole_file and self.generator.resumable:
            # What the KV may lack: at most half the window's lines above, so a place costs no more than the window.
            rules = replace(self.whole, gap=min(self.whole.gap, max(32, self.budget_for(s).above // 2)))
            whole = whole_prompt(self.lm, text, line, col, state.prefix, path=name, window=state.window, heal=heal,
                                 rules=rules, block=self.lm.block)
            if whole is not None:
                return whole
        return build_prompt(self.lm, text, line, col, others=others, path=name,
                            budget=self.budget_for(settings or self.settings),
                            window=state.window if state is not None else None, heal=heal)

    def warm(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str,
             cancel: threading.Event | None = None, chunk: int = 32,
             others: list[tuple[str, str]] | None = None, settings: CompleterSettings | None = None,
             file: FileState | None = None, ctx: RequestContext | None = None) -> Stats:
        """Prefill the prompt of a completion at (line, col) without decoding (idle prefill).

        The same prompt `complete` would build, into the same cache: a request there then
        prefills nothing, and one that cancels this keeps what it finished (Engine.warm).
        """
        prompt = self.prompt_for(text, line, col, name=name, cache_key=cache_key, others=others, settings=settings,
                                 file=file)
        ids = prompt.ids
        cached = self.generator.cached_ids(cache_key) if line == 0 and prompt.stable_end > 0 else None
        if cached is not None and prompt.stable[: len(cached)] == cached:
            # Aimed at the first line of a document whose cache holds no place yet (didOpen aims there): warm
            # what the prompt of every place below the file's head starts with (head.py), not the prompt of
            # line 1, which holds no lines above. Once a place was asked, its cache serves the requests there.
            ids = [*prompt.stable, 0]  # (Engine.warm prefills all but the last id)
        self._seed(prompt, file, name or cache_key, cache_key)
        return self.generator.warm(ids, cache_key, cancel=cancel, chunk=chunk, ctx=ctx)

    def complete(self, text: str, line: int, col: int, *, name: str | None = None, options: DecodeOptions | None = None,
                 drafter: str | None = None, cancel: threading.Event | None = None, cache_key: str | None = None,
                 others: list[tuple[str, str]] | None = None, hold: threading.Event | None = None,
                 settings: CompleterSettings | None = None, file: FileState | None = None,
                 ctx: RequestContext | None = None) -> Suggestion:
        """Complete at 0-based (line, col) of `text`; col counts code points.

        The end of the typed text is healed (`prompt_for`): the model writes it again, under
        the healing constraint, and the suggestion is what it writes after it, so the
        suggestion starts after what the user typed.

        With `options.first_answer_s` (greedy, a cache key) the answer comes as soon as the
        suggestion's first line is complete, or that long into decoding, and the generation
        pauses there (`Place`); `continue_place` finishes it (the server runs it while idle),
        and a request whose text before the cursor is the old one plus the start of the
        suggestion is served from it: at once when the rest is there, else by resuming the
        paused generation, never by a new one. Deadline plus continuation give the tokens of
        one uninterrupted generation (lsp_server/decoding/engine.py `resume`).

        `hold` (`ahead`): once set, the generation pauses after its current pass, as at the deadline.
        """
        t0 = time.perf_counter()
        opts = options or DecodeOptions()
        s = settings or self.settings
        state = self.files.of(file, cache_key)
        if cache_key is not None and s.type_through:
            hit = self.places.from_place(text, line, col, cache_key, state.place if state is not None else None, opts,
                                         cancel, ctx)
            if hit is not None:
                hit.latency_ms = (time.perf_counter() - t0) * 1000
                return hit
        drafter_name = drafter or s.drafter
        self.drafters.drafting(drafter_name, opts)
        d = self.drafter_for(drafter_name, s.draft_model)
        if d is not None:
            d.set_options(opts)  # a model drafter samples its drafts as the target samples
        _, typed, after, _ = split_at(text, line, col)
        prompt = self.prompt_for(text, line, col, name=name, cache_key=cache_key, others=others, settings=s,
                                 file=file)
        self._seed(prompt, file, name or cache_key, cache_key)
        shown_prompt = replace(prompt, typed=typed, after=after)
        heal = prompt.healed
        constraint = Healing(self.vocab_bytes(), heal.encode("utf-8")) if heal and self.generator.constrains else None
        before, after_cursor = around_cursor(text, line, col)
        place = Place(before, after_cursor, shown_prompt, heal, s.multiline,
                      drafter_name if d is not None else ("none" if self.generator.drafts else "remote"), self.lm.decode)
        deadline = (opts.first_answer_s is not None and opts.greedy and cache_key is not None
                    and self.generator.resumable)
        pause = place.pause_rule(0, opts.first_answer_s) if deadline else None
        if pause is not None and hold is not None:
            pause = _or_held(pause, hold)
        gen = self.generator.generate(prompt, options=opts, done=place.done, drafter=d, cancel=cancel,
                                      cache_key=cache_key, constraint=constraint, pause=pause, ctx=ctx)
        if deadline:
            place.again = lambda: self.generator.generate(
                prompt, options=replace(opts, first_answer_s=None, time_budget_s=None), done=place.done, drafter=d,
                cache_key=cache_key, constraint=Healing(self.vocab_bytes(), heal.encode("utf-8")) if constraint else None,
            ).completion
        place.update(gen.text, gen.completion)
        if s.budget is None:  # a prefill on a quieter machine than at load fits the budget again
            self.fit.observe(gen.completion.stats.prefill_tokens, gen.completion.stats.prefill_ms)
        sug = place.answer(0, (time.perf_counter() - t0) * 1000, notice=gen.notice)
        if state is not None:
            place.ahead = hold is not None
            state.place = place if place.text and place.completion.stats.stop_reason not in ("cancelled", "error") \
                else None
        return sug

    def ahead(self, text: str, line: int, col: int, *, name: str | None = None, options: DecodeOptions,
              cache_key: str, hold: threading.Event, settings: CompleterSettings | None = None,
              file: FileState | None = None, ctx: RequestContext | None = None) -> bool:
        """Generate, while the worker is idle, the suggestion a request at (line, col) would get, so
        that the request is answered from it (llama.vim's "speculative FIM", here for the place the
        user is at). Greedy with a deadline only: the generation pauses at its first complete line
        (the deadline's rule) or as soon as `hold` is set (a request or a newer aim came), and a
        request at the same place resumes it (place.py `Places.from_place`), so what it shows is what it would
        have generated itself. Only where the cache holds that prompt (idle prefill warmed it): a
        prefill is not stopped by `hold`, and idle prefill aimed at the top of a document warms
        the file's head instead (`warm`), which the prompt of line 1 would evict. True when a
        suggestion was kept for `cache_key`."""
        s = settings or self.settings
        if (not self.generator.resumable or not options.greedy or options.first_answer_s is None
                or not s.type_through or hold.is_set() or self.place_fits(cache_key, text, line, col, file=file)):
            return False  # (a suggestion that fits is there: the request is served from it)
        ids = self.prompt_for(text, line, col, name=name, cache_key=cache_key, settings=s, file=file).ids
        if self.generator.cached_ids(cache_key)[: len(ids) - 1] != ids[:-1]:
            return False
        self.complete(text, line, col, name=name, options=options, cache_key=cache_key, hold=hold, settings=s,
                      file=file, ctx=ctx)
        return self.place(cache_key, file) is not None

    # -- the whole file above the place (wholefile.py) ----------------------------------------------
    def _seed(self, prompt: Prompt, file: FileState | None, key: str | None, cache_key: str | None) -> None:
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

    # -- places: one generation answered in pieces (a deadline, its continuation, type-through; place.py) --
    def place(self, key: str | None, file: FileState | None = None) -> Place | None:
        """The last generation answered for `key` (in `file`, when given), or None."""
        return self.files.place(key, file)

    def pending(self, key: str, file: FileState | None = None) -> bool:
        return self.places.pending(key, self.place(key, file))

    def place_fits(self, key: str, text: str, line: int, col: int, file: FileState | None = None) -> bool:
        return self.places.place_fits(self.place(key, file), text, line, col)

    def continue_place(self, key: str, cancel: threading.Event | None = None, file: FileState | None = None,
                       ctx: RequestContext | None = None) -> bool:
        return self.places.continue_place(key, self.place(key, file), cancel=cancel, ctx=ctx)

    def check_place(self, key: str, file: FileState | None = None) -> dict | None:
        return self.places.check_place(key, self.place(key, file))


def _or_held(pause: Callable[[list[int]], bool], hold: threading.Event) -> Callable[[list[int]], bool]:
    """`pause`, or pause at once when `hold` is set (a generation made ahead yields to a request)."""
    return lambda out: hold.is_set() or pause(out)


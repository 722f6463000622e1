"""One completion from a document snapshot: the one entry point from a place in a document to a
suggestion.

Shared by the command line (`ditto-lsp complete`, `trace`, `bench`) and the language
server, so that what a user reproduces from the terminal is what the editor got.

`complete` builds the prompt, picks the drafter, generates (answered at a deadline, the rest
later) and keeps the generation as the file's place; `ahead` does the same while the worker is
idle. The rest is the Completer's parts, whose public face it keeps:

- prompts.py (`Prompts`): the prompt at a place, its budget (fitted to the machine), token
  healing's table, and KV made ahead of a request (`warm`, `fill`);
- drafting.py (`Drafters`): the drafters and draft models, the open buffers' n-gram index and
  the completions the user accepted;
- place.py (`Places`): a place's life after its first answer (type-through, resuming the paused
  generation, finishing it while idle);
- files.py (`FileStates`): the per-file state of callers that name files by key;
- settings.py (`CompleterSettings`, re-exported here): what a call is asked to do.

Only the generation step differs by where the model runs (docs/team.md): a `Generator`
(lsp_server/backends/base.py) gets the prompt and a `done(text)` rule and returns the generated text. `EngineGenerator` (lsp_server/completion/local.py)
runs Ditto's own Engine (speculative decoding with the drafters); a remote engine's
`RemoteGenerator` (lsp_server/backends/remote/generator.py) streams over HTTP and closes the
stream once `done` says the suggestion has ended. The Completer asks the generator what it can
do (`drafts`, `constrains`, `resumable`), never which kind it is.

What a call needs comes with it: the request's settings (`settings`, else the Completer's own,
given at build), the file's state (`file`: its prompt window and place, lsp_server/completion/files.py;
else the Completer's own, by key), whom the model's passes are for (`ctx`) and what the prompt may
hold beside the document (`extras`: definitions and recent edits, extras.py).
Left out on purpose: LSP types, threads and scheduling (lsp_server/lsp/), and what the parts do.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

from lsp_server.backends.base import GeneratingModel, Generator
from lsp_server.completion.buffers import HISTORY  # noqa: F401  (the source's name)
from lsp_server.completion.context import ContextBudget, Prompt, Window, split_at
from lsp_server.completion.drafting import Drafters
from lsp_server.completion.extras import PromptExtras
from lsp_server.completion.files import FileState, FileStates
from lsp_server.completion.fitting import Fit
from lsp_server.completion.local import EngineGenerator
from lsp_server.completion.show import RULES
from lsp_server.completion.place import Place, Places, Suggestion, around_cursor
from lsp_server.completion.prompts import Prompts
from lsp_server.completion.settings import CompleterSettings
from lsp_server.completion.wholefile import WholeFile
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.healing import Healing, VocabBytes
from lsp_server.decoding.types import DecodeOptions, Generated, RequestContext, Stats  # noqa: F401  (Generated: re-exported)


class Completer:
    """The generation step and its parts (module docstring).

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
        self.pass_costs: dict[int, float] | None = None  # T(n) in ms, when measured or read at build (build.py)
        self.files = FileStates()  # per-file state of callers that name files by key (files.py)

        def own() -> CompleterSettings:  # the parts read the Completer's own settings: they have one owner
            return self.settings

        # The drafters, draft models and the open buffers' index (drafting.py); load_model(spec, device=,
        # dtype=, backend=) -> a loaded model: how draft models are loaded.
        self.drafters = Drafters(lm, generator, own, load_model)
        self.prompts = Prompts(lm, generator, self.files, own)  # prompt, budget, prompt KV ahead (prompts.py)
        self.places = Places(generator, lm.decode)  # a place's life after its first answer (place.py)

    # -- the parts' state, readable on the Completer as before it had parts -----------------------
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
    def fit(self) -> Fit:
        """The budget fitted to this machine (fitting.py; prompts.py)."""
        return self.prompts.fit

    @property
    def whole(self) -> WholeFile:
        """The whole-file prompt's rules (wholefile.py; prompts.py)."""
        return self.prompts.whole

    @whole.setter
    def whole(self, rules: WholeFile) -> None:
        self.prompts.whole = rules

    @property
    def continued(self) -> int:
        """Generations resumed after their deadline (idle work or a request; place.py)."""
        return self.places.continued

    # -- prompt and budget (prompts.py) ----------------------------------------------------------
    @property
    def budget(self) -> ContextBudget:
        """The prompt budget of the Completer's own settings."""
        return self.prompts.budget_for(self.settings)

    def budget_for(self, settings: CompleterSettings) -> ContextBudget:
        return self.prompts.budget_for(settings)

    def budget_report(self, settings: CompleterSettings | None = None) -> dict:
        return self.prompts.budget_report(settings)

    def vocab_bytes(self) -> VocabBytes:
        return self.prompts.vocab_bytes()

    def prompt_for(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str | None = None,
                   others: list[tuple[str, str]] | None = None, settings: CompleterSettings | None = None,
                   file: FileState | None = None, extras: PromptExtras | None = None) -> Prompt:
        return self.prompts.prompt_for(text, line, col, name=name, cache_key=cache_key, others=others,
                                       settings=settings, file=file, extras=extras)

    def warm(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str,
             cancel: threading.Event | None = None, chunk: int = 32,
             others: list[tuple[str, str]] | None = None, settings: CompleterSettings | None = None,
             file: FileState | None = None, ctx: RequestContext | None = None,
             extras: PromptExtras | None = None) -> Stats:
        return self.prompts.warm(text, line, col, name=name, cache_key=cache_key, cancel=cancel, chunk=chunk,
                                 others=others, settings=settings, file=file, ctx=ctx, extras=extras)

    def fill(self, text: str, line: int, *, name: str | None = None, key: str | None = None,
             file: FileState | None = None, cancel: threading.Event | None = None, chunk: int = 32,
             ctx: RequestContext | None = None) -> Stats | None:
        return self.prompts.fill(text, line, name=name, key=key, file=file, cancel=cancel, chunk=chunk, ctx=ctx)

    # -- other open buffers: the prompt's snippets (prompts.py) and the drafter's index (drafting.py) --
    def set_buffer(self, name: str, text: str) -> None:
        """A buffer's text, for the prompt's snippets and the drafter's index (lsp_server/completion/buffers.py:
        only the blocks an edit touched are tokenized again; indexed now, or by `self.buffers.step()`
        when the server defers it; within the index memory budget)."""
        self.prompts.texts[name] = text
        self.buffers.set(name, text)

    def buffer_text(self, name: str) -> str | None:
        """The text the Completer holds for an open buffer (None when it is not open here)."""
        return self.prompts.texts.get(name)

    def buffer_names(self) -> list[str]:
        return list(self.prompts.texts)

    def forget_buffer(self, name: str, cache_key: str | None = None) -> None:
        """A buffer closed: its text, index, prompt window and model cache go (the cache is kept under
        `cache_key` where that is not the name: the server's document URI)."""
        self.prompts.texts.pop(name, None)
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

    # -- per-file state (files.py): prompt windows (context.py) and places (place.py) ----------------
    def window(self, key: str | None) -> Window | None:
        """The prompt-window state of the file named `key` (created on first use); None for no key."""
        state = self.files.of(None, key)
        return None if state is None else state.window

    def forget_window(self, key: str) -> None:
        state = self.files.peek(key)
        if state is not None:
            state.forget_window()

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

    # -- completion ------------------------------------------------------------------------------
    def complete(self, text: str, line: int, col: int, *, name: str | None = None, options: DecodeOptions | None = None,
                 drafter: str | None = None, cancel: threading.Event | None = None, cache_key: str | None = None,
                 others: list[tuple[str, str]] | None = None, hold: threading.Event | None = None,
                 settings: CompleterSettings | None = None, file: FileState | None = None,
                 ctx: RequestContext | None = None, extras: PromptExtras | None = None) -> Suggestion:
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
        `extras`: the definitions and recent edits to offer the prompt (extras.py; taken at a new place).
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
                                 file=file, extras=extras)
        self.prompts.seed(prompt, file, name or cache_key, cache_key)
        shown_prompt = replace(prompt, typed=typed, after=after)
        heal = prompt.healed
        constraint = Healing(self.vocab_bytes(), heal.encode("utf-8")) if heal and self.generator.constrains else None
        before, after_cursor = around_cursor(text, line, col)
        place = Place(before, after_cursor, shown_prompt, heal, s.multiline,
                      drafter_name if d is not None else ("none" if self.generator.drafts else "remote"), self.lm.decode,
                      s.show if getattr(self.lm, "calibrated", True) else RULES["all"])
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
            old = state.place
            if place.text and place.completion.stats.stop_reason not in ("cancelled", "error"):
                state.place = place
            elif old is None or (old.before, old.after) != (place.before, place.after):
                state.place = None
            # else: asked again where a suggestion is on screen, and that generation was stopped: the one
            # on screen stays the place's, so typing its start is still answered from it (type-through)
        return sug

    def ahead(self, text: str, line: int, col: int, *, name: str | None = None, options: DecodeOptions,
              cache_key: str, hold: threading.Event, settings: CompleterSettings | None = None,
              file: FileState | None = None, ctx: RequestContext | None = None,
              extras: PromptExtras | None = None) -> bool:
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
        ids = self.prompt_for(text, line, col, name=name, cache_key=cache_key, settings=s, file=file, extras=extras).ids
        if self.generator.cached_ids(cache_key)[: len(ids) - 1] != ids[:-1]:
            return False
        self.complete(text, line, col, name=name, options=options, cache_key=cache_key, hold=hold, settings=s,
                      file=file, ctx=ctx, extras=extras)
        return self.place(cache_key, file) is not None


def _or_held(pause: Callable[[list[int]], bool], hold: threading.Event) -> Callable[[list[int]], bool]:
    """`pause`, or pause at once when `hold` is set (a generation made ahead yields to a request)."""
    return lambda out: hold.is_set() or pause(out)

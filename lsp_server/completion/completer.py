"""One completion from a document snapshot: prompt, drafter sources, engine, stop rules.

Shared by the command line (`ditto-lsp complete`, `trace`, `bench`) and the language
server, so that what a user reproduces from the terminal is what the editor got.

The Completer builds the prompt, serves type-through, applies the ghost-text stop rules
and keeps the statistics; only the generation step differs by where the model runs
(docs/team.md): a `Generator` (lsp_server/backends/base.py) gets the prompt and a
`done(text)` rule and returns the generated text. `EngineGenerator` runs Ditto's own
Engine (speculative decoding with the drafters); a remote engine's `RemoteGenerator`
(lsp_server/backends/remote/generator.py) streams over HTTP and closes the stream once
`done` says the suggestion has ended. Draft models are loaded through the `load_model`
callable the builder hands in (lsp_server/completion/build.py), never imported here.
Left out on purpose: LSP types, threads and scheduling (lsp_server/lsp/).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable

from drafters import NGramDrafter
from drafters.registry import DraftContext, make_drafter
from lsp_server.backends.base import GeneratingModel, Generator
from lsp_server.completion.buffers import HISTORY, open_buffers
from lsp_server.completion.context import ContextBudget, Prompt, Window, build_prompt, finish, ghost_cut, split_at
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.healing import Healing, VocabBytes
from lsp_server.decoding.types import Completion, DecodeOptions, Generated, Stats

_PARTIAL = "\ufffd"  # what decoding shows for the first bytes of a character not yet complete
MAX_INDEXED_CHARS = 262144  # of one buffer, for the drafter: its head and tail (whole lines) past this


@dataclass
class Suggestion:
    text: str  # the ghost text, after stop rules
    raw: str  # everything the model produced
    prompt: Prompt
    completion: Completion
    drafter: str
    latency_ms: float
    typethrough: bool = False  # served from the suggestion on screen, without the model
    notice: str | None = None  # one line for the user (a remote engine failed), set once per problem

    def summary(self, model: str) -> dict:
        s = self.completion.stats
        return {
            "typethrough": self.typethrough,
            "text": self.text,
            "tokens": s.tokens,
            "target_passes": s.target_passes,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "tokens_per_pass": round(s.tokens_per_pass, 4),
            "prefill_tokens": s.prefill_tokens,
            "reused_tokens": s.reused_tokens,
            "prompt_tokens": len(self.prompt.ids),
            "prefill_ms": round(s.prefill_ms, 1),
            "decode_ms": round(s.decode_ms, 1),
            "latency_ms": round(self.latency_ms, 1),
            "stop_reason": s.stop_reason,
            "model": model,
            "drafter": self.drafter,
        }


@dataclass
class CompleterSettings:
    drafter: str = "ngram"  # one of drafters.registry.DRAFTERS
    draft_model: str = "qwen2.5-coder-0.5b"  # model spec of the model / hybrid drafters
    history_tokens: int = 4096  # accepted completions kept in the n-gram index (oldest dropped)
    multiline: bool = True  # ghost text may span lines (until the block ends)
    type_through: bool = True  # typing the start of the shown suggestion answers with its rest at once
    budget: ContextBudget = field(default_factory=ContextBudget)


class EngineGenerator:
    """Ditto's own engine: speculative decoding in-process, stopped by `done` between steps."""

    drafts = True
    constrains = True  # token healing's mask applies (lsp_server/decoding/healing.py)

    def __init__(self, engine: Engine):
        self.engine = engine

    def forget(self, key: str) -> None:
        self.engine.forget(key)

    def stats(self, intervals: bool = False) -> None:
        return None  # the engine's statistics are per completion (Stats) and in the policy's snapshot

    def generate(self, prompt: Prompt, *, options: DecodeOptions, done: Callable[[str], bool], drafter=None,
                 cancel: threading.Event | None = None, cache_key: str | None = None,
                 constraint: Healing | None = None) -> Generated:
        decode = self.engine.lm.decode

        def stop(out: list[int]) -> int | None:
            return len(out) if done(decode(out)) else None

        completion = self.engine.generate(prompt.ids, drafter=drafter, options=options, stop=stop, cancel=cancel,
                                          cache_key=cache_key, constraint=constraint)
        return Generated(decode(completion.tokens), completion)


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
        self.settings = settings or CompleterSettings()
        # load_model(spec, device=, dtype=, backend=) -> a loaded model: how draft models are loaded.
        self._load_model = load_model
        self._vocab_bytes: VocabBytes | None = None
        self.pass_costs: dict[int, float] | None = None  # T(n) in ms, when measured or read at build (build.py)
        # The tokenizer's text functions let the lookup heal a token the cursor split
        # (drafters/ngram.py); a model without them drafts by ids only.
        self.ngram = NGramDrafter(token_text=lm.token_text, encode=lm.encode)
        self._buffers: dict[str, str] = {}
        self._shown: dict[str, tuple[str, str, Suggestion]] = {}  # key -> (before, after, suggestion)
        self._history: list[list[int]] = []  # accepted completions, oldest first
        self._draft_models: dict[str, object] = {}  # spec -> LoadedModel (loaded once)
        self._drafters: dict[tuple[str, str], object] = {}  # (drafter name, draft-model spec) -> drafter, built once
        self._windows: OrderedDict[str, Window] = OrderedDict()  # document -> where its prompt window starts

    # -- other open buffers -------------------------------------------------------------
    def set_buffer(self, name: str, text: str) -> None:
        """A buffer's text, for the prompt's snippets and the drafter's index (lsp_server/completion/buffers.py:
        only the blocks an edit touched are tokenized again; indexed now, or by `open_buffers(self).step()`
        when the server defers it; within the index memory budget)."""
        self._buffers[name] = text
        open_buffers(self, MAX_INDEXED_CHARS).set(name, text)

    def forget_buffer(self, name: str, cache_key: str | None = None) -> None:
        """A buffer closed: its text, index, prompt window and model cache go (the cache is kept under
        `cache_key` where that is not the name: the server's document URI)."""
        self._buffers.pop(name, None)
        open_buffers(self, MAX_INDEXED_CHARS).forget(name)
        self.generator.forget(name)
        if cache_key is not None and cache_key != name:
            self.generator.forget(cache_key)
        self.forget_window(name)

    # -- prompt windows (context.py: windows that survive editing) --------------------------
    MAX_WINDOWS = 64

    def window(self, key: str | None) -> Window | None:
        """The prompt-window state of a document (created on first use); None for no key."""
        if key is None:
            return None
        w = self._windows.pop(key, None) or Window()
        self._windows[key] = w
        while len(self._windows) > self.MAX_WINDOWS:
            self._windows.popitem(last=False)
        return w

    def forget_window(self, key: str) -> None:
        self._windows.pop(key, None)

    def vocab_bytes(self) -> VocabBytes:
        """The model's token bytes indexed for token healing, built once (a 152k vocabulary: ~0.5 s)."""
        if self._vocab_bytes is None:
            self._vocab_bytes = VocabBytes(self.lm.token_bytes())
        return self._vocab_bytes

    # -- history: completions the user accepted ---------------------------------------------
    def accepted(self, text: str, after: str = "") -> None:
        """Remember an accepted completion (and the text typed right after it) for drafting.

        It joins the n-gram index as the "history" source (priority 2, after the open
        buffers), bounded to `settings.history_tokens` tokens, oldest entries dropped, so
        a pattern the user accepted once is proposed again in any file.
        """
        if self.generator.drafts:
            open_buffers(self, MAX_INDEXED_CHARS).accept(self.lm.encode(text + after), self.settings.history_tokens)

    def history(self) -> list[str]:
        return [self.lm.decode(ids) for ids in open_buffers(self, MAX_INDEXED_CHARS).history()]

    # -- completion -----------------------------------------------------------------------
    def draft_model(self, spec: str | None = None):
        """The draft model of `spec` (default: settings.draft_model), loaded once per spec."""
        spec = spec or self.settings.draft_model
        if spec not in self._draft_models:
            if self._load_model is None:
                raise ValueError("this completer was built without a model loader: no draft model can be loaded")
            where = self.lm.describe()
            self._draft_models[spec] = self._load_model(spec, device=where["device"], dtype=where["dtype"],
                                                        backend=where["backend"])
        return self._draft_models[spec]

    def drafter_for(self, name: str | None):
        """The drafter called `name` (drafters/registry.py), built once per draft-model spec;
        None for plain decoding or a model that generates elsewhere.

        A draft model whose tokenizer is not the target's raises
        drafters.model_drafter.TokenizerMismatch (a ValueError).
        """
        name = name or self.settings.drafter
        if not self.generator.drafts:
            return None
        spec = self.settings.draft_model
        key = (name, spec)
        if key not in self._drafters:
            def policy():
                if self.engine.speculation is None:
                    self.engine.calibrate()
                return self.engine.speculation

            ctx = DraftContext(ngram=self.ngram, target=self.lm, draft_model=lambda: self.draft_model(spec),
                               policy=policy, get=self.drafter_for)
            self._drafters[key] = make_drafter(name, ctx)
        return self._drafters[key]

    def hybrids(self) -> list:
        """The hybrid drafters built so far (one per draft-model spec), for reports."""
        return [d for (name, _), d in self._drafters.items() if name == "hybrid"]

    def prompt_for(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str | None = None,
                   others: list[tuple[str, str]] | None = None) -> Prompt:
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
        return build_prompt(self.lm, text, line, col, others=others, path=name, budget=self.settings.budget,
                            window=self.window(name or cache_key), heal=heal)

    def warm(self, text: str, line: int, col: int, *, name: str | None = None, cache_key: str,
             cancel: threading.Event | None = None, chunk: int = 32,
             others: list[tuple[str, str]] | None = None) -> Stats:
        """Prefill the prompt of a completion at (line, col) without decoding (idle prefill).

        The same prompt `complete` would build, into the same cache: a request there then
        prefills nothing, and one that cancels this keeps what it finished (Engine.warm).
        """
        prompt = self.prompt_for(text, line, col, name=name, cache_key=cache_key, others=others)
        return self.engine.warm(prompt.ids, cache_key, cancel=cancel, chunk=chunk)

    def complete(self, text: str, line: int, col: int, *, name: str | None = None, options: DecodeOptions | None = None,
                 drafter: str | None = None, cancel: threading.Event | None = None, cache_key: str | None = None,
                 others: list[tuple[str, str]] | None = None) -> Suggestion:
        """Complete at 0-based (line, col) of `text`; col counts code points.

        The end of the typed text is healed (`prompt_for`): the model writes it again, under
        the healing constraint, and the suggestion is what it writes after it, so the
        suggestion starts after what the user typed.
        """
        t0 = time.perf_counter()
        opts = options or DecodeOptions()
        drafter_name = drafter or self.settings.drafter
        if cache_key is not None and self.settings.type_through:
            hit = self._type_through(text, line, col, cache_key, opts)
            if hit is not None:
                hit.latency_ms = (time.perf_counter() - t0) * 1000
                return hit
        d = self.drafter_for(drafter_name)
        if d is not None:
            d.set_options(opts)  # a model drafter samples its drafts as the target samples
        _, typed, after, _ = split_at(text, line, col)
        prompt = self.prompt_for(text, line, col, name=name, cache_key=cache_key, others=others)
        heal = prompt.healed
        shown_prompt = replace(prompt, typed=typed, after=after)
        multiline = self.settings.multiline
        constraint = None
        if heal and self.generator.constrains:
            constraint = Healing(self.vocab_bytes(), heal.encode("utf-8"))

        def relative(generated: str) -> str | None:
            """The generated text from the real cursor on; None while it is still inside the healed text,
            "" when the model wrote something else than the healed word (nothing to show)."""
            if generated.startswith(heal):
                return generated[len(heal) :]
            written = generated.rstrip(_PARTIAL)  # a multi-byte character still being written
            if heal.startswith(written):
                return None
            if heal.strip(" \t"):
                return ""
            return generated.lstrip(" \t")  # the model chose other blanks: keep its code, not its blanks

        def done(generated: str) -> bool:
            """Whether the ghost-text stop rules have ended the suggestion in `generated`."""
            rel = relative(generated)
            if rel == "" and not generated.startswith(heal):
                return True  # it did not write the typed word (an unconstrained engine): stop
            return rel is not None and ghost_cut(rel, shown_prompt, multiline) is not None

        gen = self.generator.generate(prompt, options=opts, done=done, drafter=d, cancel=cancel, cache_key=cache_key,
                                      constraint=constraint)
        raw, completion = gen.text, gen.completion
        shown = finish(relative(raw) or "", shown_prompt, multiline)
        if completion.stats.stop_reason in ("time", "interrupted") and "\n" in shown:
            shown = shown[: shown.rfind("\n")]  # cut short: show the complete lines only
        label = drafter_name if d is not None else ("none" if self.generator.drafts else "remote")
        sug = Suggestion(shown, raw, shown_prompt, completion, label, (time.perf_counter() - t0) * 1000,
                         notice=gen.notice)
        if cache_key is not None:
            self._remember_shown(cache_key, text, line, col, sug)
        return sug

    # -- type-through -----------------------------------------------------------------------
    def _remember_shown(self, key: str, text: str, line: int, col: int, sug: Suggestion) -> None:
        """Keep what is on screen, keyed by the exact text before and after the cursor."""
        self._shown.pop(key, None)
        if sug.text and sug.completion.stats.stop_reason not in ("cancelled", "error"):
            before, after = _cut(text, line, col)
            self._shown[key] = (before, after, sug)
            while len(self._shown) > 64:
                self._shown.pop(next(iter(self._shown)))

    def _type_through(self, text: str, line: int, col: int, key: str, opts: DecodeOptions) -> Suggestion | None:
        """The rest of the shown suggestion when the user typed its beginning, else None.

        Served only when the text after the cursor is unchanged and the text before it is
        the old text plus the typed characters, so a suggestion is never served for other
        surrounding text. A sampled suggestion is not re-served (a new request must draw).
        """
        entry = self._shown.get(key)
        if entry is None or not opts.greedy:
            return None
        old_before, old_after, old = entry
        before, after = _cut(text, line, col)
        if after != old_after or len(before) <= len(old_before) or not before.startswith(old_before):
            return None
        typed = before[len(old_before) :]
        if not old.text.startswith(typed) or len(typed) >= len(old.text):
            return None
        empty = Completion([], Stats(stop_reason="typethrough"), [])
        return Suggestion(old.text[len(typed) :], old.raw, old.prompt, empty, old.drafter, 0.0, typethrough=True)


def _cut(text: str, line: int, col: int) -> tuple[str, str]:
    """The document split at 0-based (line, col): (text before the cursor, text after it)."""
    above, typed, after, below = split_at(text, line, col)
    return above + typed, after + below

"""What a Completer drafts with (`Drafters`): the drafters by name, the draft models, and the
sources the n-gram drafter copies from.

- Drafters are built once per (name, draft-model spec) through drafters/registry.py
  (`drafter_for`); a draft model loads once per spec, through the `load_model` callable the
  builder hands in (lsp_server/completion/build.py), never imported here.
- The n-gram drafter (drafters/suffix.py) looks tokens up in the open buffers
  (lsp_server/completion/buffers.py `OpenBuffers`: tokens and index within a memory budget) and
  in the completions the user accepted (`accepted`, `history`).
- Whether indexing the open buffers can be of use now (`index_wanted`) follows from the drafter
  and options of the last request (`drafting`) and the engine's pass costs.

Left out on purpose: which tokens are kept (the engine verifies, lsp_server/decoding/), the
prompt and its snippets (prompts.py), places (place.py), LSP and threads.
"""

from __future__ import annotations

from typing import Callable

from drafters.registry import DraftContext, make_drafter
from drafters.suffix import SuffixDrafter
from lsp_server.completion.buffers import OpenBuffers
from lsp_server.completion.settings import CompleterSettings
from lsp_server.decoding.speculation import measure_draft_costs
from lsp_server.decoding.types import DecodeOptions

MAX_INDEXED_CHARS = 262144  # of one buffer, for the drafter: its head and tail (whole lines) past this


class Drafters:
    """The drafters, draft models and drafting sources of one Completer (module docstring).

    `settings()` gives the Completer's own settings (what a call without its own falls back on);
    `generator` is the Completer's generation step: it says whether this model drafts at all.
    """

    LOOKUP_DRAFTERS = ("ngram", "hybrid")  # the drafters that look tokens up in the open buffers' index

    def __init__(self, lm, generator, settings: Callable[[], CompleterSettings],
                 load_model: Callable[..., object] | None = None):
        self.lm = lm
        self.generator = generator
        self.settings = settings
        # load_model(spec, device=, dtype=, backend=) -> a loaded model: how draft models are loaded.
        self._load_model = load_model
        # The tokenizer's text functions let the lookup heal a token the cursor split
        # (drafters/ngram.py); a model without them drafts by ids only.
        self.ngram = SuffixDrafter(token_text=lm.token_text, encode=lm.encode)  # the `ngram` drafter (drafters/suffix.py)
        # The open buffers' tokens and the drafter's index of them (lsp_server/completion/buffers.py).
        self.buffers = OpenBuffers(lm.encode, self.ngram, enabled=generator.drafts, max_chars=MAX_INDEXED_CHARS,
                                   wanted=self.index_wanted)
        self.models: dict[str, object] = {}  # spec -> LoadedModel (loaded once)
        self._built: dict[tuple[str, str], object] = {}  # (drafter name, draft-model spec) -> drafter, built once
        self._last = (settings().drafter, DecodeOptions())  # the last request's drafter and options

    def drafting(self, drafter: str, options: DecodeOptions) -> None:
        """Say which drafter and options the next requests use (what `index_wanted` decides by)."""
        self._last = (drafter, options)

    def index_wanted(self) -> bool:
        """Whether indexing the open buffers for the n-gram drafter can be of use now (buffers.py
        `wanted`): this engine drafts (a remote one does not), the last request's drafter looks
        tokens up, and on the engine's pass costs some draft could pay (lsp_server/decoding/speculation.py
        `can_pay`; without `adaptive` every draft is verified, whatever it costs). On llama.cpp on a
        CPU no draft can pay (docs/backends.md), so there the default drafter costs what drafting
        off costs: no lookups and no index slices for a request to wait behind."""
        name, opts = self._last
        if not self.generator.drafts or name not in self.LOOKUP_DRAFTERS or opts.draft_max <= 0:
            return False
        spec = self.generator.speculation
        return not opts.adaptive or spec is None or spec.can_pay(opts.draft_max)

    # -- history: completions the user accepted ---------------------------------------------
    def accepted(self, text: str, after: str = "", settings: CompleterSettings | None = None) -> None:
        """Remember an accepted completion (and the text typed right after it) for drafting.

        It joins the n-gram index as the "history" source (priority 2, after the open
        buffers), bounded to `settings.history_tokens` tokens, oldest entries dropped, so
        a pattern the user accepted once is proposed again in any file.
        """
        if self.generator.drafts:
            self.buffers.accept(self.lm.encode(text + after), (settings or self.settings()).history_tokens)

    def history(self) -> list[str]:
        return [self.lm.decode(ids) for ids in self.buffers.history()]

    # -- drafters and draft models ----------------------------------------------------------
    def draft_model(self, spec: str | None = None):
        """The draft model of `spec` (default: settings.draft_model), loaded once per spec."""
        spec = spec or self.settings().draft_model
        if spec not in self.models:
            if self._load_model is None:
                raise ValueError("this completer was built without a model loader: no draft model can be loaded")
            where = self.lm.describe()
            self.models[spec] = self._load_model(spec, device=where["device"], dtype=where["dtype"],
                                                 backend=where["backend"])
        return self.models[spec]

    def drafter_for(self, name: str | None, draft_model: str | None = None):
        """The drafter called `name` (drafters/registry.py) with the draft model `draft_model` (default:
        the settings'), built once per draft-model spec; None for plain decoding or a model that
        generates elsewhere.

        A draft model whose tokenizer is not the target's raises
        drafters.model_drafter.TokenizerMismatch (a ValueError).
        """
        name = name or self.settings().drafter
        if not self.generator.drafts:
            return None
        spec = draft_model or self.settings().draft_model
        key = (name, spec)
        if key not in self._built:
            engine = self.generator.engine

            def policy():
                if engine.speculation is None:
                    engine.calibrate()
                return engine.speculation

            ctx = DraftContext(ngram=self.ngram, target=self.lm, draft_model=lambda: self.draft_model(spec),
                               policy=policy, get=self.drafter_for, draft_costs=measure_draft_costs)
            self._built[key] = make_drafter(name, ctx)
        return self._built[key]

    def hybrids(self) -> list:
        """The hybrid drafters built so far (one per draft-model spec), for reports."""
        return [d for (name, _), d in self._built.items() if name == "hybrid"]

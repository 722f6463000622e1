"""Drafting with a smaller causal model of the same family, and the hybrid drafter.

`ModelDrafter`: a small model that shares the target's tokenizer drafts k tokens
autoregressively with its own KV cache. On every `propose` the cache is resynced to the
context by longest common prefix (what the target accepted since the last call is
usually an extension of what the drafter already holds), and only the rest is prefilled.
Greedy: the drafts are the draft model's argmaxes and `probs` is None (a deterministic
draft, so q is one-hot; the engine's greedy rule ignores q anyway). Sampling: each draft
token is sampled from q, the draft model's distribution after the same filtering as the
target's p (the one filter, lsp_server/decoding/probs.py), and `probs` carries q so that the
engine's general rule (accept with min(1, p/q), else resample from norm(max(p - q, 0))) keeps
the output exact.
Its drafts are `paid`: the engine verifies them whole.

`HybridDrafter`: n-gram lookup first; the model only where the n-gram drafter has no
confident match and the speculation policy (lsp_server/decoding/speculation.py), counting
the draft model's catch-up on the prompt, says it pays (see its docstring).

This is the one drafter module that needs torch. A draft model is a loaded model of
the backend interface (lsp_server/backends/base.py: forward, new_cache, crop, vocab_size, and
the text side's vocabulary() for the same-tokenizer check), so drafters/ never imports
transformers or LSP. Of the server it imports one leaf, the sampling filter (q filtered
otherwise than p would make sampling inexact; tests/test_architecture.py allows exactly that);
the speculation policy is handed to the hybrid by whoever builds it (drafters/registry.py), and
only `DraftPricing`, what the hybrid asks of it, is named here. Left out on purpose: acceptance
(the engine decides), loading models (lsp_server/backends/loader.py), pass costs
(lsp_server/decoding/speculation.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from drafters.base import Proposal
from drafters.ngram import NGramDrafter
from lsp_server.decoding.probs import filtered_probs  # the engine's own filter: exactness needs the same one


class DraftPricing(Protocol):
    """What the hybrid asks of the speculation policy (lsp_server/decoding/speculation.py `Speculation`)."""

    draft_ms: float | None  # one draft-model pass over one token (None: not measured)

    def best(self, proposal: Proposal, drafter: str = "") -> tuple[int, float]: ...

    def best_model_draft(self, k_max: int, pending: int = 1, source: str = "model") -> tuple[int, float]: ...

    def observe_draft_time(self, k: int, pending: int, measured_ms: float) -> None: ...


class TokenizerMismatch(ValueError):
    """The draft model's tokenizer is not the target's: its token ids would mean other text."""


def check_same_tokenizer(target, draft) -> None:
    """Raise TokenizerMismatch unless `draft` tokenizes exactly as `target` does.

    Compares the vocabularies (token -> id) and the special token ids; the models'
    output sizes may differ by padding rows (Qwen pads its embedding matrix). Models
    without a vocabulary (test models built from a bare config) compare output sizes.
    """
    tname, dname = getattr(target, "name", "target"), getattr(draft, "name", "draft")
    tv, dv = target.vocabulary(), draft.vocabulary()
    if not tv or not dv:
        if target.vocab_size != draft.vocab_size:
            raise TokenizerMismatch(f"draft model {dname!r} has vocabulary size {draft.vocab_size}, "
                                    f"target {tname!r} has {target.vocab_size}: use a draft model of the same family")
        return
    if tv != dv:
        only_t = len(set(tv.items()) - set(dv.items()))
        raise TokenizerMismatch(
            f"draft model {dname!r} does not share the tokenizer of {tname!r} ({len(dv)} vs {len(tv)} tokens, "
            f"{only_t} of the target's tokens differ): use a draft model of the same family")
    ts, ds = target.special_ids(), draft.special_ids()
    for attr in sorted(set(ts) | set(ds)):
        a, b = ts.get(attr), ds.get(attr)
        if a != b:
            raise TokenizerMismatch(f"draft model {dname!r}: {attr} is {b}, target {tname!r} has {a}: "
                                    f"use a draft model of the same family")
    if getattr(target, "fim", None) != getattr(draft, "fim", None):
        raise TokenizerMismatch(f"draft model {dname!r} has FIM tokens {draft.fim}, target {tname!r} has {target.fim}")


class ModelDrafter:
    """Drafts with a small causal model that shares the target's tokenizer.

    Invariant: the draft model's cache holds exactly `self._ids`. `propose(context, k)`
    keeps the longest common prefix of `_ids` and `context[:-1]`, runs the rest of the
    context in one pass (last row of logits only), then k - 1 one-token passes; so a
    call that follows an accepted draft costs one pass over the accepted tokens plus the
    new drafts.
    """

    name = "model"

    def __init__(self, lm, target=None, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, prefill_chunk: int = 512, max_draft: int = 5):
        if target is not None:
            check_same_tokenizer(target, lm)
        self.lm = lm
        self.vocab_size = int(target.vocab_size) if target is not None else int(lm.vocab_size)
        self.prefill_chunk = prefill_chunk
        self.max_draft = max_draft  # longest draft of propose() (HF's assistant default is 5)
        self._ids: list[int] = []
        self._cache = None
        self.forward_passes = 0  # draft-model passes so far (for the cost model and stats)
        self.prefilled = 0  # tokens run through the draft model to resync its cache
        self.set_options(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)

    def set_options(self, options=None, *, temperature: float | None = None, top_k: int | None = None,
                    top_p: float | None = None, seed: int | None = None) -> None:
        """Match the target's sampling: pass DecodeOptions or the fields one by one."""
        if options is not None:
            temperature, top_k, top_p, seed = options.temperature, options.top_k, options.top_p, options.seed
        self.temperature = float(temperature or 0.0)
        self.top_k = int(top_k or 0)
        self.top_p = 1.0 if top_p is None else float(top_p)
        self.gen = torch.Generator(device="cpu")
        # Any q gives exact output; the draft's randomness only has to be independent of the engine's.
        self.gen.manual_seed((seed + 0x5EED) if seed is not None else int(torch.randint(0, 2**62, ()).item()))

    # sources belong to the n-gram drafter; a model drafter has none
    def update_source(self, name: str, tokens: Sequence[int], priority: int = 1) -> None:
        pass

    def forget_source(self, name: str) -> None:
        pass

    def reset(self) -> None:
        if self._cache is not None:
            self.lm.release(self._cache)
        self._ids, self._cache = [], None

    def _keep(self, context: Sequence[int]) -> int:
        """Length of the cached prefix that `context` shares (never all of it: the last token is always run)."""
        keep, limit = 0, min(len(self._ids), len(context) - 1)
        while keep < limit and self._ids[keep] == context[keep]:
            keep += 1
        return keep

    def pending(self, context: Sequence[int]) -> int:
        """Tokens the next draft of `context` must run through the draft model before its
        first new token (the part of the context its cache does not hold; at least 1)."""
        return max(1, len(context) - self._keep(context))

    def _sync(self, context: Sequence[int]) -> torch.Tensor:
        """Make the cache hold `context` and return the logits [V] for the token after it."""
        if self._cache is None:
            self._cache = self.lm.new_cache()
            self._ids = []
        keep = self._keep(context)
        if keep == 0 and self._ids:
            self.lm.release(self._cache)
            self._cache, self._ids = self.lm.new_cache(), []
        elif keep < len(self._ids):
            self.lm.crop(self._cache, keep)
            del self._ids[keep:]
        rest = list(context[keep:])
        logits = None
        for start in range(0, len(rest), self.prefill_chunk):
            chunk = rest[start : start + self.prefill_chunk]
            logits = self.lm.forward(chunk, self._cache, last=1)[-1]
            self._ids.extend(chunk)
            self.forward_passes += 1
        self.prefilled += len(rest)
        return logits

    def _row(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary (padding rows differ between sizes)."""
        v = self.vocab_size
        if logits.shape[-1] == v:
            return logits
        if logits.shape[-1] > v:
            return logits[:v]
        return torch.cat([logits, logits.new_full((v - logits.shape[-1],), float("-inf"))])

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        """Draft min(k, max_draft) tokens."""
        return self.draft(context, min(k, self.max_draft))

    @torch.inference_mode()
    def draft(self, context: Sequence[int], k: int) -> Proposal:
        """Draft exactly k tokens (k draft-model passes, the first over the unsynced context)."""
        if k <= 0 or not context:
            return Proposal([], source=self.name)
        logits = self._row(self._sync(context))
        tokens: list[int] = []
        qs: list[torch.Tensor] | None = None if self.temperature <= 0 else []
        for i in range(k):
            if qs is None:
                tok = int(logits.argmax())
            else:
                q = filtered_probs(logits[None], self.temperature, self.top_k, self.top_p)[0]
                tok = int(torch.multinomial(q, 1, generator=self.gen))
                qs.append(q)
            tokens.append(tok)
            if i + 1 < k:
                logits = self._row(self.lm.forward([tok], self._cache, last=1)[-1])
                self._ids.append(tok)
                self.forward_passes += 1
        # Paid: its k passes already ran, so the engine verifies it whole (lsp_server/decoding/speculation.py).
        return Proposal(tokens, source=self.name, match_len=0, probs=qs, paid=True)


# ------------------------------------------------------------------------------------
# The hybrid
# ------------------------------------------------------------------------------------


@dataclass
class HybridStats:
    ngram: int = 0  # steps drafted by n-gram lookup
    model: int = 0  # steps drafted by the model
    none: int = 0  # steps with no draft (drafting did not pay)
    by_k: dict = field(default_factory=dict)


class HybridDrafter:
    """N-gram lookup first, the draft model only where it is expected to pay.

    Rule, per step (k_max = the engine's k), with the engine's speculation policy
    (lsp_server/decoding/speculation.py), given when the hybrid is built:

    1. Ask the n-gram drafter. Its proposal is *confident* when the matched n-gram has at
       least `min_match` tokens and at least `min_agreement` of the matched positions
       continue with the proposed first token (`Proposal.agreement`). A confident
       proposal is passed on without running the model; the engine trims it to the
       length that pays, exactly as for the ngram drafter.
    2. Otherwise compare expected tokens per millisecond:
       - n-gram (or no draft): what the engine will make of this proposal
         (`policy.best(proposal, "hybrid")`, which includes k = 0, plain decoding);
       - model: `policy.best_model_draft(k_max, pending)`: the model's running acceptance,
         drafting cost = its passes *including the tokens it must first catch up on*
         (`ModelDrafter.pending`: the whole prompt on a cold cache, one or two tokens
         after an accepted step), corrected by what real drafts took.
       The model runs only if it wins; its draft is `paid` and verified whole. Otherwise
       the n-gram draft is passed on whole (the engine trims it, possibly to nothing,
       and lets an untried estimate drift back).
    So where a draft pass is dear (a CPU, a cold draft cache) the hybrid decodes as the
    ngram drafter does, and where it is cheap (a GPU, a warm cache) it drafts with the
    model wherever lookup is silent. The engine tells the policy what the target kept of
    every draft, so the acceptance estimates need no channel through the hybrid.
    `clock` times the model's drafts (tests inject one).
    """

    name = "hybrid"

    def __init__(self, ngram: NGramDrafter, model: ModelDrafter, policy: DraftPricing, *, min_match: int = 3,
                 min_agreement: float = 0.5, clock: Callable[[], float] = time.perf_counter):
        if policy.draft_ms is None:
            raise ValueError("the hybrid needs the draft model's pass costs in its policy (set_draft_costs)")
        self.ngram, self.model, self.policy = ngram, model, policy  # lookup first, the model where it is silent
        self.min_match, self.min_agreement = min_match, min_agreement
        self.clock = clock
        self.stats = HybridStats()

    def update_source(self, name: str, tokens: Sequence[int], priority: int = 1) -> None:
        self.ngram.update_source(name, tokens, priority)

    def forget_source(self, name: str) -> None:
        self.ngram.forget_source(name)

    def set_options(self, options=None, **kw) -> None:
        self.model.set_options(options, **kw)

    def reset(self) -> None:
        """Forget the draft model's cache (not the policy's learned rates)."""
        self.model.reset()

    def confident(self, proposal: Proposal) -> bool:
        return bool(proposal.tokens and proposal.match_len >= self.min_match
                    and (proposal.agreement is None or proposal.agreement >= self.min_agreement))

    def choose(self, proposal: Proposal, k: int, pending: int = 1) -> tuple[str, int]:
        """("ngram" | "model" | "none", draft length) for this step; see the class docstring.
        `pending`: tokens the draft model must catch up on first (ModelDrafter.pending)."""
        if self.confident(proposal):
            return "ngram", len(proposal.tokens)
        rn = self.policy.best(proposal, self.name)[1]
        km, rm = self.policy.best_model_draft(k, pending, self.model.name)
        if km and rm > rn:
            return "model", km
        return ("ngram", len(proposal.tokens)) if proposal.tokens else ("none", 0)

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        if k <= 0:
            return Proposal([], source="")
        ng = NGramDrafter.propose(self.ngram, context, k)  # the chain lookup (a SuffixDrafter's `lookup`)
        pending = 1 if self.confident(ng) else self.model.pending(context)
        kind, n = self.choose(ng, k, pending)
        if kind == "ngram":
            out = Proposal(ng.tokens[:n], source=ng.source, match_len=ng.match_len, agreement=ng.agreement,
                           healed=ng.healed)
        elif kind == "model":
            t0 = self.clock()
            out = self.model.draft(context, n)
            self.policy.observe_draft_time(n, pending, (self.clock() - t0) * 1000)
        else:
            out = Proposal([], source="")
        setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        self.stats.by_k[n] = self.stats.by_k.get(n, 0) + 1
        return out


__all__ = ["DraftPricing", "ModelDrafter", "HybridDrafter", "TokenizerMismatch", "check_same_tokenizer"]

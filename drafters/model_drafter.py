"""Drafting with a smaller causal model of the same family, and the hybrid drafter.

`ModelDrafter`: a small model that shares the target's tokenizer drafts k tokens
autoregressively with its own KV cache. On every `propose` the cache is resynced to the
context by longest common prefix (what the target accepted since the last call is
usually an extension of what the drafter already holds), and only the rest is prefilled.
Greedy: the drafts are the draft model's argmaxes and `probs` is None (a deterministic
draft, so q is one-hot; the engine's greedy rule ignores q anyway). Sampling: each draft
token is sampled from q, the draft model's distribution after the same temperature /
top-k / top-p filtering as the target's p, and `probs` carries q so that the engine's
general rule (accept with min(1, p/q), else resample from norm(max(p - q, 0))) keeps the
output distribution exact.

`HybridDrafter`: n-gram lookup first; the model only where the n-gram drafter has no
confident match and the cost model, counting the draft model's catch-up on the prompt,
says it pays (see its docstring).

This is the one drafter module that needs torch. It takes a loaded model object with
`forward(ids, cache, logits_to_keep) -> logits [n, V]`, `new_cache()`, `vocab_size` and
`tokenizer` (lsp_server.model.LoadedModel), so drafters/ never imports transformers or
LSP. Left out on purpose: acceptance (the engine decides), loading models (model.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .base import Proposal
from .ngram import NGramDrafter


class TokenizerMismatch(ValueError):
    """The draft model's tokenizer is not the target's: its token ids would mean other text."""


def check_same_tokenizer(target, draft) -> None:
    """Raise TokenizerMismatch unless `draft` tokenizes exactly as `target` does.

    Compares the vocabularies (token -> id) and the special token ids; the models'
    output sizes may differ by padding rows (Qwen pads its embedding matrix).
    """
    tt, dt = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    tname, dname = getattr(target, "name", "target"), getattr(draft, "name", "draft")
    if tt is None or dt is None:
        if target.vocab_size != draft.vocab_size:
            raise TokenizerMismatch(f"draft model {dname!r} has vocabulary size {draft.vocab_size}, "
                                    f"target {tname!r} has {target.vocab_size}: use a draft model of the same family")
        return
    tv, dv = tt.get_vocab(), dt.get_vocab()
    if tv != dv:
        only_t = len(set(tv.items()) - set(dv.items()))
        raise TokenizerMismatch(
            f"draft model {dname!r} does not share the tokenizer of {tname!r} ({len(dv)} vs {len(tv)} tokens, "
            f"{only_t} of the target's tokens differ): use a draft model of the same family")
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(tt, attr, None), getattr(dt, attr, None)
        if a != b:
            raise TokenizerMismatch(f"draft model {dname!r}: {attr} is {b}, target {tname!r} has {a}: "
                                    f"use a draft model of the same family")
    if getattr(target, "fim", None) != getattr(draft, "fim", None):
        raise TokenizerMismatch(f"draft model {dname!r} has FIM tokens {draft.fim}, target {tname!r} has {target.fim}")


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Softmax of logits / temperature after top-k and top-p filtering ([n, V] -> [n, V]).

    The same filtering as lsp_server.engine.target_probs (a copy: drafters/ does not
    import the engine; tests/test_model_drafter.py checks the two agree).
    """
    x = logits.float() / max(temperature, 1e-6)
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_x, dim=-1) >= top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x)
    return torch.softmax(x, dim=-1)


class ModelDrafter:
    """Drafts with a small causal model that shares the target's tokenizer.

    Invariant: the draft model's cache holds exactly `self._ids`. `propose(context, k)`
    keeps the longest common prefix of `_ids` and `context[:-1]`, runs the rest of the
    context in one pass (last row of logits only), then k - 1 one-token passes; so a
    call that follows an accepted draft costs one pass over the accepted tokens plus the
    new drafts.
    """

    name = "model"
    wants_hidden = False
    # The engine must not cut a model draft short after the fact: the draft passes are
    # already paid. The length is chosen before drafting (max_draft here, the cost model
    # in HybridDrafter).
    sizes_drafts = True

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
            self._cache, self._ids = self.lm.new_cache(), []
        elif keep < len(self._ids):
            self._cache.crop(-(len(self._ids) - keep))
            del self._ids[keep:]
        rest = list(context[keep:])
        logits = None
        for start in range(0, len(rest), self.prefill_chunk):
            chunk = rest[start : start + self.prefill_chunk]
            logits = self.lm.forward(chunk, self._cache, logits_to_keep=1)[-1]
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

    def propose(self, context: Sequence[int], k: int, hidden: object | None = None) -> Proposal:
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
                logits = self._row(self.lm.forward([tok], self._cache, logits_to_keep=1)[-1])
                self._ids.append(tok)
                self.forward_passes += 1
        return Proposal(tokens, source=self.name, match_len=0, probs=qs)


# ------------------------------------------------------------------------------------
# Cost model and the hybrid
# ------------------------------------------------------------------------------------


@dataclass
class CostModel:
    """Forward-pass costs in milliseconds: target_ms[n - 1] = T(n), one target pass over n
    new tokens; draft_ms = one draft-model pass over one token; draft_token_ms = each
    further token in one draft-model pass (its prefill rate), so a draft pass over m
    tokens costs draft_ms + (m - 1) x draft_token_ms. Target costs past the measured
    range are extrapolated linearly from the last two points."""

    target_ms: list[float]
    draft_ms: float
    draft_token_ms: float = 0.0

    def target(self, n: int) -> float:
        t = self.target_ms
        if n <= len(t):
            return t[n - 1]
        slope = (t[-1] - t[-2]) if len(t) >= 2 else t[-1]
        return t[-1] + slope * (n - len(t))

    def draft(self, k: int, pending: int = 1) -> float:
        """Cost of drafting k tokens when the draft model must first run `pending` tokens
        (its first pass covers them; then k - 1 one-token passes)."""
        if k <= 0:
            return 0.0
        return self.draft_ms + max(0, pending - 1) * self.draft_token_ms + (k - 1) * self.draft_ms

    def rate(self, a: float, k: int, draft_passes: int, extra_ms: float | None = None) -> float:
        """Expected tokens per millisecond for draft length k at acceptance rate a:
        E(k) = (1 - a^(k+1)) / (1 - a) tokens per target pass, over T(k + 1) plus the
        drafting cost (`extra_ms` when given, else `draft_passes` one-token draft passes)."""
        a = min(max(a, 0.0), 0.999)
        expected = (1 - a ** (k + 1)) / (1 - a)
        drafting = draft_passes * self.draft_ms if extra_ms is None else extra_ms
        return expected / (self.target(k + 1) + drafting)

    def best_k(self, a: float, k_max: int, per_token_draft: bool, pending: int = 1,
               scale: float = 1.0) -> tuple[int, float]:
        """The draft length in 0..k_max with the highest rate (0: drafting does not pay).

        per_token_draft: each draft token costs a draft-model pass, the first of them
        over `pending` tokens; `scale` corrects the predicted drafting cost by what was
        measured (HybridDrafter)."""
        best = (0, self.rate(a, 0, 0))
        for k in range(1, k_max + 1):
            extra = scale * self.draft(k, pending) if per_token_draft else 0.0
            r = self.rate(a, k, 0, extra)
            if r > best[1]:
                best = (k, r)
        return best

    @classmethod
    def measure(cls, target, draft=None, ns: Sequence[int] = (1, 2, 4, 8), context: int = 64,
                reps: int = 2, target_ms: Sequence[float] | None = None) -> "CostModel":
        """Time T(n) of `target` (and the draft model's passes) on a cache of `context` tokens.

        Takes the minimum over `reps` runs; points between the measured n are
        interpolated linearly. A few seconds for a 1.5B model on a CPU. With `target_ms`
        given (the engine's calibration, so that the hybrid and the engine's adaptive
        speculation share one cost model) only the draft model is timed: one pass over
        one token, and one over `context` tokens for its prefill rate.
        """
        def timed(lm, n: int, ctx: int = context, keep: int = 0) -> float:
            # keep=0: logits for every row (a verify pass); 1: the last row (a draft pass)
            cache = lm.new_cache()
            ids = [(i * 7919) % max(2, min(lm.vocab_size, 50000)) for i in range(ctx + n)]
            if ctx:
                lm.forward(ids[:ctx], cache, logits_to_keep=1)
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                lm.forward(ids[ctx:], cache, logits_to_keep=keep)
                best = min(best, (time.perf_counter() - t0) * 1000)
                cache.crop(-n)
            return best

        def draft_costs() -> tuple[float, float]:
            if draft is None:
                return 0.0, 0.0
            one = timed(draft, 1, keep=1)
            many = timed(draft, context, ctx=1, keep=1)
            return one, max(0.0, (many - one) / max(1, context - 1))

        if target_ms is not None:
            return cls(list(target_ms), *draft_costs())
        points = {n: timed(target, n) for n in ns}
        top = max(ns)
        target_ms = []
        for n in range(1, top + 1):
            lo = max(m for m in ns if m <= n) if any(m <= n for m in ns) else min(ns)
            hi = min(m for m in ns if m >= n)
            w = 0.0 if hi == lo else (n - lo) / (hi - lo)
            target_ms.append(points[lo] * (1 - w) + points[hi] * w)
        return cls(target_ms, *draft_costs())


@dataclass
class _Acceptance:
    """Running acceptance rate of one draft source (exponential moving average)."""

    rate: float
    weight: float = 0.3

    def update(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.rate += self.weight * (accepted / proposed - self.rate)


@dataclass
class HybridStats:
    ngram: int = 0  # steps drafted by n-gram lookup
    model: int = 0  # steps drafted by the model
    none: int = 0  # steps with no draft (drafting did not pay)
    by_k: dict = field(default_factory=dict)


class HybridDrafter:
    """N-gram lookup first, the draft model only where it is expected to pay.

    Rule, per step (k_max = the engine's k):

    1. Ask the n-gram drafter. Its proposal is *confident* when the matched n-gram has at
       least `min_match` tokens and at least `min_agreement` of the matched positions
       continue with the proposed first token (`Proposal.agreement`). A confident
       proposal is taken without running the model; the engine's adaptive speculation
       then trims it to the length that pays, exactly as for the ngram drafter
       (`sizes_drafts` is False for n-gram proposals, True for model ones).
    2. Otherwise compare expected tokens per millisecond with the cost model
       (`CostModel`): rate = E(k) / (T(k + 1) + drafting cost), E(k) = (1 - a^(k+1)) /
       (1 - a), T(n) the target's cost for a pass over n tokens.
       - n-gram (or no draft): the value the engine's adaptive speculation will get
         from this proposal (`speculation().best(proposal, "hybrid")`, which includes
         k = 0, plain decoding at 1 / T(1)); without a speculation object, the running
         n-gram acceptance with `CostModel.best_k`;
       - model: a = running acceptance of model drafts, k in 1..k_max, drafting cost =
         the draft model's passes *including the tokens it must first catch up on*
         (`ModelDrafter.pending`: the whole prompt on a cold cache, one or two tokens
         after an accepted step), times a correction learned from timing its real
         drafts (`draft_scale`).
       The model runs only if it wins. So where a draft pass is dear (a CPU, a cold
       draft cache) the hybrid decodes as the ngram drafter does, and where it is cheap
       (a GPU, a warm cache) it drafts with the model wherever lookup is silent.
    The running acceptance rates are learned from the contexts themselves: the next call's
    context shows how much of the previous proposal the target kept (the longest common
    prefix of the proposal and the tokens appended since), so the engine needs no
    feedback channel. Drafts from the model carry its q (`probs`) in sampling mode; n-gram
    drafts are one-hot; either way the engine's rule keeps the output exact.
    """

    name = "hybrid"
    wants_hidden = False
    # Read by the engine right after each propose, so it describes the last proposal: a
    # model draft is verified whole (its passes are paid), an n-gram draft is left to the
    # engine's adaptive trimming (Engine.speculation), exactly as for the ngram drafter.
    sizes_drafts = False

    def __init__(self, ngram: NGramDrafter, model: ModelDrafter, costs: CostModel, *, min_match: int = 3,
                 min_agreement: float = 0.5, prior_ngram: float = 0.6, prior_model: float = 0.6,
                 speculation=None):
        self.ngram = ngram
        self.model = model
        self.costs = costs
        self.min_match = min_match
        self.min_agreement = min_agreement
        # A callable returning the engine's adaptive speculation (an object with
        # best(proposal, drafter) -> (k, tokens per ms); a getter, since the engine replaces
        # it when it recalibrates) or returning None; None: value n-gram drafts here.
        self.speculation = speculation
        self.acc = {"ngram": _Acceptance(prior_ngram), "model": _Acceptance(prior_model)}
        self.draft_scale = 1.0  # measured / predicted drafting cost (moving average)
        self.stats = HybridStats()
        self._last: tuple[str, list[int], list[int]] | None = None  # (kind, context, proposal)

    def update_source(self, name: str, tokens: Sequence[int], priority: int = 1) -> None:
        self.ngram.update_source(name, tokens, priority)

    def forget_source(self, name: str) -> None:
        self.ngram.forget_source(name)

    def set_options(self, options=None, **kw) -> None:
        self.model.set_options(options, **kw)

    def reset(self) -> None:
        """Forget the draft model's cache and the pending acceptance verdict (not the learned rates)."""
        self.model.reset()
        self._last = None

    def _learn(self, context: Sequence[int]) -> None:
        """Update the acceptance rate of the source that drafted the previous step."""
        if self._last is None:
            return
        kind, before, draft = self._last
        self._last = None
        n = len(before)
        if len(context) <= n or list(context[:n]) != before:
            return  # a new request: the previous step's outcome is unknown
        new = context[n:]
        accepted = 0
        while accepted < len(draft) and accepted < len(new) and new[accepted] == draft[accepted]:
            accepted += 1
        if accepted == len(new) and accepted < len(draft):
            return  # the sequence stopped mid-draft; no verdict
        self.acc[kind].update(len(draft), accepted)

    def confident(self, proposal: Proposal) -> bool:
        return bool(proposal.tokens and proposal.match_len >= self.min_match
                    and (proposal.agreement is None or proposal.agreement >= self.min_agreement))

    def choose(self, proposal: Proposal, k: int, pending: int = 1) -> tuple[str, int]:
        """("ngram" | "model" | "none", draft length) for this step; see the class docstring.
        `pending`: tokens the draft model must catch up on first (ModelDrafter.pending)."""
        if self.confident(proposal):
            return "ngram", len(proposal.tokens)
        c = self.costs
        spec = self.speculation() if self.speculation is not None else None
        if spec is not None:
            # Pass the whole n-gram draft on: the engine trims it (to nothing if that pays
            # best) and, as for the ngram drafter, lets an untried estimate drift back.
            kn, rn = len(proposal.tokens), spec.best(proposal, self.name)[1] if proposal.tokens else 1.0 / c.target(1)
        else:
            kn, rn = c.best_k(self.acc["ngram"].rate, min(k, len(proposal.tokens)), per_token_draft=False)
        km, rm = c.best_k(self.acc["model"].rate, k, per_token_draft=True, pending=pending, scale=self.draft_scale)
        if km and rm > rn:
            return "model", km
        return ("ngram", kn) if kn else ("none", 0)

    def propose(self, context: Sequence[int], k: int, hidden: object | None = None) -> Proposal:
        self._learn(context)
        if k <= 0:
            return Proposal([], source="")
        ng = self.ngram.propose(context, k)
        pending = 1 if self.confident(ng) else self.model.pending(context)
        kind, n = self.choose(ng, k, pending)
        if kind == "ngram":
            out = Proposal(ng.tokens[:n], source=ng.source, match_len=ng.match_len, agreement=ng.agreement)
        elif kind == "model":
            predicted = self.costs.draft(n, pending)
            t0 = time.perf_counter()
            out = self.model.draft(context, n)
            if predicted > 0:
                measured = (time.perf_counter() - t0) * 1000
                self.draft_scale += 0.3 * (min(max(measured / predicted, 0.25), 20.0) - self.draft_scale)
        else:
            out = Proposal([], source="")
        self.sizes_drafts = kind == "model"
        setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        self.stats.by_k[n] = self.stats.by_k.get(n, 0) + 1
        if out.tokens:
            self._last = (kind, list(context), list(out.tokens))
        return out


__all__ = ["ModelDrafter", "HybridDrafter", "CostModel", "TokenizerMismatch", "check_same_tokenizer",
           "filtered_probs"]

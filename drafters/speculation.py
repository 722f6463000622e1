"""The one speculation policy: pass costs, acceptance estimates, and how long a draft pays.

With per-token acceptance a, verifying k draft tokens yields on average
E(k) = (1 - a^(k+1)) / (1 - a) tokens for one target pass costing T(k + 1), where T(n) is
the time of a pass over n new tokens. The engine verifies the k (0 <= k <= the offered
draft) that maximises E(k) / T(k + 1); k = 0 is plain decoding. On a GPU T(k + 1) ~ T(1)
and long drafts pay; on a CPU a pass over 9 tokens can cost 2-3x one token and only
confident drafts do (docs/design.md, "Adaptive draft length").

A draft model's draft is already paid for when it reaches the engine (its passes ran),
so such a proposal says so (`Proposal.paid`) and is verified whole; the hybrid drafter
asks this policy *before* drafting whether a model draft of k tokens pays, counting the
draft model's passes: `draft_ms` per one-token draft pass, `draft_token_ms` per further
token of its first pass (the catch-up on tokens its cache lacks), times `draft_scale`, a
moving ratio of measured to predicted drafting time.

a is estimated per (drafter, match-length bucket) for n-gram drafts (longer matches are
right more often) and per source for paid drafts ("model"), as a moving average of what
the engine observed, starting from a prior and drifting back to it while a bucket is not
drafted from, so that a bad spell cannot switch drafting off for good.

Pure Python: no torch, no LSP. `measure_pass_costs` / `measure_draft_costs` time a model
through the backend interface (lsp_server/backend.py) and are the only timing code.
"""

from __future__ import annotations

import time
from typing import Sequence

from .base import Proposal


class Speculation:
    """Pass costs and acceptance estimates; chooses draft lengths (see the module docstring)."""

    PRIOR = {0: 0.5, 1: 0.25, 2: 0.35, 3: 0.5, 4: 0.6, 6: 0.7}  # n-gram bucket (match length) -> a
    PRIOR_PAID = 0.6  # a draft model's acceptance before any is observed
    RATE = 0.15  # weight of one observation
    DRIFT = 0.02  # pull toward the prior per undrafted step
    A_MAX = 0.98  # an estimate never reaches 1 (E(k) would grow without bound)

    def __init__(self, costs_ms: dict[int, float], draft_ms: float | None = None, draft_token_ms: float = 0.0):
        self.costs_ms: dict[int, float] = {}
        self.set_costs(costs_ms)
        self.draft_ms = draft_ms  # one draft-model pass over one token (None: no draft model measured)
        self.draft_token_ms = draft_token_ms  # each further token in one draft-model pass
        self.draft_scale = 1.0  # measured / predicted drafting time (moving average)
        self.acceptance: dict[tuple[str, int], float] = {}  # (drafter or paid source, bucket) -> a

    # -- costs ----------------------------------------------------------------------------
    def set_costs(self, costs_ms: dict[int, float]) -> None:
        """Replace T(n) (keeps the acceptance estimates). Needs T(1) and at least one more point."""
        costs = {int(n): float(ms) for n, ms in costs_ms.items()}
        if 1 not in costs or len(costs) < 2:
            raise ValueError(f"pass costs need T(1) and another point, got {sorted(costs)}")
        self.costs_ms = dict(sorted(costs.items()))

    def set_draft_costs(self, draft_ms: float, draft_token_ms: float = 0.0) -> None:
        self.draft_ms, self.draft_token_ms = float(draft_ms), float(draft_token_ms)

    def cost(self, n: int) -> float:
        """T(n) in ms, linearly interpolated between measured points (extrapolated past the last)."""
        pts = list(self.costs_ms.items())
        if n in self.costs_ms:
            return self.costs_ms[n]
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if n0 < n < n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        (n0, t0), (n1, t1) = pts[-2], pts[-1]
        return t1 + (t1 - t0) / max(1, n1 - n0) * (n - n1)

    def draft_cost(self, k: int, pending: int = 1, corrected: bool = True) -> float:
        """Predicted ms to draft k tokens with the draft model when it must first run `pending`
        tokens (its first pass covers them; then k - 1 one-token passes), times draft_scale
        unless `corrected` is False."""
        if k <= 0 or self.draft_ms is None:
            return 0.0
        raw = self.draft_ms + max(0, pending - 1) * self.draft_token_ms + (k - 1) * self.draft_ms
        return raw * (self.draft_scale if corrected else 1.0)

    # -- acceptance -----------------------------------------------------------------------
    @staticmethod
    def bucket(match_len: int) -> int:
        for b in (6, 4, 3, 2, 1):
            if match_len >= b:
                return b
        return 0

    def _key(self, proposal: Proposal, drafter: str) -> tuple[str, int]:
        if proposal.paid:
            return (proposal.source or "model", 0)
        return (drafter, self.bucket(proposal.match_len))

    def _prior(self, key: tuple[str, int], paid: bool) -> float:
        return self.PRIOR_PAID if paid else self.PRIOR[key[1]]

    def estimate(self, proposal: Proposal, drafter: str = "") -> float:
        key = self._key(proposal, drafter)
        return self.acceptance.get(key, self._prior(key, proposal.paid))

    def model_acceptance(self, source: str = "model") -> float:
        return self.acceptance.get((source, 0), self.PRIOR_PAID)

    def observe(self, proposal: Proposal, verified: int, accepted: int, drafter: str = "") -> None:
        """What the target did with a verified draft of `verified` tokens: `accepted` survived.
        verified == 0 (the draft was trimmed to nothing) lets the estimate drift back to its prior."""
        key = self._key(proposal, drafter)
        a = self.acceptance.get(key, self._prior(key, proposal.paid))
        if verified == 0:
            a += self.DRIFT * (self._prior(key, proposal.paid) - a)
        for i in range(min(verified, accepted + 1)):  # positions after the first rejection are unseen
            a += self.RATE * ((1.0 if i < accepted else 0.0) - a)
        self.acceptance[key] = a

    def observe_draft_time(self, k: int, pending: int, measured_ms: float) -> None:
        """Correct the drafting cost by what a real draft of k tokens took (the ratio is bounded,
        so one odd timing cannot run away)."""
        predicted = self.draft_cost(k, pending, corrected=False)
        if predicted > 0:
            self.draft_scale += 0.3 * (min(max(measured_ms / predicted, 0.25), 20.0) - self.draft_scale)

    # -- choices ----------------------------------------------------------------------------
    @staticmethod
    def expected(a: float, k: int) -> float:
        """E(k) = 1 + a + ... + a^k: tokens one pass verifying k drafts yields on average."""
        return sum(a**i for i in range(k + 1))

    def plain_rate(self) -> float:
        """Tokens per ms of plain decoding: one token per T(1)."""
        return 1.0 / self.cost(1)

    def best(self, proposal: Proposal, drafter: str = "") -> tuple[int, float]:
        """(draft length to verify, expected tokens per ms) for a proposal; length 0 is plain decoding."""
        best_k, best = 0, self.plain_rate()
        if not proposal.tokens:
            return best_k, best
        a = min(self.estimate(proposal, drafter), self.A_MAX)
        for k in range(1, len(proposal.tokens) + 1):
            value = self.expected(a, k) / self.cost(k + 1)
            if value > best:
                best_k, best = k, value
        return best_k, best

    def choose(self, proposal: Proposal, drafter: str = "") -> int:
        """How much of `proposal` the engine verifies: all of a paid draft, else the best length."""
        if proposal.paid:
            return len(proposal.tokens)
        return self.best(proposal, drafter)[0]

    def best_model_draft(self, k_max: int, pending: int = 1, source: str = "model") -> tuple[int, float]:
        """(k, expected tokens per ms) of drafting k in 1..k_max tokens with the draft model,
        its drafting time included; (0, plain rate) when no length beats plain decoding."""
        best = (0, self.plain_rate())
        if self.draft_ms is None:
            return best
        a = min(self.model_acceptance(source), self.A_MAX)
        for k in range(1, k_max + 1):
            rate = self.expected(a, k) / (self.cost(k + 1) + self.draft_cost(k, pending))
            if rate > best[1]:
                best = (k, rate)
        return best

    def snapshot(self) -> dict:
        return {"costs_ms": {str(k): round(v, 2) for k, v in self.costs_ms.items()},
                "draft_ms": None if self.draft_ms is None else round(self.draft_ms, 2),
                "draft_token_ms": round(self.draft_token_ms, 3),
                "draft_scale": round(self.draft_scale, 3),
                "acceptance": {f"{d or 'drafter'}/match>={b}": round(v, 3) for (d, b), v in self.acceptance.items()}}


# ------------------------------------------------------------------------------------
# Measuring (the only timing code; everything above takes costs as numbers)
# ------------------------------------------------------------------------------------


def _probe_ids(vocab_size: int, n: int, a: int, b: int) -> list[int]:
    return [(a + b * i) % max(2, min(vocab_size, 50000)) for i in range(n)]


def measure_pass_costs(lm, n_max: int = 9, reps: int = 3, context: Sequence[int] | None = None) -> dict[int, float]:
    """T(n) in ms of `lm` (a backend) for n in {1, 2, 3, 4, 6, n_max}, over a 64-token context.

    Best of `reps` timings per n, interleaved (a burst of load hits one sample, not one n);
    then smoothed: a pass never gets cheaper with more tokens, and never costs more than
    running its tokens one by one.
    """
    ctx = list(context) if context else _probe_ids(lm.vocab_size, 64, 7, 13)
    probe = _probe_ids(lm.vocab_size, n_max, 11, 17)
    cache = lm.new_cache()
    try:
        lm.forward(ctx, cache, last=1)
        lm.forward(probe[:1], cache, last=1)  # warm-up
        lm.crop(cache, len(ctx))
        points = sorted({1, 2, 3, 4, 6, n_max} & set(range(1, n_max + 1)))
        costs = {n: float("inf") for n in points}
        for _ in range(reps):
            for n in points:
                t = time.perf_counter()
                lm.forward(probe[:n], cache, last=n)
                costs[n] = min(costs[n], (time.perf_counter() - t) * 1000)
                lm.crop(cache, len(ctx))
    finally:
        lm.release(cache)
    for i, n in enumerate(points):
        if i:
            costs[n] = max(costs[n], costs[points[i - 1]])
        costs[n] = min(costs[n], n * costs[1])
    return costs


def measure_draft_costs(draft, context: int = 64, reps: int = 2) -> tuple[float, float]:
    """(ms of one draft-model pass over one token, ms per further token in one pass)."""
    def timed(n: int, ctx: int) -> float:
        ids = _probe_ids(draft.vocab_size, ctx + n, 0, 7919)
        best = float("inf")
        cache = draft.new_cache()
        try:
            if ctx:
                draft.forward(ids[:ctx], cache, last=1)
            for _ in range(reps):
                t0 = time.perf_counter()
                draft.forward(ids[ctx:], cache, last=1)
                best = min(best, (time.perf_counter() - t0) * 1000)
                draft.crop(cache, ctx)
        finally:
            draft.release(cache)
        return best

    one = timed(1, context)
    many = timed(context, 1)
    return one, max(0.0, (many - one) / max(1, context - 1))

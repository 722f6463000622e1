"""The one speculation policy: pass costs, acceptance estimates, and how long a draft pays.

T(n) is the time of a target pass over n new tokens. Verifying k draft tokens costs
T(k + 1) and yields E(k) tokens on average: 1 (the target's own token) plus the drafts
that survive. With a1 the chance that the first draft token is right and ac the chance
that a later one is right given the ones before it were,
E(k) = 1 + a1 * (1 + ac + ... + ac^(k-1)). (Drafts are right or wrong in runs: after a
right first token the next ones are right far more often, so one rate for every position
undervalues long drafts; docs/drafters.md has the measured rates.)

The engine verifies the k (0 <= k <= the offered draft) with the most net tokens,
E(k) - rho * T(k + 1), where rho is the rate of plain decoding, 1 / T(1) (k = 0 scores
exactly 0). This is the renewal-reward rule: a round is worth the tokens it yields minus
what the same time would yield otherwise, so extra draft tokens are verified while they
pay for their extra time at the plain rate, over the whole budget rather than per pass.
(Maximising E(k) / T(k + 1) instead stops early: it drops a longer draft whose extra
tokens are cheaper than plain decoding's but less cheap than the first few.) On a GPU
T(k + 1) ~ T(1) and long drafts pay; on a CPU a pass over 9 tokens costs 2-3x one token
and only likely drafts do (docs/design.md, "Adaptive draft length").

Pass costs are learned from the engine's own passes (`observe_pass`): T(n) = level *
shape(n). The shape starts as the calibration at load (`measure_pass_costs`) and the
level at 1; each timed pass moves the level (load moves every n alike) and, for n > 1,
the shape of its n, in log space, each step clipped so that one stalled pass cannot move
an estimate far, while a sustained change of load is followed within tens of passes. T(n)
for an n never run is interpolated from its neighbours. A pass over n tokens never costs
less than one over one, nor more than n one-token passes, nor more than one over more
tokens. Costs only decide how much of a
draft to verify; the target decides every token, so learning never changes the output.
When no draft has been verified for PROBE_EVERY passes, the engine verifies the best
positive length once anyway, so that costs measured in a bad minute are measured again.

Acceptance is estimated per (drafter, where the draft was copied from: the context,
another buffer or the history, match-length bucket, healed or exact) for n-gram drafts
(longer matches, and matches in the context, are right more often; a healed match starts
with re-encoded text, drafters/ngram.py, and starts from the exact match's prior) and per source for paid drafts ("model"), as moving
averages of a1 and ac starting from priors. Every offered n-gram draft is scored in full
against the tokens the target goes on to produce (`Scorer`), whether or not the engine
verified it: greedy, a draft token would have been accepted exactly when it equals the
target's next token; sampling, the chance of either is p(d). So the estimates never
depend on what the policy chose to verify, and a bucket the policy stopped drafting
from keeps being measured: no drift back to the prior is needed.

A draft model's draft is already paid for when it reaches the engine (its passes ran),
so such a proposal says so (`Proposal.paid`) and is verified whole; the hybrid drafter
asks this policy *before* drafting whether a model draft of k tokens pays, counting the
draft model's passes: `draft_ms` per one-token draft pass, `draft_token_ms` per further
token of its first pass (the catch-up on tokens its cache lacks), times `draft_scale`, a
moving ratio of measured to predicted drafting time.

Pure Python: no torch, no LSP. `measure_pass_costs` / `measure_draft_costs` time a model
through the backend interface (lsp_server/backends/base.py) and are the only timing code.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from drafters.base import Proposal
from lsp_server.decoding.nodes import NodeRates, NodeScorer, order_and_count


class Speculation:
    """Pass costs and acceptance estimates; chooses draft lengths (see the module docstring)."""

    # First-token acceptance a1 per n-gram bucket (match length) of a copy from the context,
    # before any is observed; a copy from another buffer or the history starts at PRIOR_OTHER.
    # (Measured on this project's history, docs/drafters.md: 0.45-0.54, 0.65-0.72, 0.79, 0.89
    # for buckets 2, 3, 4, 6; 0.2-0.4 for copies from other buffers.)
    PRIOR = {0: 0.3, 1: 0.3, 2: 0.45, 3: 0.6, 4: 0.7, 6: 0.85}
    PRIOR_OTHER = 0.3
    PRIOR_CONT = 0.8  # ac: a later draft token is right, given the ones before it were
    PRIOR_PAID = 0.6  # a draft model's a1 and ac before any is observed
    RATE = 0.05  # weight of one observation (every offered draft is scored, so ~20 make the estimate)
    A_MAX = 0.98  # an estimate never reaches 1 (E(k) would grow without bound)
    LEVEL_RATE = 0.1  # weight of one timed pass in the load level
    SHAPE_RATE = 0.05  # ... and in the shape T(n) / T(1) of its n
    CLIP = math.log(1.5)  # one pass moves an estimate by at most RATE * log(1.5)
    PROBE_EVERY = 64  # passes without a verified draft before one is verified anyway

    def __init__(self, costs_ms: dict[int, float], draft_ms: float | None = None, draft_token_ms: float = 0.0,
                 learn: bool = True):
        self.shape: dict[int, float] = {}  # n -> ms at level 1 (the calibration, then learned)
        self.level = 1.0  # load: T(n) = level * shape(n)
        self.passes: dict[int, int] = {}  # n -> timed passes observed since the costs were set
        self.learn = learn  # learn pass costs from timed passes (tests that inject costs turn it off)
        self.plain_streak = 0  # passes in a row without a verified draft
        self.probes = 0
        self.set_costs(costs_ms)
        self.draft_ms = draft_ms  # one draft-model pass over one token (None: no draft model measured)
        self.draft_token_ms = draft_token_ms  # each further token in one draft-model pass
        self.draft_scale = 1.0  # measured / predicted drafting time (moving average)
        self.acceptance: dict[tuple[str, int], float] = {}  # (drafter or paid source, bucket) -> a1
        self.continuation: dict[tuple[str, int], float] = {}  # (drafter or paid source, bucket) -> ac
        self.observed: dict[tuple[str, int], int] = {}  # drafts scored per key
        self.nodes = NodeRates()  # weighted drafts (trees): each node's chance, learned (lsp_server/decoding/nodes.py)

    # -- costs ----------------------------------------------------------------------------
    def set_costs(self, costs_ms: dict[int, float]) -> None:
        """Replace T(n) by a measurement (keeps the acceptance estimates, restarts cost learning).
        Needs T(1) and at least one more point."""
        costs = {int(n): float(ms) for n, ms in costs_ms.items()}
        if 1 not in costs or len(costs) < 2:
            raise ValueError(f"pass costs need T(1) and another point, got {sorted(costs)}")
        self.shape = dict(sorted(costs.items()))
        self.level = 1.0
        self.passes = {}

    @property
    def costs_ms(self) -> dict[int, float]:
        """The current estimate of T(n) at every n with a point (measured or observed)."""
        return {n: self.cost(n) for n in self.shape}

    def set_draft_costs(self, draft_ms: float, draft_token_ms: float = 0.0) -> None:
        self.draft_ms, self.draft_token_ms = float(draft_ms), float(draft_token_ms)

    def _shape(self, n: int) -> float:
        return self._shape_of(self.shape, n)

    @staticmethod
    def _shape_of(shape: dict[int, float], n: int) -> float:
        """shape(n), linearly interpolated between points (extrapolated past the last), and never
        above the shape at a larger n: a pass over fewer tokens does not cost more. (A point
        learned from a few passes in a loaded minute once made T(3) 2.24 x T(1) beside T(4)
        1.98 x, and the policy then skipped 2-token drafts it would have verified as 3.)"""
        if n in shape:
            value = shape[n]
        else:
            pts = list(shape.items())
            value = None
            for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
                if n0 < n < n1:
                    value = t0 + (t1 - t0) * (n - n0) / (n1 - n0)
                    break
            if value is None:
                (n0, t0), (n1, t1) = pts[-2], pts[-1]
                value = t1 + (t1 - t0) / max(1, n1 - n0) * (n - n1)
        later = [t for m, t in shape.items() if m > n]
        return min([value, *later])

    def cost(self, n: int) -> float:
        """T(n) in ms: the load level times the shape at n."""
        return self.level * self._shape(n)

    PAYS = 0.9  # a draft length "can pay" when its pass costs less than this share of the same tokens one by one

    def can_pay(self, k_max: int) -> bool:
        """Whether any draft of 1..k_max tokens could pay at all: T(k + 1) < PAYS (k + 1) T(1),
        the most even a draft accepted whole can buy. Where passes cost what their rows cost one
        by one (llama.cpp's one-row verification on a CPU) none can, and the engine does not
        consult the drafter (its lookup would cost time every step for nothing)."""
        one = self._shape(1)
        return any(self._shape(k + 1) < self.PAYS * (k + 1) * one for k in range(1, k_max + 1))

    def observe_pass(self, n: int, ms: float) -> None:
        """A target pass over n tokens took `ms`: move the level and the shape at n toward it."""
        self.plain_streak = self.plain_streak + 1 if n <= 1 else 0
        if not self.learn or n < 1 or not ms > 0:
            return
        self.passes[n] = self.passes.get(n, 0) + 1
        err = math.log(ms) - math.log(self.cost(n))
        err = max(-self.CLIP, min(self.CLIP, err))
        self.level *= math.exp(self.LEVEL_RATE * err)
        if n > 1:
            one = self.shape[1]
            value = self._shape(n) * math.exp(self.SHAPE_RATE * err)
            self.shape[n] = min(max(value, one), n * one)
            self.shape = dict(sorted(self.shape.items()))

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
        # Lookup drafts copied from another buffer or the history are right far less often
        # than drafts from the context at the same match length (docs/drafters.md): own rates.
        where = "" if proposal.source in ("context", "") else "+history" if proposal.source == "history" else "+buffers"
        # A healed match (the cursor split a token; its rest is re-encoded text) is learned apart:
        # its first draft token is not a copied id, so its rate may differ at the same length.
        healed = "+healed" if proposal.healed else ""
        return (drafter + where + healed, self.bucket(proposal.match_len))

    def _prior(self, key: tuple[str, int], paid: bool) -> float:
        if paid:
            return self.PRIOR_PAID
        other = "+buffers" in key[0] or "+history" in key[0]
        return self.PRIOR_OTHER if other else self.PRIOR[key[1]]

    def rates(self, proposal: Proposal, drafter: str = "") -> tuple[float, float]:
        """(a1, ac) for a proposal: its first token's and a later token's chance of being right."""
        key = self._key(proposal, drafter)
        a1 = self.acceptance.get(key, self._prior(key, proposal.paid))
        ac = self.continuation.get(key, a1 if proposal.paid else self.PRIOR_CONT)  # a model's: one rate until observed
        return min(a1, self.A_MAX), min(ac, self.A_MAX)

    def estimate(self, proposal: Proposal, drafter: str = "") -> float:
        return self.rates(proposal, drafter)[0]

    def model_acceptance(self, source: str = "model") -> float:
        return self.acceptance.get((source, 0), self.PRIOR_PAID)

    def observe(self, proposal: Proposal, verified: int, accepted: int, drafter: str = "") -> None:
        """What the target did with `verified` tokens of a draft: the first `accepted` were right,
        and (when accepted < verified) the next one was wrong; positions after it are unseen."""
        if verified <= 0:
            return
        key = self._key(proposal, drafter)
        a1, ac = self.rates(proposal, drafter)
        a1 += self.RATE * ((1.0 if accepted > 0 else 0.0) - a1)
        for i in range(1, min(verified, accepted + 1)):
            ac += self.RATE * ((1.0 if i < accepted else 0.0) - ac)
        self.acceptance[key], self.continuation[key] = a1, ac
        self.observed[key] = self.observed.get(key, 0) + 1

    def scorer(self, drafter: str = "") -> "Scorer":
        """A per-generation scorer of offered drafts (see `Scorer`)."""
        return Scorer(self, drafter)

    def observe_draft_time(self, k: int, pending: int, measured_ms: float) -> None:
        """Correct the drafting cost by what a real draft of k tokens took (the ratio is bounded,
        so one odd timing cannot run away)."""
        predicted = self.draft_cost(k, pending, corrected=False)
        if predicted > 0:
            self.draft_scale += 0.3 * (min(max(measured_ms / predicted, 0.25), 20.0) - self.draft_scale)

    # -- choices ----------------------------------------------------------------------------
    @staticmethod
    def expected(a: float, k: int, ac: float | None = None) -> float:
        """E(k) = 1 + a * (1 + ac + ... + ac^(k-1)) (ac defaults to a: 1 + a + ... + a^k)."""
        ac = a if ac is None else ac
        return 1.0 + a * sum(ac**i for i in range(k))

    def plain_rate(self) -> float:
        """Tokens per ms of plain decoding: one token per T(1)."""
        return 1.0 / self.cost(1)

    def _net(self, a1: float, ac: float, k: int, extra_ms: float = 0.0) -> float:
        """Net tokens of verifying k drafts: E(k) minus what plain decoding makes in the same time."""
        return self.expected(a1, k, ac) - (self.cost(k + 1) + extra_ms) * self.plain_rate()

    def best(self, proposal: Proposal, drafter: str = "") -> tuple[int, float]:
        """(draft length to verify, expected tokens per ms) for a proposal; length 0 is plain decoding."""
        k = self._best_k(proposal, drafter)[0]
        if k == 0:
            return 0, self.plain_rate()
        a1, ac = self.rates(proposal, drafter)
        return k, self.expected(a1, k, ac) / self.cost(k + 1)

    def _best_k(self, proposal: Proposal, drafter: str) -> tuple[int, int]:
        """(best length >= 0, best length >= 1) by net tokens; (0, 0) for an empty proposal."""
        if not proposal.tokens:
            return 0, 0
        a1, ac = self.rates(proposal, drafter)
        nets = [self._net(a1, ac, k) for k in range(1, len(proposal.tokens) + 1)]
        pos = 1 + max(range(len(nets)), key=nets.__getitem__)
        return (pos if nets[pos - 1] > 0.0 else 0), pos

    def choose(self, proposal: Proposal, drafter: str = "") -> int:
        """How much of `proposal` the engine verifies: all of a paid draft, else the best length
        (the best positive one as a probe after PROBE_EVERY passes without a draft)."""
        if proposal.paid:
            return len(proposal.tokens)
        if proposal.weights is not None:  # a weighted draft (a tree): its best-first nodes that pay (nodes.py)
            k, pos = order_and_count(proposal, self.nodes.path_probs(proposal),
                                     lambda e, n: e - self.cost(n + 1) * self.plain_rate())
        else:
            k, pos = self._best_k(proposal, drafter)
        if k == 0 and pos and self.learn and self.plain_streak >= self.PROBE_EVERY:
            self.plain_streak = 0
            self.probes += 1
            return pos
        return k

    def best_model_draft(self, k_max: int, pending: int = 1, source: str = "model") -> tuple[int, float]:
        """(k, expected tokens per ms) of drafting k in 1..k_max tokens with the draft model,
        its drafting time included; (0, plain rate) when no length beats plain decoding."""
        best = (0, self.plain_rate())
        if self.draft_ms is None:
            return best
        probe = Proposal([0], source=source, paid=True)
        a1, ac = self.rates(probe)
        net = 0.0
        for k in range(1, k_max + 1):
            value = self._net(a1, ac, k, self.draft_cost(k, pending))
            if value > net:
                net = value
                best = (k, self.expected(a1, k, ac) / (self.cost(k + 1) + self.draft_cost(k, pending)))
        return best

    def snapshot(self) -> dict:
        """The live estimates, for `ditto/stats` and reports. Read from another thread than the
        engine's: every dict is copied first (one C-level copy, atomic under the GIL)."""
        shape, level = dict(self.shape), self.level
        acceptance, continuation, observed = dict(self.acceptance), dict(self.continuation), dict(self.observed)
        used = {n: self._shape_of(shape, n) for n in shape}  # the costs the choices use
        t1 = level * used[1]
        return {"costs_ms": {str(n): round(level * v, 2) for n, v in used.items()},
                "cost_ratios": {str(n): round(level * v / t1, 3) for n, v in used.items() if n > 1},
                "load_level": round(level, 3),
                "passes_timed": {str(n): c for n, c in sorted(dict(self.passes).items())},
                "learning_costs": self.learn,
                "probes": self.probes,
                "draft_ms": None if self.draft_ms is None else round(self.draft_ms, 2),
                "draft_token_ms": round(self.draft_token_ms, 3),
                "draft_scale": round(self.draft_scale, 3),
                "acceptance": {f"{d or 'drafter'}/match>={b}": round(v, 3) for (d, b), v in acceptance.items()},
                "acceptance_later": {f"{d or 'drafter'}/match>={b}": round(v, 3) for (d, b), v in continuation.items()},
                "drafts_scored": {f"{d or 'drafter'}/match>={b}": c for (d, b), c in observed.items()},
                "nodes": self.nodes.snapshot()}


class Scorer:
    """Scores every offered n-gram draft in full against what the target goes on to produce.

    `offer` before the engine trims a draft (at = length of the sequence it continues);
    `settle` after each round with the sequence so far: a draft is scored once a wrong
    token shows or all of it is confirmed; `settle(seq, final=True)` at the end scores the
    rest on the positions seen. Paid drafts are verified whole and observed as verified.
    """

    def __init__(self, policy: Speculation, drafter: str = ""):
        self.policy = policy
        self.drafter = drafter
        self.pending: list[tuple[Proposal, list[int], int]] = []
        self.nodes = NodeScorer(policy.nodes)  # weighted drafts: every node (lsp_server/decoding/nodes.py)

    def offer(self, proposal: Proposal, at: int) -> None:
        if proposal.tokens and proposal.weights is not None and not proposal.paid:
            self.nodes.offer(proposal, at)
        elif proposal.tokens and not proposal.paid:
            self.pending.append((proposal, list(proposal.tokens), at))

    def settle(self, seq: Sequence[int], final: bool = False) -> None:
        self.nodes.settle(seq, final)
        keep = []
        for proposal, tokens, at in self.pending:
            seen = min(len(tokens), len(seq) - at)
            m = 0
            while m < seen and seq[at + m] == tokens[m]:
                m += 1
            if m < seen:  # wrong at m
                self.policy.observe(proposal, m + 1, m, self.drafter)
            elif m == len(tokens) or final:
                self.policy.observe(proposal, m, m, self.drafter)
            else:
                keep.append((proposal, tokens, at))
        self.pending = keep


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

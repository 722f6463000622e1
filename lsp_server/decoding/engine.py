"""The decode loop: prefill, propose, verify, accept (exact speculative decoding).

Torch only; knows nothing of LSP or tokenizers' text. One `Engine` wraps one loaded
model (the backend interface of lsp_server/backends/base.py: forward over new tokens with the
logits of the last rows, new_cache, crop, release, stop_ids) and is used from one thread
(the scheduler's model worker). How much of a draft to verify is the speculation
policy's choice (lsp_server/decoding/speculation.py); the engine times each target pass and tells
the policy (its live estimate of the pass costs), and has every offered draft scored
against the tokens the target produced.

Invariant of the loop: the KV cache holds every token of `seq` except the last one. A
target pass feeds [seq[-1]] + draft (k + 1 tokens) and gets k + 1 rows of logits; row i
is the target's distribution for the token after input i. After acceptance the cache is
cropped to exactly the accepted prefix, so the invariant holds again.

Acceptance rules (Leviathan et al. 2023): accept.py, next to their code. Drafting off (k = 0) is
the same loop with empty drafts: the reference every speculative result must equal.

Every model pass goes through `_forward`, which counts a pass begun after `cancel` was set
(`Stats.stale_passes`) and calls the engine's optional `hooks` (lsp_server/decoding/types.py
`PassHooks`: the server's debug hooks, installed only with `ditto-lsp serve --debug-hooks`) with
the caller's `RequestContext`, passed down with each call rather than kept on the engine.

KV reuse across requests: `generate(cache_key=...)` keeps the cache of the last sequence
under that key (least recently used evicted past `max_cached_docs` or
`max_cached_tokens`); a new prompt keeps the longest common token prefix and prefills
only the rest.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Sequence

import torch

from drafters.base import Drafter, Proposal
from lsp_server.decoding.speculation import Speculation, measure_pass_costs
from lsp_server.decoding.accept import accept, sureness
from lsp_server.decoding.healing import Healing
from lsp_server.decoding.state import KV, Call, Loop, completion
from lsp_server.decoding.tree import fit, parents_of, verify_tree
from lsp_server.decoding.types import (
    Cancelled,
    Completion,
    DecodeOptions,
    PassHooks,
    RequestContext,
    Round,
    Stats,
    StopRule,
)


class Engine:
    def __init__(self, lm, max_cached_docs: int = 8, max_cached_tokens: int = 32768, hooks: PassHooks | None = None):
        self.lm = lm
        self.hooks = hooks  # called around every model pass (lsp_server/lsp/worker/debug.py), None in production
        self.stale_passes = 0  # passes begun after their call's `cancel` was set, over this engine's life
        self.speculation: Speculation | None = None  # set by calibrate()
        self.max_cached_docs = max_cached_docs
        self.max_cached_tokens = max_cached_tokens
        self._kv: OrderedDict[str, KV] = OrderedDict()
        self._lock = threading.Lock()  # one generation at a time
        self.active: KV | None = None  # the sequence being decoded (for tests and traces)

    # -- KV store -----------------------------------------------------------------------
    def cached_tokens(self) -> int:
        return sum(len(s.ids) for s in self._kv.values())

    def cached_keys(self) -> list[str]:
        return list(self._kv)

    def cached_ids(self, key: str) -> list[int]:
        """The token ids the cache of `key` holds ([] if none)."""
        state = self._kv.get(key)
        return list(state.ids) if state is not None else []

    def forget(self, key: str) -> None:
        state = self._kv.pop(key, None)
        if state is not None:
            self.lm.release(state.cache)

    def clear_cache(self) -> None:
        while self._kv:
            self.lm.release(self._kv.popitem()[1].cache)

    def calibrate(self, n_max: int = 9, reps: int = 3, context: Sequence[int] | None = None) -> dict[int, float]:
        """Measure T(n) (lsp_server/decoding/speculation.py measure_pass_costs) and use it; returns {n: ms}."""
        with self._lock:
            costs = measure_pass_costs(self.lm, n_max=n_max, reps=reps, context=context)
        return dict(self.use_costs(costs).shape)  # the costs in use (n T(1) on a serial_rows backend)

    def use_costs(self, costs: dict[int, float]) -> Speculation:
        """Pass costs for the adaptive draft length; the policy object stays the same one
        (drafters built on it keep seeing it), only its costs change.

        On a backend whose multi-row passes run their rows one by one (`serial_rows`: llama.cpp)
        T(n) is n T(1) by construction; a measurement says so within its noise, and timed on a
        busy core it once said otherwise (three servers calibrating on one core at a benchmark's
        start: that server drafted 63 tokens for nothing). Only T(1) is taken from it there."""
        if self.lm.serial_rows and 1 in costs:
            costs = {n: n * costs[1] for n in costs}
        if self.speculation is None:
            self.speculation = Speculation(costs)
        else:
            self.speculation.set_costs(costs)
        return self.speculation

    def _take_state(self, key: str | None) -> KV:
        if key is not None and key in self._kv:
            state = self._kv.pop(key)
            state.loop = None  # another prompt will use this cache: a paused generation cannot resume
            return state
        return KV([], self.lm.new_cache())

    def paused(self, key: str) -> bool:
        """Whether a generation paused (or was cancelled) on `key`'s cache and can `resume`."""
        state = self._kv.get(key)
        return state is not None and state.loop is not None

    @property
    def lock(self) -> threading.Lock:
        """Held while the model runs for one call (lsp_server/decoding/prefix.py runs its fills under it)."""
        return self._lock

    def adopt(self, key: str, ids: list[int], cache) -> None:
        """Make `cache` (holding `ids`) the cache of `key`, in place of its own (prefix.py `seed`)."""
        self.forget(key)
        self._put_state(key, KV(list(ids), cache))

    def _put_state(self, key: str | None, state: KV) -> None:
        if key is None or self.max_cached_docs <= 0:
            self.lm.release(state.cache)
            return
        self._kv[key] = state
        self._kv.move_to_end(key)
        while self._kv and (len(self._kv) > self.max_cached_docs or self.cached_tokens() > self.max_cached_tokens):
            self.lm.release(self._kv.popitem(last=False)[1].cache)

    @contextmanager
    def _holding(self, key: str | None, state: KV):
        """Run the body on `state`, taken from the store for `key`, and put it back after, as far as it
        got. A failed pass may leave the cache half-written: then it is released and never reused."""
        self.active = state
        try:
            yield
        except BaseException:
            self.lm.release(state.cache)
            state.cache, state.ids = None, []
            raise
        finally:
            self.active = None
            if state.ids and state.cache is not None:
                self._put_state(key, state)
            elif state.cache is not None:
                self.lm.release(state.cache)

    def _forward(self, call: Call, ids: Sequence[int], cache, last: int) -> torch.Tensor:
        """One model pass, counted as stale when begun after the call's `cancel` was set, between the hooks."""
        if call.cancel is not None and call.cancel.is_set():
            call.stats.stale_passes += 1
            self.stale_passes += 1
        if self.hooks is not None:
            self.hooks.before_pass(call.ctx, len(ids))
        logits = self.lm.forward(ids, cache, last=last)
        if self.hooks is not None:
            self.hooks.after_pass(call.ctx, len(ids))
        return logits

    # -- phases -------------------------------------------------------------------------
    def prefill(self, state: KV, prompt: Sequence[int], opts: DecodeOptions, stats: Stats,
                cancel: threading.Event | None, ctx: RequestContext | None = None) -> None:
        """Make `state` hold prompt[:-1]: keep the common prefix, run the rest in chunks.

        prompt: [P] token ids; after: len(state.ids) == P - 1 == cache length.
        """
        want = list(prompt[:-1])
        keep = 0
        limit = min(len(state.ids), len(want))
        while keep < limit and state.ids[keep] == want[keep]:
            keep += 1
        # Passes that are not batch-invariant keep whole blocks only (lsp_server/backends/base.py WholeBlocks).
        keep = self.lm.reusable(state.cache, keep, len(want))
        if keep < len(state.ids):
            self.lm.crop(state.cache, keep)
            del state.ids[keep:]
        stats.reused_tokens = keep
        # Chunks end at multiples of `step` (absolute positions); where the backend cuts passes on
        # whole blocks, step is a multiple of the block, so a chunk finished before a cancel stays reusable.
        call = Call(stats, cancel, ctx)
        step = max(1, opts.prefill_chunk)
        block = self.lm.block
        if block:
            step = max(block, step - step % block)
        pos = keep
        while pos < len(want):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            end = min(len(want), (pos // step + 1) * step)
            chunk = want[pos:end]
            self._forward(call, chunk, state.cache, last=1)
            state.ids.extend(chunk)
            stats.prefill_tokens += len(chunk)
            pos = end

    def warm(self, prompt: Sequence[int], cache_key: str, cancel: threading.Event | None = None,
             chunk: int = 64, ctx: RequestContext | None = None) -> Stats:
        """Prefill `prompt` (all but its last token) into the cache of `cache_key`, without decoding.

        For idle time: a request for the same prompt then finds it cached. Runs in chunks of
        `chunk` tokens with the `cancel` flag checked between them, so a request that
        arrives waits at most one chunk; what was prefilled before a cancel stays cached
        (the request continues from it). Returns the prefill statistics (stop_reason
        "cancelled" when stopped early).
        """
        stats = Stats()
        t0 = time.perf_counter()
        if len(prompt) < 2:
            return stats
        with self._lock:
            state = self._take_state(cache_key)
            with self._holding(cache_key, state):
                try:
                    self.prefill(state, prompt, DecodeOptions(prefill_chunk=max(1, chunk)), stats, cancel, ctx)
                except Cancelled:
                    stats.stop_reason = "cancelled"
        stats.prefill_ms = stats.wall_ms = (time.perf_counter() - t0) * 1000
        return stats

    def propose(self, drafter: Drafter | None, seq: list[int], k: int, trees: bool = False) -> Proposal:
        rows = self.lm.fixed_rows
        if rows is not None:
            # A backend with a fixed pass shape (lsp_server/backends/torch/model.py pad_to; docs/gpu.md)
            # is exact only for passes within it: [last] + at most rows - 1 drafts.
            k = min(k, rows - 1)
        if drafter is None or k <= 0:
            return Proposal([])
        proposal = drafter.propose(seq, k)
        if proposal.tree is not None:  # a tree: at most k levels (and rows - 1 nodes), or its main path (tree.py)
            return fit(proposal, k, rows - 1 if rows is not None else len(proposal.tokens), trees and self.lm.trees)
        if len(proposal.tokens) > k:
            proposal.tokens = proposal.tokens[:k]
        return proposal

    def verify(self, state: KV, seq: list[int], draft: list[int], call: Call) -> torch.Tensor:
        """One target pass over [seq[-1]] + draft; returns logits [k + 1, V]."""
        logits = self._forward(call, [seq[-1], *draft], state.cache, last=len(draft) + 1)
        state.ids.append(seq[-1])
        state.ids.extend(draft)
        return logits

    # -- the loop -----------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        *,
        drafter: Drafter | None = None,
        options: DecodeOptions | None = None,
        stop: StopRule | None = None,
        cancel: threading.Event | None = None,
        cache_key: str | None = None,
        on_round: Callable[[Round, list[int]], None] | None = None,
        constraint: Healing | None = None,
        pause: Callable[[list[int]], bool] | None = None,
        ctx: RequestContext | None = None,
    ) -> Completion:
        """Decode a continuation of `prompt` (token ids, at least one).

        Returns the completion with statistics and the propose/verify rounds. A set
        `cancel` event ends the loop at the next step with stop_reason "cancelled".
        `constraint`: token healing (lsp_server/decoding/healing.py), applied to every row
        of every pass while it lasts, drafting on or off.

        `pause(out)` (checked after every pass, with `stop`) ends the call with stop_reason
        "paused" but not the generation: with a `cache_key`, `resume(cache_key)` goes on
        from the same cache, loop state and sampling stream, so a generation paused at a
        deadline and resumed gives the tokens one uninterrupted call gives. A cancelled one
        can be resumed the same way. Any other use of that key's cache ends the chance.
        `ctx`: whom the passes are for, handed to the engine's hooks.
        """
        opts = options or DecodeOptions()
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        t0 = time.perf_counter()
        stats = Stats()
        rounds: list[Round] = []
        out: list[int] = []
        gen = None
        if not opts.greedy:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(opts.seed if opts.seed is not None else int(torch.randint(0, 2**62, ()).item()))
        with self._lock:
            state = self._take_state(cache_key)
            with self._holding(cache_key, state):
                try:
                    self.prefill(state, prompt, opts, stats, cancel, ctx)
                except Cancelled:
                    stats.stop_reason = "cancelled"
                stats.prefill_ms = (time.perf_counter() - t0) * 1000
                seq = list(prompt)
                # Learning (pass costs, acceptance) only where the policy chooses: not for a fixed k.
                spec = self.speculation if opts.adaptive else None
                scorer = spec.scorer(drafter.name) if spec is not None and drafter is not None else None
                loop = Loop(seq, out, stats, rounds, opts, drafter, stop, gen, on_round, spec, scorer, constraint,
                             constraint.start() if constraint is not None else None, len(seq) - 1)
                if not stats.stop_reason:
                    self._run(state, loop, Call(stats, cancel, ctx), pause)
        stats.tokens = len(out)
        stats.wall_ms = (time.perf_counter() - t0) * 1000
        stats.decode_ms = stats.wall_ms - stats.prefill_ms
        return completion(loop)

    def resume(self, cache_key: str, *, pause: Callable[[list[int]], bool] | None = None,
               cancel: threading.Event | None = None, ctx: RequestContext | None = None) -> Completion | None:
        """Go on with the generation paused (or cancelled) on `cache_key`; None when there is none.

        Returns the whole completion so far (every token since the prompt, statistics summed
        over the calls), with stop_reason "paused" again if `pause` says so."""
        t0 = time.perf_counter()
        with self._lock:
            state = self._kv.get(cache_key)
            if state is None or state.loop is None:
                return None
            del self._kv[cache_key]
            loop, state.loop = state.loop, None
            with self._holding(cache_key, state):
                loop.stats.stop_reason = ""
                self._run(state, loop, Call(loop.stats, cancel, ctx), pause)
        stats = loop.stats
        stats.tokens = len(loop.out)
        spent = (time.perf_counter() - t0) * 1000
        stats.wall_ms += spent
        stats.decode_ms += spent
        return completion(loop)

    def _run(self, state: KV, loop: Loop, call: Call, pause) -> None:
        """Decode until the loop ends or pauses; a paused or cancelled loop stays on `state` to resume."""
        t = time.perf_counter()
        loop.stats.stop_reason = self._decode(state, loop, call, pause, t - loop.decoded_s)
        loop.decoded_s += time.perf_counter() - t
        if loop.stats.stop_reason in ("paused", "cancelled"):
            state.loop = loop
        elif loop.scorer is not None:
            loop.scorer.settle(loop.seq, final=True)

    def _decode(self, state: KV, loop: Loop, call: Call, pause, t_decode: float) -> str:
        """The propose/verify loop. `spec` (the policy, when adaptive) chooses how much of each
        proposal to verify and learns from every timed pass; `scorer` scores offered drafts.
        `t_decode`: when decoding began (the time budget counts from it, not from prefill or pauses)."""
        seq, out, stats, rounds, opts = loop.seq, loop.out, loop.stats, loop.rounds, loop.opts
        drafter, stop, gen, on_round, spec, scorer = loop.drafter, loop.stop, loop.gen, loop.on_round, loop.spec, \
            loop.scorer
        constraint, start = loop.constraint, loop.start
        cancel = call.cancel
        stop_ids = self.lm.stop_ids
        # A backend whose multi-row passes are not batch-invariant but close (torch float32 on a
        # CPU) names the logit margin below which a verify pass may decide otherwise than plain
        # decoding; such a round is undone (docs/backends.md, "Near-ties").
        tie = self.lm.tie_margin if opts.greedy else None
        while True:
            plain_until, rest = loop.plain_until, loop.rest
            if len(out) >= opts.max_new_tokens:
                return "length"
            if cancel is not None and cancel.is_set():
                return "cancelled"
            if opts.time_budget_s is not None and time.perf_counter() - t_decode >= opts.time_budget_s:
                return "time"
            # One pass yields up to k + 1 tokens; never overshoot the token budget.
            k = min(opts.draft_max, opts.max_new_tokens - len(out) - 1)
            if len(seq) < plain_until:
                k = 0  # past a near-tie one token per pass, as plain decoding
            if spec is not None and k > 0 and not spec.can_pay(k):
                k = 0  # no draft length could pay on these pass costs: the drafter is not consulted
            proposal = self.propose(drafter, seq, k, trees=opts.greedy and rest is None)  # trees: greedy only
            offered = len(proposal.tokens)
            if scorer is not None:
                scorer.offer(proposal, len(seq))  # scored in full, whatever part of it is verified
            if spec is not None and offered:
                # The policy says how much pays (all of a paid model draft: its passes already ran).
                chosen = spec.choose(proposal, drafter.name)
                if chosen < offered:
                    proposal.tokens = proposal.tokens[:chosen]
                    if proposal.probs is not None:
                        proposal.probs = proposal.probs[:chosen]
            draft = proposal.tokens
            rows, tree = len(draft) + 1, parents_of(proposal)
            t = time.perf_counter()
            if tree is not None:  # a tree pass; `draft` becomes the path it verified (tree.py)
                logits, draft, n_acc, token = verify_tree(self.lm, state, seq, draft, tree,
                                                          lambda ids, cache, last: self._forward(call, ids, cache, last))
            else:
                logits = self.verify(state, seq, draft, call)
                if rest is not None:  # token healing: the same mask whatever the pass shape (healing.py)
                    logits = constraint.mask(logits, rest, draft)
                n_acc, token = accept(logits, proposal, opts, gen)
            if tie and draft:
                top = logits[: n_acc + 1].float().topk(2, dim=-1).values
                close = ((top[:, 0] - top[:, 1]) < tie).nonzero()
                if len(close):
                    # A row that decided a token by less than the noise between pass shapes: plain
                    # decoding might have chosen the runner-up. Undo the round, and recompute every
                    # generated token one per pass (earlier verify passes wrote KV a little off
                    # plain decoding's), so the near-tie is decided on plain decoding's exact logits.
                    del state.ids[start:]
                    self.lm.crop(state.cache, start)
                    for tid in seq[start:-1]:
                        self._forward(call, [tid], state.cache, last=1)
                        state.ids.append(tid)
                    stats.tie_passes += 1 + len(seq) - 1 - start
                    stats.tie_replays += 1
                    loop.plain_until = len(seq) + int(close[0]) + 1
                    continue
            if spec is not None and proposal.paid and draft:
                spec.observe(proposal, len(draft), n_acc, drafter.name)
            # Keep exactly the accepted prefix in the cache: seq[:-1] + [seq[-1]] + draft[:n_acc].
            rejected = len(draft) - n_acc
            if rejected:
                del state.ids[len(state.ids) - rejected :]
                self.lm.crop(state.cache, len(state.ids))
            ms = (time.perf_counter() - t) * 1000
            if spec is not None:
                spec.observe_pass(rows, ms)  # the live estimate of T(n) (lsp_server/decoding/speculation.py)
            stats.target_passes += 1
            stats.drafted += len(draft)
            stats.accepted += n_acc
            for i in range(len(draft)):
                if i >= len(stats.drafted_at):
                    stats.drafted_at.append(0)
                    stats.accepted_at.append(0)
                stats.drafted_at[i] += 1
                stats.accepted_at[i] += int(i < n_acc)
            kind = "plain" if not draft else ("bonus" if n_acc == len(draft) else "correction")
            rnd = Round(list(draft), proposal.source, proposal.match_len, n_acc, token, kind, round(ms, 3), offered,
                        proposal.healed, rows - 1 if tree is not None else 0)
            rounds.append(rnd)
            new = [*draft[:n_acc], token]
            loop.sure.extend(sureness(logits, new))
            if rest is not None:
                loop.rest = constraint.advance(rest, new)
            seq.extend(new)
            if scorer is not None:
                scorer.settle(seq)
            stats.generated += len(new)
            if on_round is not None:
                on_round(rnd, new)
            for i, tid in enumerate(new):
                if tid in stop_ids:
                    out.extend(new[:i])
                    return "eos"
            out.extend(new)
            if stop is not None:
                keep = stop(out)
                if keep is not None:
                    del out[keep:]
                    return "stop-rule"
            if pause is not None and pause(out):
                return "paused"


"""The speculation policy (lsp_server/decoding/speculation.py): learned pass costs, scored drafts, the net rule.

Every cost here is injected: no test reads the wall clock (the engine test checks which
passes were reported, never how long they took).
"""

import random

import pytest

from drafters import NGramDrafter, Proposal
from lsp_server.decoding.speculation import Speculation
from lsp_server.decoding.types import DecodeOptions
from lsp_server.decoding.engine import Engine
from lsp_server.backends.tiny import tiny_random

# What a bad minute at start-up measured, and what passes really cost afterwards (ms).
BAD_MINUTE = {1: 400.0, 2: 800.0, 3: 900.0, 4: 1000.0, 6: 1100.0, 9: 1240.0}
TRUE = {1: 250.0, 2: 400.0, 3: 450.0, 4: 500.0, 5: 520.0, 6: 540.0, 7: 560.0, 8: 580.0, 9: 600.0}


def serve(spec: Speculation, passes: int, rng: random.Random, slow: float = 1.0, ns=(1, 1, 1, 2, 3, 4, 5, 7, 9)) -> None:
    """Report `passes` timed passes over a mix of lengths, each within +-10% of TRUE times `slow`."""
    for _ in range(passes):
        n = rng.choice(ns)
        spec.observe_pass(n, TRUE[n] * slow * rng.uniform(0.9, 1.1))


def close(spec: Speculation, tol: float) -> bool:
    return all(abs(spec.cost(n) / TRUE[n] - 1) < tol for n in (1, 2, 3, 4, 5, 7, 9))


def test_learned_costs_converge_to_the_pass_times_observed():
    spec = Speculation(BAD_MINUTE)
    short_match = Proposal(list(range(8)), "context", match_len=2)
    assert spec.choose(short_match, "ngram") == 0  # the bad minute's costs: such a draft does not pay
    serve(spec, 600, random.Random(0))
    assert close(spec, 0.08), spec.costs_ms
    assert spec.choose(short_match, "ngram") > 0  # the costs of real passes: it does
    assert spec.snapshot()["costs_ms"]["9"] == pytest.approx(600, rel=0.08)
    assert sum(spec.passes.values()) == 600


def test_learned_costs_recover_after_a_burst_of_slow_passes():
    rng = random.Random(1)
    spec = Speculation(TRUE)
    serve(spec, 200, rng)
    assert close(spec, 0.06)
    one = spec.cost(1)
    spec.observe_pass(1, 50 * TRUE[1])  # one stalled pass moves the estimate a little
    assert one < spec.cost(1) < 1.05 * one
    serve(spec, 40, rng, slow=3.0)  # a burst of load: the estimate follows it ...
    assert spec.cost(1) > 1.8 * TRUE[1]
    assert spec.cost(9) / spec.cost(1) == pytest.approx(TRUE[9] / TRUE[1], rel=0.15)  # ... as load, not shape
    serve(spec, 200, rng)  # ... and comes back when it is over
    assert close(spec, 0.06), spec.costs_ms


def test_costs_stay_what_was_injected_when_learning_is_off():
    spec = Speculation(TRUE, learn=False)
    serve(spec, 50, random.Random(2), slow=5.0)
    assert spec.costs_ms == TRUE and spec.level == 1.0


def test_a_pass_never_costs_less_than_one_token_nor_more_than_its_tokens_one_by_one():
    spec = Speculation({1: 100.0, 9: 300.0})
    for _ in range(200):
        spec.observe_pass(3, 1.0)  # absurdly cheap for 3 tokens
        spec.observe_pass(1, 100.0)
    assert spec.cost(3) >= 0.95 * spec.cost(1)
    for _ in range(200):
        spec.observe_pass(2, 10000.0)
        spec.observe_pass(1, 100.0)
    assert spec.cost(2) <= 2.05 * spec.cost(1)


def test_a_pass_over_fewer_tokens_never_costs_more_than_one_over_more():
    """A few passes timed in a loaded minute can leave one point above the next (seen: T(3) 2.24 x
    T(1) beside T(4) 1.98 x); a 2-token draft then looked dearer than a 3-token one."""
    spec = Speculation({1: 100.0, 2: 180.0, 3: 224.0, 4: 198.0, 9: 330.0})
    costs = [spec.cost(n) for n in range(1, 13)]
    assert costs == sorted(costs)
    assert spec.cost(3) == spec.cost(4) == pytest.approx(198.0)
    assert spec.cost(2) == pytest.approx(180.0)
    snap = spec.snapshot()  # ditto/stats shows the costs the choices use
    assert snap["costs_ms"]["3"] == pytest.approx(198.0) and snap["cost_ratios"]["3"] == pytest.approx(1.98)
    two = Proposal([1, 2], "context", match_len=2)
    spec.acceptance[("ngram", 2)], spec.continuation[("ngram", 2)] = 0.666, 0.833  # as learned on one repository
    assert spec.choose(two, "ngram") == 2  # E(2) = 2.22 tokens for 1.98 x T(1): pays


def test_net_rule_verifies_extra_tokens_that_pay_at_the_plain_rate():
    # T(2)/T(1) = 1.1, T(9)/T(1) = 3.0, a1 = ac = 0.8. E(k) / T(k + 1) peaks at k = 3, but
    # the 4th and 5th tokens still bring more than plain decoding would in their extra
    # time: the net rule, E(k) - T(k + 1) / T(1), verifies them too.
    spec = Speculation({1: 10.0, 2: 11.0, 9: 30.0}, learn=False)
    prop = Proposal(list(range(8)), "context", match_len=4)
    spec.acceptance[("ngram", 4)] = spec.continuation[("ngram", 4)] = 0.8
    ks = range(1, 9)
    by_ratio = max(ks, key=lambda k: spec.expected(0.8, k) / spec.cost(k + 1))
    by_net = max(ks, key=lambda k: spec.expected(0.8, k) - spec.cost(k + 1) / spec.cost(1))
    assert (by_ratio, by_net) == (3, 5)
    assert spec.choose(prop, "ngram") == by_net
    assert spec.best(prop, "ngram")[0] == by_net


def test_runs_of_right_tokens_value_long_drafts():
    """One rate for every position undervalues long drafts when drafts are right or wrong in runs."""
    spec = Speculation({1: 10.0, 2: 17.0, 5: 20.0, 9: 26.0}, learn=False)
    prop = Proposal(list(range(8)), "context", match_len=3)
    for _ in range(100):  # half the drafts wrong at once, half right for all 8 tokens
        spec.observe(prop, 1, 0, "ngram")
        spec.observe(prop, 8, 8, "ngram")
    a1, ac = spec.rates(prop, "ngram")
    assert 0.4 < a1 < 0.6 and ac > 0.9
    assert spec.choose(prop, "ngram") == 8


def test_every_offered_draft_is_scored_even_when_none_of_it_is_verified():
    spec = Speculation({1: 10.0, 2: 25.0, 9: 90.0}, learn=False)  # drafts do not pay: nothing verified
    two = Proposal([5, 6, 7], "context", match_len=2)
    for _ in range(60):
        spec.observe(two, 1, 0, "ngram")  # drafts after 2-gram matches keep failing
    low = spec.acceptance[("ngram", 2)]
    assert low < 0.1
    seq = [1, 2, 3]
    scorer = spec.scorer("ngram")
    for _ in range(60):  # now such drafts are right, though the engine verifies none of them
        scorer.offer(Proposal([5, 6, 7], "context", match_len=2), len(seq))
        seq += [5]  # one token per plain pass ...
        scorer.settle(seq)
        seq += [6, 7]
        scorer.settle(seq)  # ... and the target goes on to write all three
    assert spec.acceptance[("ngram", 2)] > 0.9
    assert spec.continuation[("ngram", 2)] > 0.9
    scorer.offer(Proposal([8, 9], "context", match_len=2), len(seq))
    seq += [8]
    scorer.settle(seq)
    assert scorer.pending  # still open: its second token is not written yet
    before = spec.observed[("ngram", 2)]
    scorer.settle(seq, final=True)  # the end of the completion scores what was seen
    assert not scorer.pending and spec.observed[("ngram", 2)] == before + 1


def test_a_probe_remeasures_costs_after_a_long_plain_stretch():
    spec = Speculation(BAD_MINUTE)
    prop = Proposal(list(range(8)), "context", match_len=2)
    for _ in range(Speculation.PROBE_EVERY - 1):
        spec.observe_pass(1, 400.0)
    assert spec.choose(prop, "ngram") == 0
    spec.observe_pass(1, 400.0)
    k = spec.choose(prop, "ngram")
    assert k > 0 and spec.probes == 1
    spec.observe_pass(k + 1, 500.0)
    assert spec.choose(prop, "ngram") == 0  # once, not every step
    assert Speculation(BAD_MINUTE, learn=False).choose(prop, "ngram") == 0  # injected costs are never probed


@pytest.fixture(scope="module")
def lm(one_thread):
    return tiny_random()


def test_the_engine_reports_every_pass_and_scores_every_offered_draft(lm):
    """Which passes were reported, not how long they took; and the output is unchanged."""
    engine = Engine(lm)
    spec = engine.speculation = Speculation({1: 10.0, 2: 25.0, 9: 90.0})  # would trim every n-gram draft
    prompt = [10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11]
    ref = engine.generate(prompt, options=DecodeOptions(max_new_tokens=16, draft_max=0))
    assert sum(spec.passes.values()) == ref.stats.target_passes == spec.passes[1]
    spec.passes.clear()
    out = engine.generate(prompt, drafter=NGramDrafter(), options=DecodeOptions(max_new_tokens=16, draft_max=6))
    assert out.tokens == ref.tokens
    lengths = {}
    for r in out.rounds:
        lengths[len(r.proposed) + 1] = lengths.get(len(r.proposed) + 1, 0) + 1
    assert spec.passes == lengths
    assert sum(spec.observed.values()) == sum(1 for r in out.rounds if r.offered)
    # A fixed draft length (no adaptive choice) teaches the policy nothing.
    spec.passes.clear()
    engine.generate(prompt, drafter=NGramDrafter(), options=DecodeOptions(max_new_tokens=16, draft_max=6, adaptive=False))
    assert spec.passes == {}


def test_drafts_from_other_buffers_have_their_own_acceptance():
    spec = Speculation(TRUE, learn=False)
    ctx = Proposal(list(range(6)), "context", match_len=4)
    buf = Proposal(list(range(6)), "other.py", match_len=4)
    hist = Proposal(list(range(6)), "history", match_len=4)
    for _ in range(60):
        spec.observe(buf, 1, 0, "ngram")  # copies from another buffer keep failing
        spec.observe(ctx, 6, 6, "ngram")  # copies from the context are right
    assert spec.choose(buf, "ngram") == 0 and spec.choose(ctx, "ngram") == 6
    assert spec.rates(hist, "ngram")[0] == Speculation.PRIOR_OTHER  # the history is a third class
    assert set(spec.snapshot()["acceptance"]) == {"ngram/match>=4", "ngram+buffers/match>=4"}


def test_healed_matches_have_their_own_acceptance():
    """A healed match (the cursor split a token; its first draft tokens are re-encoded text) is
    learned apart from exact matches of the same length and source, from the same prior."""
    spec = Speculation(TRUE, learn=False)
    exact = Proposal(list(range(6)), "context", match_len=4)
    healed = Proposal(list(range(6)), "context", match_len=4, healed=1)
    healed_buf = Proposal(list(range(6)), "other.py", match_len=4, healed=1)
    assert spec.rates(healed, "ngram") == spec.rates(exact, "ngram")
    assert spec.rates(healed_buf, "ngram")[0] == Speculation.PRIOR_OTHER
    for _ in range(60):
        spec.observe(healed, 1, 0, "ngram")
        spec.observe(exact, 6, 6, "ngram")
    assert spec.choose(healed, "ngram") == 0 and spec.choose(exact, "ngram") == 6
    assert set(spec.snapshot()["acceptance"]) == {"ngram/match>=4", "ngram+healed/match>=4"}


def test_where_no_draft_length_can_pay_the_drafter_is_not_consulted():
    """Pass costs that grow with their rows as one-by-one passes do (llama.cpp on a CPU): the engine
    never asks the drafter; costs where a pass over several rows is cheap: it does (injected costs)."""
    from lsp_server.backends.tiny import tiny_random
    from lsp_server.decoding.engine import Engine
    from lsp_server.decoding.types import DecodeOptions
    from support.prompts import ListDrafter

    assert not Speculation({1: 10.0, 2: 20.0, 5: 50.0, 9: 91.0}).can_pay(8)
    assert Speculation({1: 10.0, 2: 13.0, 9: 40.0}).can_pay(8) and not Speculation({1: 10.0, 2: 13.0}).can_pay(0)
    lm = tiny_random()
    prompt = [7, 8, 9, 10, 7, 8, 9]
    for costs, asked in (({1: 10.0, 2: 20.0, 9: 90.0}, False), ({1: 10.0, 2: 11.0, 9: 14.0}, True)):
        engine = Engine(lm)
        engine.use_costs(costs)
        engine.speculation.learn = False  # injected costs stay put: nothing is timed
        d = ListDrafter("d", lambda ctx, k: ctx[-k:])
        engine.generate(prompt, drafter=d, options=DecodeOptions(max_new_tokens=8, draft_max=4))
        assert (d.proposed > 0) == asked

"""Tier 2: the draft-model drafter, the hybrid drafter and the history source.

Tiny random models only (built in-process). Greedy output with the model drafter and the
hybrid must equal drafting-off token for token; with the target as its own draft model
every draft is accepted; sampling with the draft model's real (non-one-hot) q has the
exact distribution of plain sampling (the chi-square machinery of test_sampling.py).
"""

import random

import pytest
import torch

from drafters import NGramDrafter, Proposal
from drafters.model_drafter import (CostModel, HybridDrafter, ModelDrafter, TokenizerMismatch, check_same_tokenizer,
                                    filtered_probs)
from lsp_server.completer import HISTORY, Completer
from lsp_server.engine import DecodeOptions, Engine, target_probs
from lsp_server.model import LoadedModel, tiny_random, tiny_random_model

from test_engine import random_prompt
from test_sampling import LENGTH, N, PROMPT, V, chi_square_pvalue, exact_distribution

# Costs (ms) where drafting pays: a verify pass over n tokens costs little more than one.
CHEAP_VERIFY = CostModel(target_ms=[10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0, 13.5, 14.0], draft_ms=1.0)
# Costs where a model draft never pays: each draft pass costs as much as a target pass.
DEAR_DRAFT = CostModel(target_ms=[10.0, 25.0, 40.0, 55.0, 70.0, 85.0, 100.0, 115.0, 130.0], draft_ms=10.0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def lm():
    return tiny_random()


@pytest.fixture(scope="module")
def other(lm):
    """Another tiny random model with the same tokenizer (different weights)."""
    model = tiny_random_model(lm.vocab_size, seed=1)
    return LoadedModel(spec="tiny-random-1", name="tiny-random-1", model=model, tokenizer=lm.tokenizer,
                       device=lm.device, dtype=torch.float32, fim=lm.fim, stop_ids=lm.stop_ids,
                       vocab_size=lm.vocab_size)


def test_is_a_drafter(lm):
    from drafters import Drafter

    assert isinstance(ModelDrafter(lm, target=lm), Drafter)
    assert isinstance(HybridDrafter(NGramDrafter(), ModelDrafter(lm), CHEAP_VERIFY), Drafter)


@pytest.mark.parametrize("draft", ["self", "other"])
@pytest.mark.parametrize("seed", range(4))
def test_greedy_model_drafter_equals_drafting_off(lm, other, draft, seed):
    rng = random.Random(seed)
    engine = Engine(lm)
    drafter = ModelDrafter(lm if draft == "self" else other, target=lm)
    for _ in range(3):
        prompt = random_prompt(rng, lm)
        ref = engine.generate(prompt, options=DecodeOptions(max_new_tokens=40, draft_max=0))
        k = rng.choice([1, 3, 5, 8])
        spec = engine.generate(prompt, drafter=drafter, options=DecodeOptions(max_new_tokens=40, draft_max=k))
        assert spec.tokens == ref.tokens, f"{draft} k={k} diverged"
        s = spec.stats
        assert s.drafted > 0 or len(ref.tokens) <= 1
        if draft == "self":
            # The target drafting for itself: every greedy draft is the target's own argmax.
            assert s.accepted == s.drafted
            if ref.stats.stop_reason == "length" and k > 1:
                assert s.target_passes < ref.stats.target_passes


def test_draft_cache_is_resynced_by_common_prefix(lm):
    drafter = ModelDrafter(lm, target=lm)
    assert len(drafter.propose(list(range(10, 40)), 8).tokens) == drafter.max_draft  # propose caps at max_draft
    ctx = list(range(10, 40))
    drafter.reset()
    first = drafter.propose(ctx, 4)
    assert len(first.tokens) == 4 and first.probs is None
    assert drafter.prefilled == 30 * 2
    # The target kept two drafts (already in the draft cache) and appended its own token: one new.
    ctx2 = ctx + first.tokens[:2] + [7]
    drafter.propose(ctx2, 4)
    assert drafter.prefilled == 30 * 2 + 1
    # A different context (another document) keeps only the common prefix.
    drafter.propose(ctx[:5] + [99, 98, 97], 2)
    assert drafter.prefilled == 30 * 2 + 1 + 3
    assert drafter._cache.get_seq_length() == len(drafter._ids)
    # Same proposals as a fresh drafter: the resync is exact.
    fresh = ModelDrafter(lm, target=lm)
    assert fresh.propose(ctx2, 4).tokens == drafter.propose(ctx2, 4).tokens


@pytest.mark.parametrize("seed", range(4))
def test_greedy_hybrid_equals_drafting_off(lm, other, seed):
    rng = random.Random(100 + seed)
    from lsp_server.engine import Speculation

    engine = Engine(lm)
    engine.speculation = Speculation({n + 1: t for n, t in enumerate(CHEAP_VERIFY.target_ms)})
    for costs, spec in ((CHEAP_VERIFY, None), (DEAR_DRAFT, None), (CHEAP_VERIFY, lambda: engine.speculation)):
        hybrid = HybridDrafter(NGramDrafter(), ModelDrafter(other, target=lm), costs, speculation=spec)
        for _ in range(3):
            prompt = random_prompt(rng, lm)
            ref = engine.generate(prompt, options=DecodeOptions(max_new_tokens=40, draft_max=0))
            spec = engine.generate(prompt, drafter=hybrid, options=DecodeOptions(max_new_tokens=40, draft_max=6))
            assert spec.tokens == ref.tokens
    assert hybrid.stats.ngram + hybrid.stats.model + hybrid.stats.none > 0


def test_filtered_probs_equals_the_engines_target_probs():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    for t, k, p in [(1.0, 0, 1.0), (0.7, 5, 0.9), (1.3, 0, 0.5), (0.2, 10, 1.0)]:
        ref = target_probs(logits, DecodeOptions(temperature=t, top_k=k, top_p=p))
        assert torch.allclose(filtered_probs(logits, t, k, p), ref)


# -- sampling: the model drafter's real q ---------------------------------------------------------


@pytest.fixture(scope="module")
def v8():
    def make(seed, std):
        model = tiny_random_model(V, seed=seed, hidden=32, init_std=std)
        return LoadedModel(spec=f"tiny-v8-{seed}", name=f"tiny-v8-{seed}", model=model, tokenizer=None,
                           device=torch.device("cpu"), dtype=torch.float32, fim=None, stop_ids=frozenset(),
                           vocab_size=V)

    return make(3, 0.15), make(11, 0.4)  # the target of test_sampling.py, and a different draft model




@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_k=5, top_p=0.9)],
                         ids=["t1", "t0.7-topk-topp"])
def test_sampling_with_the_model_drafter_matches_plain_sampling(v8, kw):
    target, draft = v8
    opts_kw = dict(kw, draft_max=3)
    dist = exact_distribution(target, DecodeOptions(**kw))
    engine = Engine(target)
    drafter = ModelDrafter(draft, target=target)
    counts = {}
    saw_soft_q = False
    for i in range(N):
        opts = DecodeOptions(max_new_tokens=LENGTH, seed=20_000 + i, **opts_kw)
        drafter.set_options(opts)
        out = engine.generate(PROMPT, drafter=drafter, options=opts, cache_key="prompt")
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
        if not saw_soft_q:
            q = drafter.propose(PROMPT, 1).probs[0]
            saw_soft_q = float(q.max()) < 0.99 and int((q > 0).sum()) > 1
    assert saw_soft_q  # q really is a distribution, not one-hot
    assert chi_square_pvalue(counts, dist, N) > 1e-3, counts


def test_model_drafter_samples_drafts_from_its_q(v8):
    target, draft = v8
    drafter = ModelDrafter(draft, target=target, temperature=1.0, seed=0)
    p = drafter.propose(PROMPT, 3)
    assert len(p.probs) == 3 and all(abs(float(q.sum()) - 1) < 1e-5 for q in p.probs)
    # The first q is the draft model's own next-token distribution after PROMPT.
    want = torch.softmax(draft.forward(PROMPT, draft.new_cache())[-1], dim=-1)
    assert torch.allclose(p.probs[0], want, atol=1e-5)
    # Frequency of first draft tokens follows q.
    counts = torch.zeros(V)
    for _ in range(400):
        counts[drafter.propose(PROMPT, 1).tokens[0]] += 1
    assert float((counts / 400 - want).abs().max()) < 0.1


# -- tokenizer check -----------------------------------------------------------------------------


def test_tokenizer_mismatch_is_a_clear_error(lm):
    different = tiny_random(vocab_size=400)
    with pytest.raises(TokenizerMismatch, match="does not share the tokenizer"):
        ModelDrafter(different, target=lm)
    with pytest.raises(ValueError):  # TokenizerMismatch is a ValueError
        check_same_tokenizer(lm, different)
    check_same_tokenizer(lm, lm)


def test_completer_reports_a_mismatched_draft_model(lm, monkeypatch):
    completer = Completer(lm)
    completer._draft_models["wrong"] = tiny_random(vocab_size=400)
    completer.settings.draft_model = "wrong"
    with pytest.raises(TokenizerMismatch):
        completer.drafter_for("model")


# -- history source --------------------------------------------------------------------------------


def test_history_source_proposes_a_pattern_accepted_earlier(lm):
    completer = Completer(lm)
    pattern = "handle.register_callback(on_event, priority=HIGH_PRIORITY)"
    head = lm.encode("handle.register_callback(")
    assert completer.ngram.propose(head, 8).tokens == []  # nothing known yet
    completer.accepted(pattern, after="\n")
    assert completer.history() == [pattern + "\n"]
    prop = completer.ngram.propose(lm.encode("x = 1\n") + head, 8)
    assert prop.source == HISTORY
    want = lm.encode(pattern + "\n")[len(head):]
    assert prop.tokens and prop.tokens == want[: len(prop.tokens)]


def test_history_is_bounded_oldest_first(lm):
    completer = Completer(lm)
    completer.settings.history_tokens = 60
    for i in range(30):
        completer.accepted(f"value_{i} = compute_{i}(x)\n")
    kept = completer.ngram.source_tokens(HISTORY)
    assert len(kept) <= 60
    assert "value_29" in lm.decode(kept) and "value_0 " not in lm.decode(kept)
    assert completer.ngram._sources[HISTORY][0] == 2  # less trusted than open buffers


def test_history_is_less_trusted_than_a_buffer(lm):
    completer = Completer(lm)
    hist, buf = "result = fetch(url, timeout=3)", "result = fetch(url, retries=5)"
    completer.accepted(hist)
    completer.set_buffer("other.py", buf)
    a, b = lm.encode(hist), lm.encode(buf)
    common = 0
    while a[common] == b[common]:
        common += 1
    prop = completer.ngram.propose(a[:common], 6)  # both match equally long: the buffer wins
    assert prop.source == "other.py" and prop.tokens[0] == b[common]


# -- hybrid choice ----------------------------------------------------------------------------------


class Recording(ModelDrafter):
    def __init__(self, lm):
        super().__init__(lm, target=lm)
        self.calls = 0

    def draft(self, context, k):
        self.calls += 1
        return super().draft(context, k)


def test_hybrid_takes_a_long_ngram_match_without_running_the_model(lm):
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, CHEAP_VERIFY)
    span = list(range(20, 32))
    ctx = [5, 6, 7] + span + [40, 41] + span[:6]
    prop = hybrid.propose(ctx, 8)
    assert prop.match_len >= 3 and prop.tokens == (span[6:] + [40, 41])[:8] and prop.probs is None
    assert model.calls == 0 and hybrid.stats.ngram == 1


def test_hybrid_uses_the_model_where_lookup_has_nothing(lm):
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, CHEAP_VERIFY)
    ctx = list(range(50, 80))  # no repeated n-gram
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 1 and prop.source == "model" and len(prop.tokens) >= 1
    assert hybrid.stats.model == 1


def test_hybrid_drafts_nothing_when_the_model_does_not_pay(lm):
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, DEAR_DRAFT)
    prop = hybrid.propose(list(range(50, 80)), 4)
    assert prop.tokens == [] and model.calls == 0 and hybrid.stats.none == 1


def test_hybrid_counts_the_draft_models_catch_up_on_the_prompt(lm):
    """A cold draft cache must first run the whole prompt: on a CPU that costs more than a
    draft saves, so the hybrid decodes plainly; once the cache holds the context, it drafts."""
    cold_dear = CostModel(target_ms=CHEAP_VERIFY.target_ms, draft_ms=1.0, draft_token_ms=2.0)
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, cold_dear)
    ctx = list(range(50, 80))  # no repeated n-gram; 30 tokens to catch up: ~60 ms against a 10 ms target pass
    assert model.pending(ctx) == 30
    assert hybrid.propose(ctx, 4).tokens == [] and model.calls == 0 and hybrid.stats.none == 1
    model.draft(ctx, 1)  # now the draft cache holds the context
    model.calls = 0
    assert model.pending(ctx + [81]) <= 2
    prop = hybrid.propose(ctx + [81], 4)
    assert model.calls == 1 and prop.source == "model" and prop.tokens


class FixedSpeculation:
    """Stands in for the engine's Speculation: fixed value of an n-gram proposal."""

    def __init__(self, k, rate):
        self.k, self.rate, self.seen = k, rate, []

    def best(self, proposal, drafter=""):
        self.seen.append((list(proposal.tokens), drafter))
        return self.k, self.rate


def test_hybrid_values_a_weak_ngram_draft_as_the_engine_will(lm):
    ctx = [9, 1, 2, 60, 61, 62, 63, 1, 2]  # a 2-token match: not confident
    # The engine's speculation expects little from the weak match (it would verify none of it): the model wins.
    model = Recording(lm)
    spec = FixedSpeculation(0, 1 / 10.0)
    hybrid = HybridDrafter(NGramDrafter(), model, CHEAP_VERIFY, speculation=lambda: spec)
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 1 and prop.source == "model"
    assert spec.seen and spec.seen[0][1] == "hybrid"
    # It expects more from the same match than a model draft can give: the n-gram draft is
    # passed on whole, for the engine to trim, and the model never runs.
    model = Recording(lm)
    spec = FixedSpeculation(1, 10.0)
    hybrid = HybridDrafter(NGramDrafter(), model, CHEAP_VERIFY, speculation=lambda: spec)
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 0 and prop.tokens[:1] == [60] and prop.match_len == 2 and not hybrid.sizes_drafts
    # Neither pays: the n-gram draft still goes to the engine, which trims it to nothing and
    # lets its estimate for such matches drift back (as it does for the ngram drafter).
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, DEAR_DRAFT, speculation=lambda: FixedSpeculation(0, 1 / 10.0))
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 0 and prop.tokens[:1] == [60] and not hybrid.sizes_drafts


def test_hybrid_corrects_its_drafting_cost_by_what_it_measured(lm):
    import time as _time

    class Slow(Recording):
        def draft(self, context, k):
            _time.sleep(0.02)
            return super().draft(context, k)

    # A draft pass predicted at 2 ms pays against a 10 ms target pass; one measured at 20+ ms does not.
    optimistic = CostModel(target_ms=[10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6, 10.7, 10.8], draft_ms=2.0)
    hybrid = HybridDrafter(NGramDrafter(), Slow(lm), optimistic)
    ctx = list(range(50, 80))
    assert hybrid.propose(ctx, 1).source == "model"
    assert hybrid.draft_scale > 3  # 20+ ms measured against 2 ms predicted
    calls = hybrid.model.calls
    for i in range(4):  # the corrected cost no longer pays
        hybrid.propose(ctx + list(range(81, 82 + i)), 1)
    assert hybrid.model.calls == calls and hybrid.stats.none == 4


def test_speculation_best_is_what_choose_verifies():
    from lsp_server.engine import Speculation

    spec = Speculation({1: 10.0, 2: 11.0, 4: 13.0, 9: 18.0})
    prop = Proposal([1, 2, 3, 4, 5], match_len=6)
    k, rate = spec.best(prop, "ngram")
    assert k == spec.choose(prop, "ngram") and k > 0 and rate > 1 / 10.0
    assert spec.best(Proposal([]), "ngram") == (0, 1 / 10.0)


def test_hybrid_learns_acceptance_from_the_next_context(lm):
    hybrid = HybridDrafter(NGramDrafter(), ModelDrafter(lm, target=lm), CHEAP_VERIFY, prior_model=0.5)
    ctx = list(range(50, 80))
    prop = hybrid.propose(ctx, 4)
    hybrid.propose(ctx + prop.tokens + [3], 4)  # every draft accepted
    assert hybrid.acc["model"].rate > 0.5
    before = hybrid.acc["model"].rate
    ctx2 = ctx + prop.tokens + [3]
    prop2 = hybrid.propose(ctx2, 4)
    hybrid.propose(ctx2 + [(prop2.tokens[0] + 1) % lm.vocab_size], 4)  # first draft rejected
    assert hybrid.acc["model"].rate < before


def test_cost_model_rule():
    # a = 0: drafting never pays; a high with cheap verify: the longest draft pays.
    assert CHEAP_VERIFY.best_k(0.0, 8, per_token_draft=True)[0] == 0
    assert CHEAP_VERIFY.best_k(0.95, 8, per_token_draft=False)[0] == 8
    assert DEAR_DRAFT.best_k(0.9, 8, per_token_draft=True)[0] == 0
    assert CHEAP_VERIFY.target(20) > CHEAP_VERIFY.target(9)  # extrapolated past the measured range


def test_cost_model_measures_a_model(lm):
    costs = CostModel.measure(lm, lm, ns=(1, 2, 4), context=8, reps=1)
    assert len(costs.target_ms) == 4 and all(t > 0 for t in costs.target_ms) and costs.draft_ms > 0
    assert costs.draft_token_ms >= 0 and costs.draft(3, pending=9) == pytest.approx(
        3 * costs.draft_ms + 8 * costs.draft_token_ms)


def test_completer_builds_every_drafter_and_loads_the_draft_model_once(lm, monkeypatch):
    import lsp_server.model as model_mod

    loads = []
    monkeypatch.setattr(model_mod, "load", lambda spec, **kw: loads.append(spec) or lm)
    completer = Completer(lm)
    completer.settings.draft_model = "tiny-random"
    monkeypatch.setattr(CostModel, "measure", classmethod(lambda cls, *a, **k: CHEAP_VERIFY))
    assert completer.drafter_for("none") is None
    assert completer.drafter_for("ngram") is completer.ngram
    m = completer.drafter_for("model")
    h = completer.drafter_for("hybrid")
    assert isinstance(m, ModelDrafter) and isinstance(h, HybridDrafter) and h.model is m and h.ngram is completer.ngram
    assert completer.drafter_for("model") is m and completer.drafter_for("hybrid") is h
    assert loads == ["tiny-random"]
    text = "def f(x):\n    return x\n\ndef g(y):\n    "
    ref = completer.complete(text, 4, 4, drafter="none", options=DecodeOptions(max_new_tokens=12))
    for name in ("model", "hybrid"):
        sug = completer.complete(text, 4, 4, drafter=name, options=DecodeOptions(max_new_tokens=12))
        assert sug.text == ref.text and sug.drafter == name  # the stop rule cuts after a round: compare text


# -- settings and the server's acceptance hook -----------------------------------------------------


def test_settings_take_the_new_drafters_and_a_draft_model():
    from lsp_server.settings import Settings, SettingsError

    s = Settings().merged({"drafter": "hybrid", "draftModel": "qwen2.5-coder-1.5b"})
    assert (s.drafter, s.draft_model) == ("hybrid", "qwen2.5-coder-1.5b")
    assert Settings().merged({"drafter": "model"}).draft_model == "qwen2.5-coder-0.5b"
    with pytest.raises(SettingsError, match="draft_model"):
        Settings().merged({"draftModel": " "})


def test_cli_has_the_drafter_choices_and_draft_model():
    from lsp_server.cli import build_parser

    args = build_parser().parse_args(["complete", "x.py:1:1", "--drafter", "hybrid", "--draft-model", "tiny-random"])
    assert (args.drafter, args.draft_model) == ("hybrid", "tiny-random")


def test_server_turns_an_inserted_suggestion_into_history(lm):
    from types import SimpleNamespace

    from lsp_server.server import DittoServer, typed_after

    server = DittoServer()
    uri = "file:///tmp/a.py"
    shown = "register_callback(on_event)"
    server.traces[uri] = {"text": shown}
    change = SimpleNamespace(range=object(), text=shown)
    server.note_change(uri, SimpleNamespace(content_changes=[SimpleNamespace(range=object(), text="x")]))
    assert server._accepted == []
    server.note_change(uri, SimpleNamespace(content_changes=[change]))
    server.note_change(uri, SimpleNamespace(content_changes=[change]))  # one acceptance per suggestion
    assert server._accepted == [(uri, shown)]
    doc = SimpleNamespace(source="h." + shown + "  # done\n\n    next_line()\nlater\n")
    assert typed_after(doc, shown) == "  # done\n\n    next_line()"
    completer = Completer(lm)
    server.document = lambda u: doc
    server._apply_dirty(completer)
    assert completer.history() == [shown + "  # done\n\n    next_line()"]
    assert server._accepted == []


def test_engine_does_not_cut_a_model_draft_short(lm):
    """Adaptive speculation must not trim a model draft after its passes were paid."""
    from lsp_server.engine import Speculation

    engine = Engine(lm)
    engine.speculation = Speculation({1: 10.0, 2: 100.0, 3: 200.0, 9: 900.0})  # would trim every draft to 0
    drafter = ModelDrafter(lm, target=lm)
    prompt = list(range(10, 40))
    out = engine.generate(prompt, drafter=drafter, options=DecodeOptions(max_new_tokens=12, draft_max=4))
    assert out.stats.drafted > 0 and out.stats.accepted == out.stats.drafted


def test_hybrid_shares_the_engines_calibrated_pass_costs(lm, monkeypatch):
    import lsp_server.model as model_mod
    from lsp_server.engine import Speculation

    monkeypatch.setattr(model_mod, "load", lambda spec, **kw: lm)
    completer = Completer(lm)
    completer.engine.speculation = Speculation({1: 10.0, 2: 12.0, 4: 16.0, 9: 26.0})
    h = completer.drafter_for("hybrid")
    assert h.costs.target_ms[:4] == [10.0, 12.0, 14.0, 16.0] and len(h.costs.target_ms) == 9
    assert h.costs.draft_ms > 0  # only the draft pass was timed

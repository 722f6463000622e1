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
from drafters.model_drafter import HybridDrafter, ModelDrafter, TokenizerMismatch, check_same_tokenizer
from lsp_server.decoding.probs import filtered_probs
from lsp_server.decoding.speculation import Speculation, measure_draft_costs, measure_pass_costs
from lsp_server.completion.completer import HISTORY, Completer
from lsp_server.decoding.types import DecodeOptions
from lsp_server.decoding.engine import Engine
from lsp_server.backends.tiny import tiny_random, tiny_random_model
from lsp_server.backends.torch.model import TorchModel

from support.prompts import random_prompt
from support.sampling import LENGTH, N, PROMPT, V, chi_square_pvalue, exact_distribution


def policy(target_ms, draft_ms, draft_token_ms=0.0) -> Speculation:
    """A speculation policy with injected costs (ms): target_ms[n - 1] = T(n)."""
    return Speculation({n + 1: t for n, t in enumerate(target_ms)}, draft_ms=draft_ms, draft_token_ms=draft_token_ms,
                       learn=False)  # injected costs stay injected: no pass time is learned


# Costs (ms) where drafting pays: a verify pass over n tokens costs little more than one.
CHEAP = [10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0, 13.5, 14.0]
def CHEAP_VERIFY(): return policy(CHEAP, 1.0)  # noqa: E302,E704
# Costs where a model draft never pays: each draft pass costs as much as a target pass.
def DEAR_DRAFT(): return policy([10.0, 25.0, 40.0, 55.0, 70.0, 85.0, 100.0, 115.0, 130.0], 10.0)  # noqa: E302,E704


class FakeClock:
    """A clock for the hybrid's draft timing: every draft takes `ms` (tests never read the wall clock)."""

    def __init__(self, ms: float = 0.0):
        self.ms, self.t = ms, 0.0

    def __call__(self) -> float:
        self.t += self.ms / 1000  # seconds; read before and after each draft, so a draft "takes" ms
        return self.t


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def lm():
    return tiny_random()


@pytest.fixture(scope="module")
def other(lm):
    """Another tiny random model with the same tokenizer (different weights)."""
    model = tiny_random_model(lm.vocab_size, seed=1)
    return lm.with_module(model, spec="tiny-random-1")


def test_is_a_drafter(lm):
    from drafters import Drafter

    assert isinstance(ModelDrafter(lm, target=lm), Drafter)
    assert isinstance(HybridDrafter(NGramDrafter(), ModelDrafter(lm), CHEAP_VERIFY()), Drafter)


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
    for make in (CHEAP_VERIFY, DEAR_DRAFT):
        engine = Engine(lm)
        engine.speculation = make()  # the engine trims n-gram drafts with the hybrid's own policy
        hybrid = HybridDrafter(NGramDrafter(), ModelDrafter(other, target=lm), engine.speculation, clock=FakeClock())
        for _ in range(3):
            prompt = random_prompt(rng, lm)
            ref = engine.generate(prompt, options=DecodeOptions(max_new_tokens=40, draft_max=0))
            spec = engine.generate(prompt, drafter=hybrid, options=DecodeOptions(max_new_tokens=40, draft_max=6))
            assert spec.tokens == ref.tokens
        consulted = hybrid.stats.ngram + hybrid.stats.model + hybrid.stats.none
        # DEAR_DRAFT's verify passes cost more than their rows one by one: no draft length can pay, so
        # the engine does not consult the drafter at all (lsp_server/decoding/speculation.py can_pay).
        assert consulted > 0 if make is CHEAP_VERIFY else consulted == 0


def test_filtered_probs_filters_as_documented():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    assert torch.allclose(filtered_probs(logits, 1.0, 0, 1.0), torch.softmax(logits, -1))
    top2 = filtered_probs(logits, 1.0, 2, 1.0)[0]
    assert (top2[2:] == 0).all() and torch.allclose(top2[:2], torch.softmax(logits[0, :2], -1))
    # top-p 0.5: the first token alone has p = 0.63 >= 0.5, so it is the whole nucleus.
    assert filtered_probs(logits, 1.0, 0, 0.5)[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    cold = filtered_probs(logits, 0.1, 0, 1.0)[0]
    assert cold[0] > 0.99  # a low temperature sharpens towards the argmax


# -- sampling: the model drafter's real q ---------------------------------------------------------


@pytest.fixture(scope="module")
def v8():
    def make(seed, std):
        model = tiny_random_model(V, seed=seed, hidden=32, init_std=std)
        return TorchModel(f"tiny-v8-{seed}", f"tiny-v8-{seed}", model, None, torch.device("cpu"), torch.float32,
                          stop_ids=frozenset(), vocab_size=V)

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
    want = torch.softmax(draft.forward(PROMPT, draft.new_cache(), last=1)[-1], dim=-1)
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
    hybrid = HybridDrafter(NGramDrafter(), model, CHEAP_VERIFY(), clock=FakeClock())
    span = list(range(20, 32))
    ctx = [5, 6, 7] + span + [40, 41] + span[:6]
    prop = hybrid.propose(ctx, 8)
    assert prop.match_len >= 3 and prop.tokens == (span[6:] + [40, 41])[:8] and prop.probs is None
    assert model.calls == 0 and hybrid.stats.ngram == 1 and not prop.paid


def test_hybrid_uses_the_model_where_lookup_has_nothing(lm):
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, CHEAP_VERIFY(), clock=FakeClock())
    ctx = list(range(50, 80))  # no repeated n-gram
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 1 and prop.source == "model" and len(prop.tokens) >= 1 and prop.paid
    assert hybrid.stats.model == 1


def test_hybrid_drafts_nothing_when_the_model_does_not_pay(lm):
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, DEAR_DRAFT(), clock=FakeClock())
    prop = hybrid.propose(list(range(50, 80)), 4)
    assert prop.tokens == [] and model.calls == 0 and hybrid.stats.none == 1


def test_hybrid_counts_the_draft_models_catch_up_on_the_prompt(lm):
    """A cold draft cache must first run the whole prompt: on a CPU that costs more than a
    draft saves, so the hybrid decodes plainly; once the cache holds the context, it drafts."""
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, policy(CHEAP, 1.0, draft_token_ms=2.0), clock=FakeClock(1.0))
    ctx = list(range(50, 80))  # no repeated n-gram; 30 tokens to catch up: ~60 ms against a 10 ms target pass
    assert model.pending(ctx) == 30
    assert hybrid.propose(ctx, 4).tokens == [] and model.calls == 0 and hybrid.stats.none == 1
    model.draft(ctx, 1)  # now the draft cache holds the context
    model.calls = 0
    assert model.pending(ctx + [81]) <= 2
    prop = hybrid.propose(ctx + [81], 4)
    assert model.calls == 1 and prop.source == "model" and prop.tokens


def test_hybrid_values_a_weak_ngram_draft_as_the_engine_will(lm):
    ctx = [9, 1, 2, 60, 61, 62, 63, 1, 2]  # a 2-token match: not confident
    # The policy expects little from such matches (the engine would verify none of it): the model wins.
    model = Recording(lm)
    p = CHEAP_VERIFY()
    p.acceptance[("hybrid", 2)] = 0.0
    hybrid = HybridDrafter(NGramDrafter(), model, p, clock=FakeClock(1.0))
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 1 and prop.source == "model" and prop.paid
    # It expects more from the same match than a model draft can give: the n-gram draft is
    # passed on whole, for the engine to trim, and the model never runs.
    model = Recording(lm)
    p = CHEAP_VERIFY()
    p.acceptance[("hybrid", 2)] = 0.98
    p.acceptance[("model", 0)] = 0.3
    hybrid = HybridDrafter(NGramDrafter(), model, p, clock=FakeClock(1.0))
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 0 and prop.tokens[:1] == [60] and prop.match_len == 2 and not prop.paid
    # Neither pays: the n-gram draft still goes to the engine, which trims it to nothing and
    # lets its estimate for such matches drift back (as it does for the ngram drafter).
    model = Recording(lm)
    p = DEAR_DRAFT()
    p.acceptance[("hybrid", 2)] = 0.0
    hybrid = HybridDrafter(NGramDrafter(), model, p, clock=FakeClock(10.0))
    prop = hybrid.propose(ctx, 4)
    assert model.calls == 0 and prop.tokens[:1] == [60] and not prop.paid
    assert p.choose(prop, "hybrid") == 0


def test_hybrid_corrects_its_drafting_cost_by_what_it_measured(lm):
    # A draft pass predicted at 2 ms pays against a 10 ms target pass; one measured at 20+ ms does not.
    p = policy([10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6, 10.7, 10.8], 2.0)
    model = Recording(lm)
    hybrid = HybridDrafter(NGramDrafter(), model, p, clock=FakeClock(25.0))  # every draft takes 25 ms
    ctx = list(range(50, 80))
    model.draft(ctx, 1)  # a warm draft cache: no catch-up
    model.calls = 0
    assert hybrid.propose(ctx + [81], 1).source == "model"
    assert p.draft_scale > 3  # 25 ms measured against 2 ms predicted
    for i in range(4):  # the corrected cost no longer pays
        hybrid.propose(ctx + list(range(81, 83 + i)), 1)
    assert model.calls == 1 and hybrid.stats.none == 4


def test_speculation_best_is_what_choose_verifies():
    spec = Speculation({1: 10.0, 2: 11.0, 4: 13.0, 9: 18.0})
    prop = Proposal([1, 2, 3, 4, 5], match_len=6)
    k, rate = spec.best(prop, "ngram")
    assert k == spec.choose(prop, "ngram") and k > 0 and rate > 1 / 10.0
    assert spec.best(Proposal([]), "ngram") == (0, 1 / 10.0)
    # A paid draft is verified whole, whatever it would be worth.
    steep = Speculation({1: 10.0, 2: 100.0, 9: 900.0})
    assert steep.choose(Proposal([1, 2, 3], source="model", paid=True)) == 3


def test_the_engine_teaches_the_policy_the_model_drafts_acceptance(lm):
    """The engine observes every verified draft; the hybrid reads the estimate from the same policy."""
    p = CHEAP_VERIFY()
    before = p.model_acceptance()
    engine = Engine(lm)
    engine.speculation = p
    drafter = ModelDrafter(lm, target=lm)  # the target as its own draft model: every draft is right
    engine.generate(list(range(50, 80)), drafter=drafter, options=DecodeOptions(max_new_tokens=12, draft_max=4))
    assert p.model_acceptance() > before
    wrong = Speculation({1: 10.0, 2: 11.0})
    wrong.observe(Proposal([1, 2], source="model", paid=True), verified=2, accepted=0)
    assert wrong.model_acceptance() < Speculation.PRIOR_PAID


def test_policy_rule_for_model_drafts():
    # a = 0: drafting never pays; a high with cheap verify and drafting: the longest draft pays.
    p = CHEAP_VERIFY()
    p.acceptance[("model", 0)] = 0.0
    assert p.best_model_draft(8)[0] == 0
    p.acceptance[("model", 0)] = 0.95
    assert p.best_model_draft(8)[0] >= 6
    assert policy(CHEAP, None).best_model_draft(8)[0] == 0  # no draft model measured: never
    d = DEAR_DRAFT()
    d.acceptance[("model", 0)] = 0.9
    assert d.best_model_draft(8)[0] == 0
    assert p.cost(20) > p.cost(9)  # extrapolated past the measured range
    assert p.draft_cost(3, pending=9) == pytest.approx(3 * 1.0 + 8 * 0.0)


def test_measuring_a_model_gives_usable_costs(lm):
    costs = measure_pass_costs(lm, n_max=4, reps=1)
    assert sorted(costs) == [1, 2, 3, 4] and all(t > 0 for t in costs.values())
    one, per_token = measure_draft_costs(lm, context=8, reps=1)
    assert one > 0 and per_token >= 0


def test_completer_builds_every_drafter_and_loads_the_draft_model_once(lm):
    loads = []
    completer = Completer(lm, load_model=lambda spec, **kw: loads.append(spec) or lm)
    completer.settings.draft_model = "tiny-random"
    completer.engine.speculation = CHEAP_VERIFY()  # injected costs: nothing is timed
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


async def test_server_turns_an_inserted_suggestion_into_history(lm):
    """An inserted suggestion reaches the Completer's history on the model worker, with what the user
    typed after it by the next request (lsp_server/lsp/documents.py `note_change`, worker/state.py `sync`)."""
    import asyncio
    from types import SimpleNamespace

    from lsprotocol import types
    from pygls.workspace import Workspace

    from lsp_server.lsp.documents import typed_after
    from lsp_server.lsp.server import DittoServer
    from lsp_server.lsp.worker.state import Sinks, Worker
    from lsp_server.settings import Settings

    server = DittoServer()
    uri = "file:///tmp/a.py"
    shown = "register_callback(on_event)"
    text = "h." + shown + "  # done\n\n    next_line()\nlater\n"
    server.protocol._workspace = Workspace(None)  # (pygls's, as `initialize` makes it)
    server.workspace.put_text_document(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
    ignore = lambda *args: None  # noqa: E731
    worker = Worker(ignore, Sinks(ignore, ignore, ignore, ignore), Settings)
    completer = worker.completer = Completer(lm)
    docs = server.documents
    docs.connect(worker.inbox.put)
    docs.keep_trace(uri, {"text": shown})
    change = SimpleNamespace(range=object(), text=shown)
    docs.note_change(uri, SimpleNamespace(content_changes=[SimpleNamespace(range=object(), text="x")]))
    docs.snapshot(uri, types.Position(line=0, character=0))
    await asyncio.to_thread(worker.sync, Settings())
    assert completer.history() == []
    docs.note_change(uri, SimpleNamespace(content_changes=[change]))
    docs.note_change(uri, SimpleNamespace(content_changes=[change]))  # one acceptance per suggestion
    assert typed_after(server.documents.document(uri), shown) == "  # done\n\n    next_line()"
    docs.snapshot(uri, types.Position(line=0, character=0))  # the next request tells the worker
    await asyncio.to_thread(worker.sync, Settings())
    assert completer.history() == [shown + "  # done\n\n    next_line()"]
    docs.snapshot(uri, types.Position(line=0, character=0))
    await asyncio.to_thread(worker.sync, Settings())
    assert completer.history() == [shown + "  # done\n\n    next_line()"]


def test_engine_does_not_cut_a_model_draft_short(lm):
    """Adaptive speculation must not trim a model draft after its passes were paid."""
    engine = Engine(lm)
    # A 2-row pass at 1.7 x one row (so drafting can pay at all, lsp_server/decoding/speculation.py can_pay), longer
    # ones dear: the policy would trim an unpaid draft to one token or none.
    engine.speculation = Speculation({1: 10.0, 2: 17.0, 3: 60.0, 9: 900.0}, learn=False)  # not the clock
    drafter = ModelDrafter(lm, target=lm)
    prompt = list(range(10, 40))
    out = engine.generate(prompt, drafter=drafter, options=DecodeOptions(max_new_tokens=12, draft_max=4))
    assert out.stats.drafted > 0 and out.stats.accepted == out.stats.drafted
    assert all(len(r.proposed) == r.offered for r in out.rounds)  # verified whole, never trimmed


def test_hybrid_shares_the_engines_policy(lm):
    completer = Completer(lm, load_model=lambda spec, **kw: lm)
    completer.engine.speculation = Speculation({1: 10.0, 2: 12.0, 4: 16.0, 9: 26.0})
    completer.engine.speculation.set_draft_costs(3.0, 0.1)
    h = completer.drafter_for("hybrid")
    assert h.policy is completer.engine.speculation and h.policy.draft_ms == 3.0  # nothing re-measured
    completer.engine.use_costs({1: 20.0, 2: 24.0})  # a recalibration reaches the hybrid too
    assert h.policy.cost(2) == 24.0

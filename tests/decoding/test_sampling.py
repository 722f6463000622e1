"""Tier 2: sampling with drafts has exactly the distribution of plain sampling.

A tiny random model with an 8-token vocabulary makes the exact distribution of every
3-token continuation computable by enumeration (8^3 sequences). Samples drawn by the
engine, with and without drafts, are tested against it with a chi-square test at fixed
seeds; the same test must reject a deliberately wrong acceptance rule.
"""

import math
import random

import pytest
import torch

from drafters import NGramDrafter, Proposal
from lsp_server.decoding.probs import filtered_probs
from lsp_server.decoding.types import DecodeOptions
from lsp_server.decoding.engine import Engine
import lsp_server.decoding.engine as engine_module
from lsp_server.backends.tiny import tiny_random_model
from lsp_server.backends.torch.model import TorchModel
from support.sampling import LENGTH, N, PROMPT, V, chi_square_pvalue, exact_distribution  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def lm():
    model = tiny_random_model(V, seed=3, hidden=32, init_std=0.15)
    return TorchModel("tiny-v8", "tiny-v8", model, None, torch.device("cpu"), torch.float32, stop_ids=frozenset(),
                      vocab_size=V)


class RandomOneHot:
    name = "random"

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def propose(self, context, k):
        return Proposal([self.rng.randrange(V) for _ in range(k)], "random")


class Fixed:
    """Always proposes the same tokens: a biased one-hot drafter (uniform drafts would hide some wrong rules)."""

    name = "fixed"

    def __init__(self, seed):
        pass

    def propose(self, context, k):
        return Proposal([3, 6, 3][:k], "fixed")


class RandomQ:
    """A draft-model stand-in: non-one-hot q per position, drafts sampled from q."""

    name = "model"

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, context, k):
        qs, toks = [], []
        for _ in range(k):
            q = torch.softmax(torch.randn(V, generator=self.gen) * 1.5, dim=0)
            toks.append(int(torch.multinomial(q, 1, generator=self.gen)))
            qs.append(q)
        return Proposal(toks, "model", probs=qs)


def sample(lm, drafter_factory, opts_kw, n):
    engine = Engine(lm)
    counts = {}
    for i in range(n):
        drafter = drafter_factory(i) if drafter_factory else None
        opts = DecodeOptions(max_new_tokens=LENGTH, seed=10_000 + i, **opts_kw)
        out = engine.generate(PROMPT, drafter=drafter, options=opts, cache_key="prompt")  # prefill once
        key = tuple(out.tokens)
        counts[key] = counts.get(key, 0) + 1
    return counts


CASES = [
    ("off", None, dict(temperature=1.0, draft_max=0)),
    ("ngram", lambda i: NGramDrafter(), dict(temperature=1.0, draft_max=3)),
    ("random-onehot", RandomOneHot, dict(temperature=1.0, draft_max=3)),
    ("fixed-onehot", Fixed, dict(temperature=1.0, draft_max=3)),
    ("draft-model-q", RandomQ, dict(temperature=1.0, draft_max=3)),
    ("onehot-topk-topp", RandomOneHot, dict(temperature=0.7, top_k=5, top_p=0.9, draft_max=3)),
]


@pytest.mark.parametrize("name,factory,kw", CASES, ids=[c[0] for c in CASES])
def test_sampling_distribution_matches_plain_sampling(lm, name, factory, kw):
    dist = exact_distribution(lm, DecodeOptions(**{k: v for k, v in kw.items() if k != "draft_max"}))
    assert abs(sum(dist.values()) - 1) < 1e-4
    counts = sample(lm, factory, kw, N)
    assert sum(counts.values()) == N
    assert chi_square_pvalue(counts, dist, N) > 1e-3, counts


def wrong_accept(logits, proposal, opts, gen):
    """A broken rule: on rejection, resample from p itself (the draft keeps its mass twice)."""
    p = filtered_probs(logits, opts.temperature, opts.top_k, opts.top_p)
    for i, d in enumerate(proposal.tokens):
        if float(torch.rand((), generator=gen)) < float(p[i, d]):
            continue
        return i, int(torch.multinomial(p[i], 1, generator=gen))
    return len(proposal.tokens), int(torch.multinomial(p[len(proposal.tokens)], 1, generator=gen))


def always_accept(logits, proposal, opts, gen):
    """A broken rule: every draft survives."""
    p = filtered_probs(logits, opts.temperature, opts.top_k, opts.top_p)
    return len(proposal.tokens), int(torch.multinomial(p[len(proposal.tokens)], 1, generator=gen))


@pytest.mark.parametrize("rule", [wrong_accept, always_accept], ids=["resample-from-p", "always-accept"])
def test_the_test_rejects_a_wrong_acceptance_rule(lm, monkeypatch, rule):
    kw = dict(temperature=1.0, draft_max=3)
    dist = exact_distribution(lm, DecodeOptions(temperature=1.0))
    monkeypatch.setattr(engine_module, "accept", rule)  # the rule the engine applies (decoding/accept.py)
    counts = sample(lm, Fixed, kw, N)
    assert chi_square_pvalue(counts, dist, N) < 1e-6


def test_chi_square_helper_is_calibrated():
    # Samples drawn straight from a known distribution pass; a shifted one fails.
    rng = random.Random(0)
    dist = {(0,): 0.5, (1,): 0.3, (2,): 0.2}
    good = {}
    for _ in range(2000):
        x = rng.choices([(0,), (1,), (2,)], weights=[0.5, 0.3, 0.2])[0]
        good[x] = good.get(x, 0) + 1
    assert chi_square_pvalue(good, dist, 2000) > 1e-3
    bad = {(0,): 1200, (1,): 500, (2,): 300}
    assert chi_square_pvalue(bad, dist, 2000) < 1e-6
    assert math.isclose(chi_square_pvalue({(0,): 1000, (1,): 600, (2,): 400}, dist, 2000), 1.0, abs_tol=1e-9)

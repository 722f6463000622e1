"""Near-ties on a backend whose multi-row passes are close to, not equal to, one-row passes.

torch float32 on a CPU differs between pass shapes by about 3e-5 in a logit on the default
model, and a greedy tie 1.9e-6 wide once went the other way in a verify pass
(docs/backends.md, "Near-ties"). The engine undoes a verify round that decided a token by
less than the backend's `tie_margin` and decodes it one token per pass, from plain decoding's
exact cache. Here a wrapper around the tiny model makes every multi-row pass flip its top two
logits wherever they are closer than a wide margin: with the guard off greedy drafting then
writes other tokens than drafting off, with it on the same tokens.
"""

from __future__ import annotations

import random

import pytest
import torch

from lsp_server.decoding.types import DecodeOptions

from lsp_server.decoding.engine import Engine
from lsp_server.backends.tiny import tiny_random

from support.prompts import drafters_for, random_prompt

WIDE = 1.5  # the tiny model's logits are peaked (tiny.py); ties this wide happen every few tokens


class Flipping:
    """The tiny model, with multi-row passes that decide near-ties the other way."""

    def __init__(self, lm, tie_margin):
        self._lm, self.tie_margin = lm, tie_margin

    def __getattr__(self, name):
        return getattr(self._lm, name)

    def forward(self, ids, cache, last):
        logits = self._lm.forward(ids, cache, last=last).clone()
        if last > 1:
            top = logits.topk(2, dim=-1)
            for row in range(last):
                a, b = top.indices[row].tolist()
                if top.values[row, 0] - top.values[row, 1] < WIDE:
                    logits[row, a], logits[row, b] = logits[row, b].clone(), logits[row, a].clone()
        return logits


@pytest.fixture(scope="module")
def tiny():
    return tiny_random()


def run(lm, prompt, drafter, k):
    return Engine(lm).generate(prompt, drafter=drafter, options=DecodeOptions(max_new_tokens=16, draft_max=k,
                                                                             adaptive=False))


def test_a_verify_pass_that_flips_a_near_tie_is_undone_and_decoded_plainly(tiny):
    rng = random.Random(7)
    unguarded, guarded = Flipping(tiny, None), Flipping(tiny, WIDE)
    differed = replays = 0
    for _ in range(4):
        prompt = random_prompt(rng, tiny)
        reference = run(tiny, prompt, None, 0).tokens
        for drafter in drafters_for(tiny, prompt, reference, rng):
            for k in (3,):
                differed += run(unguarded, prompt, drafter, k).tokens != reference
                out = run(guarded, prompt, drafter, k)
                assert out.tokens == reference, (drafter.name, k)
                replays += out.stats.tie_replays
    assert differed > 0  # the flips do change unguarded output: the guard is what keeps it exact
    assert replays > 0


def test_the_torch_backend_names_a_margin_only_where_passes_are_close_but_not_invariant(tiny):
    assert tiny.tie_margin == pytest.approx(1e-3)  # float32 on the CPU
    assert tiny.with_options(pad_to=9).tie_margin is None  # one pass shape: nothing to guard
    assert getattr(Engine(tiny), "lm").tie_margin is not None

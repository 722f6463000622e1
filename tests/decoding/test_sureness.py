"""How sure the model was of each token (lsp_server/decoding/accept.py `sureness`, `Completion.probs` and
`margins`): read from the rows that decided the tokens, the same drafting on or off, and the same for a
generation paused at a deadline and resumed as for one uninterrupted call."""

from __future__ import annotations

import pytest
import torch

from lsp_server.decoding.accept import sureness
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.types import DecodeOptions
from support.prompts import ListDrafter


@pytest.fixture(scope="module")
def lm():
    from lsp_server.backends.tiny import tiny_random

    return tiny_random()


def test_sureness_is_the_softmax_of_the_deciding_row():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    (p0, m0), (p1, m1) = sureness(logits, [0, 2])
    soft = torch.softmax(logits, dim=-1)
    assert p0 == pytest.approx(float(soft[0, 0])) and m0 == pytest.approx(float(soft[0, 0] - soft[0, 1]))
    assert p1 == pytest.approx(float(soft[1, 2])) and m1 == pytest.approx(float(soft[1, 2] - soft[1, 0]))


def test_every_token_has_its_probability_drafting_on_or_off_and_across_a_pause(lm):
    prompt = lm.encode("def area(self):\n    return self.width * self.height\n\ndef perimeter(self):\n")
    opts = DecodeOptions(max_new_tokens=24)
    plain = Engine(lm).generate(prompt, options=DecodeOptions(max_new_tokens=24, draft_max=0))
    assert len(plain.probs) == len(plain.margins) == len(plain.tokens) > 0
    assert all(0.0 < p <= 1.0 for p in plain.probs) and all(0.0 <= m <= 1.0 for m in plain.margins)
    # Drafting (greedy): the same tokens, hence the same rows' verdicts, whatever was drafted.
    n = len(prompt)

    def half_right(ctx, k):  # the reference's next tokens, every third one wrong
        good = plain.tokens[len(ctx) - n : len(ctx) - n + k]
        return [t if i % 3 else (t + 1) % lm.vocab_size for i, t in enumerate(good)]

    drafted = Engine(lm).generate(prompt, options=DecodeOptions(max_new_tokens=24, adaptive=False),
                                  drafter=ListDrafter("half", half_right))
    assert drafted.tokens == plain.tokens
    assert drafted.probs == pytest.approx(plain.probs, abs=1e-4)
    # Paused after 5 tokens and resumed: one uninterrupted generation's numbers.
    engine = Engine(lm)
    first = engine.generate(prompt, options=opts, cache_key="k", pause=lambda out: len(out) >= 5)
    assert first.stats.stop_reason == "paused" and len(first.probs) == len(first.tokens)
    rest = engine.resume("k")
    assert rest.tokens == plain.tokens and rest.probs == pytest.approx(plain.probs, abs=1e-4)

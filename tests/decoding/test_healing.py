"""Token healing (lsp_server/decoding/healing.py, lsp_server/completion/typed.py `healed_tail`):
the mask, its exactness under speculation (greedy and sampling), the prompt it leaves, and
KV reuse while the user types inside a word."""

from __future__ import annotations

import random

import pytest
import torch

from lsp_server.decoding.probs import filtered_probs
from lsp_server.backends.tiny import tiny_random, tiny_random_model
from lsp_server.backends.torch.model import TorchModel
from lsp_server.completion.completer import Completer, CompleterSettings
from lsp_server.completion.context import healed_tail
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.healing import Healing, VocabBytes
from lsp_server.decoding.types import DecodeOptions
from support.prompts import drafters_for, random_prompt
from support.sampling import chi_square_pvalue

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def lm():
    return tiny_random()


# -- the mask ------------------------------------------------------------------------------------

VOCAB = [b"", b"e", b"el", b"else", b"elif", b"x", b" e", b"\xc3", b"\xa9", b"\xc3\xa9t\xc3\xa9", b"ls", b"e:"]


def test_allowed_tokens_extend_or_are_a_prefix_of_what_is_left():
    v = VocabBytes(VOCAB)
    names = lambda ids: sorted(VOCAB[i] for i in ids.tolist())  # noqa: E731
    assert names(v.allowed(b"el")) == [b"e", b"el", b"elif", b"else"]
    assert names(v.allowed(b"e")) == [b"e", b"e:", b"el", b"elif", b"else"]
    assert names(v.allowed(b"\xc3\xa9")) == [b"\xc3", b"\xc3\xa9t\xc3\xa9"]  # a byte token, or one that spells more
    assert names(v.allowed(b"\xff\xff")) == []
    assert v.step(b"el", VOCAB.index(b"e")) == b"l" and v.step(b"el", VOCAB.index(b"else")) == b""
    assert v.step(b"el", VOCAB.index(b"x")) is None and v.step(b"el", 0) is None  # a special token writes nothing


def test_the_mask_follows_the_draft_row_by_row():
    v = VocabBytes(VOCAB)
    h = Healing(v, b"els")
    logits = torch.zeros(4, len(VOCAB))
    draft = [VOCAB.index(b"e"), VOCAB.index(b"ls"), VOCAB.index(b"x")]
    out = h.mask(logits, h.start(), draft)
    allowed = [sorted(VOCAB[i] for i in torch.isfinite(row).nonzero().flatten().tolist()) for row in out]
    assert allowed[0] == [b"e", b"el", b"else"]  # "els" is left
    assert allowed[1] == [b"ls"]  # after "e": "ls" is left ("l" alone is not a token here)
    assert allowed[2] == sorted(VOCAB)  # after "els" + "ls"... healing is over: row unconstrained
    assert h.advance(b"els", [VOCAB.index(b"el")]) == b"s" and h.advance(b"els", [VOCAB.index(b"else")]) is None


# -- the prompt it leaves ------------------------------------------------------------------------

@pytest.mark.parametrize("typed", ["    e", "    sel", "self.ite", "x = é", "naïve_", "s = \"日本", "    ", "a(", "\t\tif x"])
def test_healed_tail_spells_the_typed_text_and_ends_at_a_boundary(lm, typed):
    ids, healed = healed_tail(lm, typed, "token")
    kept = b"".join(lm.token_bytes()[t] for t in ids)
    assert kept + healed.encode("utf-8") == typed.encode("utf-8")
    assert healed  # something is always left for the model to write
    if typed.strip():
        assert ids == lm.encode(typed)[: len(ids)]  # the prefix of the whole text's tokens


@pytest.mark.parametrize("typed", ["        ", "\t\t", " "])
def test_indentation_alone_leaves_its_last_blank_to_the_model(lm, typed):
    """Tokenizers write an indented line's last blank with its first word (" self"), so only that
    blank is healed (lsp_server/completion/typed.py `healed_tail`; the default model:
    tests/decoding/test_real_model.py)."""
    assert healed_tail(lm, typed, "token") == ((lm.encode(typed[:-1]) if typed[:-1] else []), typed[-1])
    assert healed_tail(lm, typed, "blanks") == ([], typed)  # a remote engine: the blanks are left out


def test_a_keystroke_rewrites_at_most_the_last_kept_token(lm):
    """The healed boundary moves only when a token completes, so a keystroke keeps every kept id
    but perhaps the last (the tiny tokenizer has few merges, so its boundary moves often; the
    default model keeps the ids inside a word: tests/decoding/test_real_model.py)."""
    seen = [healed_tail(lm, "    return sel" + "f.items"[:n], "token")[0] for n in range(8)]
    for a, b in zip(seen, seen[1:]):
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common >= min(len(a), len(b)) - 1, (a, b)


# -- exactness: plain == speculative with the mask --------------------------------------------

def _heal_cases(lm, rng, n):
    table = lm.token_bytes()
    words = [b for b in table if len(b) >= 2]
    for _ in range(n):
        w = rng.choice(words)
        yield random_prompt(rng, lm), w[: rng.randrange(1, len(w))]


@pytest.mark.parametrize("seed", range(4))
def test_greedy_speculative_with_healing_equals_drafting_off(lm, seed):
    rng = random.Random(seed)
    vocab = VocabBytes(lm.token_bytes())
    for prompt, healed in _heal_cases(lm, rng, 3):
        h = Healing(vocab, healed)
        ref = Engine(lm).generate(prompt, options=DecodeOptions(max_new_tokens=12, draft_max=0), constraint=h)
        written = b"".join(vocab.table[t] for t in ref.tokens)
        assert written.startswith(healed)  # the constraint held
        for drafter in drafters_for(lm, prompt, ref.tokens, rng):
            for k in (1, 3, 8):
                out = Engine(lm).generate(prompt, drafter=drafter, constraint=h,
                                          options=DecodeOptions(max_new_tokens=12, draft_max=k, adaptive=False))
                assert out.tokens == ref.tokens, (drafter.name, k)


def test_sampling_with_healing_draws_from_the_masked_distribution():
    """Exact distribution by enumeration (the mask applied at each step) against draws of the
    speculative sampler with a drafter that proposes forbidden and allowed tokens alike."""
    V = 8
    table = [b"", b"a", b"ab", b"abc", b"b", b"c", b"bc", b"x"]
    model = tiny_random_model(V, seed=3, hidden=32, init_std=0.15)
    lm = TorchModel("tiny-v8", "tiny-v8", model, None, torch.device("cpu"), torch.float32, stop_ids=frozenset(),
                    vocab_size=V)
    vocab = VocabBytes(table)
    h = Healing(vocab, b"abc")
    prompt, length = [1, 5, 2, 5, 2], 3
    opts = DecodeOptions(max_new_tokens=length, temperature=1.0, draft_max=3, adaptive=False, seed=None)

    dist = {}

    def walk(prefix, prob, rest):
        if len(prefix) == length:
            dist[tuple(prefix)] = dist.get(tuple(prefix), 0) + prob
            return
        logits = lm.forward(prompt + prefix, lm.new_cache(), last=1)
        logits = h.mask(logits, rest, [])
        p = filtered_probs(logits, 1.0, 0, 1.0)[0]
        for t in range(V):
            if p[t] > 0:
                walk(prefix + [t], prob * float(p[t]), h.advance(rest, [t]))

    walk([], 1.0, h.start())
    assert all(b"".join(table[t] for t in seq).startswith(b"abc") or
               b"abc".startswith(b"".join(table[t] for t in seq)) for seq in dist)

    class Mixed:
        name = "mixed"

        def __init__(self, rng):
            self.rng = rng

        def propose(self, context, k):
            from drafters import Proposal
            return Proposal([self.rng.randrange(V) for _ in range(k)], source="mixed", match_len=4)

    rng = random.Random(0)
    counts: dict = {}
    n = 1500
    for i in range(n):
        out = Engine(lm).generate(prompt, drafter=Mixed(rng), constraint=h,
                                  options=DecodeOptions(**{**opts.__dict__, "seed": i}))
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
    assert chi_square_pvalue(counts, dist, n) > 1e-3


# -- the completer: the suggestion follows the typed word; KV reuse inside a word ---------------

def test_the_suggestion_starts_after_the_typed_text_and_reuses_the_cache_while_typing(lm):
    c = Completer(lm, settings=CompleterSettings(drafter="none"))
    doc = "def area(width, height):\n    return wi\n"
    first = c.complete(doc, 1, 13, name="a.py", cache_key="a", options=DecodeOptions(max_new_tokens=8))
    assert first.prompt.healed and "wi".endswith(first.prompt.healed.strip()) or first.prompt.healed.endswith("wi")
    assert first.raw.startswith(first.prompt.healed)  # the model wrote the healed text itself
    typed_one_more = "def area(width, height):\n    return wid\n"
    c.settings.type_through = False
    second = c.complete(typed_one_more, 1, 14, name="a.py", cache_key="a", options=DecodeOptions(max_new_tokens=8))
    if second.prompt.ids == first.prompt.ids:  # the boundary did not move: nothing to prefill
        assert second.completion.stats.prefill_tokens == 0
    else:  # it moved by a completed token: only the tail is prefilled
        assert second.completion.stats.prefill_tokens <= 3
    assert second.raw.startswith(second.prompt.healed)

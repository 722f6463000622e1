"""Tier 1: the n-gram drafter on plain lists of ints (no torch, no model)."""

import random

import pytest

from drafters import NGramDrafter, NGramIndex, Proposal
from drafters.base import Drafter


def fresh_index(tokens, n_min=2, n_max=6):
    idx = NGramIndex(n_min, n_max)
    idx.set_tokens(tokens)
    return idx


def test_is_a_drafter():
    assert isinstance(NGramDrafter(), Drafter)


def test_copies_the_continuation_from_the_context():
    d = NGramDrafter()
    ctx = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    p = d.propose(ctx, 3)
    assert p.tokens == [4, 5, 9]
    assert p.match_len == 3 and p.source == "context"


def test_matches_across_buffers():
    d = NGramDrafter()
    d.update_source("other.py", [7, 8, 10, 11, 12, 13, 14])
    p = d.propose([1, 2, 7, 8, 10], 4)
    assert p.tokens == [11, 12, 13, 14]
    assert p.source == "other.py"


def test_longest_match_wins_over_a_shorter_closer_one():
    d = NGramDrafter()
    # The context has "5 6" -> 20 (a 2-gram match); the buffer has "4 5 6" -> 30 (a 3-gram).
    d.update_source("buf", [4, 5, 6, 30, 31])
    p = d.propose([5, 6, 20, 21, 4, 5, 6], 2)
    assert p.match_len == 3
    assert p.tokens == [30, 31]


def test_tie_break_by_frequency_then_proximity():
    d = NGramDrafter()
    # After "1 2": 3 occurs twice (in buffer a and b), 4 once (in the context, the most trusted).
    d.update_source("a", [1, 2, 3, 50])
    d.update_source("b", [1, 2, 3, 60])
    ctx = [1, 2, 4, 70, 1, 2]
    p = d.propose(ctx, 2)
    assert p.tokens[0] == 3  # frequency beats trust
    # Second token: 50 and 60 once each -> proximity: both buffers have the same trust,
    # so the later position wins; equal positions -> the earlier registered source.
    assert p.tokens[1] in (50, 60)
    # Equal frequency: the context (more trusted) wins over a buffer.
    d2 = NGramDrafter()
    d2.update_source("a", [1, 2, 3, 9])
    p2 = d2.propose([1, 2, 4, 9, 1, 2], 1)
    assert p2.tokens == [4]
    # Within one source, the later (nearer the cursor) position wins a tie.
    d3 = NGramDrafter()
    p3 = d3.propose([1, 2, 5, 0, 1, 2, 6, 0, 1, 2], 1)
    assert p3.tokens == [6]


def test_history_is_less_trusted_than_buffers():
    d = NGramDrafter()
    d.update_source("history", [1, 2, 8], priority=2)
    d.update_source("buf", [1, 2, 9])
    assert d.propose([0, 1, 2], 1).tokens == [9]


def test_no_self_match_past_the_end():
    d = NGramDrafter()
    # The only occurrence of the final n-gram is the end of the context itself.
    assert d.propose([1, 2, 3, 4], 4).tokens == []
    # A repeated token run: the match may copy from earlier, never from past the end.
    p = d.propose([5, 5, 5, 5], 8)
    assert all(t == 5 for t in p.tokens)
    assert len(p.tokens) <= 2  # only two positions follow a "5 5" 2-gram... inside the context


def test_empty_and_tiny_inputs():
    d = NGramDrafter()
    assert d.propose([], 4) == Proposal([], source="", match_len=0)
    assert d.propose([1], 4).tokens == []
    assert d.propose([1, 2], 4).tokens == []
    assert d.propose([1, 2, 1, 2], 0).tokens == []
    d.update_source("empty", [])
    d.update_source("one", [3])
    assert d.propose([3, 3], 2).tokens == []
    d.forget_source("never-added")  # no error


def test_draft_length_follows_match_length():
    d = NGramDrafter()
    long = list(range(100, 140))
    d.update_source("buf", long)
    assert len(d.propose([0, 100, 101], 16).tokens) == d.draft_limit(2) == 3
    assert len(d.propose([0, 100, 101, 102, 103, 104, 105], 16).tokens) == min(16, d.draft_limit(6))
    assert len(d.propose([0, 100, 101, 102, 103, 104, 105], 4).tokens) == 4


def test_forget_source():
    d = NGramDrafter()
    d.update_source("buf", [1, 2, 3])
    assert d.propose([1, 2], 1).tokens == [3]
    d.forget_source("buf")
    assert d.propose([1, 2], 1).tokens == []
    assert d.source_names() == []


@pytest.mark.parametrize("seed", range(20))
def test_incremental_updates_equal_a_fresh_index(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(rng.randrange(0, 80))]
    idx = fresh_index(tokens)
    for _ in range(15):
        op = rng.choice(["insert", "delete", "replace", "append", "truncate"])
        i = rng.randrange(len(tokens) + 1)
        if op == "insert":
            tokens[i:i] = [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
        elif op == "delete":
            del tokens[i : i + rng.randrange(1, 5)]
        elif op == "replace":
            tokens[i : i + 2] = [rng.randrange(6)]
        elif op == "append":
            idx.extend(more := [rng.randrange(6) for _ in range(3)])
            tokens.extend(more)
            assert idx.table == fresh_index(tokens).table
            continue
        else:
            del tokens[i:]
        idx.set_tokens(tokens)
        assert idx.tokens == tokens
        assert idx.table == fresh_index(tokens).table


def test_update_work_is_proportional_to_the_changed_tail():
    idx = fresh_index(list(range(1000)))
    assert idx.set_tokens(list(range(1000)) + [1, 2, 3]) == 3
    assert idx.set_tokens(list(range(990)) + [7]) == 1
    assert idx.set_tokens([7] + list(range(1, 991))) == 991  # an edit at the very start re-indexes all


def test_context_index_follows_growth_and_replacement():
    d = NGramDrafter()
    ctx = [1, 2, 3, 1, 2]
    assert d.propose(ctx, 1).tokens == [3]
    ctx += [9, 1, 2]  # generated tokens appended
    assert d.propose(ctx, 1).tokens in ([9], [3])
    # A new, unrelated context must not see the old one.
    assert d.propose([4, 4, 7, 1, 2], 1).tokens == []


def test_max_tokens_per_source_bounds_the_index():
    d = NGramDrafter(max_tokens_per_source=100)
    d.update_source("big", list(range(1000)))
    assert len(d.source_tokens("big")) == 100
    assert d.propose([0, 950, 951], 2).tokens == [952, 953]
    assert d.propose([0, 10, 11], 2).tokens == []


# -- healing: the cursor split a token (a made-up vocabulary; tiny-random's in test_engine.py) --

HEAL_VOCAB = {10: " return", 11: " self", 12: ".", 13: ".width", 14: " *", 15: ".height", 16: "\n", 17: "width",
              18: "height", 19: "w", 20: "idth", 21: ".w", 22: "i", 23: "dth", 24: "\ufffd", 25: "\ufffd\ufffd",
              26: "d", 27: "th", 28: "s"}


class Texts:
    """token_text and encode over HEAL_VOCAB (encode: longest known text first), counting calls."""

    def __init__(self):
        self.calls = 0

    def token_text(self, tid):
        self.calls += 1
        return HEAL_VOCAB[tid]

    def encode(self, text):
        out = []
        while text:
            tid = max((t for t, s in HEAL_VOCAB.items() if "\ufffd" not in s and text.startswith(s)),
                      key=lambda t: len(HEAL_VOCAB[t]))
            out.append(tid)
            text = text[len(HEAL_VOCAB[tid]) :]
        return out


def healing(**kw):
    t = Texts()
    return NGramDrafter(token_text=t.token_text, encode=t.encode, **kw), t


# " return self.width * self.height\n return self."  (the last "." is a split ".width")
SPLIT = [10, 11, 13, 14, 11, 15, 16, 10, 11, 12]


def test_a_split_last_token_matches_by_its_text():
    d, texts = healing()
    p = d.propose(SPLIT, 8)
    # The 2-gram " return self" matched as ids, "." as the start of ".width": the draft is
    # "width" (the rest, re-encoded) and what followed, up to the 2-gram's draft limit.
    assert p.tokens == [17, 14, 11][: d.draft_limit(2)]
    assert (p.match_len, p.healed, p.source, p.agreement) == (2, 1, "context", 1.0)
    calls = texts.calls
    d.propose(SPLIT, 8)
    assert texts.calls == calls  # token texts are cached
    # Without the text functions the drafter is what it was: no token "." anywhere, no draft.
    assert NGramDrafter().propose(SPLIT, 8) == Proposal([], source="", match_len=0)


def test_healing_backs_off_more_than_one_token():
    d, _ = healing()
    # ... " return self.wi": ".wi" split as ".w" "i"; m = 1 ("i") finds nothing, m = 2 (".wi") does.
    p = d.propose([10, 11, 13, 14, 16, 10, 11, 21, 22], 8)
    assert p.tokens[:2] == [23, 14] and (p.match_len, p.healed) == (2, 2)
    assert NGramDrafter(heal_back=1, token_text=HEAL_VOCAB.get, encode=Texts().encode).propose(
        [10, 11, 13, 14, 16, 10, 11, 21, 22], 8).tokens == []


def test_healing_needs_a_strictly_longer_token_and_whole_utf8():
    d, _ = healing()
    # The continuation "." itself (not longer) is the ordinary match's business.
    assert d.propose([10, 11, 12, 16, 10, 11, 12], 4).healed == 0
    # A last token that is part of a character (its text decodes to U+FFFD) is never healed ...
    assert d.propose([10, 11, 25, 16, 10, 11, 24], 4).tokens == []
    # ... nor is a continuation that is.
    assert d.propose([10, 11, 25, 26, 16, 10, 11, 26, 16, 10, 11, 24], 4).tokens == []


def test_the_match_covering_more_of_the_context_wins():
    d, _ = healing()
    # Exact: "10 11 12" -> 27 (3 tokens). Healed: "10 11" + "." in ".width" covers 3: the exact one wins the tie.
    ctx = [10, 11, 12, 27, 10, 11, 13, 14, 26, 10, 11, 12]
    p = d.propose(ctx, 4)
    assert (p.healed, p.match_len, p.tokens[0]) == (0, 3, 27)
    # Exact "11 12" (2 tokens) against healed "26 16 10 11" + "." (5): the healed one wins.
    ctx = [11, 12, 27, 26, 16, 10, 11, 13, 14, 26, 16, 10, 11, 12]
    p = d.propose(ctx, 4)
    assert (p.healed, p.match_len, p.tokens[0]) == (1, 4, 17)
    # With no text functions: the exact 2-gram, as before.
    assert NGramDrafter().propose(ctx, 4).tokens[0] == 27


def test_healing_prefers_the_more_frequent_continuation():
    d, _ = healing()
    # After "\n return self": ".height" twice, ".width" once (the nearer): frequency first.
    ctx = [16, 10, 11, 15, 16, 10, 11, 15, 16, 10, 11, 13, 16, 10, 11, 12]
    p = d.propose(ctx, 1)
    assert p.tokens == [18] and p.agreement == pytest.approx(2 / 3)


def test_healing_reaches_other_buffers():
    d, _ = healing()
    d.update_source("other.py", [16, 10, 11, 13, 14])
    p = d.propose([26, 27, 10, 11, 12], 3)
    assert p.tokens == [17, 14] and p.source == "other.py" and p.healed == 1


def test_the_default_models_tokenizer_heals_self_dot():
    """The case that showed the need: `return self.` after `return self.width ...` (Qwen2.5)."""
    from pathlib import Path

    tokenizers = pytest.importorskip("tokenizers")
    found = sorted(Path.home().glob(".cache/ditto/models/qwen2.5-coder-0.5b-*/tokenizer.json"))
    if not found:
        pytest.skip("the default model is not installed")
    tok = tokenizers.Tokenizer.from_file(str(found[0]))

    def encode(text):
        return tok.encode(text, add_special_tokens=False).ids

    def token_text(tid):
        return tok.decode([tid], skip_special_tokens=False)

    text = ("def area(self):\n    return self.width * self.height\n\n"
            "def perimeter(self):\n    return 2 * (self.width + self.height)\n\n"
            "def area(self):\n    return self.")
    ids = encode(text)
    assert token_text(ids[-1]) == "." and ids[-1] not in ids[:-1]  # the split: "." never occurs before
    assert NGramDrafter().propose(ids, 8).tokens == []
    p = NGramDrafter(token_text=token_text, encode=encode).propose(ids, 8)
    assert token_text(p.tokens[0]) == "width" and p.healed == 1 and p.match_len >= 2
    assert "".join(map(token_text, p.tokens)).startswith("width * self.height")

"""The array-backed n-gram index (drafters/ngram.py, issue 26) drafts exactly as the dict-of-lists
index it replaced (kept verbatim in tests/support/ngram_reference.py): the same proposals, field
for field, for the same index contents — random streams under random edits and appends, and
this repository's own files tokenized by tiny-random's tokenizer, with healing on.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from drafters import NGramDrafter, NGramIndex
from support.ngram_reference import RefNGramDrafter, RefNGramIndex

ROOT = Path(__file__).resolve().parents[2]


def pair(**kw):
    return NGramDrafter(**kw), RefNGramDrafter(**kw)


def same(new, ref, context, k):
    a, b = new.propose(context, k), ref.propose(context, k)
    assert a == b, (context[-8:], k, a, b)
    assert all(type(t) is int for t in a.tokens)
    return a


def edit(rng, tokens, vocab):
    op = rng.choice(["insert", "delete", "replace", "append", "truncate", "head"])
    i = rng.randrange(len(tokens) + 1)
    if op == "insert":
        tokens[i:i] = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
    elif op == "delete":
        del tokens[i : i + rng.randrange(1, 40)]
    elif op == "replace":
        tokens[i : i + 2] = [rng.randrange(vocab)]
    elif op == "append":
        tokens.extend(rng.randrange(vocab) for _ in range(rng.randrange(1, 400)))
    elif op == "truncate":
        del tokens[i:]
    else:
        tokens[:0] = [rng.randrange(vocab) for _ in range(3)]
    return tokens


@pytest.mark.parametrize("seed", range(12))
def test_random_streams_and_edits_draft_the_same(seed):
    rng = random.Random(seed)
    vocab = rng.choice([5, 12, 40, 3000])
    new, ref = pair(max_candidates=rng.choice([4, 64]), max_tokens_per_source=rng.choice([300, 65536]))
    streams = {f"b{j}": [rng.randrange(vocab) for _ in range(rng.randrange(0, 1500))] for j in range(4)}
    for name, toks in streams.items():
        prio = 2 if name == "b3" else 1
        new.update_source(name, toks, priority=prio)
        ref.update_source(name, toks, priority=prio)
    for _ in range(30):
        name = rng.choice(list(streams))
        toks = edit(rng, streams[name], vocab)
        new.update_source(name, toks, priority=2 if name == "b3" else 1)
        ref.update_source(name, toks, priority=2 if name == "b3" else 1)
        assert new.source_tokens(name) == ref.source_tokens(name)
        src = streams[rng.choice(list(streams))] or [1, 2, 3]
        at = rng.randrange(len(src) + 1)
        context = [rng.randrange(vocab) for _ in range(rng.randrange(0, 30))] + src[max(0, at - 300) : at]
        for k in (1, 3, 8, 16):
            same(new, ref, context, k)
        # The context grows by what was "generated", as in the engine's rounds.
        grown = context + [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
        same(new, ref, grown, 8)
    if rng.random() < 0.5:
        new.forget_source("b0"), ref.forget_source("b0")
        same(new, ref, streams["b0"][:50], 8)


@pytest.mark.parametrize("seed", range(20))
def test_index_tables_equal_the_reference_under_edits(seed):
    """The index itself: every gram's positions, read back from the arrays, equal the old table's."""
    rng = random.Random(seed)
    vocab = rng.choice([3, 7, 50])
    tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 900))]
    n_min, n_max = rng.choice([(2, 6), (1, 4), (2, 8), (3, 3)])
    new, ref = NGramIndex(n_min, n_max), RefNGramIndex(n_min, n_max)
    for _ in range(12):
        tokens = edit(rng, tokens, vocab)
        if rng.random() < 0.3:
            more = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
            new.extend(more), ref.extend(more)
            tokens = list(ref.tokens)  # extend() appends to what the index held
        else:
            assert new.set_tokens(tokens) == ref.set_tokens(tokens)
        assert new.tokens == ref.tokens
        assert new.table == ref.table
        for gram in list(ref.table)[:50]:
            for limit in (1, 5, 64):
                assert new.positions(gram, limit) == ref.positions(gram, limit)
    new.compact()
    assert new.table == ref.table


def test_numpy_streams_and_out_of_range_ids():
    idx = NGramIndex()
    idx.set_tokens(np.array([1, 2, 3, 1, 2, 4], np.int32))
    assert idx.positions((1, 2), 8) == [2, 5]
    assert idx.positions((1, 10**9), 8) == [] and idx.positions((-1, 2), 8) == []
    with pytest.raises(ValueError):
        idx.set_tokens([1, -5])


def test_memory_is_a_small_constant_per_token():
    idx = NGramIndex()
    idx.set_tokens([random.Random(0).randrange(30000) for _ in range(50_000)])
    assert idx.nbytes() <= 24 * 50_000 + 8192  # 22 bytes a token (n_max 6) and the bigram filter


# -- real buffers: this repository's files, tiny-random's tokenizer, healing on -------------------


@pytest.fixture(scope="module")
def tiny():
    from lsp_server.backends.tiny import tiny_random

    return tiny_random()


def test_real_buffers_draft_the_same_with_healing(tiny):
    files = [ROOT / p for p in ("drafters/ngram.py", "lsp_server/completion/context.py", "lsp_server/lsp/scheduler.py",
                                "ditto_bench/storm.py", "tests/drafters/test_drafters.py")]
    texts = {str(f): f.read_text(encoding="utf-8") for f in files}
    new, ref = pair(token_text=tiny.token_text, encode=tiny.encode)
    ids = {}
    for name, text in texts.items():
        ids[name] = tiny.encode(text)
        new.update_source(name, ids[name])
        ref.update_source(name, ids[name])
    rng = random.Random(1)
    checked = drafted = healed = 0
    for name, text in texts.items():
        lines = text.split("\n")
        for _ in range(40):
            i = rng.randrange(len(lines))
            col = rng.randrange(len(lines[i]) + 1)
            before = "\n".join(lines[max(0, i - 30) : i] + [lines[i][:col]])
            context = tiny.encode(before)
            for k in (4, 10):
                p = same(new, ref, context, k)
                checked += 1
                drafted += bool(p.tokens)
                healed += bool(p.healed)
    # An edit to one buffer (a line typed in its middle), then the same again.
    name = next(iter(texts))
    edited = texts[name].replace("\n\n", "\n    extra_line = compute(value)\n\n", 1)
    new.update_source(name, tiny.encode(edited)), ref.update_source(name, tiny.encode(edited))
    for _ in range(20):
        at = rng.randrange(len(edited))
        same(new, ref, tiny.encode(edited[max(0, at - 400) : at]), 8)
    assert drafted > checked // 2 and healed > 0, (checked, drafted, healed)

"""The open buffers' tokens and index (lsp_server/completion/buffers.py, issue 26): an edit
re-tokenizes only the blocks it touched and ends where a fresh indexing would, huge texts are
indexed as head and tail, deferred work goes in bounded slices, and the memory budget drops the
least recently used buffers, which come back when visited. Work is counted, never timed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from drafters import NGramDrafter
from lsp_server.completion import buffers as bufmod
from lsp_server.completion.buffers import BLOCK_CHARS, SLICE_CHARS, OpenBuffers, block_starts, region_of
from support.ngram_reference import RefNGramDrafter

ROOT = Path(__file__).resolve().parents[2]


class CountingEncoder:
    """A deterministic toy tokenizer (one id per word or character class run) that counts its work."""

    def __init__(self):
        self.chars = 0
        self.calls = 0

    def __call__(self, text: str) -> list[int]:
        import re

        self.chars += len(text)
        self.calls += 1
        return [hash(piece) % 50_000 for piece in re.findall(r"\w+|\s+|[^\w\s]+", text)]


def fresh_tokens(encode, text: str, max_chars: int = 262144) -> list[int]:
    region = region_of(text, max_chars)
    starts = block_starts(region, 0, len(region))
    return [t for a, z in zip(starts, starts[1:]) for t in encode(region[a:z])]


def make(encode=None, **kw) -> tuple[OpenBuffers, NGramDrafter]:
    d = NGramDrafter()
    return OpenBuffers(encode or CountingEncoder(), d, **kw), d


def corpus(lines: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        if i % 12 == 0:
            out.append(f"def function_{rng.randrange(1000)}(value, other):")
        else:
            out.append("    " * rng.randrange(1, 3) + rng.choice(["value = other + 1", "return value", "x = call(y)",
                                                                 "if value:", "items.append(value)", ""]))
    return "\n".join(out) + "\n"


def test_blocks_are_those_of_the_whole_text_where_lines_start_unindented():
    text = corpus(3000)
    starts = block_starts(text, 0, len(text))
    assert len(starts) > 10 and all(text[s - 1] == "\n" and not text[s].isspace() for s in starts[1:-1])
    assert all(b - a <= 4 * BLOCK_CHARS for a, b in zip(starts, starts[1:]))


@pytest.mark.parametrize("seed", range(8))
def test_edits_end_where_a_fresh_indexing_does(seed):
    rng = random.Random(seed)
    enc = CountingEncoder()
    ob, d = make(enc)
    text = corpus(2000, seed)
    ob.set("a.py", text)
    for _ in range(25):
        i = rng.randrange(len(text) + 1)
        op = rng.choice(["type", "enter", "delete", "paste", "cut_line"])
        if op == "type":
            text = text[:i] + rng.choice("abc(=) ") + text[i:]
        elif op == "enter":
            text = text[:i] + "\n" + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + rng.randrange(1, 200) :]
        elif op == "paste":
            text = text[:i] + corpus(rng.randrange(1, 300), seed + 1) + text[i:]
        else:
            j = text.find("\n", i)
            text = text[:i] + (text[j + 1 :] if j >= 0 else "")
        before = enc.chars
        ob.set("a.py", text)
        toks = ob.tokens("a.py")
        # Self-consistent: the tokens are the blocks' tokens; and the same as a fresh indexing's
        # wherever the blocks cut at the same places (always for this corpus: unindented lines often).
        assert toks == fresh_tokens(CountingEncoder(), text)
        assert d.source_tokens("a.py") == toks[-d.max_tokens_per_source :]
        if op in ("type", "enter", "delete"):
            assert enc.chars - before <= 12 * BLOCK_CHARS  # the touched blocks, not the text


def test_an_edit_in_the_middle_of_a_huge_text_tokenizes_nothing():
    enc = CountingEncoder()
    ob, d = make(enc, max_chars=100_000)
    text = corpus(60_000)  # ~1.3 MB
    ob.set("big.py", text)
    first = enc.chars
    assert first <= 100_000 and len(region_of(text, 100_000)) <= 100_000
    mid = len(text) // 2
    ob.set("big.py", text[:mid] + "x" + text[mid:])
    assert enc.chars == first
    end = len(text) - 50
    ob.set("big.py", text[:end] + "y = 1\n" + text[end:])
    assert enc.chars - first <= 8 * BLOCK_CHARS


def test_deferred_work_goes_in_slices():
    enc = CountingEncoder()
    ob, d = make(enc)
    ob.defer = True
    texts = {f"b{k}.py": corpus(400, k) for k in range(6)}
    for name, text in texts.items():
        ob.set(name, text)
    assert enc.chars == 0 and ob.pending() == 6 and d.source_names() == []
    steps = 0
    while True:
        before = enc.chars
        if not ob.step():
            break
        steps += 1
        assert enc.chars - before <= SLICE_CHARS + 4 * BLOCK_CHARS
    assert ob.pending() == 0 and sorted(d.source_names()) == sorted(texts)
    # The most recently set buffer was indexed first.
    assert steps >= 6


def test_the_budget_drops_the_least_recently_used_and_a_visit_brings_it_back():
    ob, d = make()
    texts = {f"b{k}.py": corpus(300, k) for k in range(5)}
    ob.set("b0.py", texts["b0.py"])
    one = ob.nbytes()
    ob.set_budget(int(one * 3.5))
    for name in list(texts)[1:]:
        ob.set(name, texts[name])
    assert ob.nbytes() <= ob.budget
    assert "b0.py" not in d.source_names() and "b4.py" in d.source_names()
    assert ob.stats()["evicted"] == 2 and ob.counts["evictions"] == 2
    ob.defer = True
    ob.visit("b0.py")
    assert ob.pending() == 1
    while ob.step():
        pass
    assert "b0.py" in d.source_names() and "b1.py" not in d.source_names()  # b1 is now the least recent
    ob.forget("b0.py")
    assert "b0.py" not in d.source_names() and "b0.py" not in ob.names()


def test_lru_order_survives_a_backlog_bigger_than_the_budget():
    ob, d = make()
    ob.defer = True
    ob.set_budget(1)  # nothing fits but the buffer indexed last
    for k in range(4):
        ob.set(f"b{k}.py", corpus(200, k))
    while ob.step():
        pass
    assert ob.pending() == 0 and ob.stats()["indexed"] == 0  # every one dropped, none indexed twice
    assert ob.counts["indexings"] == 1


def test_drafts_equal_the_reference_drafter_on_the_same_tokens():
    from lsp_server.backends.tiny import tiny_random

    lm = tiny_random()
    ob, d = make(lm.encode)
    ref = RefNGramDrafter()
    files = [ROOT / "lsp_server/completion/context.py", ROOT / "lsp_server/lsp/scheduler.py"]
    for f in files:
        text = f.read_text(encoding="utf-8")
        ob.set(f.name, text)
        ob.set(f.name, text.replace("\n\n", "\n\n# edited\n", 3))
        ref.update_source(f.name, ob.tokens(f.name))
    rng = random.Random(0)
    text = files[0].read_text(encoding="utf-8")
    for _ in range(60):
        at = rng.randrange(len(text))
        ctx = lm.encode(text[max(0, at - 300) : at])
        assert d.propose(ctx, 8) == ref.propose(ctx, 8)


def test_disabled_for_a_model_that_generates_elsewhere():
    enc = CountingEncoder()
    ob, d = make(enc, enabled=False)
    ob.set("a.py", corpus(100))
    assert enc.chars == 0 and d.source_names() == [] and ob.pending() == 0 and not ob.step()


def test_region_is_whole_lines_of_head_and_tail():
    text = "".join(f"line {i}\n" for i in range(100_000))
    region = region_of(text, 10_000)
    assert len(region) <= 10_000 and region.startswith("line 0\n") and region.endswith("line 99999\n")
    assert all(line.startswith("line ") for line in region.splitlines())
    assert region_of("short", 10) == "short"
    assert bufmod.region_of("x" * 50, 10) == "x" * 5 + "x" * 5


def test_an_update_under_way_goes_on_while_the_text_changes():
    """Typing in a big buffer that is still being indexed: the blocks already tokenized are kept, so
    the work is the text once plus the block typed in, not the text again at every keystroke."""
    enc = CountingEncoder()
    ob, d = make(enc)
    ob.defer = True
    text = corpus(8000)
    ob.set("a.py", text)
    steps = 0
    while ob.pending():
        text += "x = call(y)\n"  # typed at the end between two slices
        ob.set("a.py", text)
        ob.step()
        steps += 1
        assert steps < 200
    assert steps > 3 and enc.chars <= len(text) + steps * 4 * BLOCK_CHARS
    assert ob.tokens("a.py") == fresh_tokens(CountingEncoder(), text)

"""The edit history: changes merged into groups as a user types them, kept in step, and bounded."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from lsp_server.nextedit.history import EditHistories, EditHistory, Limits, changed_span


class Doc:
    """A text and its history, changed as an editor sends changes."""

    def __init__(self, text: str, history: EditHistory | None = None):
        self.text = text
        self.h = history or EditHistory(clock=lambda: 0.0)

    def change(self, start: int, end: int, new: str) -> None:
        removed = self.text[start:end]
        self.text = self.text[:start] + new + self.text[end:]
        self.h.record(start, end, new, removed)

    def type(self, at: int, chars: str) -> None:
        for i, c in enumerate(chars):
            self.change(at + i, at + i, c)


def check(doc: Doc, old: str) -> None:
    """Every group's `new` stands at its offset now, and putting the `old`s back gives the text before."""
    back = doc.text
    for g in sorted(doc.h.groups(), key=lambda g: g.start, reverse=True):
        assert doc.text[g.start : g.end] == g.new
        back = back[: g.start] + g.old + back[g.end :]
    assert back == old


def test_a_rename_typed_is_one_group():
    d = Doc("x = foo(1)\ny = foo(2)\n")
    i = d.text.index("foo")
    d.change(i, i + 3, "")
    d.type(i, "bar")
    (g,) = d.h.groups()
    assert (g.start, g.old, g.new, g.changes) == (i, "foo", "bar", 4)


def test_backspaces_then_typing_and_typing_around_merge():
    d = Doc("value = compute(a, b)\n")
    end = d.text.index(")")
    for k in range(1, 3):  # backspace "b" and " "
        d.change(end - k, end - k + 1, "")
    d.change(end - 3, end - 2, "")  # and the ","
    d.type(end - 3, ", c=b")
    (g,) = d.h.groups()
    assert (g.old, g.new) == (", b", ", c=b")
    check(d, "value = compute(a, b)\n")


def test_typed_and_deleted_again_leaves_nothing():
    d = Doc("abc\n")
    d.type(1, "xy")
    d.change(1, 3, "")
    assert d.h.groups() == []


def test_groups_move_with_edits_above_and_an_overlapped_one_goes():
    old = "one\ntwo\nthree\nfour\n"
    d = Doc(old)
    d.change(d.text.index("four"), d.text.index("four") + 4, "FOUR")
    d.change(d.text.index("two"), d.text.index("two") + 3, "TWO")  # a second group, above the first
    d.type(0, "zero\n")  # a third, above both: both move
    assert [g.new for g in d.h.groups()] == ["FOUR", "TWO", "zero\n"]
    check(d, old)
    i = d.text.index("TWO")
    d.change(i - 4, i + 2, "")  # cuts into TWO's region (and is not next to the newest group): TWO goes
    assert [g.new for g in d.h.groups()][:1] == ["FOUR"] and "TWO" not in [g.new for g in d.h.groups()]


def test_random_edits_keep_every_group_where_it_is():
    rng = random.Random(3)
    old = "".join(f"line {i} = value_{i}\n" for i in range(40))
    for trial in range(30):
        d = Doc(old)
        for _ in range(25):
            a = rng.randrange(len(d.text) + 1)
            b = min(len(d.text), a + rng.choice([0, 0, 1, 3]))
            d.change(a, b, rng.choice(["", "x", "yz", "\n", "foo"]))
        for g in d.h.groups():
            assert d.text[g.start : g.end] == g.new


def test_the_whole_text_form_records_the_changed_span():
    d = Doc("alpha beta gamma\n")
    d.h.record_text(d.text, "alpha BETA gamma\n")
    (g,) = d.h.groups()
    assert (g.start, g.old, g.new) == (6, "beta", "BETA")
    d.h.record_text("same", "same")
    assert len(d.h.groups()) == 1


def test_a_bad_range_is_refused_and_nothing_is_recorded():
    h = EditHistory()
    with pytest.raises(ValueError):
        h.record(5, 3, "x", "")
    with pytest.raises(ValueError):
        h.record(0, 2, "x", "abc")
    assert h.groups() == [] and h.changes == 0


@pytest.mark.parametrize("seed", range(4))
def test_changed_span_matches_a_plain_scan(seed):
    rng = random.Random(seed)
    base = "".join(rng.choice("ab\n ") for _ in range(rng.randrange(0, 20000)))
    for _ in range(20):
        a = rng.randrange(len(base) + 1)
        b = min(len(base), a + rng.randrange(0, 50))
        new = base[:a] + "".join(rng.choice("abc") for _ in range(rng.randrange(0, 5))) + base[b:]
        x, y, z = changed_span(base, new)
        assert base[:x] + new[x:z] + base[y:] == new and base[:x] == new[:x]
        p = 0
        while p < min(len(base), len(new)) and base[p] == new[p]:
            p += 1
        assert x == p  # the longest common prefix


def test_count_and_bytes_are_bounded():
    h = EditHistory(Limits(groups=4, chars=100, edit_chars=40))
    text = "x" * 1000
    for k in range(10):  # ten separate edits far apart: the oldest go
        at = 900 - 90 * k
        h.record(at, at + 1, "y", text[at : at + 1])
    assert len(h.groups()) == 4
    h.record(0, 0, "z" * 30, "")  # within edit_chars, but the characters kept pass `chars`: old groups go
    h.record(500, 500, "w" * 30, "")
    h.record(200, 200, "v" * 30, "")
    h.record(300, 300, "u" * 30, "")
    assert h.chars() <= 100


BIG = 5 * 1024 * 1024


def test_a_5_mb_document_replaced_whole_keeps_no_text():
    """A reload or a paste of a 5 MB file is a `large` group: its text is not kept (tracemalloc counts)."""
    old = "a = 1\n" * (BIG // 6)
    new = "b = 2\n" * (BIG // 6)
    h = EditHistory()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    h.record(0, len(old), new, old)
    h.record_text(new, old)  # and back, as a whole-document change
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    kept = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert kept < 64 * 1024
    assert all(g.large and g.old == "" and g.new == "" for g in h.groups())
    assert h.chars() == 0


def test_200_open_buffers_stay_within_their_bounds():
    limits = Limits()
    hs = EditHistories(limits, max_docs=256)
    text = "v = 0\n" * 2000
    for k in range(200):
        uri = f"file:///b{k}.py"
        for j in range(50):  # fifty separate edits in each, some large
            at = (j * 211) % len(text)
            new = "w" * (limits.edit_chars + 1) if j % 10 == 0 else "name_%d" % j
            hs.record(uri, at, at + 1, new, text[at])
    assert len(hs.uris()) == 200
    assert all(len(hs.peek(u).groups()) <= limits.groups for u in hs.uris())
    assert hs.chars() <= 200 * limits.chars
    hs.record("file:///extra.py", 0, 0, "x", "")
    for k in range(100):
        hs.record(f"file:///more{k}.py", 0, 0, "x", "")
    assert len(hs.uris()) == 256 and hs.peek("file:///b0.py") is None  # the least recently changed went
    hs.forget("file:///extra.py")
    assert hs.peek("file:///extra.py") is None

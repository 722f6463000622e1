"""Incremental edits through `Lines` (lsp_server/lsp/protocol.py, issue 26) give the text the
whole-document rules gave (the former apply_change, kept below as the reference), and its line
tables stay those of the text: LSP's breaks (\\n, \\r\\n, \\r) and "\\n" alone, as text.split("\\n")."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from lsprotocol import types

from lsp_server.lsp.protocol import LINE_BREAK, Lines


def reference_apply(text: str, rng: types.Range, new_text: str, units) -> str:
    """apply_change as it was before issue 26 (a line table of the whole text per change)."""
    starts = [0] + [m.end() for m in LINE_BREAK.finditer(text)]

    def offset(pos: types.Position) -> int:
        if pos.line >= len(starts):
            return len(text)
        begin = starts[pos.line]
        m = LINE_BREAK.search(text, begin)
        end = m.start() if m else len(text)
        i, seen = begin, 0
        while i < end and seen < pos.character:
            seen += units(text[i])
            i += 1
        return i

    a, b = offset(rng.start), offset(rng.end)
    if b < a:
        a, b = b, a
    return text[:a] + new_text + text[b:]


def utf16(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


PIECES = ["a", "bc", " ", "\n", "\r\n", "\r", "é", "😀", "\u2028", "\x0c", "def f():", "    x = 1", "\n\n", "\r\r\n"]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(n))


def check(lines: Lines) -> None:
    text = lines.text
    want = [0] + [m.end() for m in LINE_BREAK.finditer(text)]
    assert lines.starts.tolist() == want
    assert lines.nl.tolist() == [0] + [m.end() for m in re.finditer("\n", text)]
    split = text.split("\n")
    for i in (0, len(split) // 2, len(split) - 1):
        assert lines.line(i) == split[i]


@pytest.mark.parametrize("seed", range(30))
def test_edits_equal_the_whole_text_rules(seed):
    rng = random.Random(seed)
    text = random_text(rng, rng.randrange(0, 60))
    lines = Lines(text)
    check(lines)
    for _ in range(40):
        n = max(1, len(LINE_BREAK.findall(text)) + 1)
        pos = lambda: types.Position(line=rng.randrange(n + 2), character=rng.randrange(12))  # noqa: E731
        change = types.Range(start=pos(), end=pos())
        new = random_text(rng, rng.randrange(0, 4))
        want = reference_apply(text, change, new, utf16)
        text = lines.apply(change, new, utf16)
        assert text == want
        check(lines)


def test_ascii_lines_take_the_fast_path_with_the_same_result():
    text = "".join(f"line {i}\n" for i in range(2000))
    lines = Lines(text)
    rng = random.Random(1)
    for _ in range(200):
        p = types.Position(line=rng.randrange(2100), character=rng.randrange(20))
        new = rng.choice(["x", "\n", "", "ab\ncd"])
        want = reference_apply(text, types.Range(start=p, end=p), new, utf16)
        text = lines.apply(types.Range(start=p, end=p), new, utf16)
        assert text == want
    check(lines)
    assert isinstance(lines.nl, np.ndarray)

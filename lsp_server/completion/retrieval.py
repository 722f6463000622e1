"""Snippets of other open buffers chosen by similarity to the code around the cursor (as Continue
and Tabby do), the alternative to the head of each buffer (`ContextBudget.snippet_source`).

The document's own lines above its prompt window are one more buffer here (context.py). Each
buffer is cut into chunks of `CHUNK_LINES` lines; a chunk's score is the Jaccard
similarity of its identifiers (words of three characters or more) with those of the query (the
lines-above window and the typed text). The best chunks come first, while they fit. So that the
prompt's start stays the same while the user edits (its KV cache is reused), the choice is kept
with the document's window (context.py `Window`) and made again only when the window moves or the
set of other buffers changes; the chunks' current text is read at every request.

Left out on purpose: tokens (context.py measures the chunks against the budget).
"""

from __future__ import annotations

import re

CHUNK_LINES = 8
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


def words(text: str) -> set[str]:
    return set(_WORD.findall(text))


def ranked_chunks(others: list[tuple[str, str]], query: str, limit: int = 32) -> list[tuple[str, int]]:
    """(buffer name, first line) of the `limit` chunks of `others` most similar to `query`, best first."""
    q = words(query)
    if not q:
        return []
    scored = []
    for name, text in others:
        lines = text.split("\n")
        for start in range(0, len(lines), CHUNK_LINES):
            w = words("\n".join(lines[start:start + CHUNK_LINES]))
            if w:
                scored.append((len(w & q) / len(w | q), name, start))
    scored.sort(key=lambda s: (-s[0], s[1], s[2]))
    return [(name, start) for score, name, start in scored[:limit] if score > 0]


def chunk_text(others: dict[str, str], name: str, start: int) -> str | None:
    text = others.get(name)
    if text is None:
        return None
    return "\n".join(text.split("\n")[start:start + CHUNK_LINES])


# What followed the same lines elsewhere in this file (`repeat_ids`, context.py `Window.repeat`). Code repeats
# within a file (a sync client and its async twin, a decoder beside its siblings, a test beside the
# one it was copied from), and when the lines just above the cursor stand further up the file too,
# the lines after them there are the best guess at what comes next. Those lines are outside a small
# window of lines above: on httpx, 15 of 26 replay requests had their true line 29-652 lines up the
# same file (ditto_bench/truth_lines.py; docs/design.md, "Prompt layout and windows", `[repeat]`), and the peer, with 256 lines above,
# got all 15 right.
MIN_MATCH = 16  # non-blank characters the matched lines hold at least (`)`, `else:` alone match everywhere)
MAX_RUN = 3  # matched lines shown before what followed them
NEIGHBOURS = 12  # lines around a match (and above the cursor) whose identifiers break ties between matches


def repeated_at(lines: list[str], line: int, typed: str, regions: list[tuple[int, int]],
                limit: int = 100_000) -> tuple[int, int] | None:
    """(first, cursor) lines of the best other occurrence of the lines above `line`, or None.

    The lines just above the cursor (blank ones skipped at the end) are looked for in `regions`
    ((lo, hi) line ranges of `lines`, outside the prompt's windows), compared with their indentation
    stripped (a method and its twin one class further in). A match is kept only if the first non-blank
    line after it starts with what is typed on the cursor line. The best one matches the most
    characters, then has the most identifiers in common with the lines around the cursor (of the
    `flush` methods of six decoder classes, the one of the class that keeps the same fields), then
    lies nearest the cursor. `first` is where the shown lines start (at most MAX_RUN
    matched lines), `cursor` the line in the occurrence that stands where the cursor does: what
    followed. At most `limit` lines are compared (a huge buffer costs a bounded scan).
    """
    p = line - 1
    while p >= 0 and not lines[p].strip():
        p -= 1
    if p < 0:
        return None
    gap = line - 1 - p  # blank lines between the last matched line and the cursor
    target = lines[p].strip()
    want = typed.strip()
    best = None
    seen = 0
    near = None
    for lo, hi in regions:
        for j in range(max(lo, 0), min(hi, len(lines))):
            seen += 1
            if seen > limit:
                break
            if lines[j].strip() != target or j == p:
                continue
            run, chars = 0, 0
            while run < 64 and min(j, p) - run >= 0 and lines[j - run].strip() == lines[p - run].strip():
                chars += len(lines[j - run].strip())
                run += 1
            if chars < MIN_MATCH:
                continue
            nxt = j + 1 + gap
            while nxt < len(lines) and not lines[nxt].strip():
                nxt += 1
            if nxt >= len(lines) or not lines[nxt].strip().startswith(want):
                continue
            if near is None:
                near = words("\n".join(lines[max(0, line - NEIGHBOURS):line]))
            alike = len(near & words("\n".join(lines[max(0, j - NEIGHBOURS):j + NEIGHBOURS])))
            key = (chars, alike, -abs(line - j))
            if best is None or key > best[0]:
                best = (key, max(j - run + 1, j - MAX_RUN + 1), j + 1 + gap)
    return None if best is None else best[1:]


def followed_lines(encode, lines: list[str], line: int, typed: str, regions: list[tuple[int, int]],
                   budget: int) -> tuple[str, ...]:
    """The lines (each with its newline) of `repeated_at`'s match and what followed it, whole lines
    within `budget` tokens (`encode` tokenizes one line); () when nothing repeats or nothing that
    followed fits."""
    found = repeated_at(lines, line, typed, regions)
    if found is None:
        return ()
    first, cursor = found
    parts: list[str] = []
    n = 0
    for i in range(first, min(len(lines), cursor + 64)):
        if len(lines[i]) > 8 * budget:  # a line that cannot fit: not tokenized
            break
        k = len(encode(lines[i] + "\n"))
        if n + k > budget:
            break
        parts.append(lines[i] + "\n")
        n += k
    return tuple(parts) if first + len(parts) > cursor else ()  # something that followed, or nothing


def similar_snippets(others: list[tuple[str, str]], lines: list[str], start: int, line: int, typed: str,
             window) -> list[tuple[str, str]]:  # window: context.py `Window` or None
    """Chunks of `others` (the other buffers, and this one above its window) most like the lines-above
    window (`ranked_chunks`), as (name, chunk text) snippets; chosen again only
    when the window moves or the buffers change."""
    key = (start, tuple(sorted(n for n, _ in others)))
    if window is not None and window.chosen and window.chosen[:2] == key:
        picks = window.chosen[2]
    else:
        picks = ranked_chunks(others, "\n".join(lines[start:line]) + "\n" + typed)
        if window is not None:
            window.chosen = (*key, picks)
    texts = dict(others)
    out = [(name, t) for name, first in picks if (t := chunk_text(texts, name, first)) is not None]
    return out


def repeat_ids(encode, lines: list[str], line: int, typed: str, start: int, mid: int, below_end: int,
                budget: int, window) -> list[int]:  # window: context.py `Window` or None
    """The ids of what followed the lines above the cursor where they stand elsewhere in this file,
    outside the prompt's windows (`followed_lines`), within `budget` tokens; `encode`
    tokenizes one line. Chosen when the place is new (the middle starts at the cursor line); kept,
    text and all, while the place stays, so lines typed there do not change the prompt's start; and
    kept at a new place where nothing repeats (the last choice is still this file's text; dropping
    it would re-prefill the whole prompt)."""
    if window is not None and window.repeat and window.repeat[0] == mid:
        text = window.repeat[1]
    else:
        text = followed_lines(encode, lines, mid, typed if mid == line else lines[mid],
                              [(0, start), (below_end, len(lines))], budget)
        if not text and window is not None and window.repeat:
            text = window.repeat[1]
        if window is not None:
            window.repeat = (mid, text)
    return [t for part in text for t in encode(part)]

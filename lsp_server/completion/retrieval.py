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

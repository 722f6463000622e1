"""This file's head: its first lines, which open the prompt's prefix at every place below them.

A place not visited yet costs its whole prompt in prefill, on one CPU core about 13-16 ms a token
(docs/design.md, "Prompt layout and windows"). The lines of a file's start (after its licence and other leading
comments: its imports, usually) are the same at every place in it, so the prompt of every place
below them opens with their tokens (context.py, layout) and the engine reuses their cache from
the last place asked in the file, or from idle prefill when the file was opened
(prompts.py `warm`). Their tokens come out of the lines-above window (`ContextBudget.file_head`):
a new place costs that many fewer, for the same first lines right on the replay requests they
were measured on (the same section, `[head]`: 20/113 either way).

A snapshot of a long document is a window of it (lsp_server/lsp/documents.py `WindowText`) that
carries the document's first lines as `head_text`, so the head is the whole text's there too.

Left out on purpose: the rest of the layout (context.py), the cache (the engine).
"""

from __future__ import annotations

COMMENT = ("#", "//", "/*", "*", "--", ";")  # a leading line that starts so is not part of the head
SCAN_LINES = 256  # the head is found within the file's first lines (a window of a long document carries them)


def file_head_ids(encode, text: str, lines: list[str], start: int, budget: int,
                  too_long: int) -> tuple[list[int], list[int], int]:
    """(the head's ids before the window's first line `start`, the whole head's ids, the line after the
    whole head, relative to `lines`; 0 without a head) within `budget` tokens.

    `lines` are `text`'s; `text` may be a window of a document from its line `first_line` on,
    carrying the document's first lines as `head_text`. `encode` tokenizes one line."""
    offset = getattr(text, "first_line", 0)
    own = getattr(text, "head_text", None) if offset else None
    head_lines = own.split("\n") if own is not None else lines
    if budget <= 0 or (offset and own is None):
        return [], [], 0
    whole, end = _head(encode, head_lines, min(len(head_lines), SCAN_LINES), budget, too_long)
    if not whole:
        return [], [], 0
    before = whole if end <= start + offset else _head(encode, head_lines, start + offset, budget, too_long)[0]
    return before, whole, end - offset


def _head(encode, lines: list[str], end: int, budget: int, too_long: int) -> tuple[list[int], int]:
    """(ids, the line after them) of the first lines before `end`, after leading blank and comment
    lines, within `budget` tokens."""
    first = 0
    while first < end and (not lines[first].strip() or lines[first].lstrip().startswith(COMMENT)):
        first += 1
    ids: list[int] = []
    k = first
    while k < end and len(lines[k]) < too_long:
        part = encode(lines[k] + "\n")
        if len(ids) + len(part) > budget:
            break
        ids.extend(part)
        k += 1
    return ids, k

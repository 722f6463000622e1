"""The prompt's sections of context from outside its windows: the definitions of the names the code
around the cursor uses, and the user's recent edits (docs/design.md, "Definitions and recent edits in
the prompt"). Both come as Python comment lines (`PromptExtras`), made elsewhere: the definitions by
jedi in a process of its own (definitions.py, lsp_server/lsp/definitions.py), the edits from the
session's edit histories (lsp_server/nextedit/recent.py).

Where they go (context.py's layout): right after this file's head, before `[repeat]` and the lines
above, in the current file, so the model's own format is kept:

    <fim_prefix>[head][definitions][edits][repeat]lines above<fim_suffix>...

The head is the same at every place of the file and its KV is reused from the last place asked
(head.py); the sections change per place, so nothing of them may come before it. Each takes whole
lines (an edit's hunk whole) within its share of the budget (`ContextBudget.definitions`, `.edits`)
and, as `[repeat]` does, the place of as many tokens at the top of the window above (`room_at_top`),
so a place not visited yet costs what it did without them. The window keeps at least half its
tokens: where it holds too few to give, the sections are cut (the edits first) by whole pieces.

Chosen when a place is new and kept while it stays (`chosen`, in the file's prompt window state,
context.py `Window.extras`), as `[repeat]` is: lines typed at a place never change the prompt's
start, so its KV cache is reused while the user types, whatever newer definitions or edits arrive.

Left out on purpose: resolving and finding them (above), LSP, threads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptExtras:
    """The sections' texts offered for one prompt (comment lines, each ending with "\\n"; "" for none)."""

    definitions: str = ""
    edits: str = ""


NONE = PromptExtras()


def chosen(extras: PromptExtras | None, window, mid: int) -> PromptExtras:
    """The sections at the place whose middle starts at line `mid`: `extras` when the place is new,
    those chosen then while it stays (module docstring). `window`: context.py `Window`, or None."""
    if window is None:
        return extras or NONE
    if window.extras and window.extras[0] == mid:
        return window.extras[1]
    window.extras = (mid, extras or NONE)
    return extras or NONE


HUNK = ("# - ", "# + ")  # the lines of an edit's hunk, after its header (lsp_server/nextedit/recent.py)


def _pieces(text: str, unit: tuple[str, ...] = ()) -> list[str]:
    """`text`'s lines, or with `unit`, each line and the lines after it that start with one of `unit`."""
    pieces: list[str] = []
    for line in text.splitlines(keepends=True):
        if unit and pieces and line.startswith(unit):
            pieces[-1] += line
        else:
            pieces.append(line)
    return pieces


def section_lines(encode, text: str, budget: int, unit: tuple[str, ...] = ()) -> list[list[int]]:
    """The ids of `text`'s first pieces within `budget` tokens, a list per piece: a line, or with
    `unit`, a line and the lines after it that start with one of `unit` (an edit's header and its
    lines: a header without them says nothing), whole or not at all (`encode` tokenizes one line)."""
    out: list[list[int]] = []
    n = 0
    for piece in _pieces(text, unit):
        if len(piece) > 8 * max(budget, 1):  # cannot fit: not tokenized
            break
        ids = [t for line in piece.splitlines(keepends=True) for t in encode(line)]
        if n + len(ids) > budget:
            break
        out.append(ids)
        n += len(ids)
    return out


def room_at_top(enc, start: int, mid: int, need: int, keep: int = 0) -> tuple[int, int]:
    """(tokens, the window's new first line) of the fewest whole lines at the top of the window
    [start, mid) that hold `need` tokens, leaving at least `keep` of its tokens; fewer where the window
    cannot give that many (`enc(i)`: the ids of line i)."""
    total = sum(len(enc(i)) for i in range(start, mid)) if keep else 0
    cut, top = 0, start
    while cut < need and top < mid and (not keep or total - cut - len(enc(top)) >= keep):
        cut += len(enc(top))
        top += 1
    return cut, top


def take(enc, encode, extras: PromptExtras | None, window, start: int, mid: int, definitions: int,
         edits: int) -> tuple[list[int], list[int], int, int, frozenset[str]]:
    """(the definitions' ids, the edits' ids, the window's new first line, tokens taken from the
    window, the sections' lines as written, stripped) for a prompt whose window above is [start, mid)
    (module docstring). `definitions` and `edits` are the budget's shares (0: the section is left out).
    The lines are there for the stop rules: the model copies one now and then (`# edit in F:` after a
    typed `#`), and a suggestion never writes the prompt's own comments into the file (stops.py)."""
    if definitions <= 0 and edits <= 0:
        return [], [], start, 0, frozenset()
    ex = chosen(extras, window, mid)
    defs = section_lines(encode, ex.definitions, definitions) if definitions > 0 else []
    done = section_lines(encode, ex.edits, edits, HUNK) if edits > 0 else []
    need = sum(map(len, defs)) + sum(map(len, done))
    if need == 0:
        return [], [], start, 0, frozenset()
    window_tokens = sum(len(enc(i)) for i in range(start, mid))
    cut, top = room_at_top(enc, start, mid, need, keep=(window_tokens + 1) // 2)
    while need > cut and done:  # the window cannot give that much: the edits go first (a hunk whole), then definitions
        need -= len(done.pop())
    while need > cut and defs:
        need -= len(defs.pop())
    if need < cut:  # cut down to what is left: no line of the window goes for nothing
        cut, top = room_at_top(enc, start, mid, need)
    written = [*_pieces(ex.definitions)[:len(defs)], *_pieces(ex.edits, HUNK)[:len(done)]]
    lines = frozenset(line.strip() for piece in written for line in piece.splitlines() if line.strip())
    return [t for ids in defs for t in ids], [t for ids in done for t in ids], top, cut, lines

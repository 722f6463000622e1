"""The user's recent edits as the prompt's comment lines (`recent_edits`): what was just changed elsewhere
often says what comes next here (a function renamed, a parameter added, a field introduced).

Each open document's edits are its `EditHistory` (history.py, recorded on the event loop). An edit
group becomes a hunk of whole lines, before and after, one comment line per changed line (the
original/updated blocks Sweep's next-edit models read, written as comments so the prompt stays the
current file's code, docs/design.md "Definitions and recent edits in the prompt"):

    # edit in store.py:
    # - def get(self, key):
    # + def get_items(self, key: str) -> list[Item]:

Only the edits that bear on the cursor: those that share an identifier (three characters or more, not
a keyword, lsp_server/completion/retrieval.py `words`) with the lines around it, outside the cursor's
own window in its document (those lines are in the prompt as they are now), not whitespace alone and
not too large to keep (history.py `large`). Most recent first; at most `Limits.hunks` hunks of
`Limits.lines` lines a side. Cheap: a few string searches per edit group, so the loop computes it
when it takes a snapshot (lsp_server/lsp/documents.py).

Left out on purpose: tokens and the budget (lsp_server/completion/extras.py), LSP, recording (history.py).
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass

from lsp_server.completion.retrieval import words
from lsp_server.nextedit.history import EditGroup

COMMON = frozenset(keyword.kwlist) | {"self", "cls"}  # shared by every two pieces of code: they say nothing


@dataclass(frozen=True)
class Limits:
    hunks: int = 3  # hunks at most
    lines: int = 3  # changed lines of each side of a hunk at most
    line_chars: int = 120  # characters of one line at most (a longer one is cut)


@dataclass(frozen=True)
class Hunk:
    name: str
    old: tuple[str, ...]  # the changed lines before the edit
    new: tuple[str, ...]  # and now
    at: float  # when it was last changed (EditGroup.last_at)


def hunk(name: str, text: str, group: EditGroup, skip: tuple[int, int] | None = None) -> Hunk | None:
    """The lines `group` changed in `text` (the document now), or None: too large, nothing but
    whitespace, or touching `skip` (offsets [a, b) of the cursor's window)."""
    if group.large or group.old == group.new:
        return None
    a, b = max(0, min(group.start, len(text))), max(0, min(group.end, len(text)))
    first = text.rfind("\n", 0, a) + 1
    last = text.find("\n", b)
    last = len(text) if last < 0 else last
    if skip is not None and first <= skip[1] and last >= skip[0]:
        return None
    new = text[first:last].split("\n")
    old = (text[first:a] + group.old + text[b:last]).split("\n")
    while old and new and old[0] == new[0]:
        old, new = old[1:], new[1:]
    while old and new and old[-1] == new[-1]:
        old, new = old[:-1], new[:-1]
    if _bare(old) == _bare(new):  # whitespace alone
        return None
    return Hunk(name, tuple(old), tuple(new), group.last_at)


def recent_edits(documents, near: str, limits: Limits = Limits()) -> str:
    """The recent edits that bear on the cursor, as comment lines (module docstring).

    `documents`: (name, text now, edit groups, skip) per open document, `skip` the offsets of the
    cursor's window in its own document (None elsewhere); `near`: the lines around the cursor."""
    want = words(near) - COMMON
    if not want:
        return ""
    found: list[Hunk] = []
    for name, text, groups, skip in documents:
        for group in groups:
            h = hunk(name, text, group, skip)
            if h is not None and (words("\n".join(h.old + h.new)) - COMMON) & want:
                found.append(h)
    found.sort(key=lambda h: -h.at)
    return "".join(_written(h, limits) for h in found[: limits.hunks])


def _written(h: Hunk, limits: Limits) -> str:
    lines = [line for line in (*h.old, *h.new) if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in lines), default=0)

    def side(mark: str, part: tuple[str, ...]) -> str:
        shown = [line[indent:].rstrip() for line in part if line.strip()][: limits.lines]
        return "".join(f"# {mark} {_cut(line, limits.line_chars)}\n" for line in shown)

    return f"# edit in {h.name}:\n" + side("-", h.old) + side("+", h.new)


def _bare(lines) -> list[str]:
    return [bare for line in lines if (bare := "".join(line.split()))]


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."

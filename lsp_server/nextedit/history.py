"""A document's recent edits, kept small: what next-edit suggestions learn the user's change from.

The server records every change of a document (`record`: a range of the text before the change,
the text it removed and the text put there, in code points) and asks for the recent edits when a
next edit is wanted (`groups`). Changes that touch one another (typing a word, deleting a name
and typing its replacement) are merged into one `EditGroup`: the text of that region before the
first of them (`old`) and now (`new`), and where the region lies in the current text (`start`),
kept in step as later edits above it shift it.

Bounded whatever the documents: at most `Limits.groups` groups a document (oldest dropped) and
`Limits.chars` characters of old and new text over them; a change with more than
`Limits.edit_chars` characters on either side (a paste of a file, a whole-document reload) is kept
as a `large` group without its text, so a 5 MB document costs what a small one does. Across
documents, `EditHistories` keeps at most `max_docs` histories (least recently changed dropped).

Left out on purpose: LSP types and positions (the server turns an LSP range into offsets of its
text), the document's text itself (never copied here: the caller passes the current text when it
asks for a proposal), learning from the edits (propagate.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from lsp_server.lru import lru_get


@dataclass(frozen=True)
class Limits:
    groups: int = 16  # edit groups kept per document
    chars: int = 16384  # characters of old + new text kept per document, over its groups
    edit_chars: int = 4096  # a group with more on either side keeps no text (`large`)


@dataclass
class EditGroup:
    """A region the user changed: `old` was there before the first change, `new` is there now,
    at offset `start` of the current text (code points). `large`: too big to keep its text."""

    start: int
    old: str
    new: str
    version: int | None = None  # the document version after the last change merged in
    first_at: float = 0.0  # clock times of its first and last change
    last_at: float = 0.0
    changes: int = 1
    large: bool = False
    old_len: int = 0  # lengths, kept also for a large group (its text is dropped)
    new_len: int = 0

    @property
    def end(self) -> int:
        """End of the region in the current text."""
        return self.start + self.new_len

    def size(self) -> int:
        return len(self.old) + len(self.new)


class EditHistory:
    """The recent edits of one document, oldest first (module docstring)."""

    def __init__(self, limits: Limits | None = None, clock=time.monotonic):
        self.limits = limits or Limits()
        self.clock = clock
        self._groups: list[EditGroup] = []
        self.changes = 0  # changes recorded since creation (a statistic)

    def groups(self) -> list[EditGroup]:
        """The edit groups, oldest first (copies need not be made: callers only read them)."""
        return list(self._groups)

    def last(self) -> EditGroup | None:
        return self._groups[-1] if self._groups else None

    def chars(self) -> int:
        return sum(g.size() for g in self._groups)

    def clear(self) -> None:
        self._groups.clear()

    # -- recording --------------------------------------------------------------------------
    def record(self, start: int, end: int, new_text: str, removed: str, version: int | None = None) -> None:
        """One change: the text before it had `removed` at [start, end) (code points), now `new_text`.

        Raises ValueError when the range and `removed` disagree in length or the range is reversed
        (the caller's bug: a change must never be half-recorded)."""
        if start < 0 or end < start or end - start != len(removed):
            raise ValueError(f"edit range [{start}, {end}) does not hold the {len(removed)} removed characters")
        if not removed and not new_text:
            return
        self.changes += 1
        now = self.clock()
        delta = len(new_text) - len(removed)
        last = self._groups[-1] if self._groups else None
        merged = last is not None and not last.large and start <= last.end and end >= last.start
        # Every group after the change (in the text) moves by its length difference; one it
        # overlaps either merges (the last group) or has its region cut: it no longer says
        # what the user did there, so it goes.
        keep = []
        for g in self._groups:
            if g is last and merged:
                keep.append(g)
            elif end <= g.start:
                g.start += delta
                keep.append(g)
            elif start >= g.end:
                keep.append(g)
        self._groups = keep
        if merged:
            self._merge(last, start, end, new_text, removed, version, now)
        else:
            self._groups.append(self._group(start, removed, new_text, version, now))
        self._bound()

    def record_text(self, old: str, new: str, version: int | None = None) -> None:
        """A whole-document change (full sync): recorded as the one range where `old` and `new` differ."""
        a, b, c = changed_span(old, new)
        if a == b and a == c:
            return
        self.record(a, b, new[a:c], old[a:b], version)

    def _group(self, start: int, old: str, new: str, version, now: float) -> EditGroup:
        large = max(len(old), len(new)) > self.limits.edit_chars
        return EditGroup(start, "" if large else old, "" if large else new, version, now, now, 1, large,
                         len(old), len(new))

    def _merge(self, g: EditGroup, start: int, end: int, new_text: str, removed: str, version, now: float) -> None:
        """Merge a change touching `g`'s region into it: the region now spans both."""
        s, e = g.start, g.end
        # What the current text holds over [min(start, s), max(end, e)): the removed text where it lies
        # outside the group, the group's new text inside.
        before = removed[: s - start] if start < s else ""
        after = removed[len(removed) - (end - e) :] if end > e else ""
        lo = min(start, s)
        span = before + g.new + after
        span = span[: start - lo] + new_text + span[end - lo :]
        old = (removed[: s - start] if start < s else "") + g.old + after
        g.start = lo
        g.version, g.last_at, g.changes = version, now, g.changes + 1
        g.old_len, g.new_len = len(old), len(span)
        if max(len(old), len(span)) > self.limits.edit_chars:
            g.large, g.old, g.new = True, "", ""
        else:
            g.old, g.new = old, span
        if g.old == g.new and not g.large:
            self._groups.remove(g)  # typed and deleted again: nothing was changed there

    def _bound(self) -> None:
        while len(self._groups) > self.limits.groups:
            self._groups.pop(0)
        total = self.chars()
        while self._groups and total > self.limits.chars:
            total -= self._groups.pop(0).size()


def changed_span(old: str, new: str) -> tuple[int, int, int]:
    """(a, b, c): `old[a:b]` became `new[a:c]`, the rest is common prefix and suffix. Compares in
    blocks (slices compare at memory speed), so a keystroke in a 5 MB text costs milliseconds."""
    n = min(len(old), len(new))
    a, step = 0, 4096
    while a < n:
        m = min(step, n - a)
        if old[a : a + m] == new[a : a + m]:
            a += m
            continue
        if m == 1:
            break
        step = max(1, m // 8)
    z, step, limit = 0, 4096, n - a
    while z < limit:
        m = min(step, limit - z)
        if old[len(old) - z - m : len(old) - z] == new[len(new) - z - m : len(new) - z]:
            z += m
            continue
        if m == 1:
            break
        step = max(1, m // 8)
    return a, len(old) - z, len(new) - z


@dataclass
class EditHistories:
    """One EditHistory per document, at most `max_docs` (the least recently changed dropped)."""

    limits: Limits = field(default_factory=Limits)
    max_docs: int = 256
    clock: object = time.monotonic

    def __post_init__(self):
        self._docs: OrderedDict[str, EditHistory] = OrderedDict()

    def get(self, uri: str) -> EditHistory:
        """The history of `uri`, made on first use (and counted as the most recent)."""
        return lru_get(self._docs, uri, lambda: EditHistory(self.limits, self.clock), self.max_docs)

    def peek(self, uri: str) -> EditHistory | None:
        return self._docs.get(uri)

    def record(self, uri: str, start: int, end: int, new_text: str, removed: str, version: int | None = None) -> None:
        self.get(uri).record(start, end, new_text, removed, version)

    def record_text(self, uri: str, old: str, new: str, version: int | None = None) -> None:
        self.get(uri).record_text(old, new, version)

    def forget(self, uri: str) -> None:
        self._docs.pop(uri, None)

    def uris(self) -> list[str]:
        return list(self._docs)

    def chars(self) -> int:
        return sum(h.chars() for h in self._docs.values())

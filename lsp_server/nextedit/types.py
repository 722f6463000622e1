"""What a next-edit proposer answers: one edit somewhere in an open document (a leaf module).

Offsets are code points of the document text the proposal was made on; `position` turns one into
(line, column) with lines split at "\n" (what the server's snapshots count), which the server turns
into the client's units. Left out on purpose: LSP types.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class NextEdit:
    uri: str  # the document the edit is for (the one asked about, or another open one)
    start: int  # [start, end) of that document's text is replaced by new_text
    end: int
    new_text: str
    cursor: int  # where the cursor goes once it is applied: an offset of the text after the edit
    source: str  # the proposer: "propagate" or "rewrite"
    old_text: str = ""  # what [start, end) holds now (the editor shows it struck through)
    version: int | None = None  # the version of the document it was made on, when the caller gave one
    why: str = ""  # the learnt change, for logs and traces ("foo -> bar")
    stats: dict | None = None  # a model's rewrite: its decoding statistics (tokens, passes, drafts accepted)

    def apply(self, text: str) -> str:
        """`text` (the document it was made on) with the edit applied."""
        return text[: self.start] + self.new_text + text[self.end :]

    def as_dict(self, text: str) -> dict:
        """Positions as (line, column) of `text`, the document it was made on, and the cursor's in the text after."""
        return {"uri": self.uri, "start": position(text, self.start), "end": position(text, self.end),
                "new_text": self.new_text, "old_text": self.old_text, "cursor": position(self.apply(text), self.cursor),
                "source": self.source, "version": self.version, "why": self.why}


def position(text: str, offset: int) -> tuple[int, int]:
    """(line, column) of `offset` in `text`, 0-based, lines split at "\n", columns in code points."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset)
    return line, offset - (text.rfind("\n", 0, offset) + 1)


def offset_of(text: str, line: int, col: int) -> int:
    """The offset of (line, col) in `text` (a column past the line's end means its end)."""
    start = 0
    for _ in range(line):
        nl = text.find("\n", start)
        if nl < 0:
            return len(text)
        start = nl + 1
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    return min(start + max(0, col), end)

"""What crosses from the event loop to the model worker: owned, immutable values (lsp_server/lsp/threads.py).

- `Snapshot`: a request's or an aim's view of one document (its version, a window of its text, the
  cursor, the user's recent edits as the prompt's comment lines), taken on the loop
  (lsp_server/lsp/documents.py) and never changed after;
- the inbox messages, in the order the loop saw the events: `BufferText` (a document's new text),
  `Closed`, `Visited` (a request came for it), `Accepted` (the user accepted a suggestion there),
  `Definitions` (what the names used around a place are, resolved in another process:
  lsp_server/lsp/definitions.py);
  the worker applies them before each job (lsp_server/lsp/worker/state.py `Worker.sync`);
- `IdlePlan`: what idle work is to do, as the loop knows it when it schedules the idle job
  (lsp_server/lsp/idle.py); the worker reports what it did back to the loop.

Pure values and text helpers both threads use; no pygls, no model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SURROGATE = re.compile("[\ud800-\udfff]")  # JSON allows lone ones; tokenizers reject them


class WindowText(str):
    """A snapshot's text: whole lines of a document from `first_line` on (lsp_server/lsp/documents.py
    docstring), and its first lines (`head_text`, lsp_server/completion/head.py) when they are not in
    it. Both are set when it is made, on the loop, and never changed."""

    first_line = 0
    head_text: str | None = None


@dataclass(frozen=True)
class Snapshot:
    uri: str
    version: int | None
    text: str  # a WindowText, or the whole text
    line: int  # 0-based, in `text`
    col: int  # code points
    position: tuple[int, int]  # (line, character) in the document, in client units, clamped to the line
    name: str = ""  # the buffer's name in prompts and the drafter's index (its path when it is a file)
    edits: str = ""  # the recent edits that bear on the cursor, as comment lines (lsp_server/nextedit/recent.py)

    @property
    def first_line(self) -> int:
        """The document line `text` starts at."""
        return getattr(self.text, "first_line", 0)


@dataclass(frozen=True)
class BufferText:
    """A document's text at `version` (didOpen, didChange). `clean`: surely no lone surrogate in it."""

    uri: str
    name: str
    text: str
    clean: bool
    version: int | None = None


@dataclass(frozen=True)
class Closed:
    uri: str
    name: str


@dataclass(frozen=True)
class Visited:
    """A request or aim came for the document: re-index it if the index dropped it."""

    uri: str
    name: str


@dataclass(frozen=True)
class Accepted:
    """The user accepted `shown` in the document; `after` is what they typed after it by the next request."""

    uri: str
    shown: str
    after: str


@dataclass(frozen=True)
class Definitions:
    """The definitions of the names used around document line `line` at `version`, as the prompt's
    comment lines (lsp_server/completion/definitions.py); the worker keeps the latest per document line."""

    uri: str
    version: int | None
    line: int
    text: str


@dataclass(frozen=True)
class IdlePlan:
    """Idle work as the loop sees it when it schedules it (lsp_server/lsp/idle.py)."""

    aim: Snapshot | None  # where the user is: warm its prompt, then generate there
    finish: tuple[str, int] | None  # (uri, token): a suggestion answered at its deadline, to finish
    fill: Snapshot | None  # the document whose prefix KV is filled (whole_file), at its last aim
    fill_at: float  # time.monotonic() after which filling may start (no request for FILL_AFTER_S)
    settings: object  # lsp_server/settings.py Settings (frozen) of the moment
    show_bias: float = 0.0  # how far this workspace's user moves the `show` limit (lsp_server/lsp/shown.py)


def model_text(text: str) -> str:
    """`text` with lone surrogates (JSON allows "\\ud83d"; tokenizers reject them) as "?", one for one,
    so that columns stay put."""
    if text.isascii() or SURROGATE.search(text) is None:
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")

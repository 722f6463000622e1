"""The document session (`DocumentSession`): the open documents, what the server keeps per document,
and owned snapshots of them. On the event loop only (lsp_server/lsp/threads.py).

The texts and versions are pygls's (`workspace.text_documents`, kept in step by protocol.py's
didChange, which applies edits with this session's line tables). Everything else per document
is a `Document` here: its line table, the trace of its last suggestion and its recent edits. A
snapshot (lsp_server/lsp/worker/messages.py `Snapshot`) is an immutable copy: the model worker never
reads a document the event loop changes. What the worker must know of the documents goes to its
inbox as messages, in order (`changed`: a new text or a close; a request's visit; an accepted
suggestion with what the user typed after it); the worker keeps its own copy of the texts and its
own per-file state (lsp_server/lsp/worker/state.py), and indexes the buffers for the drafter while
idle, within the `index_memory_mb` budget.

A snapshot carries the user's recent edits that bear on the cursor, as the prompt's comment lines
(`Snapshot.edits`, lsp_server/nextedit/recent.py: this document's away from the cursor's window and
the other open documents'), computed here from the edit histories when the `recent_edits` setting
is on: a few string searches per edit group.

Only documents the client opened are read: pygls's `workspace.get_text_document` would read
any other URI from disk, so membership in `workspace.text_documents` is checked first.
Positions arrive in the negotiated encoding (UTF-16 by default) and are turned into code
points through pygls's position codec.

Big documents (issue 26): a keystroke costs what the edit costs, not what the document does.
Each document's line starts are kept in step with its edits (protocol.py `Lines`), and a
snapshot hands the completer not the whole text but a window of whole lines around the cursor
(`WindowText`, which knows its first line): enough for any prompt the budget allows (the lines
above the cursor that the prompt window can reach, with room for it to follow its first lines,
and the lines below), its edges on a grid of WINDOW_GRID lines so that they move rarely. Where
the window's first line moves, the worker moves the document's prompt window with it
(`FileState.shift`), so a prompt is the one the whole text would give. A document of up to a few
thousand lines is its own window.
"""

from __future__ import annotations

import logging
import os
from typing import Callable
from urllib.parse import unquote

from lsprotocol import types
from pygls.uris import to_fs_path

from lsp_server.completion.context import ContextBudget
from lsp_server.completion.head import SCAN_LINES
from lsp_server.lsp.protocol import Lines
from lsp_server.lsp.threads import on_loop
from lsp_server.lsp.worker.messages import (Accepted, BufferText, Closed, Snapshot, Visited, WindowText,
                                            model_text)
from lsp_server.nextedit.history import EditHistory
from lsp_server.nextedit.recent import recent_edits

__all__ = ["DocumentSession", "Document", "Snapshot", "WindowText", "buffer_name", "model_text", "typed_after"]

log = logging.getLogger(__name__)

WINDOW_GRID = 512  # lines: a snapshot window's edges sit on multiples of this
WHOLE_FILE_LINES = 1024  # lines above the cursor a window reaches at least: a file's prefix sequence (wholefile.py)
NEAR_ABOVE, NEAR_BELOW = 30, 5  # lines around the cursor: the edits shown share a word with them, and lie outside them


class Document:
    """What the session keeps for one open document beside its text (module docstring)."""

    __slots__ = ("lines", "trace", "edits", "shown")

    def __init__(self):
        self.lines: Lines | None = None  # its line starts (protocol.py), in step with its text
        self.trace: dict | None = None  # its last suggestion, for `ditto/trace`
        self.edits = EditHistory()  # its recent edits, bounded (lsp_server/nextedit/history.py)
        self.shown: str | None = None  # a suggestion the user accepted, told to the worker at the next snapshot


class DocumentSession:
    """The open documents (module docstring). `workspace` gives pygls's workspace (it exists once the
    client initialized); `budget` the prompt budget a snapshot window must hold; `to_worker` puts a
    message in the model worker's inbox (lsp_server/lsp/worker/state.py `Worker.inbox`); `edits_wanted`
    whether snapshots carry the recent edits (the `recent_edits` setting)."""

    def __init__(self, workspace: Callable[[], object], budget: Callable[[], ContextBudget],
                 to_worker: Callable[[object], None] = lambda message: None,
                 edits_wanted: Callable[[], bool] = lambda: False):
        self._workspace = workspace
        self._budget = budget
        self._to_worker = to_worker
        self._edits_wanted = edits_wanted
        self._docs: dict[str, Document] = {}  # unquoted uri -> its Document

    def connect(self, to_worker: Callable[[object], None]) -> None:
        """Where the messages to the worker go (the completion service connects its worker's inbox)."""
        self._to_worker = to_worker

    # -- the documents ---------------------------------------------------------------------------
    def document(self, uri: str):
        """The open document (pygls's: `.uri`, `.version`, `.source`), or None; never reads from disk.

        pygls keys its documents by the percent-decoded URI (`file:///a%20b.py` is stored
        as `file:///a b.py`), so look them up the same way.
        """
        return self._workspace().text_documents.get(unquote(uri))

    def position_units(self):
        """The client's units of a string (UTF-16 code units unless negotiated otherwise)."""
        return self._workspace().position_codec.client_num_units

    def open_documents(self) -> dict:
        """uri -> pygls document, of every open document."""
        return self._workspace().text_documents

    def _state(self, uri: str) -> Document:
        key = unquote(uri)
        doc = self._docs.get(key)
        if doc is None:
            doc = self._docs[key] = Document()
        return doc

    def state(self, uri: str) -> Document | None:
        """The session's record of an open document (None when it is not open)."""
        return self._state(uri) if self.document(uri) is not None else None

    def lines_of(self, uri: str, text: str) -> Lines:
        """The line starts of an open document whose text is `text` (made again when it is not in step)."""
        doc = self._state(uri)
        if doc.lines is None or doc.lines.text is not text:
            doc.lines = Lines(text)
        return doc.lines

    @on_loop
    def apply_changes(self, uri: str, text: str, changes, units, version: int | None = None) -> str:
        """The text of `uri` after a didChange's `changes` (protocol.py applies them by LSP's rules with
        the line table), each recorded in the document's edit history (next-edit suggestions)."""
        doc = self._state(uri)
        lines = self.lines_of(uri, text)
        for change in changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                a, b = lines.span(change.range, units)
                removed = lines.text[a:b]
                text = lines.replace(a, b, change.text)
                doc.edits.record(a, b, change.text, removed, version)
            else:
                doc.edits.record_text(lines.text, change.text, version)
                text = change.text
                lines = self.lines_of(uri, text)
        return text

    def edits(self, uri: str) -> EditHistory | None:
        """The recent edits of an open document (None when it is not open)."""
        doc = self.state(uri)
        return None if doc is None else doc.edits

    @on_loop
    def changed(self, uri: str, text: str | None, version: int | None = None) -> None:
        """Tell the worker a document's new text (None: closed); a closed document's record goes."""
        if text is None:
            self._docs.pop(unquote(uri), None)
            self._to_worker(Closed(uri, buffer_name(uri)))
            return
        doc = self._docs.get(unquote(uri))
        lines = doc.lines if doc is not None else None
        clean = lines is not None and lines.text is text and lines.clean  # (else the worker checks it all)
        self._to_worker(BufferText(uri, buffer_name(uri), text, clean, version))

    def trace(self, uri: str) -> dict | None:
        doc = self._docs.get(unquote(uri))
        return None if doc is None else doc.trace

    @on_loop
    def keep_trace(self, uri: str, trace: dict) -> None:
        """Keep the trace of `uri`'s last suggestion while the document is open (one closed while its
        request ran has no record left to write into). The worker posts it here."""
        doc = self.state(uri)
        if doc is not None:
            doc.trace = trace

    @on_loop
    def note_change(self, uri: str, params) -> None:
        """A didChange that inserts exactly the last suggestion shown for `uri` is an acceptance.

        The worker hears of it with the next snapshot (`snapshot`), with the text typed after it by
        then, and gives it to the Completer's history source.
        """
        doc = self._docs.get(unquote(uri))
        shown = (doc.trace or {}).get("text") if doc is not None else None
        if not shown or len(shown.strip()) < 2:
            return
        for change in params.content_changes:
            if getattr(change, "range", None) is not None and change.text and change.text.endswith(shown):
                doc.shown = shown
                doc.trace = {**doc.trace, "text": None}  # one acceptance per suggestion
                return

    def _tell_acceptances(self) -> None:
        """The suggestions accepted since the last snapshot, each with what was typed after it by now."""
        for uri, doc in self._docs.items():
            if doc.shown is not None:
                shown, doc.shown = doc.shown, None
                self._to_worker(Accepted(uri, shown, typed_after(self.document(uri), shown)))

    # -- positions ---------------------------------------------------------------------------
    @on_loop
    def snapshot(self, uri: str, position: types.Position) -> Snapshot | None:
        """(uri, version, a window of the text, position): what a request or idle prefill works on."""
        doc = self.document(uri)
        if doc is None:
            log.info("request for a document that is not open: %s", uri)
            return None
        lines = self.lines_of(doc.uri, doc.source)
        count = len(lines.nl)
        if position.line >= count:
            log.info("position %s:%d is past the end (%d lines)", uri, position.line, count)
            return None
        line = lines.line(position.line).removesuffix("\r")
        # LSP: a character past the end of the line means the end of the line.
        if line.isascii():  # one unit a character in every encoding (pygls's codec walks the line)
            char = col = min(position.character, len(line))
        else:
            codec = self._workspace().position_codec
            char = min(position.character, codec.client_num_units(line))
            col = codec.position_from_client_units([line], types.Position(line=0, character=char)).character
        first, text = self._window(lines, position.line)
        self._tell_acceptances()
        name = buffer_name(uri)
        self._to_worker(Visited(uri, name))
        edits = self.recent_edits(doc.uri, lines, position.line) if self._edits_wanted() else ""
        return Snapshot(uri, doc.version, text, position.line - first, col, (position.line, char), name, edits)

    def recent_edits(self, uri: str, lines: Lines, line: int) -> str:
        """The recent edits that bear on a cursor on `line` of `uri` (lsp_server/nextedit/recent.py): this
        document's outside the lines around the cursor, the other open documents'."""
        nl, text = lines.nl, lines.text
        a, b = max(0, line - NEAR_ABOVE), min(len(nl), line + NEAR_BELOW + 1)
        skip = (int(nl[a]), int(nl[b]) if b < len(nl) else len(text))
        near = text[skip[0] : skip[1]]
        found = []
        for key, record in self._docs.items():
            other = self.document(key)
            groups = record.edits.groups()
            if other is not None and groups:
                here = key == unquote(uri)
                found.append((os.path.basename(buffer_name(other.uri)), other.source, groups, skip if here else None))
        return recent_edits(found, near) if found else ""

    def _window(self, lines: Lines, line: int) -> tuple[int, str]:
        """(first line, WindowText) of the lines any prompt at `line` can read (module docstring)."""
        budget = self._budget()
        above = budget.above + 2 * budget.chunk_lines + 160  # + room to follow the window's first lines
        above = max(above, WHOLE_FILE_LINES)  # the whole file above the cursor (lsp_server/completion/wholefile.py)
        below = budget.below + 64
        nl, text = lines.nl, lines.text
        first = max(0, (line - above) // WINDOW_GRID * WINDOW_GRID)
        end = min(len(nl), ((line + below) // WINDOW_GRID + 1) * WINDOW_GRID)  # lines [first, end)
        if first == 0 and end == len(nl):
            window = WindowText(text)
        else:
            window = WindowText(text[int(nl[first]) : int(nl[end]) - 1 if end < len(nl) else len(text)])
        window.first_line = first
        if first:  # the document's first lines: the prompt's file head (lsp_server/completion/head.py)
            top = min(first, SCAN_LINES)
            window.head_text = text[: int(nl[top]) - 1 if top < len(nl) else len(text)]
        return first, window

    def to_client(self, text: str, line: int, col: int) -> types.Position:
        """The client position of code point `col` of line `line` of `text` (a snapshot's window, or a text)."""
        line_text = text.split("\n")[line]
        return types.Position(line=line + getattr(text, "first_line", 0),
                              character=self._workspace().position_codec.client_num_units(line_text[:col]))

    def selected_range(self, snap: Snapshot, sel) -> tuple[int, int] | None:
        """(start, end) code-point columns of the selected completion's range, if it can be honoured."""
        if sel is None:
            return None
        r = sel.range
        if r.start.line != snap.position[0] or r.end.line != snap.position[0] or "\n" in sel.text:
            log.info("selectedCompletionInfo not on the cursor line: ignored")
            return None
        line_text = snap.text.split("\n")[snap.line].removesuffix("\r")
        codec = self._workspace().position_codec
        start = codec.position_from_client_units([line_text], types.Position(0, min(r.start.character,
                                                                                   codec.client_num_units(line_text))))
        end = codec.position_from_client_units([line_text], types.Position(0, min(r.end.character,
                                                                                 codec.client_num_units(line_text))))
        if not (start.character <= snap.col <= end.character):
            log.info("selectedCompletionInfo range does not contain the cursor: ignored")
            return None
        return start.character, end.character

    @staticmethod
    def with_selection(snap: Snapshot, start: int, end: int, text: str) -> Snapshot:
        """`snap` as if the completion item the editor selected (`text` over columns [start, end) of the
        cursor's line) were inserted, the cursor after it; the window's first line and head stay."""
        lines = snap.text.split("\n")
        line = lines[snap.line]
        lines[snap.line] = line[:start] + text + line[end:]
        window = WindowText("\n".join(lines))
        window.first_line = getattr(snap.text, "first_line", 0)
        window.head_text = getattr(snap.text, "head_text", None)
        return Snapshot(snap.uri, snap.version, window, snap.line, start + len(text), snap.position, snap.name,
                        snap.edits)


def typed_after(doc, shown: str, limit: int = 200) -> str:
    """What follows the last occurrence of `shown` in `doc`, to the end of the next non-blank line."""
    text = doc.source if doc is not None else ""
    i = text.rfind(shown)
    if i < 0:
        return ""
    rest = text[i + len(shown) : i + len(shown) + limit]
    lines = rest.split("\n")
    keep = [lines[0]]
    for line in lines[1:]:
        keep.append(line)
        if line.strip():
            break
    return "\n".join(keep)


def buffer_name(uri: str) -> str:
    """The name a buffer has in prompts and the drafter's index: its path when it is a file."""
    try:
        return to_fs_path(uri) or uri
    except Exception:
        return uri

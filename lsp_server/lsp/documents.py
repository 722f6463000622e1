"""The document session (`DocumentSession`): the open documents, what the server keeps per document,
owned snapshots of them, and the queue of their changes for the model worker.

The texts and versions are pygls's (`workspace.text_documents`, kept in step by protocol.py's
didChange, which applies edits with this session's line tables). Everything else per document
is a `Document` here: its line table, where its newest snapshot window starts, its per-file
state for the Completer (lsp_server/completion/files.py `FileState`: the prompt window and the
place; handed to every Completer call for it, and gone when it closes), and the trace of its last
suggestion. A snapshot is a copy: the worker never reads a document the event loop changes.

Only documents the client opened are read: pygls's `workspace.get_text_document` would read
any other URI from disk, so membership in `workspace.text_documents` is checked first.
Positions arrive in the negotiated encoding (UTF-16 by default) and are turned into code
points through pygls's position codec. Changes to the open buffers are queued (`changed`)
and handed to the Completer on the worker before the next completion (`sync`); the drafter's
index of them is brought up to date by idle work, a slice at a time (lsp_server/lsp/idle.py,
lsp_server/completion/buffers.py), within the `index_memory_mb` budget.

Big documents (issue 26): a keystroke costs what the edit costs, not what the document does.
Each document's line starts are kept in step with its edits (protocol.py `Lines`), and a
snapshot hands the completer not the whole text but a window of whole lines around the cursor
(`WindowText`, which knows its first line): enough for any prompt the budget allows (the lines
above the cursor that the prompt window can reach, with room for it to follow its first lines,
and the lines below), its edges on a grid of WINDOW_GRID lines so that they move rarely. Where
the window's first line moves, the document's prompt window is moved with it (`FileState.shift`), so a prompt is
the one the whole text would give. A document of up to a few thousand lines is its own window.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote

from lsprotocol import types
from pygls.uris import to_fs_path

from lsp_server.completion.context import ContextBudget
from lsp_server.completion.files import FileState
from lsp_server.completion.head import SCAN_LINES
from lsp_server.lsp.protocol import SURROGATE, Lines
from lsp_server.nextedit.history import EditHistory

log = logging.getLogger(__name__)

WINDOW_GRID = 512  # lines: a snapshot window's edges sit on multiples of this
WHOLE_FILE_LINES = 1024  # lines above the cursor a window reaches at least: a file's prefix sequence (wholefile.py)


@dataclass
class Snapshot:
    uri: str
    version: int | None
    text: str
    line: int  # 0-based
    col: int  # code points
    position: types.Position  # in client units, clamped to the line


class WindowText(str):
    """A snapshot's text: whole lines of a document from `first_line` on (documents.py docstring),
    and its first lines (`head_text`, lsp_server/completion/head.py) when they are not in it."""

    first_line = 0
    head_text: str | None = None


class Document:
    """What the session keeps for one open document beside its text (module docstring)."""

    __slots__ = ("lines", "first_line", "applied", "file", "trace", "edits")

    def __init__(self):
        self.lines: Lines | None = None  # its line starts (protocol.py), in step with its text
        self.first_line = 0  # first line of its newest snapshot window (event loop)
        self.applied = 0  # first line its FileState's prompt window is counted from (worker)
        self.file = FileState()  # the Completer's per-file state (worker only)
        self.trace: dict | None = None  # its last suggestion, for `ditto/trace` (event loop)
        self.edits = EditHistory()  # its recent edits, bounded (lsp_server/nextedit/history.py; event loop)


@dataclass
class Changes:
    """What changed since the worker last looked (`DocumentSession.take_changes`)."""

    texts: dict[str, str | None]  # uri -> new text (None: closed)
    accepted: list[tuple[str, str]]  # (uri, suggestion text) the user accepted
    visits: set[str]  # uris asked for (re-index a dropped buffer)
    moved: dict[str, tuple[Document, int]]  # uri -> (document, first line of its newest snapshot window)


class DocumentSession:
    """The open documents (module docstring). `workspace` gives pygls's workspace (it exists once the
    client initialized); `budget` the prompt budget a snapshot window must hold."""

    def __init__(self, workspace: Callable[[], object], budget: Callable[[], ContextBudget]):
        self._workspace = workspace
        self._budget = budget
        self._docs: dict[str, Document] = {}  # unquoted uri -> its Document
        self._lock = threading.Lock()  # the change queue, shared by the event loop and the worker
        self._texts: dict[str, str | None] = {}
        self._accepted: list[tuple[str, str]] = []
        self._visits: set[str] = set()

    # -- the documents (event loop) --------------------------------------------------------
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

    def file(self, uri: str) -> FileState | None:
        """The per-file state the Completer uses for `uri` (None when it is not open)."""
        doc = self.state(uri)
        return None if doc is None else doc.file

    def reset_files(self) -> None:
        """A new model: every document's per-file state starts afresh (as the new Completer's would)."""
        for doc in self._docs.values():
            doc.file = FileState()

    def lines_of(self, uri: str, text: str) -> Lines:
        """The line starts of an open document whose text is `text` (made again when it is not in step)."""
        doc = self._state(uri)
        if doc.lines is None or doc.lines.text is not text:
            doc.lines = Lines(text)
        return doc.lines

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

    def changed(self, uri: str, text: str | None) -> None:
        """Queue a buffer's new text (None: closed) for the worker; a closed document's record goes."""
        with self._lock:
            self._texts[uri] = text
        if text is None:
            self._docs.pop(unquote(uri), None)

    def trace(self, uri: str) -> dict | None:
        doc = self._docs.get(unquote(uri))
        return None if doc is None else doc.trace

    def keep_trace(self, uri: str, trace: dict) -> None:
        """Keep the trace of `uri`'s last suggestion, on the event loop, while the document is open
        (one closed while its request ran has no record left to write into)."""
        doc = self.state(uri)
        if doc is not None:
            doc.trace = trace

    def note_change(self, uri: str, params) -> None:
        """A didChange that inserts exactly the last suggestion shown for `uri` is an acceptance.

        It is queued and given to the Completer's history source (with the text typed
        after it by then) on the worker, before the next completion.
        """
        doc = self._docs.get(unquote(uri))
        shown = (doc.trace or {}).get("text") if doc is not None else None
        if not shown or len(shown.strip()) < 2:
            return
        for change in params.content_changes:
            if getattr(change, "range", None) is not None and change.text and change.text.endswith(shown):
                with self._lock:
                    self._accepted.append((uri, shown))
                doc.trace = {**doc.trace, "text": None}  # one acceptance per suggestion
                return

    # -- the worker's view -------------------------------------------------------------------
    def all_buffers(self) -> list[tuple[str, str]]:
        """(name, text) of every open document, for a Completer being built; the queue of changes
        starts afresh (what changes later is queued again)."""
        with self._lock:
            self._texts = {}
            return [(buffer_name(uri), model_text(doc.source)) for uri, doc in self.open_documents().items()]

    def take_changes(self) -> Changes:
        """What changed since the last call (the worker applies it to the Completer: `sync`)."""
        with self._lock:
            texts, self._texts = self._texts, {}
            accepted, self._accepted = self._accepted, []
            visits, self._visits = self._visits, set()
            moved = {u: (d, d.first_line) for u, d in self._docs.items() if d.applied != d.first_line}
        return Changes(texts, accepted, visits, moved)

    def sync(self, completer, index_budget_bytes: int, settings=None) -> bool:
        """On the worker: bring the Completer's open buffers (and the drafter's index of them) up to
        date, move prompt windows with their snapshot windows, and hand it the accepted
        suggestions (kept as `settings`, CompleterSettings, say: `history_tokens`). True when the
        index has work left for idle time."""
        ch = self.take_changes()
        index = completer.buffers
        index.defer = True  # indexing is idle work here (idle.py), never a request's
        index.set_budget(index_budget_bytes)
        for uri, text in ch.texts.items():
            if text is None:
                completer.forget_buffer(buffer_name(uri), cache_key=uri)
            else:
                doc = self._docs.get(unquote(uri))
                lines = doc.lines if doc is not None else None
                clean = lines is not None and lines.text is text and lines.clean  # (model_text reads it all)
                completer.set_buffer(buffer_name(uri), text if clean else model_text(text))
        for uri in ch.visits:
            index.visit(buffer_name(uri))
        for doc, first in ch.moved.values():  # the snapshot window moved: its prompt window moves with it
            doc.file.shift(first - doc.applied)
            doc.applied = first
        for uri, shown in ch.accepted:
            completer.accepted(shown, typed_after(self.document(uri), shown), settings=settings)
        return bool(ch.texts) and index.pending()

    # -- positions ---------------------------------------------------------------------------
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
        clamped = types.Position(line=position.line, character=char)
        first, text = self._window(lines, position.line)
        with self._lock:
            self._visits.add(uri)
            self._state(uri).first_line = first
        return Snapshot(uri, doc.version, text, position.line - first, col, clamped)

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
        if r.start.line != snap.line or r.end.line != snap.line or "\n" in sel.text:
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


def buffer_name(uri: str) -> str:
    """The name a buffer has in prompts and the drafter's index: its path when it is a file."""
    try:
        return to_fs_path(uri) or uri
    except Exception:
        return uri


"""The document session: the open documents, snapshots of them, and the drafter's view of them
(a mixin of DittoServer, lsp_server/lsp/server.py).

Only documents the client opened are read: pygls's `workspace.get_text_document` would read
any other URI from disk, so membership in `workspace.text_documents` is checked first.
Positions arrive in the negotiated encoding (UTF-16 by default) and are turned into code
points through pygls's position codec. Changes to the open buffers are queued (`mark_dirty`)
and handed to the completer on the worker before the next completion; the drafter's index of
them is brought up to date by idle work, a slice at a time (lsp_server/completion/buffers.py,
`index_while_idle`), within the `index_memory_mb` budget.

Big documents (issue 26): a keystroke costs what the edit costs, not what the document does.
Each document's line starts are kept in step with its edits (protocol.py `Lines`), and a
snapshot hands the completer not the whole text but a window of whole lines around the cursor
(`WindowText`, which knows its first line): enough for any prompt the budget allows (the lines
above the cursor that the prompt window can reach, with room for it to follow its first lines,
and the lines below), its edges on a grid of WINDOW_GRID lines so that they move rarely. Where
the window's first line moves, the completer's prompt window is moved with it, so a prompt is
the one the whole text would give. A document of up to a few thousand lines is its own window.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from urllib.parse import unquote

from lsprotocol import types
from pygls.uris import to_fs_path

from lsp_server.completion.buffers import open_buffers
from lsp_server.completion.completer import MAX_INDEXED_CHARS
from lsp_server.completion.context import ContextBudget
from lsp_server.completion.head import SCAN_LINES
from lsp_server.lsp.protocol import SURROGATE, Lines

log = logging.getLogger(__name__)

WINDOW_GRID = 512  # lines: a snapshot window's edges sit on multiples of this


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


class _DocState:
    """Per server, what the documents mixin keeps beside pygls's documents."""

    def __init__(self):
        self.lines: dict[str, Lines] = {}  # document key -> its line starts
        self.visits: set[str] = set()  # uris asked for since the worker last looked (re-index a dropped buffer)
        self.first_line: dict[str, int] = {}  # uri -> first line of its newest snapshot window
        self.applied: dict[str, int] = {}  # uri -> first line the completer's prompt window is counted from
        self.lock = threading.Lock()


class DocumentsMixin:
    """Documents, snapshots and the queue of buffer changes for the worker."""

    @property
    def _docs(self) -> _DocState:
        state = self.__dict__.get("_doc_state")
        if state is None:
            state = self.__dict__["_doc_state"] = _DocState()
        return state

    def lines_of(self, uri: str, text: str) -> Lines:
        """The line starts of an open document whose text is `text` (made again when it is not in step)."""
        key = unquote(uri)
        lines = self._docs.lines.get(key)
        if lines is None or lines.text is not text:
            lines = self._docs.lines[key] = Lines(text)
        return lines

    def document(self, uri: str):
        """The open document, or None; never reads from disk.

        pygls keys its documents by the percent-decoded URI (`file:///a%20b.py` is stored
        as `file:///a b.py`), so look them up the same way.
        """
        return self.workspace.text_documents.get(unquote(uri))

    def mark_dirty(self, uri: str, text: str | None) -> None:
        """Queue a buffer's new text (None: closed) for the worker, and idle work to index it."""
        with self._dirty_lock:
            self._dirty[uri] = text
        if text is None:
            self._docs.lines.pop(unquote(uri), None)
            self._docs.first_line.pop(uri, None)
        if self.completer is not None and self.model_state == "ready" and hasattr(self, "_schedule_idle"):
            self._schedule_idle()

    def _apply_dirty(self, completer) -> None:
        """On the worker: bring the drafter's index up to date with the open buffers."""
        docs = self._docs
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, {}
            accepted, self._accepted = self._accepted, []
        with docs.lock:
            visits, docs.visits = docs.visits, set()
            moved = {u: f for u, f in docs.first_line.items() if docs.applied.get(u, 0) != f}
        index = open_buffers(completer, MAX_INDEXED_CHARS)
        index.defer = True  # indexing is idle work here (index_while_idle), never a request's
        index.set_budget(int(self.settings.index_memory_mb) << 20)
        for uri, text in dirty.items():
            if text is None:
                completer.forget_buffer(buffer_name(uri), cache_key=uri)
                docs.applied.pop(uri, None)
            else:
                lines = docs.lines.get(unquote(uri))
                clean = lines is not None and lines.text is text and lines.clean  # (model_text reads it all)
                completer.set_buffer(buffer_name(uri), text if clean else model_text(text))
        for uri in visits:
            index.visit(buffer_name(uri))
        for uri, first in moved.items():  # the snapshot window moved: its prompt window moves with it
            window = getattr(completer, "_windows", {}).get(buffer_name(uri))
            if window is not None and window.start is not None:
                shift = docs.applied.get(uri, 0) - first
                window.start = window.start + shift if window.start + shift >= 0 else None
                if window.middle is not None and window.last_line is not None:  # the place moves with it
                    middle, last = window.middle + shift, window.last_line + shift
                    window.middle, window.last_line = (middle, last) if middle >= 0 else (None, None)
            docs.applied[uri] = first
        for uri, shown in accepted:
            completer.accepted(shown, typed_after(self.document(uri), shown))
        if dirty and index.pending() and getattr(self.scheduler, "_idle_running", None) is None \
                and hasattr(self, "_schedule_idle"):
            self._schedule_idle()  # (a request's job: the indexing goes on once it is answered)

    def index_stats(self) -> dict | None:
        """The open buffers' index for `ditto/stats` (None before a model is loaded)."""
        completer = self.completer
        return None if completer is None else open_buffers(completer, MAX_INDEXED_CHARS).stats()

    def index_while_idle(self, cancel: threading.Event, slices: int | None = None) -> int:
        """Idle work (lsp_server/lsp/idle.py): index the open buffers a slice at a time until a request
        (or newer idle work) sets `cancel`, or `slices` ran; returns the slices run. Cut short by a
        request, it asks to go on later."""
        completer = self.completer
        if completer is None:
            return 0
        self._apply_dirty(completer)
        index = open_buffers(completer, MAX_INDEXED_CHARS)
        steps = 0
        while not cancel.is_set() and (slices is None or steps < slices) and index.step():
            steps += 1
        if cancel.is_set() and index.pending() and hasattr(self, "_schedule_idle"):
            self._schedule_idle()  # queued behind the request that stopped it (this job is the one running)
        return steps

    def note_change(self, uri: str, params) -> None:
        """A didChange that inserts exactly the last suggestion shown for `uri` is an acceptance.

        It is queued and given to the Completer's history source (with the text typed
        after it by then) on the worker, before the next completion.
        """
        shown = (self.traces.get(uri) or {}).get("text")
        if not shown or len(shown.strip()) < 2:
            return
        for change in params.content_changes:
            if getattr(change, "range", None) is not None and change.text and change.text.endswith(shown):
                with self._dirty_lock:
                    self._accepted.append((uri, shown))
                self.traces[uri] = {**self.traces[uri], "text": None}  # one acceptance per suggestion
                return

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
            codec = self.workspace.position_codec
            char = min(position.character, codec.client_num_units(line))
            col = codec.position_from_client_units([line], types.Position(line=0, character=char)).character
        clamped = types.Position(line=position.line, character=char)
        first, text = self._window(lines, position.line)
        with self._docs.lock:
            self._docs.visits.add(uri)
            self._docs.first_line[uri] = first
        return Snapshot(uri, doc.version, text, position.line - first, col, clamped)

    def _window(self, lines: Lines, line: int) -> tuple[int, str]:
        """(first line, WindowText) of the lines any prompt at `line` can read (module docstring)."""
        # The current settings' budget; left to the machine, the loaded model's fitted one (the largest
        # step, 2048, before a model is loaded: a window too wide costs a little text, not prompt tokens).
        completer = self.completer
        tokens = self.settings.context_tokens or (completer.fitted_tokens if completer is not None else 2048)
        budget = ContextBudget.scaled(tokens, self.settings.snippets)
        above = budget.above + 2 * budget.chunk_lines + 160  # + room to follow the window's first lines
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
                              character=self.workspace.position_codec.client_num_units(line_text[:col]))


    def selected_range(self, snap: Snapshot, sel) -> tuple[int, int] | None:
        """(start, end) code-point columns of the selected completion's range, if it can be honoured."""
        if sel is None:
            return None
        r = sel.range
        if r.start.line != snap.line or r.end.line != snap.line or "\n" in sel.text:
            log.info("selectedCompletionInfo not on the cursor line: ignored")
            return None
        line_text = snap.text.split("\n")[snap.line].removesuffix("\r")
        codec = self.workspace.position_codec
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


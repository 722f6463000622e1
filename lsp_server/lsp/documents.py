"""The document session: the open documents, snapshots of them, and the drafter's view of them
(a mixin of DittoServer, lsp_server/lsp/server.py).

Only documents the client opened are read: pygls's `workspace.get_text_document` would read
any other URI from disk, so membership in `workspace.text_documents` is checked first.
Positions arrive in the negotiated encoding (UTF-16 by default) and are turned into code
points through pygls's position codec. Changes to the open buffers are queued (`mark_dirty`)
and applied to the completer's n-gram index on the worker, before the next completion.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import unquote

from lsprotocol import types
from pygls.uris import to_fs_path

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    uri: str
    version: int | None
    text: str
    line: int  # 0-based
    col: int  # code points
    position: types.Position  # in client units, clamped to the line



class DocumentsMixin:
    """Documents, snapshots and the queue of buffer changes for the worker."""

    def document(self, uri: str):
        """The open document, or None; never reads from disk.

        pygls keys its documents by the percent-decoded URI (`file:///a%20b.py` is stored
        as `file:///a b.py`), so look them up the same way.
        """
        return self.workspace.text_documents.get(unquote(uri))

    def mark_dirty(self, uri: str, text: str | None) -> None:
        with self._dirty_lock:
            self._dirty[uri] = text

    def _apply_dirty(self, completer) -> None:
        """On the worker: bring the drafter's index up to date with the open buffers."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, {}
            accepted, self._accepted = self._accepted, []
        for uri, text in dirty.items():
            if text is None:
                completer.forget_buffer(buffer_name(uri))
            else:
                completer.set_buffer(buffer_name(uri), model_text(text))
        for uri, shown in accepted:
            completer.accepted(shown, typed_after(self.document(uri), shown))

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
        doc = self.document(uri)
        if doc is None:
            log.info("request for a document that is not open: %s", uri)
            return None
        text = doc.source
        lines = text.split("\n")
        if position.line >= len(lines):
            log.info("position %s:%d is past the end (%d lines)", uri, position.line, len(lines))
            return None
        line = lines[position.line].removesuffix("\r")
        codec = self.workspace.position_codec
        units = codec.client_num_units(line)
        # LSP: a character past the end of the line means the end of the line.
        char = min(position.character, units)
        clamped = types.Position(line=position.line, character=char)
        col = codec.position_from_client_units([line], types.Position(line=0, character=char)).character
        return Snapshot(uri, doc.version, text, position.line, col, clamped)

    def to_client(self, text: str, line: int, col: int) -> types.Position:
        line_text = text.split("\n")[line]
        return types.Position(line=line, character=self.workspace.position_codec.client_num_units(line_text[:col]))


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


"""pygls workarounds: what pygls 2.1.1 gets wrong on the wire, fixed in one place.

- Requests whose params fail to deserialise get InvalidParams (pygls 2.1.1 sends no reply at
  all), a message with an id but neither a method nor a result gets InvalidRequest, requests
  after `shutdown` or before `initialize` get an error instead of running, and so does a second
  `initialize` (pygls 2.1.1 would make a new workspace and drop every open document).
- Incremental edits are applied here, not by pygls (whose 2.1.1 code splits lines on
  Unicode separators like \x0c and \u2028 that the client does not count, drops the last
  character for a column past the end of the last line, and garbles reversed ranges).
  The rules, per LSP: lines end at \n, \r\n or \r; a line past the end means the end of
  the document; a character past the end of a line means the end of that line (before
  its line break); a position inside a surrogate pair means after that character; a
  range whose end comes before its start is swapped. A change for a document that is not
  open is ignored.
- Per keystroke, the cost follows the edit, not the document (issue 26): `Lines` keeps where
  every line starts (by LSP's breaks, and by "\n" alone, which the prompt counts) and is
  updated around each edit (an array shift for the lines after it); the one whole-text cost
  left is building the new string, a copy at memory speed (pygls keeps a document as one str).
- pygls 2.1.1 keeps the future of every notification it ran through a generator, coroutine
  or thread handler (filed under a fresh uuid, never removed): ~1.4 KB per didChange, the slow
  RSS growth a long day showed (issue 26). A handler's future is dropped once it is done.
- `edit_end`: where an edit leaves the cursor (idle prefill aims there).
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote

import numpy as np
from lsprotocol import types
from lsprotocol.types import ResponseError
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest, JsonRpcServerNotInitialized
from pygls.protocol import LanguageServerProtocol, lsp_method

from lsp_server.lsp.worker.messages import SURROGATE

log = logging.getLogger(__name__)

LINE_BREAK = re.compile(r"\r\n|\r|\n")
NEWLINE = re.compile(r"\n")


class _Answered:
    """Stands in for a request pygls could not deserialise and that was already answered."""

    jsonrpc = "answered"


class DittoProtocol(LanguageServerProtocol):
    """pygls's protocol with the fixes of the module docstring. pygls's own state is read here only
    (`_workspace`, `_shutdown`, `_request_futures`, `_server`), and offered to the rest of the
    server through the public properties below."""

    @property
    def initialized(self) -> bool:
        """The client sent `initialize` (the workspace exists)."""
        return self._workspace is not None

    @property
    def shut_down(self) -> bool:
        """The client sent `shutdown` (serve.py: exit code 0)."""
        return bool(self._shutdown)

    @property
    def requests_under_way(self) -> int:
        return len(self._request_futures)

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "id" in data and not {"method", "result", "error"} & data.keys():
                # Neither a request nor a response (pygls 2.1.1 drops it): InvalidRequest.
                self._send_response(data["id"], error=ResponseError(
                    code=JsonRpcInvalidRequest.CODE, message="a request needs a method"))
                return _Answered()
            if isinstance(data, dict) and "id" in data and "method" in data:
                err = exc if isinstance(exc, JsonRpcInvalidParams) else JsonRpcInvalidParams()
                err.message = f"invalid params for {data.get('method')!r}"
                self._send_response(data["id"], error=err.to_response_error())
                return _Answered()
            raise

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None):
        """As pygls's, and the handler's future leaves `_request_futures` when it is done (module docstring)."""
        def done(future, callback=callback):
            if self._request_futures.get(msg_id) is future:
                del self._request_futures[msg_id]
            callback(future)

        return super()._execute_handler(msg_id=msg_id, handler=handler, callback=done, args=args, kwargs=kwargs)

    def handle_message(self, message):
        if isinstance(message, _Answered):
            return
        method, msg_id = getattr(message, "method", None), getattr(message, "id", None)
        if method is not None and msg_id is not None:  # a request
            # pygls 2.1.1 answers nothing after shutdown, and runs handlers before initialize.
            if self._shutdown:
                self._send_response(msg_id, error=ResponseError(
                    code=JsonRpcInvalidRequest.CODE, message=f"{method}: the server is shutting down"))
                return
            if self._workspace is None and method != types.INITIALIZE:
                self._send_response(msg_id, error=ResponseError(
                    code=JsonRpcServerNotInitialized.CODE, message=f"{method}: the server is not initialized"))
                return
            if self._workspace is not None and method == types.INITIALIZE:
                log.warning("a second initialize request: refused (the open documents stay)")
                self._send_response(msg_id, error=ResponseError(
                    code=JsonRpcInvalidRequest.CODE, message="initialize: the server is already initialized"))
                return
        super().handle_message(message)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        """Applies the changes with the rules of the module docstring, then calls the handler."""
        uri = params.text_document.uri
        doc = self.workspace.text_documents.get(unquote(uri))
        if doc is None:
            log.info("didChange for a document that is not open: %s", uri)
            return
        units = self.workspace.position_codec.client_num_units
        # The document session applies them with its line table, and records them in its edit history.
        text = self._server.documents.apply_changes(doc.uri, doc.source, params.content_changes, units,
                                                    params.text_document.version)
        self.workspace.update_text_document(
            params.text_document, types.TextDocumentContentChangeWholeDocument(text=text))
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield user_handler, (params,), None


def apply_change(text: str, rng: types.Range, new_text: str, units) -> str:
    """`text` with `rng` replaced by `new_text`; `units(s)` counts client units (module docstring rules)."""
    return Lines(text).apply(rng, new_text, units)


class Lines:
    """Where the lines of one text start, by LSP's breaks (`starts`) and by "\n" alone (`nl`, the
    lines the prompt and snapshots count), kept in step with edits (`apply`); `clean`: the text
    surely holds no lone surrogate (False may be stale after one was deleted)."""

    __slots__ = ("text", "starts", "nl", "clean")

    def __init__(self, text: str):
        self.text = text
        self.clean = text.isascii() or SURROGATE.search(text) is None  # no lone surrogate (documents.model_text)
        self.nl = _line_starts(text, NEWLINE, 0, len(text))
        self.starts = self.nl if "\r" not in text else _line_starts(text, LINE_BREAK, 0, len(text))

    def offset(self, pos: types.Position, units) -> int:
        """The offset of an LSP position (module docstring rules)."""
        starts, text = self.starts, self.text
        if pos.line >= len(starts):
            return len(text)
        begin = int(starts[pos.line])
        if pos.line + 1 < len(starts):  # before the line's break
            end = int(starts[pos.line + 1])
            end -= 2 if end - 2 >= begin and text.startswith("\r\n", end - 2) else 1
        else:
            end = len(text)
        if text[begin:end].isascii():  # one unit a character in every encoding
            return min(end, begin + pos.character)
        i, seen = begin, 0
        while i < end and seen < pos.character:
            seen += units(text[i])
            i += 1
        return i

    def span(self, rng: types.Range, units) -> tuple[int, int]:
        """The offsets [a, b) of an LSP range (a reversed one swapped)."""
        a, b = self.offset(rng.start, units), self.offset(rng.end, units)
        return (a, b) if a <= b else (b, a)

    def apply(self, rng: types.Range, new_text: str, units) -> str:
        """Replace `rng` by `new_text`; returns the new text, which this now describes."""
        return self.replace(*self.span(rng, units), new_text)

    def replace(self, a: int, b: int, new_text: str) -> str:
        """Replace offsets [a, b) by `new_text`; returns the new text, which this now describes."""
        old = self.text
        text = "".join((old[:a], new_text, old[b:]))
        delta = len(text) - len(old)
        crlf = self.starts is not self.nl  # the text holds a "\r": LSP's lines are not "\n"'s
        self.nl = _shifted(self.nl, text, a, b, delta, NEWLINE)
        if crlf:
            self.starts = _shifted(self.starts, text, a, b, delta, LINE_BREAK)
        else:
            self.starts = self.nl if "\r" not in new_text else _line_starts(text, LINE_BREAK, 0, len(text))
        self.text = text
        self.clean = self.clean and (new_text.isascii() or SURROGATE.search(new_text) is None)
        return text

    def line(self, i: int) -> str:
        """Line i by "\n" alone (as text.split("\n")[i])."""
        nl, text = self.nl, self.text
        return text[int(nl[i]) : int(nl[i + 1]) - 1 if i + 1 < len(nl) else len(text)]


def _line_starts(text: str, pattern: re.Pattern, a: int, z: int) -> np.ndarray:
    """0 (when a == 0) and the end of every break in text[a:z]."""
    head = [0] if a == 0 else []
    if pattern is NEWLINE:
        try:  # a text of one byte a character: a vector search
            raw = np.frombuffer(text[a:z].encode("latin-1"), np.uint8)
            return np.concatenate([np.array(head, np.int64), np.flatnonzero(raw == 10).astype(np.int64) + a + 1])
        except UnicodeEncodeError:
            pass
    return np.array(head + [m.end() for m in pattern.finditer(text, a, z)], np.int64)


def _shifted(starts: np.ndarray, text: str, a: int, b: int, delta: int, pattern: re.Pattern) -> np.ndarray:
    """The line starts of `text`, which is the text of `starts` with [a, b) replaced (delta characters
    longer): those up to a line before the edit kept, those two lines after it on shifted, the ones
    between found again (a break next to the edit may have changed: "\r" + "\n" is one)."""
    la = int(np.searchsorted(starts, a, "right")) - 1
    lb = int(np.searchsorted(starts, b, "right")) - 1
    r0 = int(starts[max(0, la - 1)])
    keep_after = lb + 2 < len(starts)
    r1 = int(starts[lb + 2]) + delta if keep_after else len(text)
    middle = _line_starts(text, pattern, r0, r1)
    if len(middle) and middle[0] == 0 and r0 == 0:
        middle = middle[1:]
    if keep_after:
        middle = middle[middle < r1]
    return np.concatenate([starts[: max(0, la - 1) + 1], middle, starts[lb + 2 :] + delta if keep_after else []])


def edit_end(changes, units) -> types.Position | None:
    """Where the last incremental change of a didChange leaves the cursor (client units); None
    for a whole-document change, which says nothing about where the user is."""
    if not changes or not isinstance(changes[-1], types.TextDocumentContentChangePartial):
        return None
    change = changes[-1]
    start = change.range.start
    start, end = (start, change.range.end) if (start.line, start.character) <= (
        change.range.end.line, change.range.end.character) else (change.range.end, start)
    lines = LINE_BREAK.split(change.text)
    if len(lines) == 1:
        return types.Position(line=start.line, character=start.character + units(lines[0]))
    return types.Position(line=start.line + len(lines) - 1, character=units(lines[-1]))

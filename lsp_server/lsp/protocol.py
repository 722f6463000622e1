"""pygls workarounds: what pygls 2.1.1 gets wrong on the wire, fixed in one place.

- Requests whose params fail to deserialise get InvalidParams (pygls 2.1.1 sends no reply at
  all), a message with an id but neither a method nor a result gets InvalidRequest, requests
  after `shutdown` or before `initialize` get an error instead of running.
- Incremental edits are applied here, not by pygls (whose 2.1.1 code splits lines on
  Unicode separators like \x0c and \u2028 that the client does not count, drops the last
  character for a column past the end of the last line, and garbles reversed ranges).
  The rules, per LSP: lines end at \n, \r\n or \r; a line past the end means the end of
  the document; a character past the end of a line means the end of that line (before
  its line break); a position inside a surrogate pair means after that character; a
  range whose end comes before its start is swapped. A change for a document that is not
  open is ignored.
- `edit_end`: where an edit leaves the cursor (idle prefill aims there).
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from lsprotocol.types import ResponseError
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest, JsonRpcServerNotInitialized
from pygls.protocol import LanguageServerProtocol, lsp_method

log = logging.getLogger(__name__)

LINE_BREAK = re.compile(r"\r\n|\r|\n")


class _Answered:
    """Stands in for a request pygls could not deserialise and that was already answered."""

    jsonrpc = "answered"


class DittoProtocol(LanguageServerProtocol):
    """Answers requests whose params fail to deserialise with InvalidParams."""

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
        super().handle_message(message)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        """Applies the changes with the rules of the module docstring, then calls the handler."""
        uri = params.text_document.uri
        doc = self.workspace.text_documents.get(unquote(uri))
        if doc is None:
            log.info("didChange for a document that is not open: %s", uri)
            return
        text = doc.source
        units = self.workspace.position_codec.client_num_units
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                text = apply_change(text, change.range, change.text, units)
            else:
                text = change.text
        self.workspace.update_text_document(
            params.text_document, types.TextDocumentContentChangeWholeDocument(text=text))
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield user_handler, (params,), None


def apply_change(text: str, rng: types.Range, new_text: str, units) -> str:
    """`text` with `rng` replaced by `new_text`; `units(s)` counts client units (module docstring rules)."""
    starts = [0] + [m.end() for m in LINE_BREAK.finditer(text)]

    def offset(pos: types.Position) -> int:
        if pos.line >= len(starts):
            return len(text)
        begin = starts[pos.line]
        m = LINE_BREAK.search(text, begin)
        end = m.start() if m else len(text)
        i, seen = begin, 0
        while i < end and seen < pos.character:
            seen += units(text[i])
            i += 1
        return i

    a, b = offset(rng.start), offset(rng.end)
    if b < a:
        a, b = b, a
    return text[:a] + new_text + text[b:]


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

"""`ditto/nextEdit` in the server (`NextEdits`): after the user's recent edits, the edit that follows,
often somewhere else (lsp_server/nextedit/, docs/nextedit.md).

Request `ditto/nextEdit` `{textDocument: {uri}, position}` (the cursor) answers `null` or
`{uri, range, newText, oldText, cursor, version, source, why}`: `range` (in the client's units, of the
document `uri`, this one or another open one) is to be replaced by `newText`, and `cursor` is where the
cursor goes in the text after it. Nothing is applied here: the editor shows it and applies it on the
user's key. The document session records every change of every open document in its bounded edit
history (documents.py `apply_changes`); the proposer is edit propagation (no model, the default:
docs/nextedit.md says why the model rewrite is off). It runs off the event loop on copies of the
history and texts, and its answer is dropped (`null`) when a newer request for the document came
or the document changed meanwhile: a stale proposal never reaches the editor.
The editors show the answer and bind its keys (editors/nvim/lua/ditto/nextedit.lua,
editors/vscode/src/nextedit.ts). Left out on purpose: the model rewrite (it needs the model worker),
and the inline item that replaces text at the cursor's line (issue 43 says what remains).
"""

from __future__ import annotations

import asyncio
import dataclasses
from urllib.parse import unquote

from lsprotocol import types

from lsp_server.lsp.documents import DocumentSession
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.types import NextEdit, position

NEXT_EDIT = "ditto/nextEdit"
MAX_OTHERS = 8  # other open documents searched, most recently edited first
MAX_OTHER_CHARS = 1 << 20  # larger ones are not searched (a proposal elsewhere is a rename's echo)


class NextEdits:
    def __init__(self, documents: DocumentSession):
        self.documents = documents
        self._newest: dict[str, int] = {}  # uri -> number of its newest request
        self.counts = {"requests": 0, "proposed": 0, "none": 0, "stale": 0}

    def closed(self, uri: str) -> None:
        self._newest.pop(uri, None)

    async def propose(self, uri: str, pos: types.Position) -> dict | None:
        c = self.counts
        c["requests"] += 1
        docs = self.documents
        doc, history = docs.document(uri), docs.edits(uri)
        if doc is None or history is None or history.last() is None:
            c["none"] += 1
            return None
        seq = self._newest[uri] = self._newest.get(uri, 0) + 1
        text, version = doc.source, doc.version
        cursor = docs.lines_of(doc.uri, text).offset(pos, docs.position_units())
        groups = [dataclasses.replace(g) for g in history.groups()]  # the event loop goes on recording
        others = self._others(uri)
        edit = await asyncio.to_thread(Propagator().propose, groups, uri, text, cursor, others, version)
        now = docs.document(uri)
        if self._newest.get(uri) != seq or now is None or now.version != version:
            c["stale"] += 1
            return None
        if edit is None:
            c["none"] += 1
            return None
        target = text if edit.uri == uri else dict(others).get(edit.uri)
        if target is None or (edit.uri != uri and self._changed_since(edit.uri, target)):
            c["stale"] += 1
            return None
        c["proposed"] += 1
        return self._answer(edit, target)

    def _others(self, uri: str) -> list[tuple[str, str]]:
        """(uri, text) of the other open documents, most recently edited first."""
        docs = self.documents
        found = []
        for other, doc in docs.open_documents().items():
            if other == unquote(uri) or len(doc.source) > MAX_OTHER_CHARS:
                continue
            history = docs.edits(other)
            last = history.last() if history is not None else None
            found.append((last.last_at if last is not None else 0.0, other, doc.source))
        found.sort(key=lambda f: f[0], reverse=True)
        return [(other, text) for _, other, text in found[:MAX_OTHERS]]

    def _changed_since(self, uri: str, text: str) -> bool:
        doc = self.documents.document(uri)
        return doc is None or doc.source is not text

    def _answer(self, edit: NextEdit, text: str) -> dict:
        to_client = self.documents.to_client
        start, end = position(text, edit.start), position(text, edit.end)
        after = edit.apply(text)
        cursor = position(after, edit.cursor)
        return {
            "uri": edit.uri,
            "range": {"start": _pos(to_client(text, *start)), "end": _pos(to_client(text, *end))},
            "newText": edit.new_text,
            "oldText": edit.old_text,
            "cursor": _pos(to_client(after, *cursor)),
            "version": edit.version,
            "source": edit.source,
            "why": edit.why,
        }


def _pos(p: types.Position) -> dict:
    return {"line": p.line, "character": p.character}

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
editors/vscode/src/nextedit.ts).

At the cursor's own line the same proposal also comes as a standard inline completion item
(`inline_item`, asked by the `textDocument/inlineCompletion` handler, lsp_server/lsp/handlers.py): where
the edit lies on the cursor's line at or after the cursor, the item's range runs from the cursor to
the line's end and its text is that rest of the line with the edit made, so any LSP editor shows it
over the old text and applies it with its own accept key (Neovim 0.12's vim.lsp.inline_completion
overlays the new rest of the line from its first changed character; to the line's end, so that a
longer name does not leave the old one's tail on screen). The `next_edit` setting off, neither answers anything.

The proposer is the `next_edit_proposer` setting: `propagate` (the default) runs off the event loop in
its own thread; `rewrite` and `both` (lsp_server/nextedit/rewrite.py) run the loaded model on the model
worker (the scheduler, key `nextedit:<uri>`: a newer request for the document supersedes the older
one, a completion request does not wait behind more than one rewrite), their rewrites in one slot of
the engine's KV cache (`REWRITE_CACHE`). Without a local engine (the model still loading, or a team's
remote engine) they fall back to propagation, counted as `without_model`. The inline item at the
cursor's line is always propagation's: ghost text cannot wait seconds for the model. A change to the
document stops its model job, queued or running (`changed`, from the didChange handler): its answer would
be stale, and the judge's seconds on a CPU core (judge.py) would hold the worker the next completion waits
for; counted as `cancelled`.

On the event loop (lsp_server/lsp/threads.py): the newest request per document, the model jobs under
way (kept here to set their cancel events) and the counts are written here only. A model job runs on
the worker (lsp_server/lsp/worker/proposers.py) with copies of the history and the texts, and says what
happened in its result (an edit, none, cancelled, or no model), which the loop counts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

from lsprotocol import types

from lsp_server.lsp.documents import DocumentSession
from lsp_server.lsp.scheduler import Superseded
from lsp_server.lsp.threads import on_loop
from lsp_server.lsp.worker.proposers import CANCELLED, NO_MODEL
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.types import NextEdit, position

log = logging.getLogger(__name__)

NEXT_EDIT = "ditto/nextEdit"
MAX_OTHERS = 8  # other open documents searched, most recently edited first
MAX_OTHER_CHARS = 1 << 20  # larger ones are not searched (a proposal elsewhere is a rename's echo)


class NextEdits:
    def __init__(self, documents: DocumentSession, service=None, settings=None):
        self.documents = documents
        self.service = service  # the completion service (suggest.py): its scheduler and loaded model, for the rewrite
        self._settings = settings or (lambda: None)
        self._newest: dict[str, int] = {}  # uri -> number of its newest request
        self._jobs: dict = {}  # uri -> its model job (scheduler.py Job), queued or running
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ditto-propagate")  # `_propagate`
        self.counts = {"requests": 0, "proposed": 0, "none": 0, "stale": 0, "inline": 0, "model": 0,
                       "without_model": 0, "cancelled": 0}

    async def _propagate(self, *args) -> NextEdit | None:
        """Propagation (`Propagator.propose(*args)`, a few ms) off the event loop, on this object's one thread: the
        default executor grew a thread per overlapping request (up to the cores + 4) when a busy machine made
        typing's inline items overlap (found by tests/lsp/test_faults.py's storm beside other jobs)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, Propagator().propose, *args)

    @on_loop
    def closed(self, uri: str) -> None:
        self.changed(uri)
        self._newest.pop(uri, None)

    @on_loop
    def changed(self, uri: str) -> None:
        """The document changed (didChange): its model job, queued or running, is stale, so it stops (at
        once if queued, else at the judge's or the engine's next check) rather than hold the worker a
        completion waits for."""
        job = self._jobs.pop(uri, None)
        if job is not None:
            job.cancel.set()

    async def propose(self, uri: str, pos: types.Position) -> dict | None:
        c = self.counts
        c["requests"] += 1
        found = self._inputs(uri, pos)
        if found is None:
            c["none"] += 1
            return None
        seq = self._newest[uri] = self._newest.get(uri, 0) + 1
        text, version, cursor, groups = found
        others = self._others(uri)
        try:
            edit = await self._propose(uri, text, cursor, groups, others, version)
        except Superseded:
            c["stale"] += 1
            return None
        now = self.documents.document(uri)
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

    async def _propose(self, uri, text, cursor, groups, others, version) -> NextEdit | None:
        """The setting's proposer (module docstring)."""
        settings = self._settings()
        name = settings.next_edit_proposer if settings is not None else "propagate"
        if name == "propagate" or self.service is None or not self.service.model_ready:
            self.counts["without_model"] += name != "propagate"
            return await self._propagate(groups, uri, text, cursor, others, version)
        mine = []

        def started(job) -> None:
            mine.append(job)
            self._jobs[uri] = job

        try:
            edit = await self.service.propose_edit(uri, name, (groups, uri, text, cursor, others, version), started)
        finally:
            if mine and self._jobs.get(uri) is mine[0]:
                del self._jobs[uri]
        if edit is CANCELLED:  # changed, superseded or cancelled meanwhile: stopped early, nothing to show
            self.counts["cancelled"] += 1
            return None
        if edit is NO_MODEL:  # no local engine (a remote one), or a model without <|file_sep|>
            self.counts["without_model"] += 1
            return await self._propagate(groups, uri, text, cursor, others, version)
        self.counts["model"] += 1
        return edit

    async def inline_item(self, uri: str, pos: types.Position) -> types.InlineCompletionItem | None:
        """The next edit as an inline completion item, where it lies on the cursor's line at or after the
        cursor (module docstring), else None. This document only; one under `MAX_OTHER_CHARS`."""
        found = self._inputs(uri, pos)
        if found is None or len(found[0]) > MAX_OTHER_CHARS:
            return None
        text, version, cursor, groups = found
        edit = await self._propagate(groups, uri, text, cursor, (), version)
        now = self.documents.document(uri)
        if edit is None or now is None or now.version != version or edit.uri != uri or edit.start < cursor:
            return None
        if "\n" in text[cursor : edit.end] or "\n" in edit.new_text:
            return None  # not on the cursor's line: `ditto/nextEdit` shows it there
        line, col = position(text, cursor)
        eol = text.find("\n", edit.end)
        eol = len(text) if eol < 0 else eol - (text[eol - 1 : eol] == "\r")
        to_client = self.documents.to_client
        self.counts["inline"] += 1
        return types.InlineCompletionItem(insert_text=text[cursor : edit.start] + edit.new_text + text[edit.end : eol],
                                          range=types.Range(start=to_client(text, line, col),
                                                            end=to_client(text, line, col + eol - cursor)))

    def _inputs(self, uri: str, pos: types.Position) -> tuple[str, int | None, int, list] | None:
        """(text, version, the cursor's offset, a copy of the edit groups) of an open document with edits."""
        docs = self.documents
        doc, history = docs.document(uri), docs.edits(uri)
        if doc is None or history is None or history.last() is None:
            return None
        text = doc.source
        cursor = docs.lines_of(doc.uri, text).offset(pos, docs.position_units())
        groups = [dataclasses.replace(g) for g in history.groups()]  # the event loop goes on recording
        return text, doc.version, cursor, groups

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

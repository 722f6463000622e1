"""The LSP methods: one small function per method, registered by `register` (the only place
that names them). Each is a thin call into the server's parts (lsp_server/lsp/server.py): the
document session (`ls.documents`), the completion service (`ls.service`, through its verbs: `opened`,
`changed`, `moved`, `closed`, `invalid`, `suggest`, ...), next edits (`ls.next_edits`), the client
(`ls.client`). All of them run on the event loop (lsp_server/lsp/threads.py).

- `textDocument/inlineCompletion` is registered WITH InlineCompletionOptions (else pygls
  2.1.1 does not advertise it); `textDocument/completion` is the fallback (one item).
- Custom requests `ditto/stats`, `ditto/trace` and `ditto/nextEdit` (lsp_server/lsp/nextedit.py);
  the notification `ditto/didMoveCursor`
  aims idle prefill; with the `debug_documents` setting (which a client can set only when
  the server runs as `ditto-lsp serve --debug-hooks`), `ditto/debug/document` answers the
  server's text of an open document (tests compare it with a reference model of the edits); with
  `debug_check_places`, `ditto/debug/checkPlace` finishes the generation answered at a deadline
  for a document and compares it with the same generation uninterrupted (the editor replay's check); with
  `debug_documents`, `ditto/debug/worker` answers what the model worker holds of each open document
  and what idle work still has to do (tests/lsp/test_thread_stress.py compares them with a model).
"""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcMethodNotFound

from lsp_server.lsp.nextedit import NEXT_EDIT
from lsp_server.lsp.shown import root_of

log = logging.getLogger(__name__)

STATS = "ditto/stats"
TRACE = "ditto/trace"
CURSOR = "ditto/didMoveCursor"  # notification {textDocument: {uri}, position}: aims idle prefill
DEBUG_DOCUMENT = "ditto/debug/document"
DEBUG_CHECK_PLACE = "ditto/debug/checkPlace"  # {uri}: does the last deadline + continuation there equal one generation?
DEBUG_WORKER = "ditto/debug/worker"  # the model worker's view of the open documents, and the idle plan


def _get(obj, *names, default=None):
    """Read a field of custom-request params (a namedtuple, dict or None)."""
    for name in names:
        if obj is None:
            return default
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return default if obj is None else obj


def on_initialize(ls, params: types.InitializeParams):
    ls.client.loop = asyncio.get_running_loop() if _has_loop() else None
    ls.service.workspace(root_of(params))
    if params.initialization_options is not None:
        ls.apply_settings(params.initialization_options, "initializationOptions", load=False)

def on_initialized(ls, params: types.InitializedParams):
    ls.client.loop = asyncio.get_running_loop()
    ls.service.start()

def on_shutdown(ls, params):
    ls.service.close()

def on_configuration(ls, params: types.DidChangeConfigurationParams):
    ls.apply_settings(params.settings, "workspace/didChangeConfiguration")

def on_open(ls, params: types.DidOpenTextDocumentParams):
    doc = params.text_document
    ls.service.opened(doc.uri, doc.text, doc.version)

def on_change(ls, params: types.DidChangeTextDocumentParams):
    uri = params.text_document.uri
    if ls.documents.document(uri) is not None:
        ls.documents.note_change(uri, params)  # an accepted suggestion
        ls.service.changed(uri, params.content_changes)
        ls.next_edits.changed(ls.documents.document(uri).uri)  # its model next edit, if one runs, is stale: it stops

def on_cursor(ls, params):
    uri = _get(params, "textDocument", "uri")
    line, char = _get(params, "position", "line"), _get(params, "position", "character")
    if isinstance(uri, str) and isinstance(line, int) and isinstance(char, int) and line >= 0 and char >= 0:
        ls.service.moved(uri, types.Position(line=line, character=char))

def on_close(ls, params: types.DidCloseTextDocumentParams):
    ls.service.closed(params.text_document.uri)  # its record (trace, edits) goes, and the worker's state of it
    ls.next_edits.closed(params.text_document.uri)

async def inline_completion(ls, params: types.InlineCompletionParams):
    snap = ls.documents.snapshot(params.text_document.uri, params.position)
    if snap is None:
        ls.service.invalid()
        return None
    sel = params.context.selected_completion_info if params.context else None
    replace = ls.documents.selected_range(snap, sel)
    position = types.Position(*snap.position)
    if replace is not None:
        snap = ls.documents.with_selection(snap, *replace, sel.text)
    elif ls.settings.next_edit:  # the user's change applies again on this line: that edit, not the model's text
        item = await ls.next_edits.inline_item(snap.uri, position)
        if item is not None:
            return types.InlineCompletionList(items=[item])
    text = await ls.service.suggest(snap, ls.settings)
    if not text:
        return None
    if replace is not None:
        items = [types.InlineCompletionItem(insert_text=sel.text + text, range=sel.range)]
    else:
        here = types.Range(start=position, end=position)
        items = [types.InlineCompletionItem(insert_text=text, range=here)]
        first = text.split("\n", 1)[0]
        invoked = params.context and params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        if invoked and "\n" in text and first.strip():
            items.append(types.InlineCompletionItem(insert_text=first, range=here))
    return types.InlineCompletionList(items=items)

async def completion(ls, params: types.CompletionParams):
    snap = ls.documents.snapshot(params.text_document.uri, params.position)
    if snap is None:
        ls.service.invalid()
        return None
    text = await ls.service.suggest(snap, ls.settings)
    if not text:
        return None
    line_text = snap.text.split("\n")[snap.line]
    start = snap.col
    while start > 0 and (line_text[start - 1].isalnum() or line_text[start - 1] == "_"):
        start -= 1
    word = line_text[start:snap.col]
    first = text.split("\n", 1)[0]
    edit_range = types.Range(start=ls.documents.to_client(snap.text, snap.line, start), end=types.Position(*snap.position))
    item = types.CompletionItem(
        label=first if first.strip() else text.strip().split("\n", 1)[0],
        kind=types.CompletionItemKind.Text,
        detail="Ditto",
        documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=text) if "\n" in text else None,
        filter_text=word + first,
        sort_text="0",
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=edit_range, new_text=word + text),
    )
    return types.CompletionList(is_incomplete=True, items=[item])

async def next_edit(ls, params):
    uri = _get(params, "textDocument", "uri")
    line, char = _get(params, "position", "line"), _get(params, "position", "character")
    if not isinstance(uri, str) or not isinstance(line, int) or not isinstance(char, int) or line < 0 or char < 0:
        raise JsonRpcInvalidParams(f"{NEXT_EDIT}: needs textDocument.uri and a position")
    if not ls.settings.next_edit:
        return None
    return await ls.next_edits.propose(uri, types.Position(line=line, character=char))

def stats(ls, params):
    return ls.stats(intervals=bool(_get(params, "remoteIntervals", default=False)))

def trace(ls, params):
    uri = _get(params, "uri") or _get(params, "textDocument", "uri")
    if uri is not None and not isinstance(uri, str):
        raise JsonRpcInvalidParams("ditto/trace: uri must be a string")
    if uri is None:
        return None
    return ls.documents.trace(uri)

def debug_document(ls, params):
    if not ls.settings.debug_documents:
        raise JsonRpcMethodNotFound(f"{DEBUG_DOCUMENT} is off: needs `serve --debug-hooks` and debugDocuments")
    uri = _get(params, "uri")
    if not isinstance(uri, str):
        raise JsonRpcInvalidParams(f"{DEBUG_DOCUMENT}: uri must be a string")
    doc = ls.documents.document(uri)
    return None if doc is None else {"uri": uri, "version": doc.version, "text": doc.source}


async def debug_worker(ls, params):
    if not ls.settings.debug_documents:
        raise JsonRpcMethodNotFound(f"{DEBUG_WORKER} is off: needs `serve --debug-hooks` and debugDocuments")
    return await ls.service.debug_view()


async def debug_check_place(ls, params):
    if not ls.settings.debug_check_places:
        raise JsonRpcMethodNotFound(f"{DEBUG_CHECK_PLACE} is off: needs `serve --debug-hooks` and debugCheckPlaces")
    uri = _get(params, "uri")
    if not isinstance(uri, str):
        raise JsonRpcInvalidParams(f"{DEBUG_CHECK_PLACE}: uri must be a string")
    return await ls.service.check_place(uri)


def register(server) -> None:
    """Register every handler on `server` (a DittoServer)."""
    server.feature(types.INITIALIZE)(on_initialize)
    server.feature(types.INITIALIZED)(on_initialized)
    server.feature(types.SHUTDOWN)(on_shutdown)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(on_configuration)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(on_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(on_change)
    server.feature(CURSOR)(on_cursor)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(on_close)
    server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(inline_completion)
    server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[".", "(", " "]))(completion)
    server.feature(NEXT_EDIT)(next_edit)
    server.feature(STATS)(stats)
    server.feature(TRACE)(trace)
    server.feature(DEBUG_DOCUMENT)(debug_document)
    server.feature(DEBUG_CHECK_PLACE)(debug_check_place)
    server.feature(DEBUG_WORKER)(debug_worker)



def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


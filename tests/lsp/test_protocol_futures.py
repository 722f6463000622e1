"""pygls 2.1.1 keeps the future of every notification run through a generator handler (didChange)
under a fresh id forever; lsp_server/lsp/protocol.py drops it once done (issue 26: the long day's
slow RSS growth). Counted in-process, and through `ditto/stats` by tests/bench/test_longday.py."""

from lsprotocol import types
from pygls.workspace import Workspace

from lsp_server.lsp.server import build_server

URI = "file:///tmp/ditto-futures/a.py"


async def test_a_thousand_edits_leave_no_future_behind():  # (async: handlers run on the event loop)
    server = build_server()
    server.protocol._workspace = Workspace(None)
    server.workspace.put_text_document(types.TextDocumentItem(uri=URI, language_id="python", version=1, text="x\n"))
    for v in range(1000):
        params = types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=v + 2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="a")])
        server.protocol._handle_notification(types.TEXT_DOCUMENT_DID_CHANGE, params)
    assert server.documents.document(URI).source == "a" * 1000 + "x\n"
    assert server.protocol.requests_under_way == 0

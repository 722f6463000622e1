"""The language server: LSP in, ghost-text suggestions out. Only lsp_server/lsp/ imports pygls.

`DittoServer` is pygls's LanguageServer plus the parts it owns, each an object with its own state:

| part | module | owns |
|---|---|---|
| `documents`: the document session | documents.py | open documents, line tables, per-file state, traces, snapshots, the change queue |
| `service`: the completion service | suggest.py | the model worker (scheduler.py; its state in worker/), loading (loading.py), idle work (idle.py), the prompt's definitions resolved in a process of their own (definitions.py), counters (stats.py) |
| `next_edits`: `ditto/nextEdit`, the cursor line's inline item | nextedit.py | the newest request per document, its counts, the model rewriter (run on the service's worker; the edit histories are the session's) |
| `client`: what the parts say to the client | errors.py | the one error path, notifications, `$/progress` |
| the LSP methods, one function each | handlers.py | nothing: thin calls into the parts |
| pygls workarounds (invalid params, edits, a second `initialize`) | protocol.py | the wire |

Two threads, one owner for every piece of state (lsp_server/lsp/threads.py): the event loop runs the
handlers and owns the parts above; the model runs on the scheduler's single worker thread, which owns
the loaded Completer and the per-file state (lsp_server/lsp/worker/) and gets everything else as
immutable values. Handlers take a snapshot (uri, version, text, position) from the session, await the
service, which drops a result whose document version changed meanwhile. `$/cancelRequest` and newer requests for the same document set the
engine's stop flag. Settings come from `initializationOptions` and
`workspace/didChangeConfiguration` (`apply_settings`); the parts read the live ones, and a
request takes the settings of its moment down to the Completer as an argument.

Left out on purpose: prompts and stop rules (lsp_server/completion/), decoding
(lsp_server/decoding/), the command line (lsp_server/commands/serve.py).
"""

from __future__ import annotations

import logging

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from lsp_server.lsp.documents import DocumentSession
from lsp_server.lsp.errors import Client
from lsp_server.lsp.handlers import register
from lsp_server.lsp.nextedit import NextEdits
from lsp_server.lsp.protocol import DittoProtocol
from lsp_server.lsp.suggest import CompletionService
from lsp_server.lsp.threads import Latest, on_loop
from lsp_server.settings import Settings, SettingsError

log = logging.getLogger(__name__)


class DittoServer(LanguageServer):
    def __init__(self, settings: Settings | None = None):
        # pygls's thread pool serves only its stdin reader here (`StdinAsyncReader`; no handler is a
        # thread function): one read at a time, so one worker. With pygls's default (cores + 4) a busy
        # machine made it start a new thread for a read submitted before the last reader thread went
        # idle (tests/lsp/test_faults.py, the typing storm).
        super().__init__("ditto-lsp", "0.1.0", protocol_cls=DittoProtocol, max_workers=1,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        # The settings: an immutable value the loop replaces whole and the worker may read (threads.py).
        self._settings = Latest(settings or Settings())
        self.client = Client(self)
        self.documents = DocumentSession(lambda: self.workspace, lambda: self.service.window_budget(),
                                         edits_wanted=lambda: self.settings.recent_edits)
        self.service = CompletionService(self.documents, self.client, self._settings.get)
        self.next_edits = NextEdits(self.documents, self.service, self._settings.get)

    # -- settings ----------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self._settings.get()

    @settings.setter
    def settings(self, value: Settings) -> None:
        self._settings.set(value)

    @on_loop
    def apply_settings(self, options, where: str, load: bool = True) -> None:
        unknown: list[str] = []
        refused: list[str] = []
        try:
            new = self.settings.merged(options, unknown, refused)
        except SettingsError as err:
            self.client.fail(f"Ditto: ignored {where}: {err}", show=True)
            return
        if unknown:
            log.warning("ignored unknown settings in %s: %s", where, ", ".join(unknown))
        if refused:
            log.warning("ignored %s in %s: the server was not started with `ditto-lsp serve --debug-hooks`",
                        ", ".join(refused), where)
        old, self.settings = self.settings, new  # a request takes the settings of its moment to the worker
        if load:
            self.service.settings_changed(old, new)

    @on_loop
    def stats(self, intervals: bool = False) -> dict:
        """`ditto/stats` (stats.py `report`)."""
        p = self.protocol
        out = self.service.stats(open_documents=len(self.workspace.text_documents) if p.initialized else 0,
                                 protocol_futures=p.requests_under_way, intervals=intervals)
        return {**out, "next_edit": dict(self.next_edits.counts)}

    def report_server_error(self, error, source):
        """pygls's hook for errors out of band: errors.py's one error path."""
        self.client.report_server_error(error, source)


def build_server(settings: Settings | None = None) -> DittoServer:
    server = DittoServer(settings)
    register(server)
    return server

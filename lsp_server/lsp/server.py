"""The language server: LSP in, ghost-text suggestions out. Only lsp_server/lsp/ imports pygls.

`DittoServer` is one object whose concerns live in one module each:

| concern | module |
|---|---|
| pygls workarounds (invalid params, incremental edits) | protocol.py |
| the LSP methods, one function each | handlers.py |
| open documents, snapshots, the drafter's view of them | documents.py |
| a completion request: waiting, the worker, stale results, traces | suggest.py |
| the model's life: loading, `$/progress`, waiting requests | lifecycle.py |
| idle prefill | idle.py |
| counters and `ditto/stats` | stats.py |
| test hooks around model passes | debug.py |
| the one error path (log, `window/showMessage`) | errors.py |
| the model worker thread (newest request per document wins) | scheduler.py |

The model runs on the scheduler's single worker thread; handlers snapshot (uri, version,
text, position), await the worker, and drop a result whose document version changed
meanwhile. `$/cancelRequest` and newer requests for the same document set the engine's
stop flag. Settings come from `initializationOptions` and `workspace/didChangeConfiguration`
(`apply_settings`).

Left out on purpose: prompts and stop rules (lsp_server/completion/), decoding
(lsp_server/decoding/), the command line (lsp_server/commands/serve.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from lsp_server.lsp.debug import DebugMixin
from lsp_server.lsp.documents import DocumentsMixin
from lsp_server.lsp.errors import ErrorsMixin
from lsp_server.lsp.handlers import register
from lsp_server.lsp.idle import IdleMixin
from lsp_server.lsp.lifecycle import LifecycleMixin
from lsp_server.lsp.protocol import DittoProtocol
from lsp_server.lsp.scheduler import Scheduler
from lsp_server.lsp.stats import Counters, StatsMixin
from lsp_server.lsp.suggest import SuggestMixin
from lsp_server.settings import Settings, SettingsError

log = logging.getLogger(__name__)


class DittoServer(ErrorsMixin, StatsMixin, DocumentsMixin, IdleMixin, LifecycleMixin, DebugMixin, SuggestMixin,
                  LanguageServer):
    def __init__(self, settings: Settings | None = None):
        super().__init__("ditto-lsp", "0.1.0", protocol_cls=DittoProtocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.settings = settings or Settings()
        self.scheduler = Scheduler()
        self.counters = Counters()
        self.completer = None  # lsp_server.completion.completer.Completer once a model is loaded
        self.model_state = "not loaded"  # not loaded | loading | ready | failed
        self.model_error: str | None = None
        self.model_info: dict = {}
        self.traces: dict[str, dict] = {}  # uri -> last completion's rounds
        self._loaded_key: tuple | None = None
        self._load_seq = itertools.count(1)
        self._load_wanted = 0
        self._dirty: dict[str, str | None] = {}  # uri -> new text (None: closed), applied on the worker
        self._dirty_lock = threading.Lock()
        self._accepted: list[tuple[str, str]] = []  # (uri, suggestion text) the user accepted; for the history source
        self._step_cancel: threading.Event | None = None
        self._stale_in_request: tuple = (None, 0)  # (cancel event of a request, its stale passes)
        self._step_uri: str | None = None
        self._warmed: dict[str, bool] = {}  # uri -> an idle prefill ran since its last request
        self._idle_cancel: threading.Event | None = None  # set while idle work runs
        self._aim = None  # Snapshot of where the user is: what idle prefill warms (lsp_server/lsp/idle.py)
        self._continue_uri: str | None = None  # a suggestion answered at its deadline, to finish while idle
        self.loop: asyncio.AbstractEventLoop | None = None
        # Requests waiting for the model to load: uri -> future of the newest one, resolved
        # with the load's outcome ("ready" | "failed" | "stopped") or "superseded".
        self._waiting: dict[str, asyncio.Future] = {}
        self._request_seq: dict[str, int] = {}  # uri -> number of its newest completion request

    # -- settings ----------------------------------------------------------------------------
    def apply_settings(self, options, where: str, load: bool = True) -> None:
        unknown: list[str] = []
        refused: list[str] = []
        try:
            new = self.settings.merged(options, unknown, refused)
        except SettingsError as err:
            self.fail(f"Ditto: ignored {where}: {err}", show=True)
            return
        if unknown:
            log.warning("ignored unknown settings in %s: %s", where, ", ".join(unknown))
        if refused:
            log.warning("ignored %s in %s: the server was not started with `ditto-lsp serve --debug-hooks`",
                        ", ".join(refused), where)
        old, self.settings = self.settings, new  # the worker gives the completer its share per request
        if load and (new.model_key() != old.model_key() or self.model_state == "failed"):
            self.request_load()



def build_server(settings: Settings | None = None) -> DittoServer:
    server = DittoServer(settings)
    register(server)
    return server

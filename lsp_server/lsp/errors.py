"""The server's one error path, and what its parts say to the client (`Client`): how an error
reaches the log, the user and the request's answer; notifications and `$/progress`.

- `fail(message, show=...)`: one log line (with the traceback when `exc` is an unexpected
  exception), and a `window/showMessage` when the user must act (a model that does not
  load, settings that are refused, a remote engine that stopped answering);
- the request's answer is `None` ("no suggestion") for every expected failure; an
  unexpected exception in a handler reaches pygls, which answers InternalError and logs
  it with its traceback (`report_server_error` then does not log it a second time);
- requests pygls cannot even read are answered by lsp_server/lsp/protocol.py with
  InvalidParams / InvalidRequest.
"""

from __future__ import annotations

import logging

from lsprotocol import types
from pygls.exceptions import FeatureRequestError

log = logging.getLogger(__name__)


class Client:
    """The client as the server's parts see it (lsp_server/lsp/server.py builds one over pygls's
    LanguageServer): they say things through it and never hold the server."""

    def __init__(self, server):
        self._server = server
        self.loop = None  # the event loop, once the client initialized (handlers.py)

    def notify(self, method: str, params) -> None:
        """Send a notification (on the event loop)."""
        self._server.protocol.notify(method, params)

    def notify_threadsafe(self, method: str, params) -> None:
        """Send a notification from the model worker (dropped before the loop exists)."""
        self.post(self._server.protocol.notify, method, params)

    def post(self, fn, *args) -> None:
        """From the model worker: run `fn(*args)` on the event loop (lsp_server/lsp/threads.py); the one
        way the worker's results reach the loop's state. Dropped before the loop exists (no job runs
        before the client initialized)."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(fn, *args)

    def progress_supported(self) -> bool:
        caps = self._server.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)

    @property
    def progress(self):
        """pygls's `work_done_progress` (create_async, begin, report, end)."""
        return self._server.work_done_progress

    def fail(self, message: str, *, show: bool = False, exc: BaseException | None = None,
             logged: bool = False) -> None:
        """Log `message` once (unless the caller's own module `logged` it), with the traceback of
        `exc`; show it to the user when `show` (they must act on it)."""
        if not logged:
            log.error("%s", message, exc_info=exc)
        if show:
            self._server.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=message))

    def report_server_error(self, error, source) -> None:
        """pygls's hook for errors out of band (DittoServer passes it here). Its default shows every one
        to the user; log instead. A failed request was already logged by pygls with its traceback:
        log it once, not twice."""
        if source is FeatureRequestError:
            return
        self.fail(f"{getattr(source, '__name__', source)}: {error}")

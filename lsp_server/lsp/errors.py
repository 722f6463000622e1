"""The server's one error path: how an error reaches the log, the user and the request's answer
(a mixin of DittoServer, lsp_server/lsp/server.py).

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


class ErrorsMixin:
    def fail(self, message: str, *, show: bool = False, exc: BaseException | None = None,
             logged: bool = False) -> None:
        """Log `message` once (unless the caller's own module `logged` it), with the traceback of
        `exc`; show it to the user when `show` (they must act on it)."""
        if not logged:
            log.error("%s", message, exc_info=exc)
        if show:
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=message))

    def report_server_error(self, error, source):
        """pygls's hook for errors out of band. Its default shows every one to the user; log instead.
        A failed request was already logged by pygls with its traceback: log it once, not twice."""
        if source is FeatureRequestError:
            return
        self.fail(f"{getattr(source, '__name__', source)}: {error}")

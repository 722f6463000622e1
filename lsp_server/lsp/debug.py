"""Test hooks around every model pass: `debug_step_delay_ms`, `debug_notify_steps`,
`debug_fail_forward`, and the count of passes begun for a request already cancelled
(a mixin of DittoServer, lsp_server/lsp/server.py; the settings need `serve --debug-hooks`).
"""

from __future__ import annotations

DEBUG_STEP = "ditto/debug/step"


class DebugMixin:
    def _before_step(self, n_tokens: int) -> None:
        """On the worker, before every model pass: the debug hooks of the settings."""
        s = self.settings
        idle = self._idle_cancel
        if idle is None and self._step_cancel is not None and self._step_cancel.is_set():
            # A pass begun after the request was cancelled/superseded. One can race the
            # engine's check of the flag; more than one per request means it is not checked.
            self.counters.stale_passes += 1
            n = self._stale_in_request[1] + 1 if self._stale_in_request[0] is self._step_cancel else 1
            self._stale_in_request = (self._step_cancel, n)
            self.counters.stale_passes_max = max(self.counters.stale_passes_max, n)
        if s.debug_notify_steps and self.loop is not None:
            params = {"uri": self._step_uri, "tokens": n_tokens, **({"idle": True} if idle is not None else {})}
            self.loop.call_soon_threadsafe(self.protocol.notify, DEBUG_STEP, params)
        wait_on = idle if idle is not None else self._step_cancel
        if s.debug_step_delay_ms > 0 and wait_on is not None:
            wait_on.wait(s.debug_step_delay_ms / 1000)

    def _after_step(self, n_tokens: int) -> None:
        """On the worker, after every model pass: the `debug_fail_forward` fault."""
        if self.settings.debug_fail_forward:
            raise RuntimeError("out of memory (simulated by the debug_fail_forward setting)")


"""Test hooks around every model pass (`DebugHooks`): `debug_step_delay_ms`, `debug_notify_steps` and
`debug_fail_forward`. Installed as the engine's pass hooks (lsp_server/decoding/types.py `PassHooks`)
only when the server runs as `ditto-lsp serve --debug-hooks` (lsp_server/lsp/loading.py, worker/state.py); a
production server's engine has none.

Each pass arrives with the `RequestContext` of the work it is for (the document, idle or not, the
cancel event), passed down by the Completer and the engine; nothing here is kept between passes.
The settings are read at every pass, so a test changes them while the model runs.
Left out on purpose: counting stale passes (the engine's `Stats.stale_passes`, summed by
lsp_server/lsp/suggest.py for every server).
"""

from __future__ import annotations

from typing import Callable

from lsp_server.decoding.types import RequestContext

DEBUG_STEP = "ditto/debug/step"


class DebugHooks:
    def __init__(self, settings: Callable[[], object], notify: Callable[[str, dict], None]):
        self._settings = settings  # the server's live settings
        self._notify = notify  # thread-safe: called on the worker

    def before_pass(self, ctx: RequestContext | None, rows: int) -> None:
        """On the worker, before every model pass: notify the pass, then make it slow."""
        s = self._settings()
        idle = ctx is not None and ctx.idle
        if s.debug_notify_steps:
            self._notify(DEBUG_STEP, {"uri": ctx.key if ctx is not None else None, "tokens": rows,
                                      **({"idle": True} if idle else {})})
        if s.debug_step_delay_ms > 0 and ctx is not None and ctx.cancel is not None:
            ctx.cancel.wait(s.debug_step_delay_ms / 1000)  # a cancelled request is not kept waiting

    def after_pass(self, ctx: RequestContext | None, rows: int) -> None:
        """On the worker, after every model pass (the KV cache holds its tokens): the simulated fault."""
        if self._settings().debug_fail_forward:
            raise RuntimeError("out of memory (simulated by the debug_fail_forward setting)")

"""Idle work: while the user pauses, prefill the prompt they are likely to ask for next (a mixin
of DittoServer, lsp_server/lsp/server.py; docs/design.md, "Prompt layout and windows"); then index
the open buffers for the drafter, a slice at a time (lsp_server/lsp/documents.py
`index_while_idle`; a request waits for at most one slice). One idle job does both, so that
neither replaces the other in the scheduler's one idle slot.
"""

from __future__ import annotations

import threading

from lsprotocol import types

from lsp_server.lsp.documents import Snapshot, buffer_name, model_text


class IdleMixin:
    # -- idle prefill -------------------------------------------------------------------------
    IDLE_CHUNK = 32  # tokens per idle prefill pass: a request waits at most one such pass (~0.5 s on one CPU core)

    def aim(self, uri: str, position: types.Position) -> None:
        """Prefill, while the worker is idle, the prompt of a request at `position` of `uri`.

        Re-aimed by didOpen (the top of the document: LSP does not say where the cursor is),
        every didChange (the end of the edit), and `ditto/didMoveCursor` from Ditto's own
        plugins. The newest aim replaces the older one; a request stops it after one chunk
        and continues from what it prefilled (docs/design.md, "Prompt layout and windows").
        """
        if self.model_state != "ready" or self.completer is None or not self.settings.idle_prefill:
            return
        snap = self.snapshot(uri, position)
        if snap is None:
            return
        self.__dict__["_aimed"] = snap
        self._schedule_idle()

    def _schedule_idle(self) -> None:
        self.scheduler.idle(self._idle_work)

    def _idle_work(self, cancel: threading.Event) -> None:
        snap = self.__dict__.pop("_aimed", None)
        if snap is not None:
            self._warm(snap, cancel)
            if cancel.is_set():
                self.__dict__.setdefault("_aimed", snap)  # stopped by a request: go on from there later
        self.index_while_idle(cancel)

    def _warm(self, snap: Snapshot, cancel: threading.Event) -> None:
        completer = self.completer
        if completer is None or completer.engine is None or cancel.is_set():
            return  # (no engine: a remote one, which keeps its own prefix cache)
        doc = self.document(snap.uri)
        if doc is None or doc.version != snap.version:
            return  # the document moved on; a newer aim follows
        self._apply_dirty(completer)
        completer.settings = self.settings.completer_settings()
        self._idle_cancel, self._step_uri = cancel, snap.uri
        try:
            st = completer.warm(model_text(snap.text), snap.line, snap.col, name=buffer_name(snap.uri),
                                cache_key=snap.uri, cancel=cancel, chunk=self.IDLE_CHUNK)
        finally:
            self._idle_cancel = self._step_uri = None
        c = self.counters
        c.idle_prefills += 1
        c.idle_prefill_tokens += st.prefill_tokens
        c.idle_prefills_stopped += int(st.stop_reason == "cancelled")
        self._warmed[snap.uri] = True


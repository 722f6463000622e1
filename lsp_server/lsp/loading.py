"""The model's life in the server: loading in the background with `$/progress`, requests that
wait for it, failures shown once, and `ditto/modelReady` (a mixin of DittoServer,
lsp_server/lsp/server.py).

A completion request made while the model loads waits for it (the newest per document: an
older one waiting for the same document gets `None` at once; `$/cancelRequest` cancels a
waiting one), for at most the `load_wait_s` setting, and is then computed like any other, so
the first suggestion needs no second keystroke. When the load is done the server sends the
notification `ditto/modelReady` `{"model": spec}`, for editors that drop answers that come
late (the plugins re-ask once). A failure answers the waiting requests `None`, is shown once
(`window/showMessage`) and logged; a settings change to a loadable model recovers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from lsprotocol import types

from lsp_server.backends.base import ModelError
from lsp_server.lsp.documents import buffer_name, model_text
from lsp_server.lsp.scheduler import StepHook
from lsp_server.settings import Settings

log = logging.getLogger(__name__)

MODEL_READY = "ditto/modelReady"


class LifecycleMixin:
    # -- model loading --------------------------------------------------------------------
    def request_load(self) -> None:
        """Load the model of the current settings in the background (no-op if loaded)."""
        if self._loaded_key == self.settings.model_key() and self.model_state in ("ready", "loading"):
            return
        seq = next(self._load_seq)
        self._load_wanted = seq
        self.model_state = "loading"
        self._loaded_key = self.settings.model_key()
        asyncio.ensure_future(self._load(seq, self.settings))

    async def _load(self, seq: int, settings: Settings) -> None:
        token = f"ditto-load-{seq}"
        progress = self._progress_supported()
        if progress:
            try:
                await self.work_done_progress.create_async(token)
            except Exception as err:  # the client refused: load without progress
                log.warning("window/workDoneProgress/create failed: %s", err)
                progress = False
        if progress:
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
                title="Ditto", message=f"loading model {settings.model}", percentage=0))
        loop = asyncio.get_running_loop()

        def report(msg: str, frac) -> None:
            if progress:
                pct = None if frac is None else max(0, min(100, int(frac * 100)))
                self.work_done_progress.report(token, types.WorkDoneProgressReport(message=msg, percentage=pct))

        def job(cancel: threading.Event):
            if seq != self._load_wanted:
                return None  # a newer load was asked for meanwhile
            if not self._debug_load_delay(seq, cancel):
                return None
            from lsp_server.backends.loader import load
            from lsp_server.completion.build import build_completer
            from lsp_server.decoding.engine import Engine

            self.completer = None
            lm = load(settings.model, device=settings.device, dtype=settings.dtype,
                      trust_remote_code=settings.trust_remote_code, backend=settings.backend,
                      remote=settings.remote,
                      progress=lambda msg, frac: loop.call_soon_threadsafe(report, msg, frac))
            with self._dirty_lock:  # every open document now; what changes later is queued again
                self._dirty = {}
                buffers = [(buffer_name(uri), model_text(doc.source)) for uri, doc in self.workspace.text_documents.items()]
            # Pass costs measured afresh at every load (on a plain engine, without the step hooks).
            completer = build_completer(lm, self.settings.completer_settings(), calibration="fresh", buffers=buffers,
                                        engine=Engine(StepHook(lm, self._before_step, self._after_step)))
            self._apply_dirty(completer)  # accepted completions, and changes made while it was built
            self.completer = completer
            return lm

        try:
            lm = await self.scheduler.run(None, job)
        except Exception as err:
            if seq == self._load_wanted:
                self.model_state = "failed"
                self.model_error = str(err).splitlines()[0] if str(err) else type(err).__name__
                self._loaded_key = None
                msg = f"Ditto: could not load model {settings.model!r}: {self.model_error}"
                # A ModelError is one line saying what to do; anything else is a bug: its traceback is logged.
                self.fail(msg, show=True, exc=None if isinstance(err, ModelError) else err)
                self._settle_waiting("failed")
            if progress:
                self.work_done_progress.end(token, types.WorkDoneProgressEnd(message="failed"))
            return
        if progress:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message="ready" if lm else "skipped"))
        if seq != self._load_wanted:
            return  # a newer load answers the waiting requests
        if lm is None:
            self._settle_waiting("stopped")  # the worker was stopped during the load
            return
        self.model_state = "ready"
        self.model_error = None
        self.model_info = {"model": lm.spec, "name": lm.name, **lm.describe(), "load_seconds": round(lm.load_seconds, 2)}
        log.info("model %s ready on %s (%s) in %.1f s", lm.spec, self.model_info["device"], self.model_info["backend"],
                 lm.load_seconds)
        self.protocol.notify(MODEL_READY, {"model": lm.spec})
        self._settle_waiting("ready")

    def _debug_load_delay(self, seq: int, cancel: threading.Event) -> bool:
        """On the worker, before a load: the `debug_load_delay_s` hook (tests make loading slow).

        The setting is read again while sleeping, so a test ends the sleep early by setting it
        to 0. False when the worker stops or a newer load is asked for meanwhile.
        """
        t0 = time.monotonic()
        while (left := self.settings.debug_load_delay_s - (time.monotonic() - t0)) > 0:
            if seq != self._load_wanted or cancel.wait(min(left, 0.05)):
                return False
        return True

    # -- requests made while the model loads -----------------------------------------------
    async def _wait_for_model(self, uri: str, seq: int) -> str:
        """Wait for the load under way: "ready" | "failed" | "stopped" | "superseded" | "timeout".

        Only the newest request per document waits: `suggest` answers an older one
        "superseded" at once, and so is one that was woken but overtaken by a newer request
        (`seq` is no longer the document's newest) before it ran.
        """
        fut = asyncio.get_running_loop().create_future()
        self._waiting[uri] = fut
        self.counters.waited += 1
        try:
            outcome = await asyncio.wait_for(fut, self.settings.load_wait_s)
        except asyncio.TimeoutError:
            outcome = "timeout"
        finally:
            if self._waiting.get(uri) is fut:
                del self._waiting[uri]
        if outcome == "ready" and self._request_seq.get(uri) != seq:
            outcome = "superseded"
        return outcome

    def _settle_waiting(self, outcome: str) -> None:
        """Answer every request waiting for the model with the load's outcome."""
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_result(outcome)

    def _progress_supported(self) -> bool:
        caps = self.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)


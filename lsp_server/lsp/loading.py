"""The model's life in the server (`ModelLoader`): loading in the background with `$/progress`,
requests that wait for it, failures shown once, and `ditto/modelReady`.

A completion request made while the model loads waits for it (the newest per document: an
older one waiting for the same document gets `None` at once; `$/cancelRequest` cancels a
waiting one), for at most the `load_wait_s` setting, and is then computed like any other, so
the first suggestion needs no second keystroke. When the load is done the server sends the
notification `ditto/modelReady` `{"model": spec}`, for editors that drop answers that come
late (the plugins re-ask once). A failure answers the waiting requests `None`, is shown once
(`window/showMessage`) and logged; a settings change to a loadable model recovers.

On the event loop (lsp_server/lsp/threads.py). The load itself is a job on the model worker
(lsp_server/lsp/worker/state.py `Worker.load`, which owns the Completer it builds); the loop keeps
the outcome: the state, the model's description, and its own reference to the loaded Completer
(`completer`, None until a load succeeds), which it only hands on and never runs. A newer load sets
the older one's cancel event instead of a flag both threads read. The engine carries the debug hooks
only when the server runs with `--debug-hooks` (lsp_server/lsp/worker/debug.py).
Left out on purpose: what a request does with the model (lsp_server/lsp/suggest.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import Callable

from lsprotocol import types

from lsp_server.backends.base import ModelError
from lsp_server.lsp.errors import Client
from lsp_server.lsp.scheduler import Scheduler
from lsp_server.lsp.threads import on_loop
from lsp_server.lsp.worker.state import Worker
from lsp_server.settings import Settings

log = logging.getLogger(__name__)

MODEL_READY = "ditto/modelReady"


class ModelLoader:
    def __init__(self, scheduler: Scheduler, worker: Worker, client: Client, settings: Callable[[], Settings]):
        self.scheduler = scheduler
        self._worker = worker  # its `load` runs as a job (never called here)
        self.client = client
        self._settings = settings  # the server's live settings
        self._job = None  # the load job under way (its cancel event stops it when a newer load is asked for)
        self.completer = None  # lsp_server.completion.completer.Completer once a model is loaded
        self.state = "not loaded"  # not loaded | loading | ready | failed
        self.error: str | None = None
        self.info: dict = {}
        self._loaded_key: tuple | None = None
        self._seq = itertools.count(1)
        self._wanted = 0
        # Requests waiting for the model: uri -> future of the newest one, resolved with the load's
        # outcome ("ready" | "failed" | "stopped") or "superseded".
        self._waiting: dict[str, asyncio.Future] = {}
        self._newest: dict[str, int] = {}  # uri -> number of its newest completion request
        self.waited = 0  # requests that arrived while the model loaded, and waited for it

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self.completer is not None

    @property
    def waiting(self) -> int:
        """Requests waiting for the load now."""
        return sum(not f.done() for f in self._waiting.values())

    # -- model loading --------------------------------------------------------------------
    @on_loop
    def request_load(self) -> None:
        """Load the model of the current settings in the background (no-op if loaded)."""
        settings = self._settings()
        if self._loaded_key == settings.model_key() and self.state in ("ready", "loading"):
            return
        seq = next(self._seq)
        self._wanted = seq
        if self._job is not None:
            self._job.cancel.set()  # a newer load is asked for: the older one stops
        self.state = "loading"
        self._loaded_key = settings.model_key()
        asyncio.ensure_future(self._load(seq, settings))

    @on_loop
    def settings_changed(self, old: Settings, new: Settings) -> None:
        """Load again when the model settings changed, or the last load failed."""
        if new.model_key() != old.model_key() or self.state == "failed":
            self.request_load()

    async def _load(self, seq: int, settings: Settings) -> None:
        token = f"ditto-load-{seq}"
        client = self.client
        progress = client.progress_supported()
        if progress:
            try:
                await client.progress.create_async(token)
            except Exception as err:  # the client refused: load without progress
                log.warning("window/workDoneProgress/create failed: %s", err)
                progress = False
        if progress:
            client.progress.begin(token, types.WorkDoneProgressBegin(
                title="Ditto", message=f"loading model {settings.model}", percentage=0))
        def report(msg: str, frac) -> None:
            if progress:
                pct = None if frac is None else max(0, min(100, int(frac * 100)))
                client.progress.report(token, types.WorkDoneProgressReport(message=msg, percentage=pct))

        worker = self._worker
        post = client.post

        def job(cancel: threading.Event):
            if cancel.is_set() or not self._debug_load_delay(cancel):
                return None  # a newer load was asked for meanwhile
            return worker.load(settings, lambda msg, frac: post(report, msg, frac), cancel)

        self._job = self.scheduler.submit(None, job)
        try:
            loaded = await self.scheduler.wait(self._job)
        except Exception as err:
            if seq == self._wanted:
                self.state = "failed"
                self.error = str(err).splitlines()[0] if str(err) else type(err).__name__
                self._loaded_key = None
                msg = f"Ditto: could not load model {settings.model!r}: {self.error}"
                # A ModelError is one line saying what to do; anything else is a bug: its traceback is logged.
                client.fail(msg, show=True, exc=None if isinstance(err, ModelError) else err)
                self._settle("failed")
            if progress:
                client.progress.end(token, types.WorkDoneProgressEnd(message="failed"))
            return
        if progress:
            client.progress.end(token, types.WorkDoneProgressEnd(message="ready" if loaded else "skipped"))
        if seq != self._wanted:
            return  # a newer load answers the waiting requests
        if loaded is None:
            self._settle("stopped")  # the worker was stopped during the load
            return
        lm, self.completer = loaded
        self.state = "ready"
        self.error = None
        self.info = {"model": lm.spec, "name": lm.name, **lm.describe(), "load_seconds": round(lm.load_seconds, 2)}
        log.info("model %s ready on %s (%s) in %.1f s", lm.spec, self.info["device"], self.info["backend"],
                 lm.load_seconds)
        client.notify(MODEL_READY, {"model": lm.spec})
        self._settle("ready")

    def _debug_load_delay(self, cancel: threading.Event) -> bool:
        """On the worker, before a load: the `debug_load_delay_s` hook (tests make loading slow).

        The setting (a published immutable value) is read again while sleeping, so a test ends the
        sleep early by setting it to 0. False when the worker stops or a newer load is asked for.
        """
        t0 = time.monotonic()
        while (left := self._settings().debug_load_delay_s - (time.monotonic() - t0)) > 0:
            if cancel.wait(min(left, 0.05)):
                return False
        return True

    # -- requests made while the model loads -----------------------------------------------
    @on_loop
    def arrived(self, uri: str) -> int:
        """A completion request for `uri` arrived: its number. An older one still waiting for the
        model is answered "superseded" (even when this one need not wait)."""
        seq = self._newest[uri] = self._newest.get(uri, 0) + 1
        older = self._waiting.get(uri)
        if older is not None and not older.done():
            older.set_result("superseded")
        return seq

    @on_loop
    def forget(self, uri: str) -> None:
        """`uri` closed."""
        self._newest.pop(uri, None)

    async def wait(self, uri: str, seq: int) -> str:
        """Wait for the load under way: "ready" | "failed" | "stopped" | "superseded" | "timeout".

        Only the newest request per document waits (`arrived`), and one that was woken but
        overtaken by a newer request (`seq` is no longer the document's newest) before it ran is
        "superseded" too.
        """
        fut = asyncio.get_running_loop().create_future()
        self._waiting[uri] = fut
        self.waited += 1
        try:
            outcome = await asyncio.wait_for(fut, self._settings().load_wait_s)
        except asyncio.TimeoutError:
            outcome = "timeout"
        finally:
            if self._waiting.get(uri) is fut:
                del self._waiting[uri]
        if outcome == "ready" and self._newest.get(uri) != seq:
            outcome = "superseded"
        return outcome

    @on_loop
    def _settle(self, outcome: str) -> None:
        """Answer every request waiting for the model with the load's outcome."""
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_result(outcome)

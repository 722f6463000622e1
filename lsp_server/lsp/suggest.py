"""The completion service (`CompletionService`): one entry point from a document's snapshot and the
request's settings to a suggestion, over the parts it owns: the model worker (scheduler.py and the
worker's state, lsp_server/lsp/worker/), the model's loading (loading.py), idle work (idle.py), the
definitions resolved in a process of their own for the prompt (definitions.py) and the counters (stats.py).

On the event loop (lsp_server/lsp/threads.py). Handlers tell it what happened with its verbs
(`opened`, `changed`, `moved`, `closed`, `invalid`, `start`, `settings_changed`) and ask with
`suggest`, `stats` and `check_place`; none reaches into its parts. A request waits for the model if
it loads, runs on the worker (newest request per document wins) with everything it needs as owned
values (the snapshot, the settings of the moment, a cancel event), drops a stale result, and is
counted. What the worker produces (counts, a suggestion's trace, its part of `ditto/stats`) comes
back through the loop (`Client.post`), and only the loop writes it down.
Left out on purpose: LSP types and positions (handlers.py, documents.py), prompts and decoding
(lsp_server/completion/, lsp_server/decoding/), what the worker keeps (worker/state.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from lsprotocol import types

from lsp_server.completion.context import ContextBudget
from lsp_server.lsp.definitions import DefinitionJobs
from lsp_server.lsp.documents import DocumentSession
from lsp_server.lsp.errors import Client
from lsp_server.lsp.idle import IdleWork
from lsp_server.lsp.loading import ModelLoader
from lsp_server.lsp.protocol import edit_end
from lsp_server.lsp.scheduler import Scheduler, Superseded
from lsp_server.lsp.shown import ShownLog
from lsp_server.lsp.stats import Counters, report
from lsp_server.lsp.threads import Latest, on_loop
from lsp_server.lsp.worker.debug import DebugHooks
from lsp_server.lsp.worker.idle import run_idle
from lsp_server.lsp.worker.messages import Snapshot
from lsp_server.lsp.worker.state import NO_MODEL_REPORT, Sinks, Worker
from lsp_server.settings import Settings


class CompletionService:
    def __init__(self, documents: DocumentSession, client: Client, settings: Callable[[], Settings]):
        self.documents = documents
        self.client = client
        self._settings = settings  # the server's live settings (a published immutable value)
        self.counters = Counters()
        self.shown = ShownLog()  # what the user does with what is shown (`workspace` gives it its file)
        self._published = Latest(NO_MODEL_REPORT)  # the worker's part of ditto/stats, as it last published it
        # The engine's debug hooks exist only in a server started with `serve --debug-hooks` (worker/debug.py).
        hooks = DebugHooks(settings, client.notify_threadsafe) if settings().debug_hooks else None
        sinks = Sinks(count=self.counters.add, trace=documents.keep_trace, published=self._published.set,
                      wake_idle=lambda: self.idle.again(0.0))
        self._worker = worker = Worker(client.post, sinks, settings, hooks)
        documents.connect(worker.inbox.put)  # the loop's messages to the worker
        self.definitions = DefinitionJobs(documents, worker.inbox.put, settings)  # resolved off the request path
        self.scheduler = Scheduler(after_job=worker.publish)
        self.loader = ModelLoader(self.scheduler, worker, client, settings)
        post, scheduler = client.post, self.scheduler
        self.idle = IdleWork(self.scheduler, documents,
                             lambda plan, cancel, loop_side: run_idle(worker, plan, cancel, post, loop_side,
                                                                      lambda: scheduler.idle_queued),
                             lambda: self.loader.ready, settings, self.show_bias)

    @property
    def settings(self) -> Settings:
        return self._settings()

    @property
    def model_ready(self) -> bool:
        return self.loader.ready

    def window_budget(self) -> ContextBudget:
        """The prompt budget a snapshot window must hold (documents.py): the settings' own, else the
        loaded model's fitted one as the worker last published it (the largest step, 2048, before a
        model is loaded: a window too wide costs a little text, not prompt tokens)."""
        s = self.settings
        tokens = s.context_tokens or self._published.get().get("fit_tokens") or 2048
        return ContextBudget.scaled(tokens, s.snippets)

    # -- what happened (the handlers' verbs) --------------------------------------------------------
    @on_loop
    def start(self) -> None:
        """The client initialized: load the model of the settings."""
        self.loader.request_load()

    @on_loop
    def settings_changed(self, old: Settings, new: Settings) -> None:
        self.loader.settings_changed(old, new)
        self.definitions.settings_changed(old, new)

    @on_loop
    def workspace(self, root: str | None) -> None:
        """The client's workspace (initialize): what its user kept before is read from the cache."""
        from lsp_server.backends.packaged import cache_dir

        self.shown = ShownLog.for_workspace(root, cache_dir())
        self.definitions.set_root(root)

    def show_bias(self) -> float:
        """How far the `show` limit moves for this workspace's user (shown.py)."""
        s = self.settings
        return self.shown.bias(s.show, s.learn_show)

    @on_loop
    def opened(self, uri: str, text: str, version: int | None) -> None:
        self.documents.changed(uri, text, version)
        self.idle.buffers_changed()
        self.idle.aim(uri, types.Position(line=0, character=0))  # LSP does not say where the cursor is

    @on_loop
    def changed(self, uri: str, changes) -> None:
        """An open document changed by a didChange's `changes` (already applied)."""
        doc = self.documents.document(uri)
        if doc is None:
            return
        units = self.documents.position_units()
        self.shown.changed(uri, changes, units)  # accepted or typed over
        self.documents.changed(doc.uri, doc.source, doc.version)
        self.idle.buffers_changed()
        end = edit_end(changes, units)  # where the edit left the cursor (None: not known)
        if end is not None:
            self.idle.aim(uri, end)
            self.definitions.wanted(uri, end.line)

    @on_loop
    def moved(self, uri: str, position: types.Position) -> None:
        """The cursor moved (Ditto's plugins say so): idle work warms the prompt there, and the names used
        around it are resolved once the user pauses."""
        self.idle.aim(uri, position)
        self.definitions.wanted(uri, position.line)

    @on_loop
    def closed(self, uri: str) -> None:
        self.documents.changed(uri, None)  # its record (trace, edits) goes, and the worker's state of it
        self.shown.closed(uri)
        self.loader.forget(uri)
        self.idle.closed(uri)
        self.definitions.closed(uri)
        self.idle.buffers_changed()

    @on_loop
    def invalid(self) -> None:
        """A request for a document that is not open, or a position outside it."""
        self.counters.invalid += 1

    # -- a request -------------------------------------------------------------------------------
    async def suggest(self, snap: Snapshot, settings: Settings | None = None) -> str | None:
        """The ghost text for `snap` with `settings` (default: the live ones), or None (not ready,
        superseded, stale, empty)."""
        c = self.counters
        c.requests += 1
        self.definitions.wanted(snap.uri, snap.position[0])  # (editors that do not say where the cursor moves)
        loader = self.loader
        seq = loader.arrived(snap.uri)
        settings = settings or self.settings
        if loader.state in ("not loaded", "loading") and settings.load_wait_s > 0:
            try:
                outcome = await loader.wait(snap.uri, seq)
            except asyncio.CancelledError:
                c.cancelled += 1
                raise
            if outcome == "superseded":
                c.superseded += 1
                return None
            if outcome != "ready":
                c.not_ready += 1
                return None
            if not self._current(snap):
                c.dropped_stale += 1  # the document changed while the model loaded
                return None
        if not loader.ready:
            c.not_ready += 1
            return None
        t0 = time.perf_counter()
        self.idle.request_made()  # older aims are where the user was (idle.py)
        worker, bias = self._worker, self.show_bias()
        try:
            sug = await self.scheduler.run(snap.uri, lambda cancel: worker.complete(snap, settings, cancel, t0, bias))
        except asyncio.CancelledError:
            c.cancelled += 1
            raise
        except Superseded:
            c.superseded += 1
            return None
        except Exception:
            c.errors += 1
            raise
        if sug is None:
            c.not_ready += 1
            return None
        if not self._current(snap):
            c.dropped_stale += 1
            return None
        if sug.completion.stats.stop_reason == "cancelled":  # superseded while running
            c.superseded += 1
            return None
        if sug.completion.stats.stop_reason == "error":  # a remote engine failed: shown once per outage
            c.errors += 1
            if sug.notice:  # logged by the generator (lsp_server/backends/remote/generator.py)
                self.client.fail(sug.notice, show=True, logged=True)
            return None
        c.completed += 1
        c.typethrough += int(sug.typethrough)
        c.paused += int(sug.continuing and not sug.typethrough and not sug.resumed)
        c.served_by_continuation += int(sug.from_continuation)
        c.resumed += int(sug.resumed)
        c.served_ahead += int(sug.ahead)
        if sug.continuing:
            self.idle.continue_later(snap.uri)
        c.latencies_ms.append((time.perf_counter() - t0) * 1000)
        s = sug.completion.stats
        c.drafted += s.drafted
        c.accepted += s.accepted
        c.generated += s.generated
        c.target_passes += s.target_passes
        if not sug.text:
            c.empty += 1
            return None
        if not sug.typethrough and not sug.resumed:  # a suggestion of its own: its outcome is the user's to tell
            self.shown.shown(snap.uri, snap.position, sug.text, settings.show)
        return sug.text

    def _current(self, snap: Snapshot) -> bool:
        """Whether the document is still open at the snapshot's version."""
        doc = self.documents.document(snap.uri)
        return doc is not None and doc.version == snap.version

    # -- the debug hook `ditto/debug/checkPlace` ------------------------------------------------
    async def check_place(self, uri: str) -> dict | None:
        if self.loader.completer is None:
            return None
        worker = self._worker
        return await self.scheduler.run(None, lambda cancel: worker.check_place(uri))

    async def debug_view(self) -> dict:
        """`ditto/debug/worker`: the worker's view of the documents (a job: after what is queued) and
        the idle plan as the loop holds it."""
        worker, settings = self._worker, self.settings
        documents = await self.scheduler.run(None, lambda cancel: worker.debug_view(settings))
        return {"documents": documents, "idle": self.idle.debug_view()}

    async def propose_edit(self, uri: str, name: str, args: tuple, started: Callable[[object], None]):
        """A model next edit on the worker (lsp_server/lsp/worker/proposers.py); `started(job)` gets the
        job, whose cancel event the caller sets when the document changes."""
        worker = self._worker
        job = self.scheduler.submit(f"nextedit:{uri}", lambda cancel: worker.propose_edit(name, args, cancel))
        started(job)
        return await self.scheduler.wait(job)

    def stats(self, *, open_documents: int, protocol_futures: int, intervals: bool = False) -> dict:
        """`ditto/stats`: the loop's counts and the worker's last published report; a remote engine's
        counts live, while a request streams (its generator reads them behind its own lock)."""
        worker = self._published.get()
        completer = self.loader.completer
        if completer is not None and completer.generator.live_stats:
            worker = {**worker, "remote": completer.generator.stats(intervals)}
        out = report(self, worker, open_documents=open_documents, protocol_futures=protocol_futures)
        s = self.settings
        return {**out, "shown": self.shown.report(s.show, s.learn_show)}

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker (it sets the running generation's stop flag; that ends within one pass)."""
        self.shown.save()
        self.definitions.close()
        self.scheduler.close()
        if timeout is not None:
            self.scheduler.join(timeout)

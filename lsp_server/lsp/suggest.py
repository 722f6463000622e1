"""The completion service (`CompletionService`): one entry point from a document's snapshot and the
request's settings to a suggestion, over the parts it owns: the model worker (scheduler.py), the
model's loading (loading.py), idle work (idle.py) and the counters (stats.py).

A request waits for the model if it loads, runs the Completer on the worker (newest request per
document wins) with everything it needs as arguments (the snapshot, the settings of the moment,
the document's per-file state, a `RequestContext` for the engine's hooks), drops a stale result,
and is counted. Its trace (for `ditto/trace`) is built on the worker and handed to the event loop,
where the document session keeps it only while the document is open.
Left out on purpose: LSP types and positions (handlers.py, documents.py), prompts and decoding
(lsp_server/completion/, lsp_server/decoding/).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

from lsp_server.completion.context import ContextBudget
from lsp_server.completion.rounds import trace_data
from lsp_server.decoding.types import RequestContext
from lsp_server.lsp.debug import DebugHooks
from lsp_server.lsp.documents import DocumentSession, Snapshot, buffer_name, model_text
from lsp_server.lsp.errors import Client
from lsp_server.lsp.idle import IdleWork
from lsp_server.lsp.loading import ModelLoader
from lsp_server.lsp.scheduler import Scheduler, Superseded
from lsp_server.lsp.stats import Counters, report
from lsp_server.settings import Settings


class CompletionService:
    def __init__(self, documents: DocumentSession, client: Client, settings: Callable[[], Settings]):
        self.documents = documents
        self.client = client
        self._settings = settings  # the server's live settings (workspace/didChangeConfiguration replaces them)
        self.scheduler = Scheduler()
        self.counters = Counters()
        # The engine's debug hooks exist only in a server started with `serve --debug-hooks` (debug.py).
        hooks = DebugHooks(settings, client.notify_threadsafe) if settings().debug_hooks else None
        self.loader = ModelLoader(self.scheduler, documents, client, settings, hooks)
        self.idle = IdleWork(self.scheduler, documents, self.loader, self.counters, settings)

    @property
    def settings(self) -> Settings:
        return self._settings()

    @property
    def completer(self):
        """The loaded model's Completer, or None."""
        return self.loader.completer

    def window_budget(self) -> ContextBudget:
        """The prompt budget a snapshot window must hold (documents.py): the settings' own, else the
        loaded model's fitted one (the largest step, 2048, before a model is loaded: a window too wide
        costs a little text, not prompt tokens)."""
        s, completer = self.settings, self.loader.completer
        tokens = s.context_tokens or (completer.fit.tokens if completer is not None else 2048)
        return ContextBudget.scaled(tokens, s.snippets)

    # -- the documents' life (event loop) ------------------------------------------------------
    def closed(self, uri: str) -> None:
        self.loader.forget(uri)
        self.idle.forget(uri)

    # -- a request -------------------------------------------------------------------------------
    async def suggest(self, snap: Snapshot, settings: Settings | None = None) -> str | None:
        """The ghost text for `snap` with `settings` (default: the live ones), or None (not ready,
        superseded, stale, empty)."""
        c = self.counters
        c.requests += 1
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
        options, completer_settings = settings.decode_options(), settings.completer_settings()
        file = self.documents.file(snap.uri)
        loop = asyncio.get_running_loop()

        def job(cancel: threading.Event):
            started = time.perf_counter()
            completer = loader.completer
            if completer is None:
                return None
            self.idle.sync(completer)
            warmed = self.idle.took_warm(snap.uri)
            stale_before = completer.generator.stale_passes
            try:
                sug = completer.complete(model_text(snap.text), snap.line, snap.col, name=buffer_name(snap.uri),
                                         options=options, cancel=cancel, cache_key=snap.uri,
                                         settings=completer_settings, file=file,
                                         ctx=RequestContext(snap.uri, False, cancel))
            finally:
                c.stale(completer.generator.stale_passes - stale_before)
            st = sug.completion.stats
            if warmed and not sug.typethrough and st.reused_tokens >= 0.9 * len(sug.prompt.ids):
                c.idle_hits += 1
            if sug.typethrough:
                return sug  # the trace of the completion on screen stays the one to show
            c.whole_file += int(sug.prompt.whole)
            trace = self._trace(snap, sug, completer)
            # Where a request's time went besides the Completer (docs/perf/README.md): waiting for the
            # worker (idle work finishing its pass, an older request) and the rest of the job.
            trace["waited_ms"] = round((started - t0) * 1000, 1)
            trace["job_ms"] = round((time.perf_counter() - started) * 1000, 1)
            # Kept on the event loop (before this job's answer reaches it, cancelled or superseded too),
            # and only while the document is open: the worker never writes what didClose removes.
            loop.call_soon_threadsafe(self.documents.keep_trace, snap.uri, trace)
            return sug

        try:
            sug = await self.scheduler.run(snap.uri, job)
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
        return sug.text

    def _current(self, snap: Snapshot) -> bool:
        """Whether the document is still open at the snapshot's version."""
        doc = self.documents.document(snap.uri)
        return doc is not None and doc.version == snap.version

    @staticmethod
    def _trace(snap: Snapshot, sug, completer) -> dict:
        """`ditto/trace`'s answer for a suggestion: the same data `ditto-lsp trace --json` prints
        (lsp_server/commands/trace.py, rounds.py `trace_data`), and its legacy `rounds` read from it."""
        lm = completer.lm
        s = sug.completion.stats
        data = trace_data(sug.completion, lm.token_text, text=sug.text, model=lm.spec, drafter=sug.drafter)
        return {
            "uri": snap.uri,
            "version": snap.version,
            "position": {"line": snap.position.line, "character": snap.position.character},
            "text": sug.text,
            "raw": sug.raw,
            "drafter": sug.drafter,
            "stop_reason": s.stop_reason,
            "stats": s.as_dict(),
            "latency_ms": round(sug.latency_ms, 1),
            "ahead": sug.ahead,  # generated while idle before the request (its stats are that generation's)
            "prompt_tokens": len(sug.prompt.ids),  # what the model saw (its stats say what it processed)
            "whole_file": sug.prompt.whole,  # the whole file above the place (lsp_server/completion/wholefile.py)
            "rounds": legacy_rounds(data["rounds"], lm.decode),
            "trace": data,
        }

    # -- the debug hook `ditto/debug/checkPlace` ------------------------------------------------
    async def check_place(self, uri: str) -> dict | None:
        completer = self.loader.completer
        if completer is None or not completer.generator.resumable:
            return None
        file = self.documents.file(uri)
        return await self.scheduler.run(None, lambda cancel: completer.check_place(uri, file))

    def stats(self, *, open_documents: int, protocol_futures: int, intervals: bool = False) -> dict:
        return report(self, open_documents=open_documents, protocol_futures=protocol_futures, intervals=intervals)

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker (it sets the running generation's stop flag; that ends within one pass)."""
        self.scheduler.close()
        if timeout is not None:
            self.scheduler.join(timeout)


def legacy_rounds(rounds: list[dict], decode: Callable[[list[int]], str]) -> list[dict]:
    """The trace's older per-round form (clients read `rounds`), read from `trace_data`'s rounds."""
    return [{
        "proposed": [p["text"] for p in r["proposed"]],
        "proposed_text": decode([p["id"] for p in r["proposed"]]) if r["proposed"] else "",
        "accepted": r["accepted"],
        "appended": r["token"]["text"],
        "kind": r["kind"],
        "source": r["source"],
        "match_len": r["match_len"],
        "ms": r["ms"],
    } for r in rounds]

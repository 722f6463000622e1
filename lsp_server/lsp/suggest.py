"""One completion request in the server: wait for the model if it loads, run the Completer on
the worker (newest request per document wins), drop a stale result, count it, and keep its
trace for `ditto/trace` (a mixin of DittoServer, lsp_server/lsp/server.py).
"""

from __future__ import annotations

import asyncio
import threading
import time

from lsp_server.completion.rounds import trace_data
from lsp_server.lsp.documents import Snapshot, buffer_name, model_text
from lsp_server.lsp.scheduler import Superseded


class SuggestMixin:
    # -- completion ------------------------------------------------------------------------------
    async def suggest(self, snap: Snapshot) -> str | None:
        """The ghost text for `snap`, or None (not ready, superseded, stale, empty)."""
        c = self.counters
        c.requests += 1
        seq = self._request_seq[snap.uri] = self._request_seq.get(snap.uri, 0) + 1
        older = self._waiting.get(snap.uri)
        if older is not None and not older.done():
            older.set_result("superseded")  # even when this one need not wait
        if self.model_state in ("not loaded", "loading") and self.settings.load_wait_s > 0:
            try:
                outcome = await self._wait_for_model(snap.uri, seq)
            except asyncio.CancelledError:
                c.cancelled += 1
                raise
            if outcome == "superseded":
                c.superseded += 1
                return None
            if outcome != "ready":
                c.not_ready += 1
                return None
            doc = self.document(snap.uri)
            if doc is None or doc.version != snap.version:
                c.dropped_stale += 1  # the document changed while the model loaded
                return None
        if self.model_state != "ready" or self.completer is None:
            c.not_ready += 1
            return None
        t0 = time.perf_counter()
        self.request_made()  # older aims are where the user was (lsp_server/lsp/idle.py)
        settings = self.settings
        options = settings.decode_options()

        def job(cancel: threading.Event):
            started = time.perf_counter()
            completer = self.completer
            if completer is None:
                return None
            self._apply_dirty(completer)
            completer.settings = settings.completer_settings()  # on the worker: the request's settings
            self._step_cancel, self._step_uri = cancel, snap.uri
            warmed = self._warmed.pop(snap.uri, False)
            try:
                sug = completer.complete(model_text(snap.text), snap.line, snap.col, name=buffer_name(snap.uri), options=options,
                                         cancel=cancel, cache_key=snap.uri)
            finally:
                self._step_cancel = self._step_uri = None
            st = sug.completion.stats
            if warmed and not sug.typethrough and st.reused_tokens >= 0.9 * len(sug.prompt.ids):
                self.counters.idle_hits += 1
            self._record(snap, sug, completer)
            # Where a request's time went besides the Completer (docs/perf/README.md): waiting for the
            # worker (idle work finishing its pass, an older request) and the rest of the job.
            if not sug.typethrough:
                self.traces[snap.uri]["waited_ms"] = round((started - t0) * 1000, 1)
                self.traces[snap.uri]["job_ms"] = round((time.perf_counter() - started) * 1000, 1)
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
        doc = self.document(snap.uri)
        if doc is None or doc.version != snap.version:
            c.dropped_stale += 1
            return None
        if sug.completion.stats.stop_reason == "cancelled":  # superseded while running
            c.superseded += 1
            return None
        if sug.completion.stats.stop_reason == "error":  # a remote engine failed: shown once per outage
            c.errors += 1
            if sug.notice:  # logged by the generator (lsp_server/backends/remote/generator.py)
                self.fail(sug.notice, show=True, logged=True)
            return None
        c.completed += 1
        c.typethrough += int(sug.typethrough)
        c.paused += int(sug.continuing and not sug.typethrough and not sug.resumed)
        c.served_by_continuation += int(sug.from_continuation)
        c.resumed += int(sug.resumed)
        c.served_ahead += int(sug.ahead)
        if sug.continuing:
            self.continue_later(snap.uri)
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

    def _record(self, snap: Snapshot, sug, completer) -> None:
        if sug.typethrough:
            return  # the trace of the completion on screen stays the one to show
        lm = completer.lm
        s = sug.completion.stats
        self.traces[snap.uri] = {
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
            "rounds": [{
                "proposed": [lm.token_text(t) for t in r.proposed],
                "proposed_text": lm.decode(r.proposed) if r.proposed else "",
                "accepted": r.accepted,
                "appended": lm.token_text(r.token),
                "kind": r.kind,
                "source": r.source,
                "match_len": r.match_len,
                "ms": r.ms,
            } for r in sug.completion.rounds],
            # The same data `ditto-lsp trace --json` prints (lsp_server/commands/trace.py), for tools that read both.
            "trace": trace_data(sug.completion, lm.token_text, text=sug.text, model=lm.spec, drafter=sug.drafter),
        }


"""Definitions resolved off the request path (`DefinitionJobs`): the loop's side of the prompt's
definitions (docs/design.md, "Definitions and recent edits in the prompt").

jedi (lsp_server/completion/definitions.py `resolve`) is pure Python and can take seconds on a large
project. In the server's process it would hold the GIL that the event loop and the model worker need,
so it runs in a process of its own: a `ProcessPoolExecutor` of one `spawn`ed process at lower priority,
started on the first job. A request never waits for it:

- the handlers' verbs say where the user is (`wanted`: an edit's end, a cursor move, a request), and
  a job starts after DEBOUNCE_S of quiet, for the newest place only; one job runs at a time, and a
  place asked meanwhile runs next;
- with nothing asked, the places ahead (`_ahead_place`): lines every AHEAD_STEP of the document the
  user was last at, nearest first, at most AHEAD_MAX a document, so that a place the user jumps to
  finds definitions resolved near it before its first request (the prompt's sections are chosen when
  a place is new and kept while it stays: completion/extras.py); a place asked always goes first;
- results are cached by (document, version, line); what a job finds goes into the model worker's
  inbox as an immutable `Definitions` message (lsp_server/lsp/worker/messages.py), and the worker
  offers the latest near the cursor to the prompt at its next new place (worker/state.py `extras`);
  until then the prompt simply has none;
- a job that runs past `timeout_s` is abandoned and counted, and its process killed; the process's
  start is not a job's time (beside two busy cores a nice-19 start took longer than 15 s, and every
  job killed it and started it again, so none ever finished): it has `start_timeout_s` of its own;
  a pool that broke (its process died) is replaced at the next job; a job whose resolver met an
  error counts as failed (it answers nothing, never raises).

On the event loop only (lsp_server/lsp/threads.py): the timer, the job's task and the counts are the
loop's; the pool's own threads only hand the result back to it (`asyncio.wrap_future`).
Left out on purpose: what is resolved and how it is written (completion/definitions.py), the prompt's
budget (completion/extras.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import signal
from collections import OrderedDict, deque
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

from pygls.uris import to_fs_path

from lsp_server.completion.definitions import Request, Resolved, cap_text, process_id, resolve, start_process
from lsp_server.lsp.documents import DocumentSession, buffer_name
from lsp_server.lsp.threads import on_loop
from lsp_server.lsp.worker.messages import Definitions
from lsp_server.numbers import percentile

log = logging.getLogger(__name__)


class DefinitionJobs:
    DEBOUNCE_S = 0.3  # quiet after the last edit, move or request before a job starts
    TIMEOUT_S = 15.0  # a job running longer is abandoned (its process's start not counted)
    START_TIMEOUT_S = 300.0  # a process's start taking longer is abandoned (a nice-19 start beside busy cores is slow)
    CACHE = 64  # results kept, by (document, version, line)
    AHEAD_STEP = 32  # lines between the places resolved ahead (a place is offered what was resolved <= 64 lines off)
    AHEAD_MAX = 48  # places resolved ahead a document, at most (~1,500 lines around where the user is;
    # the places the user asked for are not counted)

    def __init__(self, documents: DocumentSession, to_worker: Callable[[object], None],
                 settings: Callable[[], object]):
        self._documents = documents
        self._to_worker = to_worker
        self._settings = settings
        self.root: str | None = None  # the workspace's folder (initialize), None without one
        self.timeout_s = self.TIMEOUT_S
        self.start_timeout_s = self.START_TIMEOUT_S
        self.initializer: Callable[[], None] = start_process  # the process's start (tests slow it down)
        self._pool: ProcessPoolExecutor | None = None
        self._pid: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._wanted: tuple[str, int] | None = None  # (uri, document line): the newest place asked for
        self._next: tuple[str, int] | None = None  # a place due while a job ran
        self._task: asyncio.Task | None = None
        self._cache: OrderedDict[tuple, Resolved] = OrderedDict()
        self._last: tuple[str, int] | None = None  # the place last asked for: the places ahead are around it
        self._resolved: dict[str, set[int]] = {}  # per document, the lines resolved (asked or ahead)
        self._ahead_done: dict[str, int] = {}  # per document, the places resolved ahead (AHEAD_MAX)
        self.ahead = 0  # jobs for places ahead
        self.jobs = self.abandoned = self.failed = self.cache_hits = self.pools = self.delivered = self.found = 0
        self._times_ms: deque = deque(maxlen=1000)
        self._total_ms = 0.0

    def set_root(self, root: str | None) -> None:
        """The workspace's root from `initialize` (a URI or a path), as a folder path."""
        if root and root.startswith("file:"):
            root = to_fs_path(root)
        self.root = root or None

    # -- what happened --------------------------------------------------------------------------
    @on_loop
    def wanted(self, uri: str, line: int) -> None:
        """The user is at `line` of `uri`: resolve there once they pause (DEBOUNCE_S)."""
        if not self._settings().definitions:
            return
        self._wanted = self._last = (uri, line)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.DEBOUNCE_S, self._due)

    @on_loop
    def closed(self, uri: str) -> None:
        self._resolved.pop(uri, None)
        self._ahead_done.pop(uri, None)
        if self._last is not None and self._last[0] == uri:
            self._last = None
        if self._wanted is not None and self._wanted[0] == uri:
            self._wanted = None
        if self._next is not None and self._next[0] == uri:
            self._next = None

    @on_loop
    def settings_changed(self, old, new) -> None:
        """Turned off: the process goes (it holds its memory otherwise)."""
        if old.definitions and not new.definitions:
            self._wanted = self._next = self._last = None
            self._stop_pool()

    # -- jobs ------------------------------------------------------------------------------------
    @on_loop
    def _due(self) -> None:
        self._timer = None
        self._next, self._wanted = self._wanted or self._next, None
        self._pump()

    def _pump(self) -> None:
        if self._task is not None:
            return
        ahead = self._next is None
        if ahead:
            if self._wanted is not None or self._timer is not None:  # (a place asked is due soon: it goes first)
                return
            self._next = self._ahead_place()
            if self._next is None:
                return
            self.ahead += 1
        (uri, line), self._next = self._next, None
        doc = self._documents.document(uri)
        if doc is None:
            return self._pump()  # (nothing to run: the next place, if any)
        self._resolved.setdefault(uri, set()).add(line)
        if ahead:
            self._ahead_done[uri] = self._ahead_done.get(uri, 0) + 1
        key = (uri, doc.version, line)
        hit = self._cache.get(key)
        if hit is not None:
            self.cache_hits += 1
            self._cache.move_to_end(key)
            self._deliver(key, hit)
            return self._pump()
        lines = self._documents.lines_of(doc.uri, doc.source)
        if line >= len(lines.nl):
            return self._pump()
        text, at = cap_text(doc.source, lines.nl, line)
        s = self._settings()
        request = Request(buffer_name(uri), text, at, self.root, s.debug_resolve_delay_s if s.debug_hooks else 0.0)
        self._task = asyncio.get_running_loop().create_task(self._run(key, request))

    def _ahead_place(self) -> tuple[str, int] | None:
        """The next place to resolve ahead (module docstring): of the lines every AHEAD_STEP in the
        document last asked for, the nearest to where it was asked that is not within half a step of a
        line resolved already (asked or ahead); None when there is none or AHEAD_MAX were resolved ahead."""
        if self._last is None or not self._settings().definitions:
            return None
        uri, line = self._last
        doc = self._documents.document(uri)
        done = self._resolved.setdefault(uri, set())
        if doc is None or self._ahead_done.get(uri, 0) >= self.AHEAD_MAX:
            return None
        count = len(self._documents.lines_of(doc.uri, doc.source).nl)
        half = self.AHEAD_STEP // 2
        for a in sorted(range(0, count, self.AHEAD_STEP), key=lambda a: abs(a - line)):
            if all(abs(a - d) >= half for d in done):
                return uri, a
        return None

    async def _run(self, key: tuple, request: Request) -> None:
        starting = True
        try:
            pool = await self._started()
            starting = False
            result = await asyncio.wait_for(asyncio.wrap_future(pool.submit(resolve, request)), self.timeout_s)
        except asyncio.TimeoutError:
            self.abandoned += 1
            log.info("definitions: %s ran past %.0f s and was abandoned", "the process's start" if starting
                     else "a job", self.start_timeout_s if starting else self.timeout_s)
            self._stop_pool()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the process died (BrokenProcessPool), or could not start
            self.failed += 1
            log.info("definitions: the resolver's process failed (%s); a new one starts with the next job", err)
            self._stop_pool()
        else:
            self.jobs += 1
            self._total_ms += result.ms
            self._times_ms.append(result.ms)
            if result.error is not None:
                self.failed += 1
            if result.items:
                self.found += 1
            log.debug("definitions: %s:%d: %d items of %d names in %.0f ms%s%s", request.path, request.line + 1,
                      result.items, result.names, result.ms, " (partial)" if result.partial else "",
                      f" ({result.error})" if result.error else "")
            if not result.partial:  # (cut short: the place asked again gets a job, on a warmer process)
                self._cache[key] = result
            while len(self._cache) > self.CACHE:
                self._cache.popitem(last=False)
            self._deliver(key, result)
        finally:
            self._task = None
        self._pump()

    async def _started(self) -> ProcessPoolExecutor:
        """The pool, started now if it is not (its process's id read first: a job past its time is killed),
        within `start_timeout_s`."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=self.initializer)
            self.pools += 1
            self._pid = None
            self._pid = await asyncio.wait_for(asyncio.wrap_future(self._pool.submit(process_id)),
                                               self.start_timeout_s)
        return self._pool

    def _deliver(self, key: tuple, result: Resolved) -> None:
        uri, version, line = key
        if self._documents.document(uri) is not None:
            self.delivered += 1
            self._to_worker(Definitions(uri, version, line, result.text))

    def _stop_pool(self, wait: bool = False) -> None:
        """The process goes (killed: a job past its time never ends on its own), and the pool with it;
        `wait`: until the pool's thread has seen it go."""
        pool, pid, self._pool, self._pid = self._pool, self._pid, None, None
        if pid is not None:
            try:
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
            except OSError:
                pass
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)

    def close(self) -> None:
        """The server stops (from any thread, the loop may be gone): the process goes, and the pool's
        semaphores with it (the server leaves by os._exit, which runs no finalizer: multiprocessing's
        resource tracker would clean them up and warn)."""
        if self._timer is not None:
            self._timer.cancel()
        had = self._pool is not None
        self._stop_pool(wait=True)
        if had:
            gc.collect()

    # -- ditto/stats -------------------------------------------------------------------------------
    def report(self) -> dict:
        times = self._times_ms
        return {"enabled": bool(self._settings().definitions), "jobs": self.jobs, "ahead": self.ahead, "found": self.found, "abandoned": self.abandoned,
                "failed": self.failed, "cache_hits": self.cache_hits, "delivered": self.delivered,
                "processes_started": self.pools, "running": self._task is not None,
                "resolve_ms": {"total": round(self._total_ms, 1), "p50": percentile(times, 50, 1),
                               "p95": percentile(times, 95, 1), "count": len(times)}}

"""One model worker thread; the newest request per document wins.

The event loop never runs the model: a handler calls `await scheduler.run(key, fn)`,
which queues `fn(cancel)` for the worker thread and awaits its result. Three things
set a job's `cancel` event, which the engine checks between decode steps and prefill
chunks:
- the awaiting task is cancelled (`$/cancelRequest`): `run` sets it in
  `except asyncio.CancelledError`;
- a newer job arrives for the same key (Neovim never cancels superseded requests): the
  older job is marked superseded and its `run` returns `Superseded`;
- `close()`.
Jobs without a key (model loads) are never superseded. Jobs run one at a time, in order.

Idle work: `idle(fn)` sets the one job to run when nothing else is queued (prefilling the
prompt the user is likely to ask for next). Any `submit` sets the running idle job's
cancel flag, and a newer `idle(fn)` replaces it (cancelling it if it runs), so idle work
never delays a request by more than the engine's check interval (one prefill chunk).
`idle(fn, after_s)` starts it no sooner than `after_s` after it was set (a newer `idle` sets
a new time): an editor sends its request right after the edit that aimed the idle work, and
a chunk begun in between (about half a second on one CPU core) would make the request wait
for work at a place the user just left.
Idle jobs are not counted as pending or busy.

The scheduler is where the two threads meet (lsp_server/lsp/threads.py): the event loop submits
jobs and the worker runs them, and its own state is behind its one lock (`_lock`: the queue's
bookkeeping, the newest job per key, the idle job). `after_job`, when given, runs on the worker
after every job (idle ones and failed ones too): the server publishes the worker's part of
`ditto/stats` there (lsp_server/lsp/worker/state.py `Worker.publish`).

Left out on purpose: LSP types, what a job computes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from lsp_server.lsp.threads import WORKER_THREAD

log = logging.getLogger(__name__)


class Superseded(Exception):
    """A newer request for the same document replaced this one."""


class Closed(Exception):
    """The scheduler was closed before the job ran."""


@dataclass
class Job:
    key: str | None
    fn: Callable[[threading.Event], Any]
    cancel: threading.Event = field(default_factory=threading.Event)
    future: Future = field(default_factory=Future)
    superseded: bool = False
    not_before: float = 0.0  # (idle jobs) time.monotonic() before which it does not start


_IDLE = object()  # queue marker: run the idle job if nothing else waits


class Scheduler:
    def __init__(self, name: str = WORKER_THREAD, after_job: Callable[[], None] | None = None):
        self._after_job = after_job
        self._queue: queue.Queue = queue.Queue()
        self._idle: Job | None = None  # the idle job not yet started
        self._idle_running: Job | None = None
        self.idle_runs = 0  # idle jobs started
        self.idle_cancelled = 0  # idle jobs stopped early by a request or a newer idle job
        self._lock = threading.Lock()
        self._latest: dict[str, Job] = {}  # key -> newest job not yet finished
        self._running: Job | None = None
        self._pending = 0  # queued + running
        self.max_pending = 0  # the most jobs ever queued + running at once
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    # -- state -----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a job is queued or running."""
        with self._lock:
            return self._pending > 0

    @property
    def idle_busy(self) -> bool:
        """True while idle work is queued or running (it is not counted as busy: a request stops it)."""
        with self._lock:
            return self._idle is not None or self._idle_running is not None

    @property
    def idle_queued(self) -> bool:
        """True while an idle job waits to start (asked from inside a running one: a newer one replaced it)."""
        with self._lock:
            return self._idle is not None

    @property
    def idle_running(self) -> bool:
        """True while idle work runs (asked from inside it: it is the job on the worker)."""
        with self._lock:
            return self._idle_running is not None

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    # -- submitting ----------------------------------------------------------------------
    def submit(self, key: str | None, fn: Callable[[threading.Event], Any]) -> Job:
        """Queue fn(cancel) on the worker; a queued or running job with the same key is superseded."""
        job = Job(key, fn)
        with self._lock:
            if self._closed:
                job.future.set_exception(Closed("the model worker has stopped"))
                return job
            if self._idle_running is not None:
                self._idle_running.cancel.set()  # a request waits at most one chunk of idle work
            if key is not None:
                old = self._latest.get(key)
                if old is not None and not old.future.done():
                    old.superseded = True
                    old.cancel.set()
                    if old is not self._running and old.future.set_running_or_notify_cancel():
                        # Still queued: answer it now rather than when the worker gets to it
                        # (behind whatever runs), so a typing burst never waits in line.
                        old.future.set_exception(Superseded())
                self._latest[key] = job
            self._pending += 1
            self.max_pending = max(self.max_pending, self._pending)
        self._queue.put(job)
        return job

    async def run(self, key: str | None, fn: Callable[[threading.Event], Any]) -> Any:
        """Run fn(cancel) on the worker and await its result.

        Raises Superseded when a newer job for `key` replaced this one, and re-raises
        CancelledError (after setting the job's cancel event) when the awaiting task is
        cancelled.
        """
        return await self.wait(self.submit(key, fn))

    async def wait(self, job: Job) -> Any:
        """Await a submitted job's result (as `run`): for a caller that keeps the job (its cancel event)."""
        try:
            result = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.cancel.set()
            raise
        if job.superseded:
            raise Superseded()
        return result

    def idle(self, fn: Callable[[threading.Event], Any], after_s: float = 0.0) -> Job:
        """Run fn(cancel) when the worker has nothing else to do (replacing an earlier idle job),
        and not before `after_s` from now."""
        job = Job(None, fn, not_before=time.monotonic() + after_s)
        with self._lock:
            if self._closed:
                job.future.set_exception(Closed("the model worker has stopped"))
                return job
            if self._idle is not None:
                self._idle.future.cancel()
            if self._idle_running is not None:
                self._idle_running.cancel.set()
            self._idle = job
        self._queue.put(_IDLE)
        return job

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._idle_running is not None:
                self._idle_running.cancel.set()
            for job in self._latest.values():
                job.cancel.set()
            if self._running is not None:
                self._running.cancel.set()
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the worker ----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=self._idle_wait())
            except queue.Empty:
                job = _IDLE  # the idle job's start time came with nothing queued
            if job is None:
                break
            if job is _IDLE:
                self._run_idle()
                continue
            with self._lock:
                self._running = job
            result = exc = None
            try:
                if job.superseded or job.future.done():
                    exc = Superseded()  # never started
                elif self._closed:
                    exc = Closed("the model worker has stopped")
                else:
                    result = job.fn(job.cancel)
            except BaseException as err:  # handed to the awaiting handler
                exc = err
            self._after()
            with self._lock:
                # Free before answering, so that whoever awaits the answer sees the worker idle.
                self._running = None
                self._pending -= 1
                if job.key is not None and self._latest.get(job.key) is job:
                    del self._latest[job.key]
            if not job.future.done() and job.future.set_running_or_notify_cancel():
                if exc is not None:
                    job.future.set_exception(exc)
                else:
                    job.future.set_result(result)
        with self._lock:
            while not self._queue.empty():
                job = self._queue.get_nowait()
                if job is not None and job is not _IDLE and job.future.set_running_or_notify_cancel():
                    job.future.set_exception(Closed("the model worker has stopped"))
            if self._idle is not None:
                self._idle.future.cancel()

    def _idle_wait(self) -> float | None:
        """Seconds the worker may wait for a job before the idle job is due (None: no idle job)."""
        with self._lock:
            return None if self._idle is None else max(0.0, self._idle.not_before - time.monotonic())

    def _run_idle(self) -> None:
        with self._lock:
            job = self._idle
            if job is None or self._closed or not self._queue.empty():
                return  # already run or replaced, or a request waits: it goes first
            if job.not_before > time.monotonic():
                return  # not due yet: the worker waits for it (`_idle_wait`)
            self._idle = None
            if not job.future.set_running_or_notify_cancel():
                return
            self._idle_running = job
            self.idle_runs += 1
        try:
            job.future.set_result(job.fn(job.cancel))
        except BaseException as err:  # idle work failing must not stop the worker
            log.warning("idle job failed: %s", err)
            job.future.set_exception(err)
        finally:
            self._after()
            with self._lock:
                self._idle_running = None
                if job.cancel.is_set():
                    self.idle_cancelled += 1

    def _after(self) -> None:
        if self._after_job is not None:
            try:
                self._after_job()
            except Exception as err:  # reporting must not stop the worker
                log.warning("after-job hook failed: %s", err)

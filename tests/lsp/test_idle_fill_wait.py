"""Idle work fills a file's prefix KV only after the user has made no request for FILL_AFTER_S
(lsp_server/lsp/idle.py, lsp_server/lsp/worker/idle.py): while they type, no request lands in a fill
chunk. The loop side (IdleWork) runs on the test's event loop, the worker side (run_idle) on a plain
thread as the scheduler would run it, and what it posts back is run on the loop. Fakes for the
scheduler, the document session and the model, and a fake clock: nothing here waits."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from lsprotocol import types

from lsp_server.lsp import idle as idle_module
from lsp_server.lsp.idle import IdleWork
from lsp_server.lsp.worker import idle as worker_idle
from lsp_server.lsp.worker.idle import run_idle
from lsp_server.lsp.worker.messages import Snapshot
from lsp_server.settings import Settings

URI = "file:///tmp/fill.py"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeScheduler:
    def __init__(self):
        self.handed: list[tuple[object, float]] = []  # (job, after_s)

    def idle(self, fn, after_s: float = 0.0):
        self.handed.append((fn, after_s))


class FakeDocuments:
    snap = Snapshot(URI, 1, "x = 1\ny = 2\n", 1, 0, (1, 0), "/project/fill.py")

    def snapshot(self, uri, position):
        return self.snap


class FakeCompleter:
    def __init__(self):
        self.generator = SimpleNamespace(resumable=True)
        self.buffers = SimpleNamespace(step=lambda: False, pending=lambda: False)
        self.fills = 0

    def fill(self, text, line, **kw):
        self.fills += 1
        return None  # (filled already: nothing counted)

    def pending(self, uri, file):
        return False

    def warm(self, *a, **kw):
        return SimpleNamespace(stop_reason="done", prefill_tokens=0)

    def ahead(self, *a, **kw):
        return False


class FakeWorker:
    def __init__(self, completer):
        self.completer = completer
        self.warmed: set[str] = set()

    def sync(self, settings, in_idle=False):
        return False

    def is_current(self, snap):
        return True

    def file(self, snap):
        return object()

    def file_of(self, uri):
        return None

    def count(self, **kw):
        pass


def make(monkeypatch, whole_file=True):
    clock = Clock()
    monkeypatch.setattr(idle_module.time, "monotonic", clock)
    monkeypatch.setattr(worker_idle.time, "monotonic", clock)
    completer = FakeCompleter()
    worker = FakeWorker(completer)
    scheduler = FakeScheduler()
    posted: list = []
    work = IdleWork(scheduler, FakeDocuments(),
                    lambda plan, cancel, loop_side: run_idle(worker, plan, cancel,
                                                             lambda fn, *a: posted.append((fn, a)), loop_side,
                                                             lambda: False),  # (the fake never replaces a job)
                    lambda: True, lambda: Settings(whole_file=whole_file, idle_prefill=True))
    return work, scheduler, completer, clock, posted


async def run_last_idle_job(scheduler: FakeScheduler, posted: list) -> None:
    """Run the newest idle job on a thread (the worker), then what it posted, on the loop."""
    job, _ = scheduler.handed[-1]
    scheduler.handed.clear()
    await asyncio.to_thread(job, threading.Event())
    for fn, args in posted:
        fn(*args)
    posted.clear()


async def test_the_fill_waits_until_no_request_came_for_fill_after_s(monkeypatch):
    work, scheduler, completer, clock, posted = make(monkeypatch)
    work.aim(URI, types.Position(line=1, character=0))
    work.request_made()  # at 100.0
    clock.now += 0.4
    await run_last_idle_job(scheduler, posted)
    assert completer.fills == 0  # 0.4 s after a request: the user may be typing
    # the worker asked the loop to run it again once the user has paused long enough
    assert scheduler.handed and abs(scheduler.handed[-1][1] - (IdleWork.FILL_AFTER_S - 0.4)) < 1e-9
    clock.now += IdleWork.FILL_AFTER_S
    await run_last_idle_job(scheduler, posted)
    assert completer.fills == 1  # paused long enough: filled


async def test_with_whole_file_off_nothing_is_filled_nor_rescheduled(monkeypatch):
    work, scheduler, completer, clock, posted = make(monkeypatch, whole_file=False)
    work.aim(URI, types.Position(line=1, character=0))
    work.request_made()  # (the aim is then where the user was: nothing to warm)
    clock.now += 10
    work.schedule()
    await run_last_idle_job(scheduler, posted)
    assert completer.fills == 0 and scheduler.handed == []


class BlockingCompleter(FakeCompleter):
    """Its idle prefill runs until the test lets it go (`go`), as a model pass in progress would."""

    def __init__(self):
        super().__init__()
        self.started, self.go = threading.Event(), threading.Event()

    def warm(self, *a, **kw):
        self.started.set()
        assert self.go.wait(30)
        return SimpleNamespace(stop_reason="cancelled", prefill_tokens=0)


class LoopSide:
    """What run_idle posts to: the loop's IdleWork, recording the names of the calls."""

    def __init__(self):
        self.calls: list[str] = []

    def __getattr__(self, name):
        return lambda *a: self.calls.append(name)


def test_idle_work_stopped_by_a_newer_plan_asks_nothing_and_stopped_by_a_request_asks_again():
    """A newer plan replaces running idle work: the scheduler holds the newer job, so run_idle must not
    ask the loop to schedule again (that would restart the newer job's settle time: each cursor notice
    would delay the idle work by up to one model pass). A request stopping it: it asks, so the plan's
    rest runs after the request. A real scheduler and worker thread; the prefill blocks until let go."""
    from lsp_server.lsp.scheduler import Scheduler
    from lsp_server.lsp.worker.messages import IdlePlan

    plan = IdlePlan(FakeDocuments.snap, None, None, float("inf"), Settings(idle_prefill=True, whole_file=False), 0.0)
    for stopper in ("newer plan", "request"):
        completer = BlockingCompleter()
        worker, side, posted = FakeWorker(completer), LoopSide(), []
        worker.extras = lambda snap: None  # (the prompt's extra sections: none here)
        scheduler = Scheduler()
        try:
            scheduler.idle(lambda cancel: run_idle(worker, plan, cancel, lambda fn, *a: posted.append(fn), side,
                                                   lambda: scheduler.idle_queued))
            assert completer.started.wait(30)
            if stopper == "newer plan":
                scheduler.idle(lambda cancel: None, after_s=3600)  # queued, not due while the test runs
            else:
                scheduler.submit("request", lambda cancel: None)
            completer.go.set()
            scheduler.submit("after", lambda cancel: None).future.result(30)  # the idle job has ended
        finally:
            scheduler.close()
            scheduler.join(30)
        for fn in posted:
            fn()
        assert side.calls.count("again") == (0 if stopper == "newer plan" else 1), (stopper, side.calls)

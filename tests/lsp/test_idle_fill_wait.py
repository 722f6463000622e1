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
                                                             lambda fn, *a: posted.append((fn, a)), loop_side),
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

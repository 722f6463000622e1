"""IdleWork fills a file's prefix KV only after the user has made no request for FILL_AFTER_S
(lsp_server/lsp/idle.py): while they type, no request lands in a fill chunk. Fakes for the
scheduler, the document session and the model, and a fake clock: nothing here waits."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from lsprotocol import types

from lsp_server.lsp import idle as idle_module
from lsp_server.lsp.documents import Snapshot
from lsp_server.lsp.idle import IdleWork
from lsp_server.lsp.stats import Counters
from lsp_server.settings import Settings

URI = "file:///tmp/fill.py"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeScheduler:
    idle_running = False

    def __init__(self):
        self.idle_calls: list[float] = []

    def idle(self, fn, after_s: float = 0.0):
        self.idle_calls.append(after_s)


class FakeDocuments:
    def __init__(self):
        self.snap = Snapshot(URI, 1, "x = 1\ny = 2\n", 1, 0, types.Position(line=1, character=0))

    def snapshot(self, uri, position):
        return self.snap

    def sync(self, completer, memory, settings):
        return False

    def file(self, uri):
        return object()

    def document(self, uri):
        return SimpleNamespace(version=self.snap.version)


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


def make(monkeypatch, whole_file=True):
    clock = Clock()
    monkeypatch.setattr(idle_module.time, "monotonic", clock)
    completer = FakeCompleter()
    loader = SimpleNamespace(ready=True, completer=completer)
    scheduler = FakeScheduler()
    work = IdleWork(scheduler, FakeDocuments(), loader, Counters(),
                    lambda: Settings(whole_file=whole_file, idle_prefill=True))
    return work, scheduler, completer, clock


def test_the_fill_waits_until_no_request_came_for_fill_after_s(monkeypatch):
    work, scheduler, completer, clock = make(monkeypatch)
    work.aim(URI, types.Position(line=1, character=0))
    work.request_made()  # at 100.0
    clock.now += 0.4
    scheduler.idle_calls.clear()
    _run_idle(work)
    assert completer.fills == 0  # 0.4 s after a request: the user may be typing
    assert scheduler.idle_calls and abs(scheduler.idle_calls[-1] - (IdleWork.FILL_AFTER_S - 0.4)) < 1e-9
    clock.now += IdleWork.FILL_AFTER_S
    _run_idle(work)
    assert completer.fills == 1  # paused long enough: filled


def test_with_whole_file_off_nothing_is_filled_nor_rescheduled(monkeypatch):
    work, scheduler, completer, clock = make(monkeypatch, whole_file=False)
    work.aim(URI, types.Position(line=1, character=0))
    work.request_made()  # (the aim is then where the user was: nothing to warm)
    clock.now += 10
    scheduler.idle_calls.clear()
    _run_idle(work)
    assert completer.fills == 0 and scheduler.idle_calls == []


def _run_idle(work: IdleWork) -> None:
    """Run the idle job the way the scheduler would: the callable `schedule` hands it."""
    handed = []
    real = work.scheduler.idle
    work.scheduler.idle = lambda fn, after_s=0.0: handed.append(fn)
    work.schedule()
    work.scheduler.idle = real
    handed[0](threading.Event())

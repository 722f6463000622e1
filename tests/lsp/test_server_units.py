"""Tier 1 of the server tests: settings and the scheduler, without a model or pygls."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from lsp_server.lsp.scheduler import Scheduler, Superseded
from lsp_server.settings import Settings, SettingsError


def test_settings_accept_camel_case_nested_and_report_unknown_keys():
    unknown: list[str] = []
    s = Settings(debug_hooks=True).merged({"ditto": {"maxTokens": 12, "timeBudgetS": None, "debugStepDelayMs": 5},
                                           "bogus": 1}, unknown)
    assert (s.max_tokens, s.time_budget_s, s.debug_step_delay_ms) == (12, None, 5.0)
    assert unknown == ["bogus"]
    assert s.decode_options().max_new_tokens == 12


def test_debug_settings_are_refused_unless_the_server_has_debug_hooks():
    debug = {"debugStepDelayMs": 5, "debugNotifySteps": True, "debugDocuments": True, "debugFailForward": True}
    unknown: list[str] = []
    refused: list[str] = []
    s = Settings().merged({**debug, "debugHooks": True, "maxTokens": 3}, unknown, refused)
    assert s == Settings(max_tokens=3) and unknown == []
    assert refused == [*debug, "debugHooks"]
    on = Settings(debug_hooks=True).merged(debug)
    assert (on.debug_step_delay_ms, on.debug_notify_steps, on.debug_documents, on.debug_fail_forward) == \
        (5, True, True, True)
    refused.clear()
    assert Settings(debug_hooks=True).merged({"debugHooks": False}, refused=refused).debug_hooks is True  # CLI only
    assert refused == ["debugHooks"]
    with pytest.raises(SettingsError, match="--debug-hooks"):
        Settings(debug_documents=True).validate()  # a debug setting on without the hooks is no valid state


@pytest.mark.parametrize("options", [{"maxTokens": 0}, {"maxTokens": "8"}, {"multiline": 1}, {"topP": 0},
                                     {"drafter": "magic"}, {"model": " "}, [1, 2]])
def test_settings_reject_bad_values_with_the_key_named(options):
    with pytest.raises(SettingsError) as err:
        Settings().merged(options)
    if isinstance(options, dict):
        key = next(iter(options))
        assert key.lower()[:5] in str(err.value).replace("_", "").lower()


def test_model_key_changes_only_with_model_settings():
    s = Settings()
    assert s.merged({"maxTokens": 3}).model_key() == s.model_key()
    assert s.merged({"model": "tiny-random"}).model_key() != s.model_key()


async def test_scheduler_newest_job_per_key_wins_and_stops_the_older():
    sched = Scheduler()
    started = threading.Event()
    seen = []

    def slow(cancel: threading.Event):
        started.set()
        cancel.wait(30)  # stands in for decode steps that check the flag
        seen.append(cancel.is_set())
        return "old"

    old = asyncio.ensure_future(sched.run("doc", slow))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    new = await asyncio.wait_for(sched.run("doc", lambda cancel: "new"), 10)
    assert new == "new"
    with pytest.raises(Superseded):
        await old
    assert seen == [True]
    assert not sched.busy and sched.pending == 0
    sched.close()
    assert sched.join(5)


async def test_scheduler_cancelled_await_sets_the_stop_flag_and_frees_the_worker():
    sched = Scheduler()
    started = threading.Event()
    stopped = threading.Event()

    def slow(cancel: threading.Event):
        started.set()
        if cancel.wait(30):
            stopped.set()

    task = asyncio.ensure_future(sched.run("a", slow))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The worker is free again: the next job (other key) runs and returns.
    assert await asyncio.wait_for(sched.run("b", lambda cancel: 42), 10) == 42
    assert stopped.is_set() and not sched.busy
    sched.close()


async def test_scheduler_passes_exceptions_and_keeps_working():
    sched = Scheduler()

    def boom(cancel):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await sched.run("a", boom)
    assert await sched.run("a", lambda cancel: 1) == 1
    sched.close()


def test_engine_pass_hooks_run_around_every_pass_with_the_work_they_are_for():
    """The engine calls its hooks before and after every model pass with the caller's RequestContext
    (the server's debug hooks read the document, idle or not, and the cancel event from it)."""
    from lsp_server.backends.tiny import tiny_random
    from lsp_server.decoding.engine import Engine
    from lsp_server.decoding.types import DecodeOptions, RequestContext

    calls = []

    class Hooks:
        def before_pass(self, ctx, rows):
            calls.append(("before", ctx, rows))

        def after_pass(self, ctx, rows):
            calls.append(("after", ctx, rows))

    ctx = RequestContext("file:///a.py", False, threading.Event())
    engine = Engine(tiny_random(), hooks=Hooks())
    done = engine.generate(list(range(5, 25)), options=DecodeOptions(max_new_tokens=4, draft_max=0),
                           cache_key="a", ctx=ctx)
    befores = [c for c in calls if c[0] == "before"]
    assert befores[0][2] >= 19 and all(c[2] == 1 for c in befores[1:])  # the prompt's pass, then one token a pass
    assert len(befores) - 1 == done.stats.target_passes + done.stats.tie_passes and done.stats.target_passes >= 1
    assert all(c[1] is ctx for c in calls)
    assert [c[0] for c in calls] == ["before", "after"] * len(befores)


def test_debug_hooks_notify_delay_on_the_cancel_event_and_fail():
    from lsp_server.decoding.types import RequestContext
    from lsp_server.lsp.worker.debug import DEBUG_STEP, DebugHooks

    sent = []
    settings = Settings(debug_hooks=True, debug_notify_steps=True, debug_step_delay_ms=10_000)
    hooks = DebugHooks(lambda: settings, lambda method, params: sent.append((method, params)))
    cancel = threading.Event()
    cancel.set()  # a cancelled request is not kept waiting: the delay returns at once
    hooks.before_pass(RequestContext("file:///a.py", True, cancel), 3)
    assert sent == [(DEBUG_STEP, {"uri": "file:///a.py", "tokens": 3, "idle": True})]
    hooks.after_pass(None, 3)
    settings = Settings(debug_hooks=True, debug_fail_forward=True)
    with pytest.raises(RuntimeError, match="out of memory"):
        hooks.after_pass(None, 1)


async def test_scheduler_answers_a_queued_superseded_job_at_once():
    """A superseded job still waiting in the queue is answered immediately, not behind the running job."""
    sched = Scheduler()
    release = threading.Event()
    started = threading.Event()

    def blocker(cancel):
        started.set()
        release.wait(10)
        return "blocker"

    running = asyncio.ensure_future(sched.run("other", blocker))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
    queued = asyncio.ensure_future(sched.run("doc", lambda cancel: "old"))
    await asyncio.sleep(0)  # let it submit
    newer = asyncio.ensure_future(sched.run("doc", lambda cancel: "new"))
    with pytest.raises(Superseded):
        await asyncio.wait_for(queued, 5)  # while the blocker still holds the worker
    assert not running.done()
    release.set()
    assert await running == "blocker"
    assert await newer == "new"
    sched.close()
    assert sched.join(5)


async def test_scheduler_idle_job_waits_its_settle_time_and_a_request_in_it_never_waits():
    """An idle job set with `after_s` does not start before then: a request made right after the
    event that set it (an editor's request after its edit) finds the worker free, and the idle
    job runs once due. (No timing is asserted but "not before a long time".)"""
    sched = Scheduler()
    started = threading.Event()
    late = sched.idle(lambda cancel: started.set() or "late", after_s=3600)
    assert await sched.run("doc", lambda cancel: "answer") == "answer"
    assert not started.is_set() and not late.future.done() and sched.idle_runs == 0
    soon = sched.idle(lambda cancel: "soon", after_s=0.01)  # replaces the late one
    assert await asyncio.wrap_future(soon.future) == "soon"
    assert late.future.cancelled() and not started.is_set() and sched.idle_runs == 1
    sched.close()
    assert sched.join(10)


async def test_scheduler_idle_job_runs_when_nothing_waits_and_yields_to_a_request():
    """Idle work (prefill while the user pauses) runs only on an idle worker, and a request
    stops it at its next check: the request waits for one step of it, never for all of it."""
    sched = Scheduler()
    started, steps, order = threading.Event(), [], []

    def idle(cancel: threading.Event):
        started.set()
        while not cancel.is_set():  # a step of idle work, then the check
            steps.append(1)
            cancel.wait(0.005)
        order.append("idle stopped")
        return len(steps)

    job = sched.idle(idle)
    assert await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asyncio.to_thread(started.wait, 30),
                                                                      asyncio.get_running_loop())) is True
    assert not sched.busy  # idle work is not a pending request
    assert sched.idle_busy  # ... but it is idle work under way (ditto/stats worker_idle_work)
    assert await sched.run("doc", lambda cancel: order.append("request") or "answer") == "answer"
    assert order == ["idle stopped", "request"]
    assert not sched.idle_busy
    assert job.future.done() and sched.idle_runs == 1 and sched.idle_cancelled == 1
    # A newer idle job replaces one that has not started.
    blocker = threading.Event()
    sched.submit("doc", lambda cancel: blocker.wait(30))
    first = sched.idle(lambda cancel: "first")
    assert sched.idle_busy  # queued behind the request
    second = sched.idle(lambda cancel: "second")
    blocker.set()
    assert await asyncio.wrap_future(second.future) == "second"
    assert first.future.cancelled()
    sched.close()
    assert sched.join(10)


async def test_a_change_stops_the_documents_model_next_edit():
    """lsp_server/lsp/nextedit.py `changed`: a model next edit (the judge takes seconds on a CPU core) stops
    when its document changes, running or still queued, so the worker is free for the completion the typing
    asks for; another document's change leaves it running."""
    from lsp_server.lsp.nextedit import NextEdits
    from lsp_server.lsp.worker.proposers import EditProposers

    sched = Scheduler()
    started, asked = threading.Event(), []

    class Waiting:  # stands in for Judged: its prefill checks `cancel` between chunks
        def propose(self, groups, uri, text, cursor, others, version, cancel):
            asked.append(uri)
            started.set()
            return None if cancel.wait(30) else "proposal"

    proposers = EditProposers()
    proposers._proposer = lambda name, completer: Waiting()

    class Service:  # the completion service's `propose_edit`: the job on the worker (worker/proposers.py)
        model_ready = True

        async def propose_edit(self, uri, name, args, started):
            job = sched.submit(f"nextedit:{uri}", lambda cancel: proposers.propose(name, None, args, cancel))
            started(job)
            return await sched.wait(job)

    ne = NextEdits(None, Service(), lambda: Settings(next_edit_proposer="judged"))
    loop = asyncio.get_running_loop()

    task = asyncio.ensure_future(ne._propose("a.py", "x", 0, [], [], 1))
    await loop.run_in_executor(None, started.wait, 10)
    ne.changed("b.py")  # another document: a.py's job goes on
    assert not task.done()
    ne.changed("a.py")
    assert await asyncio.wait_for(task, 10) is None
    assert ne.counts["cancelled"] == 1 and asked == ["a.py"]

    started.clear()
    blocker = asyncio.ensure_future(ne._propose("b.py", "x", 0, [], [], 1))  # holds the worker
    await loop.run_in_executor(None, started.wait, 10)
    queued = asyncio.ensure_future(ne._propose("a.py", "x", 0, [], [], 2))
    await asyncio.sleep(0)
    ne.changed("a.py")  # while queued: its proposer is never asked
    ne.changed("b.py")
    assert await asyncio.wait_for(blocker, 10) is None and await asyncio.wait_for(queued, 10) is None
    assert ne.counts["cancelled"] == 3 and asked == ["a.py", "b.py"]
    sched.close()
    assert sched.join(5)

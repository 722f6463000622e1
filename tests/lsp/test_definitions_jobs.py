"""The loop's side of the prompt's definitions (lsp_server/lsp/definitions.py `DefinitionJobs`), with its
real process: a job starts after a pause, one place at a time, and its result goes to the worker's inbox
as a `Definitions` message; results are cached; a job that runs too long is abandoned and its process
replaced; a process that died is replaced; off, nothing runs. No timed assertion: each test waits for
the state it expects (at most WAIT_S, so a broken one cannot hang)."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time

import pytest

from lsp_server.lsp.definitions import DefinitionJobs
from lsp_server.lsp.protocol import Lines
from lsp_server.lsp.worker.messages import Definitions
from lsp_server.settings import Settings
from support.workspaces import slow_start, write_store

WAIT_S = 60
APP = "from store import open_store\n\n\ndef main():\n    store = open_store('x')\n    store.get_items('k')\n"


class Doc:
    def __init__(self, uri: str, source: str, version: int = 1):
        self.uri, self.source, self.version = uri, source, version


class Session:
    """What DefinitionJobs reads of the document session: open documents and their line tables."""

    def __init__(self):
        self.docs: dict[str, Doc] = {}

    def document(self, uri):
        return self.docs.get(uri)

    def lines_of(self, uri, text):
        return Lines(text)


@pytest.fixture
def workspace(tmp_path):
    write_store(tmp_path)
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


class Setup:
    def __init__(self, root):
        self.session = Session()
        self.inbox: list = []
        self.settings = Settings(debug_hooks=True, definitions=True)  # (off by default)
        self.jobs = DefinitionJobs(self.session, self.inbox.append, lambda: self.settings)
        self.jobs.DEBOUNCE_S = 0.05
        self.jobs.timeout_s = WAIT_S  # (a job's time, not a test of how busy the machine is)
        self.jobs.set_root(root.as_uri())
        self.uri = (root / "app.py").as_uri()
        self.session.docs[self.uri] = Doc(self.uri, APP)

    def slow(self, seconds: float) -> None:
        self.settings = self.settings.merged({"debug_resolve_delay_s": seconds})

    async def until(self, check) -> None:
        deadline = time.monotonic() + WAIT_S
        while not check():
            assert time.monotonic() < deadline, self.jobs.report()
            await asyncio.sleep(0.02)


@pytest.fixture
async def setup(workspace):
    s = Setup(workspace)
    yield s
    s.jobs.close()


async def test_a_job_runs_after_a_pause_and_its_result_goes_to_the_worker(setup):
    assert setup.jobs.root is not None and os.path.isdir(setup.jobs.root)
    setup.jobs.wanted(setup.uri, 5)
    await setup.until(lambda: setup.inbox)
    (msg,) = setup.inbox
    assert isinstance(msg, Definitions) and (msg.uri, msg.version, msg.line) == (setup.uri, 1, 5)
    assert "# store.py: class Store: def get_items(self, key: str) -> list: ..." in msg.text.splitlines()
    r = setup.jobs.report()
    assert (r["jobs"], r["abandoned"], r["failed"], r["processes_started"]) == (1, 0, 0, 1)
    assert r["resolve_ms"]["count"] == 1 and r["resolve_ms"]["total"] > 0 and r["resolve_ms"]["p50"] is not None
    # The same place of the same version again: from the cache, no job.
    setup.jobs.wanted(setup.uri, 5)
    await setup.until(lambda: len(setup.inbox) == 2)
    assert setup.jobs.report()["cache_hits"] == 1 and setup.jobs.report()["jobs"] == 1
    assert setup.inbox[1].text == msg.text


async def test_the_resolver_runs_at_the_priority_asked_and_19_below_the_server_by_default(setup, monkeypatch):
    from lsp_server.completion.definitions import NICE, resolver_nice

    monkeypatch.setenv("DITTO_DEFINITIONS_NICE", "3")  # (read by the process when it starts)
    setup.jobs.wanted(setup.uri, 5)
    await setup.until(lambda: setup.inbox)
    assert os.getpriority(os.PRIO_PROCESS, setup.jobs._pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 3)
    monkeypatch.delenv("DITTO_DEFINITIONS_NICE")
    assert resolver_nice() == NICE == 19
    monkeypatch.setenv("DITTO_DEFINITIONS_NICE", "low")
    assert resolver_nice() == NICE


async def test_places_asked_in_a_burst_make_one_job_for_the_last(setup):
    for line in (1, 2, 3, 4, 5):
        setup.jobs.wanted(setup.uri, line)
    await setup.until(lambda: setup.inbox)
    await asyncio.sleep(0.2)  # (nothing more comes)
    assert [m.line for m in setup.inbox] == [5] and setup.jobs.report()["jobs"] == 1


async def test_a_place_asked_while_a_job_runs_runs_next(setup):
    setup.slow(1.0)
    setup.jobs.wanted(setup.uri, 5)
    await setup.until(lambda: setup.jobs.report()["running"])
    setup.slow(0.0)
    setup.jobs.wanted(setup.uri, 4)
    await setup.until(lambda: len(setup.inbox) == 2)
    assert [m.line for m in setup.inbox] == [5, 4]


async def test_a_job_past_its_time_is_abandoned_and_its_process_replaced(setup):
    setup.jobs.wanted(setup.uri, 5)  # the process starts (its start is not the slow job's time)
    await setup.until(lambda: setup.inbox)
    setup.jobs.timeout_s = 5.0
    setup.slow(60.0)
    setup.jobs.wanted(setup.uri, 4)
    await setup.until(lambda: setup.jobs.report()["abandoned"] == 1)
    assert len(setup.inbox) == 1  # nothing of it reached the worker
    setup.jobs.timeout_s = WAIT_S  # (the next job starts a new process)
    setup.slow(0.0)
    setup.jobs.wanted(setup.uri, 3)
    await setup.until(lambda: len(setup.inbox) == 2)
    r = setup.jobs.report()
    assert (r["jobs"], r["abandoned"], r["processes_started"]) == (2, 1, 2) and setup.inbox[1].line == 3


async def test_the_process_start_is_not_a_jobs_time_and_has_a_limit_of_its_own(setup):
    """Beside two busy cores a nice-19 start outlasted a job's 15 s, and each job killed the process and
    started it again, so no definition ever arrived: the start has start_timeout_s, the job timeout_s."""
    setup.jobs.initializer = functools.partial(slow_start, 12.0)
    setup.jobs.timeout_s = 6.0  # shorter than the start, long enough for this job beside two busy cores
    setup.jobs.wanted(setup.uri, 5)
    await setup.until(lambda: setup.inbox)
    r = setup.jobs.report()
    assert (r["jobs"], r["abandoned"], r["processes_started"]) == (1, 0, 1), r
    setup.jobs.close()
    setup.jobs.initializer = functools.partial(slow_start, 60.0)  # a start that never ends in time
    setup.jobs.start_timeout_s = 2.0
    setup.jobs.wanted(setup.uri, 4)
    await setup.until(lambda: setup.jobs.report()["abandoned"] == 1)
    assert len(setup.inbox) == 1 and setup.jobs._pool is None  # killed, nothing delivered
    setup.jobs.timeout_s, setup.jobs.start_timeout_s = WAIT_S, WAIT_S
    setup.jobs.initializer = functools.partial(slow_start, 0.0)
    setup.jobs.wanted(setup.uri, 3)  # the next job starts a new process
    await setup.until(lambda: len(setup.inbox) == 2)
    assert setup.jobs.report()["processes_started"] == 3 and setup.inbox[1].line == 3


async def test_a_process_that_died_is_replaced(setup):
    setup.jobs.wanted(setup.uri, 5)
    await setup.until(lambda: setup.inbox)
    os.kill(setup.jobs._pid, signal.SIGKILL)
    setup.session.docs[setup.uri] = Doc(setup.uri, APP + "\n", version=2)
    setup.jobs.wanted(setup.uri, 5)  # the pool is broken: this job fails ...
    await setup.until(lambda: setup.jobs.report()["failed"] == 1)
    setup.jobs.wanted(setup.uri, 4)  # ... and the next one starts a new process
    await setup.until(lambda: len(setup.inbox) == 2)
    assert setup.jobs.report()["processes_started"] == 2


async def test_off_nothing_runs_and_a_closed_document_gets_nothing(setup):
    setup.settings = setup.settings.merged({"definitions": False})
    setup.jobs.wanted(setup.uri, 5)
    await asyncio.sleep(0.3)
    assert not setup.inbox and setup.jobs.report()["processes_started"] == 0
    setup.settings = setup.settings.merged({"definitions": True})
    setup.jobs.wanted(setup.uri, 5)
    setup.jobs.closed(setup.uri)
    del setup.session.docs[setup.uri]
    await asyncio.sleep(0.3)
    assert not setup.inbox and setup.jobs.report()["jobs"] == 0


LONG = APP + "".join(f"V_{i} = {i}\n" for i in range(150)) + "store2 = open_store('y')\n"


async def test_with_nothing_asked_places_ahead_are_resolved_nearest_first_and_capped(setup):
    """A place the user jumps to should find definitions resolved near it before its first request: with
    nothing asked, lines every AHEAD_STEP of the document are resolved, nearest to the last place first,
    none within half a step of one resolved, at most AHEAD_MAX; a place asked goes before the rest."""
    setup.session.docs[setup.uri] = Doc(setup.uri, LONG)
    setup.jobs.AHEAD_MAX = 3
    setup.jobs.wanted(setup.uri, 70)
    await setup.until(lambda: len(setup.inbox) == 4)
    await asyncio.sleep(0.3)  # (nothing more comes: the cap)
    assert [m.line for m in setup.inbox] == [70, 64 + 32, 32, 128]  # 64 is within half a step of 70
    assert setup.jobs.report()["ahead"] == 3 and len(setup.inbox) == 4
    assert all(m.version == 1 for m in setup.inbox)
    # Past the cap, a place asked is still resolved, and the places asked never count toward it.
    setup.jobs.wanted(setup.uri, 150)
    await setup.until(lambda: len(setup.inbox) == 5)
    assert setup.inbox[4].line == 150 and setup.jobs.report()["ahead"] == 3
    setup.jobs.AHEAD_MAX = 4  # one more ahead: 0, the last line every AHEAD_STEP not near one resolved
    setup.jobs.wanted(setup.uri, 40)
    await setup.until(lambda: len(setup.inbox) == 7)
    assert [m.line for m in setup.inbox[5:]] == [40, 0] and setup.jobs.report()["ahead"] == 4


async def test_a_place_asked_while_places_ahead_run_goes_next(setup):
    setup.session.docs[setup.uri] = Doc(setup.uri, LONG)
    setup.slow(1.0)  # every job takes a second: the place asked comes while one ahead runs
    setup.jobs.wanted(setup.uri, 0)
    await setup.until(lambda: setup.inbox and setup.jobs.report()["running"])  # 0 done, 32 (ahead) running
    setup.jobs.wanted(setup.uri, 140)
    await setup.until(lambda: any(m.line == 140 for m in setup.inbox))
    lines = [m.line for m in setup.inbox]
    assert lines[:3] == [0, 32, 140], lines


LEAVES = """
import os, multiprocessing
from concurrent.futures import ProcessPoolExecutor
from lsp_server.completion.definitions import process_id, start_process
pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=start_process)
print(pool.submit(process_id).result(), flush=True)
os.kill(os.getpid(), 9)  # a server killed, or gone by os._exit: nothing of the pool is shut down
"""


def test_the_resolver_process_leaves_with_the_server():
    """Killed, the server leaves the pool's process waiting for a job on a queue it holds itself, and
    multiprocessing's resource tracker (which inherited the server's stdout) alive with it: the client
    would wait for the protocol's end for ever. The process watches its parent and goes with it; the
    run returns once every holder of the stdout pipe is gone (its timeout only bounds a broken run)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LEAVES], capture_output=True, text=True, timeout=120)
    pid = int(done.stdout.split()[0])
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
        assert "Z" in state  # exited, not reaped yet
    except FileNotFoundError:
        pass  # gone

"""Which thread runs what: the event loop and the model worker (docs/design.md, "Two threads, one owner each").

The server runs on two threads. The event loop (pygls's asyncio loop) owns everything the client
changes: the open documents, their per-document records, the idle aim, the counters, the settings.
The model worker (lsp_server/lsp/scheduler.py, one thread named `ditto-model`) owns the loaded
model and everything that changes while it runs: the Completer, the per-file prompt windows and
places, the drafter's index (lsp_server/lsp/worker/). Neither writes the other's state:

- the loop hands the worker owned, immutable values (a frozen snapshot, a message in the worker's
  inbox, an idle plan) and reads what the worker hands back;
- the worker hands its results to the loop with `call_soon_threadsafe` (the `post` it is given),
  and only the loop writes session state;
- a value both threads read is an immutable one behind a `Latest` box, replaced whole by its one
  writer (a swap of one reference).

`on_loop` and `on_worker` mark a method as one thread's. With DITTO_CHECK_THREADS=1 in the
environment (the tests set it, tests/conftest.py) each call checks that it runs where it must and
raises `WrongThread` otherwise; without it they cost nothing. tests/test_architecture.py checks the
import side of the rule: nothing under lsp_server/lsp/worker/ imports pygls, lsprotocol or a
loop-side module.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
WORKER_THREAD = "ditto-model"  # the scheduler's thread name (scheduler.py)


class WrongThread(AssertionError):
    """A method of one thread's part ran on the other (only raised with DITTO_CHECK_THREADS=1)."""


def checking() -> bool:
    return os.environ.get("DITTO_CHECK_THREADS") == "1"


def in_loop() -> bool:
    """Whether this thread is running an asyncio event loop now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def on_loop(fn: Callable) -> Callable:
    """Mark `fn` as the event loop's: with the check on, calling it from a thread without a running
    event loop (the model worker) raises WrongThread."""
    if not checking():
        return fn

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if not in_loop():
            raise WrongThread(f"{fn.__qualname__} runs on the event loop, called on {threading.current_thread().name}")
        return fn(*args, **kwargs)

    checked.thread = "loop"
    return checked


def on_worker(fn: Callable) -> Callable:
    """Mark `fn` as the model worker's: with the check on, calling it on the event loop raises WrongThread
    (tests call worker code from a plain thread too; only the loop is refused)."""
    if not checking():
        return fn

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if in_loop():
            raise WrongThread(f"{fn.__qualname__} runs on the model worker, called on the event loop")
        return fn(*args, **kwargs)

    checked.thread = "worker"
    return checked


class Latest(Generic[T]):
    """One immutable value that one thread publishes and any thread reads: `set` replaces the
    reference whole (atomic in CPython), the value itself never changes in place."""

    __slots__ = ("_value",)

    def __init__(self, value: T):
        self._value = value

    def get(self) -> T:
        return self._value

    def set(self, value: T) -> None:
        self._value = value

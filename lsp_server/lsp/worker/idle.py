"""Idle work on the model worker (`run_idle`): one run of the plan the event loop scheduled
(lsp_server/lsp/idle.py has the order of the work and why; docs/design.md, "Idle work").

Runs on the model worker thread only. It reads the plan (an immutable `IdlePlan`) and the worker's own
state (state.py), and reports back to the loop's `IdleWork` only through `post`: `warmed` (the aim's
prompt is cached), `finished` (the suggestion to finish is done with), `paused_ahead` (a suggestion
generated ahead paused: finish it later), `again` (call me again after some seconds). The loop alone
changes the plan, so a report that comes after the loop moved on changes nothing.
Left out on purpose: deciding what to do next (the loop's), LSP.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from lsp_server.decoding.types import RequestContext
from lsp_server.lsp.threads import on_worker
from lsp_server.lsp.worker.messages import IdlePlan, Snapshot, model_text
from lsp_server.lsp.worker.state import completer_settings

IDLE_CHUNK = 32  # tokens per idle prefill pass: a request waits at most one such pass (~0.35 s on one CPU core)


@on_worker
def run_idle(worker, plan: IdlePlan, cancel: threading.Event, post, loop_side, replaced: Callable[[], bool]) -> None:
    """Do `plan` until done or `cancel` is set; `loop_side` is the loop's IdleWork, reached only through `post`.
    Stopped early by a request or a next-edit job, it asks the loop to schedule idle work again: the
    loop's plan then says what is still to do, and it goes on from what was done. Stopped by a newer
    plan (`replaced()`: the scheduler holds a newer idle job), it asks nothing: that job has the loop's
    plan already, and asking again would restart its settle time (scheduler.py `idle`), so each cursor
    notice or keystroke would cost the idle work up to one more model pass (about one decode step a
    warm request, measured against the server before the thread boundary: docs/design.md, "Idle work")."""
    try:
        _run(worker, plan, cancel, post, loop_side)
    finally:
        if cancel.is_set() and not replaced():
            post(loop_side.again, 0.0)


def _run(worker, plan: IdlePlan, cancel: threading.Event, post, loop_side) -> None:
    completer = worker.completer
    if completer is None or not completer.generator.resumable or cancel.is_set():
        return  # (no engine: a remote one, which keeps its own prefix cache and generates on its own)
    s = plan.settings
    index(worker, s, cancel, slices=1)  # tens of milliseconds; the model work below takes passes
    aim = plan.aim
    if plan.finish is not None:
        uri, token = plan.finish
        file = worker.file_of(uri)
        if completer.pending(uri, file) and (aim is None or aim.uri != uri or _fits(worker, aim)):
            ran = completer.continue_place(uri, cancel, file=file, ctx=RequestContext(uri, True, cancel))
            worker.count(idle_continuations=int(ran))
            if cancel.is_set():
                return  # a request came: it goes on from here, and the loop still holds the plan
        post(loop_side.finished, token)
    if aim is not None and s.idle_prefill and _warm(worker, aim, s, cancel, post, loop_side):
        _ahead(worker, aim, s, plan.show_bias, cancel, post, loop_side)
    fill = not cancel.is_set() and s.idle_prefill and s.whole_file and plan.fill is not None
    wait = plan.fill_at - time.monotonic()
    if fill and wait <= 0:
        _fill_file(worker, plan.fill, cancel)
    index(worker, s, cancel)
    if fill and wait > 0 and not cancel.is_set():
        post(loop_side.again, wait)  # the fill, once the user has paused that long


@on_worker
def index(worker, settings, cancel: threading.Event, slices: int | None = None) -> int:
    """Index the open buffers a slice at a time until `cancel` is set or `slices` ran; returns the
    slices run (cut short, `run_idle` asks for idle work again)."""
    completer = worker.completer
    if completer is None:
        return 0
    worker.sync(settings, in_idle=True)
    buffers = completer.buffers
    steps = 0
    while not cancel.is_set() and (slices is None or steps < slices) and buffers.step():
        steps += 1
    return steps


def _fits(worker, snap: Snapshot) -> bool:
    """Whether the suggestion being finished at `snap.uri` still fits the document there."""
    return worker.completer.place_fits(snap.uri, model_text(snap.text), snap.line, snap.col, file=worker.file(snap))


def _warm(worker, snap: Snapshot, s, cancel: threading.Event, post, loop_side) -> bool:
    """Prefill the prompt at `snap` (at line 1 of a document with nothing cached, the file's head:
    Completer.warm); True when that prefill ran to its end (not stopped or skipped)."""
    completer = worker.completer
    if cancel.is_set():
        return False
    file = worker.file(snap) if worker.is_current(snap) else None
    if file is None:  # the document changed since (a whole-text change aims nowhere) or closed
        post(loop_side.warmed, snap)  # nothing to warm there
        return False
    if completer.pending(snap.uri, file) and _fits(worker, snap):
        # A generation paused here still fits what is typed (one answered at its deadline whose finishing
        # another document's took over): finish it rather than prefill, which would end it.
        ran = completer.continue_place(snap.uri, cancel, file=file, ctx=RequestContext(snap.uri, True, cancel))
        worker.count(idle_continuations=int(ran))
        if not cancel.is_set():
            post(loop_side.warmed, snap)
        return False  # (its place is there: nothing to generate ahead)
    # A paused generation the user typed past (its text is not what was typed) can serve no
    # request: warming the new prompt ends it and keeps its prompt's cache for the new one.
    worker.sync(s, in_idle=True)
    st = completer.warm(model_text(snap.text), snap.line, snap.col, name=snap.name, cache_key=snap.uri,
                        cancel=cancel, chunk=IDLE_CHUNK, settings=s.completer_settings(), file=file,
                        ctx=RequestContext(snap.uri, True, cancel), extras=worker.extras(snap))
    stopped = st.stop_reason == "cancelled"
    worker.count(idle_prefills=1, idle_prefill_tokens=st.prefill_tokens, idle_prefills_stopped=int(stopped))
    worker.warmed.add(snap.uri)
    if not stopped:
        post(loop_side.warmed, snap)  # done: nothing more to warm there until the next aim
    return not stopped


def _ahead(worker, snap: Snapshot, s, show_bias: float, cancel: threading.Event, post, loop_side) -> None:
    """Generate the suggestion at `snap` (its prompt is cached) until its first line is complete or
    a request or a newer aim comes (either sets `cancel`); finish it later like a suggestion answered
    at its deadline."""
    completer = worker.completer
    file = worker.file(snap)
    if file is None or cancel.is_set():
        return
    kept = completer.ahead(model_text(snap.text), snap.line, snap.col, name=snap.name,
                           options=s.decode_options(), cache_key=snap.uri, hold=cancel,
                           settings=completer_settings(s, show_bias), file=file,
                           ctx=RequestContext(snap.uri, True, cancel), extras=worker.extras(snap))
    worker.count(idle_ahead=int(kept))
    if kept and completer.pending(snap.uri, file):
        # To finish later; right away unless a keystroke stopped it (then after what stopped it).
        post(loop_side.paused_ahead, snap.uri, not cancel.is_set())


def _fill_file(worker, snap: Snapshot, cancel: threading.Event) -> None:
    """Fill the prefix KV of the document last aimed at, from its top, until done or a request comes."""
    if not worker.is_current(snap):
        return  # closed, or changed since: a newer aim follows
    file = worker.file(snap)
    if file is None:
        return
    st = worker.completer.fill(model_text(snap.text), snap.line, name=snap.name, file=file, cancel=cancel,
                               chunk=IDLE_CHUNK, ctx=RequestContext(snap.uri, True, cancel))
    if st is not None:
        worker.count(file_fills=1, file_fill_tokens=st.prefill_tokens)

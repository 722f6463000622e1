"""Idle work (`IdleWork`): while the user pauses, the worker does first what the next request needs
(docs/design.md, "Prompt layout and windows").

In order (after one slice of indexing, so that it goes on however often requests stop the rest):
1. finish the suggestion answered at its deadline (lsp_server/completion/place.py `Place`),
   while the document still fits it (what was typed since is the start of the suggestion):
   the next request there is then served from it at once;
2. prefill the prompt of the place the user is at (the newest aim), so the next request there
   prefills nothing. Where the user typed something other than the paused suggestion, this
   ends that generation (it could serve no request there) instead of leaving the pause idle.
   Then generate the suggestion there, up to its first complete line (`Completer.ahead`), and
   go on as with 1: a request there is answered from it, or resumes it where it stopped.
3. with the `whole_file` setting on, and once no request came for `FILL_AFTER_S`, fill the prefix
   KV of the document last aimed at (the whole file from its top, 32-token chunks:
   lsp_server/completion/wholefile.py; docs/design.md, "The whole file above the cursor"), so that
   requests there get the whole file above their place for the cost of their suffix;
4. index the open buffers for the drafter, a slice at a time (`index`; a request waits for at
   most one slice), only while a draft could pay
   (lsp_server/completion/drafting.py `index_wanted`).

Every request stops idle work after one model pass or prefill chunk and goes on from what it
did; `ditto/stats` counts the runs and the requests each served. Each piece of model work names
itself to the engine's hooks as idle (`RequestContext(idle=True)`).

Two threads, one owner each (lsp_server/lsp/threads.py): `IdleWork` here is the event loop's. It
alone holds the plan (the aim, the suggestion to finish, the document to fill, when the last request
came) and hands the worker a copy of it (an immutable `IdlePlan`) each time it schedules the idle job;
the work itself runs on the worker (lsp_server/lsp/worker/idle.py `run_idle`), which reports what it
did through the loop (`warmed`, `finished`, `paused_ahead`, `again`). A report that arrives after
the loop moved on (a newer aim, a newer suggestion to finish) changes nothing, and no change the
loop makes while the worker runs can be overwritten by the worker.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

from lsprotocol import types

from lsp_server.lsp.documents import DocumentSession
from lsp_server.lsp.scheduler import Scheduler
from lsp_server.lsp.threads import on_loop
from lsp_server.lsp.worker.idle import IDLE_CHUNK
from lsp_server.lsp.worker.messages import IdlePlan, Snapshot


class IdleWork:
    IDLE_CHUNK = IDLE_CHUNK  # tokens per idle prefill pass (lsp_server/lsp/worker/idle.py)
    # Idle work starts this long after the event that aimed it (lsp_server/lsp/scheduler.py `idle`):
    # editors send a request right after the edit, and one that found an idle chunk begun for
    # the place the user just left waited for it (about 0.5 s at 4 in 10 cold arrivals of the
    # replays; docs/design.md, "Idle work"). A pause the user makes is far longer.
    IDLE_SETTLE_S = 0.05
    # A file's prefix KV is filled only once the user has made no request for this long: while they
    # type, a request that lands in a fill chunk waits for it (docs/design.md, "The whole file above
    # the cursor"); a reading pause is longer than the gap between keystrokes and lines.
    FILL_AFTER_S = 1.5

    def __init__(self, scheduler: Scheduler, documents: DocumentSession,
                 run: Callable[[IdlePlan, threading.Event, "IdleWork"], None], ready: Callable[[], bool],
                 settings: Callable[[], object], show_bias: Callable[[], float] = lambda: 0.0):
        self.scheduler = scheduler
        self.documents = documents
        self._run = run  # the worker's run of a plan (worker/idle.py run_idle, bound to the worker)
        self._ready = ready  # whether a model is loaded
        self._settings = settings  # the server's live settings
        self._show_bias = show_bias  # the `show` limit's bias in this workspace (shown.py)
        self._aim: Snapshot | None = None  # where the user is: what idle prefill warms
        self._finish: tuple[str, int] | None = None  # (uri, token): a suggestion answered at its deadline
        self._fill: Snapshot | None = None  # the document whose prefix KV idle work fills (the last aim)
        self._last_request = float("-inf")  # when the last request came (time.monotonic)
        self._tokens = itertools.count(1)

    # -- events ------------------------------------------------------------------------------------
    @on_loop
    def aim(self, uri: str, position: types.Position) -> None:
        """Prefill, while the worker is idle, the prompt of a request at `position` of `uri`.

        Re-aimed by didOpen (the top of the document: LSP does not say where the cursor is),
        every didChange (the end of the edit), and `ditto/didMoveCursor` from Ditto's own
        plugins. The newest aim replaces the older one; a request stops it after one chunk
        and continues from what it prefilled (docs/design.md, "Prompt layout and windows").
        """
        if not self._ready():
            return
        snap = self.documents.snapshot(uri, position)
        if snap is None:
            return
        self._aim = self._fill = snap
        self.schedule()

    @on_loop
    def buffers_changed(self) -> None:
        """An open buffer changed: index it while idle."""
        if self._ready():
            self.schedule()

    @on_loop
    def request_made(self) -> None:
        """A request came: an aim made before it is where the user was, and the request prefills
        where the user is. Left in place, idle work after the answer would warm that older place
        into the document's cache and end the answer's paused generation. Filling a file's prefix KV
        goes on after the answer."""
        self._aim = None
        self._last_request = time.monotonic()
        if self._fill is not None:
            self.schedule()

    @on_loop
    def continue_later(self, uri: str) -> None:
        """The suggestion answered for `uri` paused at its deadline: finish it while idle."""
        self._finish = (uri, next(self._tokens))
        self.schedule()

    @on_loop
    def closed(self, uri: str) -> None:
        """`uri` closed: nothing of it is left to do."""
        if self._finish is not None and self._finish[0] == uri:
            self._finish = None
        if self._aim is not None and self._aim.uri == uri:
            self._aim = None
        if self._fill is not None and self._fill.uri == uri:
            self._fill = None

    @on_loop
    def schedule(self, after_s: float | None = None) -> None:
        """Hand the worker the plan as it is now, to run when it has nothing else to do."""
        plan = IdlePlan(self._aim, self._finish, self._fill, self._last_request + self.FILL_AFTER_S,
                        self._settings(), self._show_bias())
        run = self._run
        self.scheduler.idle(lambda cancel: run(plan, cancel, self),
                            after_s=self.IDLE_SETTLE_S if after_s is None else after_s)

    def debug_view(self) -> dict:
        """The plan now (`ditto/debug/worker`): at rest, nothing is left to warm or to finish."""
        return {"aim": None if self._aim is None else self._aim.uri,
                "finish": None if self._finish is None else self._finish[0]}

    # -- what the worker reports (posted to the loop) -------------------------------------------------
    @on_loop
    def warmed(self, snap: Snapshot) -> None:
        """Nothing more to warm at `snap` until the next aim (its prompt is cached, or its version is gone)."""
        if self._aim is snap:
            self._aim = None

    @on_loop
    def finished(self, token: int) -> None:
        """The suggestion to finish with this token is done with (finished, or not pending any more)."""
        if self._finish is not None and self._finish[1] == token:
            self._finish = None

    @on_loop
    def paused_ahead(self, uri: str, go_on: bool) -> None:
        """A suggestion generated ahead at `uri` paused: finish it later, at once unless a keystroke
        stopped it (its request is queued and the idle work after it goes on)."""
        self._finish = (uri, next(self._tokens))
        if go_on:
            self.schedule()

    @on_loop
    def again(self, after_s: float) -> None:
        """Idle work has more to do (the index, or the fill once the user paused long enough)."""
        if self._ready():
            self.schedule(after_s=max(after_s, self.IDLE_SETTLE_S))

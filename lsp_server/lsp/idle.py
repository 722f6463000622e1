"""Idle work (`IdleWork`): while the user pauses, the worker does first what the next request needs
(docs/design.md, "Prompt layout and windows").

In order (after one slice of indexing, so that it goes on however often requests stop the rest):
1. finish the suggestion answered at its deadline (lsp_server/completion/completer.py `Place`),
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
   (lsp_server/completion/completer.py `index_wanted`).

Every request stops idle work after one model pass or prefill chunk and goes on from what it
did; `ditto/stats` counts the runs and the requests each served. Each piece of model work names
itself to the engine's hooks as idle (`RequestContext(idle=True)`).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from lsprotocol import types

from lsp_server.decoding.types import RequestContext
from lsp_server.lsp.documents import DocumentSession, Snapshot, buffer_name, model_text
from lsp_server.lsp.loading import ModelLoader
from lsp_server.lsp.scheduler import Scheduler
from lsp_server.lsp.stats import Counters


class IdleWork:
    IDLE_CHUNK = 32  # tokens per idle prefill pass: a request waits at most one such pass (~0.35 s on one CPU core)
    # Idle work starts this long after the event that aimed it (lsp_server/lsp/scheduler.py `idle`):
    # editors send a request right after the edit, and one that found an idle chunk begun for
    # the place the user just left waited for it (about 0.5 s at 4 in 10 cold arrivals of the
    # replays, docs/perf/README.md 2026-12-04). A pause the user makes is far longer.
    IDLE_SETTLE_S = 0.05
    # A file's prefix KV is filled only once the user has made no request for this long: while they
    # type, a request that lands in a fill chunk waits for it (docs/design.md, "The whole file above
    # the cursor"); a reading pause is longer than the gap between keystrokes and lines.
    FILL_AFTER_S = 1.5

    def __init__(self, scheduler: Scheduler, documents: DocumentSession, loader: ModelLoader, counters: Counters,
                 settings: Callable[[], object]):
        self.scheduler = scheduler
        self.documents = documents
        self.loader = loader
        self.counters = counters
        self._settings = settings  # the server's live settings
        self._aim: Snapshot | None = None  # where the user is: what idle prefill warms
        self._continue_uri: str | None = None  # a suggestion answered at its deadline, to finish while idle
        self._warmed: set[str] = set()  # uris warmed by an idle prefill since their last request
        self._fill: Snapshot | None = None  # the document whose prefix KV idle work fills (the last aim)
        self._last_request = float("-inf")  # when the last request came (time.monotonic)

    # -- on the event loop -----------------------------------------------------------------
    def aim(self, uri: str, position: types.Position) -> None:
        """Prefill, while the worker is idle, the prompt of a request at `position` of `uri`.

        Re-aimed by didOpen (the top of the document: LSP does not say where the cursor is),
        every didChange (the end of the edit), and `ditto/didMoveCursor` from Ditto's own
        plugins. The newest aim replaces the older one; a request stops it after one chunk
        and continues from what it prefilled (docs/design.md, "Prompt layout and windows").
        """
        if not self.loader.ready:
            return
        snap = self.documents.snapshot(uri, position)
        if snap is None:
            return
        self._aim = self._fill = snap
        self.schedule()

    def buffers_changed(self) -> None:
        """An open buffer changed: index it while idle."""
        if self.loader.ready:
            self.schedule()

    def request_made(self) -> None:
        """A request came: an aim made before it is where the user was, and the request prefills
        where the user is. Left in place, idle work after the answer would warm that older place
        into the document's cache and end the answer's paused generation. Filling a file's prefix KV
        goes on after the answer."""
        self._aim = None
        self._last_request = time.monotonic()
        if self._fill is not None:
            self.schedule()

    def continue_later(self, uri: str) -> None:
        """The suggestion answered for `uri` paused at its deadline: finish it while idle."""
        self._continue_uri = uri
        self.schedule()

    def forget(self, uri: str) -> None:
        """`uri` closed."""
        self._warmed.discard(uri)

    def schedule(self) -> None:
        self.scheduler.idle(self._work, after_s=self.IDLE_SETTLE_S)

    # -- on the worker -----------------------------------------------------------------------
    def took_warm(self, uri: str) -> bool:
        """Whether an idle prefill ran for `uri` since its last request (and now it has been used)."""
        warmed = uri in self._warmed
        self._warmed.discard(uri)
        return warmed

    def sync(self, completer) -> None:
        """Bring the Completer's open buffers up to date (documents.py `sync`); indexing left over goes
        on while idle (queued behind the request that runs now; not from inside idle work itself)."""
        s = self._settings()
        pending = self.documents.sync(completer, int(s.index_memory_mb) << 20, s.completer_settings())
        if pending and not self.scheduler.idle_running:
            self.schedule()

    def index(self, cancel: threading.Event, slices: int | None = None) -> int:
        """Index the open buffers a slice at a time until a request (or newer idle work) sets `cancel`,
        or `slices` ran; returns the slices run. Cut short by a request, it asks to go on later."""
        completer = self.loader.completer
        if completer is None:
            return 0
        self.sync(completer)
        index = completer.buffers
        steps = 0
        while not cancel.is_set() and (slices is None or steps < slices) and index.step():
            steps += 1
        if cancel.is_set() and index.pending():
            self.schedule()  # queued behind the request that stopped it (this job is the one running)
        return steps

    def _work(self, cancel: threading.Event) -> None:
        completer = self.loader.completer
        if completer is None or not completer.generator.resumable or cancel.is_set():
            return  # (no engine: a remote one, which keeps its own prefix cache and generates on its own)
        self.index(cancel, slices=1)  # tens of milliseconds; the model work below takes passes
        uri, aim = self._continue_uri, self._aim
        file = self.documents.file(uri) if uri is not None else None
        if uri is not None and completer.pending(uri, file) and (aim is None or aim.uri != uri or self._fits(aim)):
            ran = completer.continue_place(uri, cancel, file=file, ctx=RequestContext(uri, True, cancel))
            self.counters.idle_continuations += int(ran)
            if cancel.is_set():
                return  # a request came: it goes on from here
        self._continue_uri = None
        if aim is not None and self._settings().idle_prefill and self._warm(aim, cancel):
            self._ahead(aim, cancel)
        s = self._settings()
        fill = not cancel.is_set() and s.idle_prefill and s.whole_file and self._fill is not None
        wait = self.FILL_AFTER_S - (time.monotonic() - self._last_request)
        if fill and wait <= 0:
            self._fill_file(cancel)
        self.index(cancel)
        if fill and wait > 0 and not cancel.is_set():
            self.scheduler.idle(self._work, after_s=wait)  # the fill, once the user has paused that long

    def _fill_file(self, cancel: threading.Event) -> None:
        """Fill the prefix KV of the document last aimed at, from its top, until done or a request comes."""
        snap, completer = self._fill, self.loader.completer
        file = self.documents.file(snap.uri) if snap is not None else None
        doc = self.documents.document(snap.uri) if snap is not None else None
        if file is None or doc is None or doc.version != snap.version:
            return  # closed, or changed since: a newer aim follows
        st = completer.fill(model_text(snap.text), snap.line, name=buffer_name(snap.uri), file=file, cancel=cancel,
                            chunk=self.IDLE_CHUNK, ctx=RequestContext(snap.uri, True, cancel))
        if st is not None:
            self.counters.file_fills += 1
            self.counters.file_fill_tokens += st.prefill_tokens

    def _fits(self, snap: Snapshot) -> bool:
        """Whether the suggestion being finished at `snap.uri` still fits the document there."""
        return self.loader.completer.place_fits(snap.uri, model_text(snap.text), snap.line, snap.col,
                                                file=self.documents.file(snap.uri))

    def _warm(self, snap: Snapshot, cancel: threading.Event) -> bool:
        """Prefill the prompt at `snap` (at line 1 of a document with nothing cached, the file's head:
        Completer.warm); True when that prefill ran to its end (not stopped or skipped)."""
        completer = self.loader.completer
        if completer is None or not completer.generator.resumable or cancel.is_set():
            return False
        doc = self.documents.document(snap.uri)
        file = self.documents.file(snap.uri)
        if doc is None or doc.version != snap.version or file is None:
            return False  # the document moved on; a newer aim follows
        if completer.pending(snap.uri, file) and self._fits(snap):
            return False  # prefilling here would end the paused generation (the request there resumes it)
        # A paused generation the user typed past (its text is not what was typed) can serve no
        # request: warming the new prompt ends it and keeps its prompt's cache for the new one.
        self.sync(completer)
        st = completer.warm(model_text(snap.text), snap.line, snap.col, name=buffer_name(snap.uri),
                            cache_key=snap.uri, cancel=cancel, chunk=self.IDLE_CHUNK,
                            settings=self._settings().completer_settings(), file=file,
                            ctx=RequestContext(snap.uri, True, cancel))
        c = self.counters
        c.idle_prefills += 1
        c.idle_prefill_tokens += st.prefill_tokens
        c.idle_prefills_stopped += int(st.stop_reason == "cancelled")
        if self._aim is snap and st.stop_reason != "cancelled":
            self._aim = None  # done: nothing more to warm until the next aim
        self._warmed.add(snap.uri)
        return st.stop_reason != "cancelled"

    def _ahead(self, snap: Snapshot, cancel: threading.Event) -> None:
        """Generate the suggestion at `snap` (its prompt is cached) until its first line is complete or
        a request comes; finish it later like a suggestion answered at its deadline."""
        completer = self.loader.completer
        if self._aim is not None and self._aim is not snap:
            return  # aimed elsewhere since: warm there first
        file = self.documents.file(snap.uri)
        if file is None:
            return  # closed meanwhile
        settings = self._settings()
        kept = completer.ahead(model_text(snap.text), snap.line, snap.col, name=buffer_name(snap.uri),
                               options=settings.decode_options(), cache_key=snap.uri, hold=cancel,
                               settings=settings.completer_settings(), file=file,
                               ctx=RequestContext(snap.uri, True, cancel))
        self.counters.idle_ahead += int(kept)
        if kept and completer.pending(snap.uri, file):
            if cancel.is_set():
                self._continue_uri = snap.uri  # for the idle work after what stopped this one (a keystroke)
            else:
                self.continue_later(snap.uri)

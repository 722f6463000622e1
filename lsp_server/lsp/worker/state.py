"""The model worker's own state (`Worker`): the loaded Completer and what only the worker changes.

Runs on the model worker thread only (lsp_server/lsp/threads.py). It owns:
- `completer`: the loaded model's Completer (lsp_server/completion/completer.py), set by `load`;
- `texts`: its own copy of every open document's text, kept from the inbox (the loop never shares
  pygls's documents with it), from which a new model's Completer is built;
- `files`: per open document, the Completer's `FileState` (prompt window, place, prefix KV) and the
  first line of the snapshot window it is counted from; a snapshot whose window starts elsewhere
  moves it (`file`), so a prompt is the one the whole text gives (lsp_server/lsp/documents.py);
- `warmed`: documents an idle prefill warmed since their last request (`ditto/stats` idle hits);
- `definitions`: per open document, the latest definitions resolved at each of its lines (`Definitions`
  messages: lsp_server/lsp/definitions.py resolves them in another process, where the user is and at
  places ahead), of which `extras` offers the prompt the nearest
  with the snapshot's recent edits (lsp_server/completion/extras.py takes them at a new place);
- `inbox`: the one thing the event loop touches, a thread-safe queue of immutable messages
  (lsp_server/lsp/worker/messages.py) that `sync` applies before each job, in order.

What it produces goes back to the loop through `post` (the loop's `call_soon_threadsafe`) into the
loop's sinks (`Sinks`): counts, a suggestion's trace, the published report for `ditto/stats`.
Left out on purpose: LSP and pygls (the loop's, lsp_server/lsp/), what idle work does (idle.py here).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, replace
from typing import Callable

from lsp_server.completion.extras import PromptExtras
from lsp_server.completion.files import FileState
from lsp_server.completion.rounds import trace_data
from lsp_server.decoding.types import RequestContext
from lsp_server.lsp.threads import on_worker
from lsp_server.lsp.worker.messages import Accepted, BufferText, Closed, Definitions, Snapshot, Visited, model_text
from lsp_server.lsp.worker.proposers import EditProposers


# The worker's report while no model is loaded (`Worker.report`).
NO_MODEL_REPORT = {"budget": {"context_tokens": None, "context_fitted_to": None}, "fit_tokens": None,
                   "speculation": None, "remote": None, "index": None, "kv_cache": None}


@dataclass(frozen=True)
class Sinks:
    """The loop's receivers of what the worker produces; the worker only ever hands them to `post`."""

    count: Callable[[dict], None]  # counter increments (lsp_server/lsp/stats.py Counters.add)
    trace: Callable[[str, dict], None]  # a suggestion's trace, kept while the document is open
    published: Callable[[dict], None]  # the worker's report for `ditto/stats` (`report`)
    wake_idle: Callable[[], None]  # idle work has something to do (the drafter's index is behind)


class _File:
    __slots__ = ("state", "applied")

    def __init__(self):
        self.state = FileState()
        self.applied = 0  # the document line its FileState is counted from


class Worker:
    def __init__(self, post: Callable[..., None], sinks: Sinks, settings: Callable[[], object], hooks=None):
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._post = post
        self._sinks = sinks
        self._settings = settings  # the latest published Settings (a Latest box's get: an immutable value)
        self.hooks = hooks  # the engine's pass hooks (lsp_server/lsp/worker/debug.py), None in production
        self.completer = None
        self.texts: dict[str, BufferText] = {}
        self.files: dict[str, _File] = {}
        self.warmed: set[str] = set()
        self.definitions: dict[str, dict[int, Definitions]] = {}  # per document, by the line resolved at
        self.proposers = EditProposers()

    # -- what the loop sent ------------------------------------------------------------------------
    @on_worker
    def sync(self, settings, in_idle: bool = False) -> bool:
        """Apply the inbox: texts to the Completer's open buffers (the drafter's index of them goes on
        while idle), closes, visits and acceptances. True when the index has work left; outside idle
        work that also wakes idle work, which indexes a slice at a time."""
        closed: dict[str, Closed] = {}
        texts: dict[str, BufferText] = {}
        visits: list[Visited] = []
        accepted: list[Accepted] = []
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, BufferText):
                texts[msg.uri] = msg
                self.texts[msg.uri] = msg
            elif isinstance(msg, Closed):
                texts.pop(msg.uri, None)
                closed[msg.uri] = msg
                self.texts.pop(msg.uri, None)
                self.files.pop(msg.uri, None)
                self.warmed.discard(msg.uri)
                self.definitions.pop(msg.uri, None)
            elif isinstance(msg, Visited):
                visits.append(msg)
            elif isinstance(msg, Accepted):
                accepted.append(msg)
            elif isinstance(msg, Definitions) and msg.uri in self.texts:
                at = self.definitions.setdefault(msg.uri, {})
                at.pop(msg.line, None)
                at[msg.line] = msg  # (the newest last: the oldest go first beyond KEEP_DEFINITIONS)
                while len(at) > self.KEEP_DEFINITIONS:
                    del at[next(iter(at))]
        completer = self.completer
        if completer is None:
            return False  # `load` builds the Completer from `texts`
        index = completer.buffers
        index.defer = True  # indexing is idle work here (lsp_server/lsp/worker/idle.py), never a request's
        index.set_budget(int(settings.index_memory_mb) << 20)
        for msg in closed.values():
            completer.forget_buffer(msg.name, cache_key=msg.uri)
        for msg in texts.values():
            completer.set_buffer(msg.name, msg.text if msg.clean else model_text(msg.text))
        for msg in visits:
            index.visit(msg.name)
        for msg in accepted:
            completer.accepted(msg.shown, msg.after, settings=settings.completer_settings())
        pending = bool(texts) and index.pending()
        if pending and not in_idle:
            self._post(self._sinks.wake_idle)
        return pending

    def is_current(self, snap: Snapshot) -> bool:
        """Whether the newest text the worker has of `snap`'s document is the snapshot's version
        (False: closed or changed since; a newer aim or request follows)."""
        msg = self.texts.get(snap.uri)
        return msg is not None and msg.version == snap.version

    @on_worker
    def file(self, snap: Snapshot) -> FileState | None:
        """The FileState of `snap`'s document, counted from the snapshot's first line (None: closed since)."""
        if snap.uri not in self.texts:
            return None
        rec = self.files.get(snap.uri)
        if rec is None:
            rec = self.files[snap.uri] = _File()
        first = snap.first_line
        if rec.applied != first:  # the snapshot window moved: the prompt window moves with it
            rec.state.shift(first - rec.applied)
            rec.applied = first
        return rec.state

    NEAR_LINES = 64  # definitions resolved this many lines or fewer from a place are offered there
    KEEP_DEFINITIONS = 96  # places' definitions kept a document (the resolver's places ahead: 48 at most)

    def extras(self, snap: Snapshot) -> PromptExtras:
        """What the prompt at `snap` may hold beside the document: the definitions resolved nearest its
        line, within NEAR_LINES (none farther: they are another place's names; of two as near, the one
        resolved later), and the snapshot's recent edits."""
        line = snap.position[0]
        newest_first = reversed(self.definitions.get(snap.uri, {}).values())  # (min keeps the first of equals)
        d = min(newest_first, key=lambda d: abs(d.line - line), default=None)
        d = d if d is not None and abs(d.line - line) <= self.NEAR_LINES else None
        return PromptExtras(model_text(d.text) if d else "", model_text(snap.edits))  # (texts of documents)

    def file_of(self, uri: str) -> FileState | None:
        rec = self.files.get(uri)
        return None if rec is None else rec.state

    def count(self, **increments: int) -> None:
        """Counter increments, for the loop's Counters."""
        if any(increments.values()):
            self._post(self._sinks.count, increments)

    # -- loading ---------------------------------------------------------------------------------------
    @on_worker
    def load(self, settings, progress: Callable[[str, float | None], None], cancel):
        """Load `settings.model` and build its Completer from the open documents' texts; None when
        `cancel` was set (a newer load was asked for). Per-file state starts afresh (the old model's)."""
        from lsp_server.backends.loader import load
        from lsp_server.completion.build import build_completer
        from lsp_server.decoding.engine import Engine

        self.completer = None
        self.sync(settings)
        lm = load(settings.model, device=settings.device, dtype=settings.dtype,
                  trust_remote_code=settings.trust_remote_code, backend=settings.backend,
                  remote=settings.remote, progress=progress)
        if cancel.is_set():
            return None
        self.sync(settings)  # what changed while it loaded
        live = self._settings()
        buffers = [(m.name, model_text(m.text)) for m in self.texts.values()]
        # Pass costs measured afresh at every load (build.py: on a plain engine, without the hooks).
        completer = build_completer(lm, live.completer_settings(), calibration="fresh", buffers=buffers,
                                    engine=Engine(lm, hooks=self.hooks))
        self.files, self.warmed = {}, set()  # prompt windows and places were the old model's
        self.completer = completer
        self.sync(live)  # changes made while it was built
        return lm, completer

    # -- a request ---------------------------------------------------------------------------------------
    @on_worker
    def complete(self, snap: Snapshot, settings, cancel, asked: float, show_bias: float = 0.0):
        """The suggestion for `snap` (None without a model, or when the document closed meanwhile).
        Its counts and trace go to the loop (`post`), so a request cancelled meanwhile is counted too."""
        started = time.perf_counter()
        completer = self.completer
        if completer is None:
            return None
        self.sync(settings)
        warmed = snap.uri in self.warmed
        self.warmed.discard(snap.uri)
        file = self.file(snap)
        if file is None:
            return None  # closed since: its answer would be dropped
        stale_before = completer.generator.stale_passes
        try:
            sug = completer.complete(model_text(snap.text), snap.line, snap.col, name=snap.name,
                                     options=settings.decode_options(), cancel=cancel, cache_key=snap.uri,
                                     settings=completer_settings(settings, show_bias), file=file,
                                     ctx=RequestContext(snap.uri, False, cancel), extras=self.extras(snap))
        finally:
            self.count(stale_passes=completer.generator.stale_passes - stale_before)
        st = sug.completion.stats
        hit = warmed and not sug.typethrough and st.reused_tokens >= 0.9 * len(sug.prompt.ids)
        if sug.typethrough:
            self.count(idle_hits=int(hit))
            return sug  # the trace of the completion on screen stays the one to show
        sections = sug.prompt.sections
        self.count(idle_hits=int(hit), whole_file=int(sug.prompt.whole), prompted=1,
                   with_definitions=int(sections.get("definitions", 0) > 0),
                   with_edits=int(sections.get("edits", 0) > 0))
        trace = trace_of(snap, sug, completer)
        # Where a request's time went besides the Completer (docs/design.md, "The server"): waiting for
        # the worker (idle work finishing its pass, an older request) and the rest of the job.
        trace["waited_ms"] = round((started - asked) * 1000, 1)
        trace["job_ms"] = round((time.perf_counter() - started) * 1000, 1)
        # Kept by the loop before this job's answer reaches it (cancelled or superseded too), and only
        # while the document is open.
        self._post(self._sinks.trace, snap.uri, trace)
        return sug

    @on_worker
    def check_place(self, uri: str) -> dict | None:
        """`ditto/debug/checkPlace` (lsp_server/lsp/handlers.py)."""
        completer = self.completer
        if completer is None or not completer.generator.resumable:
            return None
        return completer.check_place(uri, self.file_of(uri))

    @on_worker
    def debug_view(self, settings) -> dict:
        """`ditto/debug/worker` (tests): what the worker holds of each open document after applying its
        inbox: its text, the Completer's buffer, whether a generation is paused there."""
        self.sync(settings, in_idle=True)
        completer = self.completer
        return {uri: {"version": m.version, "text": m.text,
                      "buffer": completer.buffer_text(m.name) if completer is not None else None,
                      "pending": completer is not None and completer.pending(uri, self.file_of(uri))}
                for uri, m in self.texts.items()}

    @on_worker
    def propose_edit(self, name: str, args: tuple, cancel):
        """A model next edit (lsp_server/lsp/worker/proposers.py) on the loaded model."""
        return self.proposers.propose(name, self.completer, args, cancel)

    # -- what `ditto/stats` reads ---------------------------------------------------------------------------
    @on_worker
    def publish(self) -> None:
        """Hand the loop this worker's part of `ditto/stats` (after every job: scheduler.py `after_job`)."""
        self._post(self._sinks.published, self.report())

    def report(self, intervals: bool = False) -> dict:
        completer = self.completer
        if completer is None:
            return NO_MODEL_REPORT
        generator = completer.generator
        return {
            "budget": completer.budget_report(self._settings().completer_settings()),
            "fit_tokens": completer.fit.tokens,
            "speculation": generator.speculation.snapshot() if generator.speculation else None,
            "remote": generator.stats(intervals),
            "index": completer.buffers.stats(),
            "kv_cache": generator.cache_stats(),
        }


def completer_settings(settings, show_bias: float = 0.0):
    """The Completer's share of `settings`, with the `show` limit moved by this workspace's user."""
    cs = settings.completer_settings()
    return replace(cs, show=cs.show.biased(show_bias)) if show_bias else cs


def trace_of(snap: Snapshot, sug, completer) -> dict:
    """`ditto/trace`'s answer for a suggestion: the same data `ditto-lsp trace --json` prints
    (lsp_server/commands/trace.py, rounds.py `trace_data`), and its legacy `rounds` read from it."""
    lm = completer.lm
    s = sug.completion.stats
    data = trace_data(sug.completion, lm.token_text, text=sug.text, model=lm.spec, drafter=sug.drafter)
    return {
        "uri": snap.uri,
        "version": snap.version,
        "position": {"line": snap.position[0], "character": snap.position[1]},
        "text": sug.text,
        "withheld": sug.withheld,  # what the `show` rule held back (lsp_server/completion/show.py)
        "raw": sug.raw,
        "drafter": sug.drafter,
        "stop_reason": s.stop_reason,
        "stats": s.as_dict(),
        "latency_ms": round(sug.latency_ms, 1),
        "ahead": sug.ahead,  # generated while idle before the request (its stats are that generation's)
        "prompt_tokens": len(sug.prompt.ids),  # what the model saw (its stats say what it processed)
        "whole_file": sug.prompt.whole,  # the whole file above the place (lsp_server/completion/wholefile.py)
        # Tokens of each part of the prompt, by name (lsp_server/completion/context.py: snippets, header,
        # file_head, definitions, edits, repeat, above, below, middle, typed); {} for a whole-file prompt.
        "prompt_sections": dict(sug.prompt.sections),
        "rounds": legacy_rounds(data["rounds"], lm.decode),
        "trace": data,
        # How sure the model was of each token it wrote (lsp_server/completion/show.py decides on it):
        # [text the token added, probability, lead over the runner-up], in order.
        "sure": sure_pieces(sug.completion, lm.decode),
    }


def sure_pieces(completion, decode: Callable[[list[int]], str]) -> list[list]:
    tokens, out, before = completion.tokens, [], ""
    for i, (p, m) in enumerate(zip(completion.probs, completion.margins)):
        text = decode(tokens[: i + 1])
        out.append([text[len(before):] if text.startswith(before) else text, round(p, 4), round(m, 4)])
        before = text
    return out


def legacy_rounds(rounds: list[dict], decode: Callable[[list[int]], str]) -> list[dict]:
    """The trace's older per-round form (clients read `rounds`), read from `trace_data`'s rounds."""
    return [{
        "proposed": [p["text"] for p in r["proposed"]],
        "proposed_text": decode([p["id"] for p in r["proposed"]]) if r["proposed"] else "",
        "accepted": r["accepted"],
        "appended": r["token"]["text"],
        "kind": r["kind"],
        "source": r["source"],
        "match_len": r["match_len"],
        "ms": r["ms"],
    } for r in rounds]

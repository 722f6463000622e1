"""The language server: LSP in, ghost-text suggestions out. The only module importing pygls.

- `textDocument/inlineCompletion` (registered WITH InlineCompletionOptions, else pygls
  2.1.1 does not advertise it) and `textDocument/completion` as a fallback (one item).
- Incremental document sync; positions in the negotiated encoding (UTF-16 by default)
  through pygls's position codec. Only documents the client opened are read: pygls's
  `workspace.get_text_document` would read any other URI from disk, so membership in
  `workspace.text_documents` is checked first.
- The model runs on the scheduler's single worker thread; handlers snapshot
  (uri, version, text, position), await the worker, and drop a result whose document
  version changed meanwhile. `$/cancelRequest` and newer requests for the same document
  set the engine's stop flag.
- The model loads on the worker in the background with `$/progress`. A completion request
  made meanwhile waits for it (the newest per document: an older one waiting for the same
  document gets `None` at once; `$/cancelRequest` cancels a waiting one), for at most the
  `load_wait_s` setting, and is then computed like any other, so the first suggestion
  needs no second keystroke. When the load is done the server sends the notification
  `ditto/modelReady` `{"model": spec}`, for editors that drop answers that come late (the
  plugins re-ask once). A failure answers the waiting requests `None`, is shown once
  (`window/showMessage`) and logged; a settings change to a loadable model recovers.
- Params pygls cannot deserialise get an InvalidParams error (pygls 2.1.1 sends no reply
  at all for them).
- Custom requests `ditto/stats` and `ditto/trace`; with the `debug_documents` setting (which a
  client can set only when the server runs as `ditto-lsp serve --debug-hooks`),
  `ditto/debug/document` answers the server's text of an open document (tests compare it
  with a reference model of the edits).
- Incremental edits are applied here, not by pygls (whose 2.1.1 code splits lines on
  Unicode separators like \x0c and \u2028 that the client does not count, drops the last
  character for a column past the end of the last line, and garbles reversed ranges).
  The rules, per LSP: lines end at \n, \r\n or \r; a line past the end means the end of
  the document; a character past the end of a line means the end of that line (before
  its line break); a position inside a surrogate pair means after that character; a
  range whose end comes before its start is swapped. A change for a document that is not
  open is ignored.

Left out on purpose: prompts and stop rules (context.py, completer.py), decoding
(engine.py), the command line (server_cli.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import (FeatureRequestError, JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest,
                              JsonRpcMethodNotFound, JsonRpcServerNotInitialized)
from pygls.lsp.server import LanguageServer
from lsprotocol.types import ResponseError
from pygls.protocol import LanguageServerProtocol, lsp_method
from pygls.uris import to_fs_path

from .numbers import percentile
from .scheduler import Scheduler, StepHook, Superseded
from .settings import Settings, SettingsError

log = logging.getLogger(__name__)

STATS = "ditto/stats"
MODEL_READY = "ditto/modelReady"
TRACE = "ditto/trace"
CURSOR = "ditto/didMoveCursor"  # notification {textDocument: {uri}, position}: aims idle prefill
DEBUG_STEP = "ditto/debug/step"
DEBUG_DOCUMENT = "ditto/debug/document"

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class _Answered:
    """Stands in for a request pygls could not deserialise and that was already answered."""

    jsonrpc = "answered"


class DittoProtocol(LanguageServerProtocol):
    """Answers requests whose params fail to deserialise with InvalidParams."""

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "id" in data and not {"method", "result", "error"} & data.keys():
                # Neither a request nor a response (pygls 2.1.1 drops it): InvalidRequest.
                self._send_response(data["id"], error=ResponseError(
                    code=JsonRpcInvalidRequest.CODE, message="a request needs a method"))
                return _Answered()
            if isinstance(data, dict) and "id" in data and "method" in data:
                err = exc if isinstance(exc, JsonRpcInvalidParams) else JsonRpcInvalidParams()
                err.message = f"invalid params for {data.get('method')!r}"
                self._send_response(data["id"], error=err.to_response_error())
                return _Answered()
            raise

    def handle_message(self, message):
        if isinstance(message, _Answered):
            return
        method, msg_id = getattr(message, "method", None), getattr(message, "id", None)
        if method is not None and msg_id is not None:  # a request
            # pygls 2.1.1 answers nothing after shutdown, and runs handlers before initialize.
            if self._shutdown:
                self._send_response(msg_id, error=ResponseError(
                    code=JsonRpcInvalidRequest.CODE, message=f"{method}: the server is shutting down"))
                return
            if self._workspace is None and method != types.INITIALIZE:
                self._send_response(msg_id, error=ResponseError(
                    code=JsonRpcServerNotInitialized.CODE, message=f"{method}: the server is not initialized"))
                return
        super().handle_message(message)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        """Applies the changes with the rules of the module docstring, then calls the handler."""
        uri = params.text_document.uri
        doc = self.workspace.text_documents.get(unquote(uri))
        if doc is None:
            log.info("didChange for a document that is not open: %s", uri)
            return
        text = doc.source
        units = self.workspace.position_codec.client_num_units
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                text = apply_change(text, change.range, change.text, units)
            else:
                text = change.text
        self.workspace.update_text_document(
            params.text_document, types.TextDocumentContentChangeWholeDocument(text=text))
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield user_handler, (params,), None


def apply_change(text: str, rng: types.Range, new_text: str, units) -> str:
    """`text` with `rng` replaced by `new_text`; `units(s)` counts client units (module docstring rules)."""
    starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]

    def offset(pos: types.Position) -> int:
        if pos.line >= len(starts):
            return len(text)
        begin = starts[pos.line]
        m = _LINE_BREAK.search(text, begin)
        end = m.start() if m else len(text)
        i, seen = begin, 0
        while i < end and seen < pos.character:
            seen += units(text[i])
            i += 1
        return i

    a, b = offset(rng.start), offset(rng.end)
    if b < a:
        a, b = b, a
    return text[:a] + new_text + text[b:]


@dataclass
class Counters:
    requests: int = 0  # inline + completion requests received
    completed: int = 0  # answered with the model's result (empty or not)
    empty: int = 0  # of which the suggestion was empty (answered None)
    cancelled: int = 0  # $/cancelRequest
    superseded: int = 0  # replaced by a newer request for the same document
    dropped_stale: int = 0  # the document changed while computing
    not_ready: int = 0  # no model: its load failed, or took longer than load_wait_s (answered None)
    waited: int = 0  # arrived while the model loaded, and waited for it
    invalid: int = 0  # unknown document or position outside it (answered None)
    errors: int = 0  # the engine raised
    stale_passes: int = 0  # model passes begun for a request already cancelled or superseded
    stale_passes_max: int = 0  # the most such passes for one request
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    target_passes: int = 0
    typethrough: int = 0  # answered with the rest of the suggestion on screen, without the model
    idle_prefills: int = 0  # idle prefills that ran (the worker had nothing else to do)
    idle_prefill_tokens: int = 0  # prompt tokens they prefilled
    idle_prefills_stopped: int = 0  # of which stopped early by a request or a newer aim (their chunks stay cached)
    idle_hits: int = 0  # requests whose prompt was at least 90% in the cache right after an idle prefill
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=1000))


@dataclass
class Snapshot:
    uri: str
    version: int | None
    text: str
    line: int  # 0-based
    col: int  # code points
    position: types.Position  # in client units, clamped to the line


class DittoServer(LanguageServer):
    def __init__(self, settings: Settings | None = None):
        super().__init__("ditto-lsp", "0.1.0", protocol_cls=DittoProtocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.settings = settings or Settings()
        self.scheduler = Scheduler()
        self.counters = Counters()
        self.completer = None  # lsp_server.completer.Completer once a model is loaded
        self.model_state = "not loaded"  # not loaded | loading | ready | failed
        self.model_error: str | None = None
        self.model_info: dict = {}
        self.traces: dict[str, dict] = {}  # uri -> last completion's rounds
        self._loaded_key: tuple | None = None
        self._load_seq = itertools.count(1)
        self._load_wanted = 0
        self._dirty: dict[str, str | None] = {}  # uri -> new text (None: closed), applied on the worker
        self._dirty_lock = threading.Lock()
        self._accepted: list[tuple[str, str]] = []  # (uri, suggestion text) the user accepted; for the history source
        self._step_cancel: threading.Event | None = None
        self._stale_in_request: tuple = (None, 0)  # (cancel event of a request, its stale passes)
        self._step_uri: str | None = None
        self._warmed: dict[str, bool] = {}  # uri -> an idle prefill ran since its last request
        self._idle_cancel: threading.Event | None = None  # set while an idle prefill runs
        self.loop: asyncio.AbstractEventLoop | None = None
        # Requests waiting for the model to load: uri -> future of the newest one, resolved
        # with the load's outcome ("ready" | "failed" | "stopped") or "superseded".
        self._waiting: dict[str, asyncio.Future] = {}
        self._request_seq: dict[str, int] = {}  # uri -> number of its newest completion request

    # -- errors ------------------------------------------------------------------------
    def report_server_error(self, error, source):
        # pygls's default shows every out-of-band error to the user; log instead. A failed
        # request was already logged by pygls with its traceback: log it once, not twice.
        if source is FeatureRequestError:
            return
        log.error("%s: %s", getattr(source, "__name__", source), error)

    # -- documents -----------------------------------------------------------------------
    def document(self, uri: str):
        """The open document, or None; never reads from disk.

        pygls keys its documents by the percent-decoded URI (`file:///a%20b.py` is stored
        as `file:///a b.py`), so look them up the same way.
        """
        return self.workspace.text_documents.get(unquote(uri))

    def mark_dirty(self, uri: str, text: str | None) -> None:
        with self._dirty_lock:
            self._dirty[uri] = text

    # -- idle prefill -------------------------------------------------------------------------
    IDLE_CHUNK = 32  # tokens per idle prefill pass: a request waits at most one such pass (~0.5 s on one CPU core)

    def aim(self, uri: str, position: types.Position) -> None:
        """Prefill, while the worker is idle, the prompt of a request at `position` of `uri`.

        Re-aimed by didOpen (the top of the document: LSP does not say where the cursor is),
        every didChange (the end of the edit), and `ditto/didMoveCursor` from Ditto's own
        plugins. The newest aim replaces the older one; a request stops it after one chunk
        and continues from what it prefilled (docs/design.md, "Prompt layout and windows").
        """
        if self.model_state != "ready" or self.completer is None or not self.settings.idle_prefill:
            return
        snap = self.snapshot(uri, position)
        if snap is None:
            return
        self.scheduler.idle(lambda cancel: self._warm(snap, cancel))

    def _warm(self, snap: Snapshot, cancel: threading.Event) -> None:
        completer = self.completer
        if completer is None or completer.engine is None or cancel.is_set():
            return  # (no engine: a remote one, which keeps its own prefix cache)
        doc = self.document(snap.uri)
        if doc is None or doc.version != snap.version:
            return  # the document moved on; a newer aim follows
        self._apply_dirty(completer)
        completer.settings = self.settings.completer_settings()
        self._idle_cancel, self._step_uri = cancel, snap.uri
        try:
            st = completer.warm(model_text(snap.text), snap.line, snap.col, name=buffer_name(snap.uri),
                                cache_key=snap.uri, cancel=cancel, chunk=self.IDLE_CHUNK)
        finally:
            self._idle_cancel = self._step_uri = None
        c = self.counters
        c.idle_prefills += 1
        c.idle_prefill_tokens += st.prefill_tokens
        c.idle_prefills_stopped += int(st.stop_reason == "cancelled")
        self._warmed[snap.uri] = True

    def _apply_dirty(self, completer) -> None:
        """On the worker: bring the drafter's index up to date with the open buffers."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, {}
            accepted, self._accepted = self._accepted, []
        for uri, text in dirty.items():
            if text is None:
                completer.forget_buffer(buffer_name(uri))
            else:
                completer.set_buffer(buffer_name(uri), model_text(text))
        for uri, shown in accepted:
            if hasattr(completer, "accepted"):
                completer.accepted(shown, typed_after(self.document(uri), shown))

    def note_change(self, uri: str, params) -> None:
        """A didChange that inserts exactly the last suggestion shown for `uri` is an acceptance.

        It is queued and given to the Completer's history source (with the text typed
        after it by then) on the worker, before the next completion.
        """
        shown = (self.traces.get(uri) or {}).get("text")
        if not shown or len(shown.strip()) < 2:
            return
        for change in params.content_changes:
            if getattr(change, "range", None) is not None and change.text and change.text.endswith(shown):
                with self._dirty_lock:
                    self._accepted.append((uri, shown))
                self.traces[uri] = {**self.traces[uri], "text": None}  # one acceptance per suggestion
                return

    # -- model loading --------------------------------------------------------------------
    def request_load(self) -> None:
        """Load the model of the current settings in the background (no-op if loaded)."""
        if self._loaded_key == self.settings.model_key() and self.model_state in ("ready", "loading"):
            return
        seq = next(self._load_seq)
        self._load_wanted = seq
        self.model_state = "loading"
        self._loaded_key = self.settings.model_key()
        asyncio.ensure_future(self._load(seq, self.settings))

    async def _load(self, seq: int, settings: Settings) -> None:
        token = f"ditto-load-{seq}"
        progress = self._progress_supported()
        if progress:
            try:
                await self.work_done_progress.create_async(token)
            except Exception as err:  # the client refused: load without progress
                log.warning("window/workDoneProgress/create failed: %s", err)
                progress = False
        if progress:
            self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
                title="Ditto", message=f"loading model {settings.model}", percentage=0))
        loop = asyncio.get_running_loop()

        def report(msg: str, frac) -> None:
            if progress:
                pct = None if frac is None else max(0, min(100, int(frac * 100)))
                self.work_done_progress.report(token, types.WorkDoneProgressReport(message=msg, percentage=pct))

        def job(cancel: threading.Event):
            if seq != self._load_wanted:
                return None  # a newer load was asked for meanwhile
            if not self._debug_load_delay(seq, cancel):
                return None
            from .completer import Completer
            from .engine import Engine
            from .model import load

            self.completer = None
            lm = load(settings.model, device=settings.device, dtype=settings.dtype,
                      trust_remote_code=settings.trust_remote_code, backend=settings.backend,
                      remote=settings.remote,
                      progress=lambda msg, frac: loop.call_soon_threadsafe(report, msg, frac))
            completer = Completer(lm, engine=Engine(StepHook(lm, self._before_step, self._after_step)),
                                  settings=self.settings.completer_settings())
            # Pass costs for the adaptive draft length, measured on a plain engine (no test hooks).
            from .completer import calibrate

            if completer.engine is not None:  # None: a remote engine generates (lsp_server/remote_backend.py)
                completer.engine.use_costs(calibrate(Engine(lm), lm, fresh=True))
            with self._dirty_lock:
                self._dirty = {uri: doc.source for uri, doc in self.workspace.text_documents.items()}
            self._apply_dirty(completer)
            self.completer = completer
            return lm

        try:
            lm = await self.scheduler.run(None, job)
        except Exception as err:
            if seq == self._load_wanted:
                self.model_state = "failed"
                self.model_error = str(err).splitlines()[0] if str(err) else type(err).__name__
                self._loaded_key = None
                msg = f"Ditto: could not load model {settings.model!r}: {self.model_error}"
                log.error("%s", msg, exc_info=not _is_model_error(err))
                self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=msg))
                self._settle_waiting("failed")
            if progress:
                self.work_done_progress.end(token, types.WorkDoneProgressEnd(message="failed"))
            return
        if progress:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message="ready" if lm else "skipped"))
        if seq != self._load_wanted:
            return  # a newer load answers the waiting requests
        if lm is None:
            self._settle_waiting("stopped")  # the worker was stopped during the load
            return
        self.model_state = "ready"
        self.model_error = None
        self.model_info = {"model": lm.spec, "name": lm.name, **lm.describe(), "load_seconds": round(lm.load_seconds, 2)}
        log.info("model %s ready on %s (%s) in %.1f s", lm.spec, self.model_info["device"], self.model_info["backend"],
                 lm.load_seconds)
        self.protocol.notify(MODEL_READY, {"model": lm.spec})
        self._settle_waiting("ready")

    def _debug_load_delay(self, seq: int, cancel: threading.Event) -> bool:
        """On the worker, before a load: the `debug_load_delay_s` hook (tests make loading slow).

        The setting is read again while sleeping, so a test ends the sleep early by setting it
        to 0. False when the worker stops or a newer load is asked for meanwhile.
        """
        t0 = time.monotonic()
        while (left := self.settings.debug_load_delay_s - (time.monotonic() - t0)) > 0:
            if seq != self._load_wanted or cancel.wait(min(left, 0.05)):
                return False
        return True

    # -- requests made while the model loads -----------------------------------------------
    async def _wait_for_model(self, uri: str, seq: int) -> str:
        """Wait for the load under way: "ready" | "failed" | "stopped" | "superseded" | "timeout".

        Only the newest request per document waits: `suggest` answers an older one
        "superseded" at once, and so is one that was woken but overtaken by a newer request
        (`seq` is no longer the document's newest) before it ran.
        """
        fut = asyncio.get_running_loop().create_future()
        self._waiting[uri] = fut
        self.counters.waited += 1
        try:
            outcome = await asyncio.wait_for(fut, self.settings.load_wait_s)
        except asyncio.TimeoutError:
            outcome = "timeout"
        finally:
            if self._waiting.get(uri) is fut:
                del self._waiting[uri]
        if outcome == "ready" and self._request_seq.get(uri) != seq:
            outcome = "superseded"
        return outcome

    def _settle_waiting(self, outcome: str) -> None:
        """Answer every request waiting for the model with the load's outcome."""
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_result(outcome)

    def _progress_supported(self) -> bool:
        caps = self.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)

    def _before_step(self, n_tokens: int) -> None:
        """On the worker, before every model pass: the debug hooks of the settings."""
        s = self.settings
        idle = self._idle_cancel
        if idle is None and self._step_cancel is not None and self._step_cancel.is_set():
            # A pass begun after the request was cancelled/superseded. One can race the
            # engine's check of the flag; more than one per request means it is not checked.
            self.counters.stale_passes += 1
            n = self._stale_in_request[1] + 1 if self._stale_in_request[0] is self._step_cancel else 1
            self._stale_in_request = (self._step_cancel, n)
            self.counters.stale_passes_max = max(self.counters.stale_passes_max, n)
        if s.debug_notify_steps and self.loop is not None:
            params = {"uri": self._step_uri, "tokens": n_tokens, **({"idle": True} if idle is not None else {})}
            self.loop.call_soon_threadsafe(self.protocol.notify, DEBUG_STEP, params)
        wait_on = idle if idle is not None else self._step_cancel
        if s.debug_step_delay_ms > 0 and wait_on is not None:
            wait_on.wait(s.debug_step_delay_ms / 1000)

    def _after_step(self, n_tokens: int) -> None:
        """On the worker, after every model pass: the `debug_fail_forward` fault."""
        if self.settings.debug_fail_forward:
            raise RuntimeError("out of memory (simulated by the debug_fail_forward setting)")

    # -- settings ----------------------------------------------------------------------------
    def apply_settings(self, options, where: str, load: bool = True) -> None:
        unknown: list[str] = []
        refused: list[str] = []
        try:
            new = self.settings.merged(options, unknown, refused)
        except SettingsError as err:
            msg = f"Ditto: ignored {where}: {err}"
            log.error("%s", msg)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=msg))
            return
        if unknown:
            log.warning("ignored unknown settings in %s: %s", where, ", ".join(unknown))
        if refused:
            log.warning("ignored %s in %s: the server was not started with `ditto-lsp serve --debug-hooks`",
                        ", ".join(refused), where)
        old, self.settings = self.settings, new  # the worker gives the completer its share per request
        if load and (new.model_key() != old.model_key() or self.model_state == "failed"):
            self.request_load()

    # -- positions ---------------------------------------------------------------------------
    def snapshot(self, uri: str, position: types.Position) -> Snapshot | None:
        doc = self.document(uri)
        if doc is None:
            log.info("request for a document that is not open: %s", uri)
            return None
        text = doc.source
        lines = text.split("\n")
        if position.line >= len(lines):
            log.info("position %s:%d is past the end (%d lines)", uri, position.line, len(lines))
            return None
        line = lines[position.line].removesuffix("\r")
        codec = self.workspace.position_codec
        units = codec.client_num_units(line)
        # LSP: a character past the end of the line means the end of the line.
        char = min(position.character, units)
        clamped = types.Position(line=position.line, character=char)
        col = codec.position_from_client_units([line], types.Position(line=0, character=char)).character
        return Snapshot(uri, doc.version, text, position.line, col, clamped)

    def to_client(self, text: str, line: int, col: int) -> types.Position:
        line_text = text.split("\n")[line]
        return types.Position(line=line, character=self.workspace.position_codec.client_num_units(line_text[:col]))

    # -- completion ------------------------------------------------------------------------------
    async def suggest(self, snap: Snapshot) -> str | None:
        """The ghost text for `snap`, or None (not ready, superseded, stale, empty)."""
        c = self.counters
        c.requests += 1
        seq = self._request_seq[snap.uri] = self._request_seq.get(snap.uri, 0) + 1
        older = self._waiting.get(snap.uri)
        if older is not None and not older.done():
            older.set_result("superseded")  # even when this one need not wait
        if self.model_state in ("not loaded", "loading") and self.settings.load_wait_s > 0:
            try:
                outcome = await self._wait_for_model(snap.uri, seq)
            except asyncio.CancelledError:
                c.cancelled += 1
                raise
            if outcome == "superseded":
                c.superseded += 1
                return None
            if outcome != "ready":
                c.not_ready += 1
                return None
            doc = self.document(snap.uri)
            if doc is None or doc.version != snap.version:
                c.dropped_stale += 1  # the document changed while the model loaded
                return None
        if self.model_state != "ready" or self.completer is None:
            c.not_ready += 1
            return None
        t0 = time.perf_counter()
        settings = self.settings
        options = settings.decode_options()

        def job(cancel: threading.Event):
            completer = self.completer
            if completer is None:
                return None
            self._apply_dirty(completer)
            completer.settings = settings.completer_settings()  # on the worker: the request's settings
            self._step_cancel, self._step_uri = cancel, snap.uri
            warmed = self._warmed.pop(snap.uri, False)
            try:
                sug = completer.complete(model_text(snap.text), snap.line, snap.col, name=buffer_name(snap.uri), options=options,
                                         cancel=cancel, cache_key=snap.uri)
            finally:
                self._step_cancel = self._step_uri = None
            st = sug.completion.stats
            if warmed and not sug.typethrough and st.reused_tokens >= 0.9 * len(sug.prompt.ids):
                self.counters.idle_hits += 1
            self._record(snap, sug, completer)
            return sug

        try:
            sug = await self.scheduler.run(snap.uri, job)
        except asyncio.CancelledError:
            c.cancelled += 1
            raise
        except Superseded:
            c.superseded += 1
            return None
        except Exception:
            c.errors += 1
            raise
        if sug is None:
            c.not_ready += 1
            return None
        doc = self.document(snap.uri)
        if doc is None or doc.version != snap.version:
            c.dropped_stale += 1
            return None
        if sug.completion.stats.stop_reason == "cancelled":  # superseded while running
            c.superseded += 1
            return None
        if sug.completion.stats.stop_reason == "error":  # a remote engine failed: shown once per outage
            c.errors += 1
            if sug.notice:
                self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=sug.notice))
            return None
        c.completed += 1
        c.typethrough += int(getattr(sug, "typethrough", False))
        c.latencies_ms.append((time.perf_counter() - t0) * 1000)
        s = sug.completion.stats
        c.drafted += s.drafted
        c.accepted += s.accepted
        c.generated += s.generated
        c.target_passes += s.target_passes
        if not sug.text:
            c.empty += 1
            return None
        return sug.text

    def _record(self, snap: Snapshot, sug, completer) -> None:
        if getattr(sug, "typethrough", False):
            return  # the trace of the completion on screen stays the one to show
        from .rounds import trace_data

        lm = completer.lm
        s = sug.completion.stats
        self.traces[snap.uri] = {
            "uri": snap.uri,
            "version": snap.version,
            "position": {"line": snap.position.line, "character": snap.position.character},
            "text": sug.text,
            "raw": sug.raw,
            "drafter": sug.drafter,
            "stop_reason": s.stop_reason,
            "stats": s.as_dict(),
            "latency_ms": round(sug.latency_ms, 1),
            "rounds": [{
                "proposed": [lm.token_text(t) for t in r.proposed],
                "proposed_text": lm.decode(r.proposed) if r.proposed else "",
                "accepted": r.accepted,
                "appended": lm.token_text(r.token),
                "kind": r.kind,
                "source": r.source,
                "match_len": r.match_len,
                "ms": r.ms,
            } for r in sug.completion.rounds],
            # The same data `ditto-lsp trace --json` prints (lsp_server/trace.py), for tools that read both.
            "trace": trace_data(sug.completion, lm.token_text, text=sug.text, model=lm.spec, drafter=sug.drafter),
        }

    def stats(self, intervals: bool = False) -> dict:
        c = self.counters
        return {
            "requests": c.requests,
            "completed": c.completed,
            "empty": c.empty,
            "cancelled": c.cancelled,
            "superseded": c.superseded,
            "dropped_stale": c.dropped_stale,
            "not_ready": c.not_ready,
            "waited": c.waited,
            "waiting": sum(not f.done() for f in self._waiting.values()),
            "invalid": c.invalid,
            "errors": c.errors,
            "stale_passes": c.stale_passes,
            "stale_passes_max": c.stale_passes_max,
            "latency_ms": {"p50": percentile(c.latencies_ms, 50, 1), "p95": percentile(c.latencies_ms, 95, 1),
                           "count": len(c.latencies_ms)},
            "acceptance_rate": round(c.accepted / c.drafted, 4) if c.drafted else None,
            "tokens_per_target_pass": round(c.generated / c.target_passes, 4) if c.target_passes else None,
            "drafted": c.drafted,
            "accepted": c.accepted,
            "typethrough": c.typethrough,
            "idle_prefill": {"runs": c.idle_prefills, "tokens": c.idle_prefill_tokens,
                             "stopped": c.idle_prefills_stopped, "hits": c.idle_hits},
            "model": self.model_info.get("model") if self.model_state == "ready" else self.settings.model,
            "device": self.model_info.get("device") if self.model_state == "ready" else None,
            "dtype": self.model_info.get("dtype") if self.model_state == "ready" else None,
            "backend": self.model_info.get("backend") if self.model_state == "ready" else None,
            "model_state": self.model_state,
            "model_error": self.model_error,
            "speculation": (self.completer.engine.speculation.snapshot()
                            if self.completer is not None and self.completer.engine is not None
                            and self.completer.engine.speculation else None),
            # A remote engine's counts; with {"remoteIntervals": true}, each request's (start, first piece,
            # end, outcome) in wall-clock seconds (lsp_server/storm.py measures the engine's concurrency).
            "remote": (self.completer.generator.stats(intervals)
                       if self.completer is not None and hasattr(self.completer.generator, "stats") else None),
            "worker_busy": self.scheduler.busy,
            "worker_pending": self.scheduler.pending,
            "worker_pending_max": self.scheduler.max_pending,
            "open_documents": len(self.workspace.text_documents) if self.protocol._workspace else 0,
        }


def edit_end(changes, units) -> types.Position | None:
    """Where the last incremental change of a didChange leaves the cursor (client units); None
    for a whole-document change, which says nothing about where the user is."""
    if not changes or not isinstance(changes[-1], types.TextDocumentContentChangePartial):
        return None
    change = changes[-1]
    start = change.range.start
    start, end = (start, change.range.end) if (start.line, start.character) <= (
        change.range.end.line, change.range.end.character) else (change.range.end, start)
    lines = _LINE_BREAK.split(change.text)
    if len(lines) == 1:
        return types.Position(line=start.line, character=start.character + units(lines[0]))
    return types.Position(line=start.line + len(lines) - 1, character=units(lines[-1]))


def typed_after(doc, shown: str, limit: int = 200) -> str:
    """What follows the last occurrence of `shown` in `doc`, to the end of the next non-blank line."""
    text = doc.source if doc is not None else ""
    i = text.rfind(shown)
    if i < 0:
        return ""
    rest = text[i + len(shown) : i + len(shown) + limit]
    lines = rest.split("\n")
    keep = [lines[0]]
    for line in lines[1:]:
        keep.append(line)
        if line.strip():
            break
    return "\n".join(keep)


def model_text(text: str) -> str:
    """`text` with lone surrogates (JSON allows "\\ud83d"; tokenizers reject them) as "?", one for one,
    so that columns stay put."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def buffer_name(uri: str) -> str:
    """The name a buffer has in prompts and the drafter's index: its path when it is a file."""
    try:
        return to_fs_path(uri) or uri
    except Exception:
        return uri


def _is_model_error(err: Exception) -> bool:
    return type(err).__name__ == "ModelError"


def _get(obj, *names, default=None):
    """Read a field of custom-request params (a namedtuple, dict or None)."""
    for name in names:
        if obj is None:
            return default
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return default if obj is None else obj


def build_server(settings: Settings | None = None) -> DittoServer:
    server = DittoServer(settings)

    @server.feature(types.INITIALIZE)
    def on_initialize(ls: DittoServer, params: types.InitializeParams):
        ls.loop = asyncio.get_running_loop() if _has_loop() else None
        if params.initialization_options is not None:
            ls.apply_settings(params.initialization_options, "initializationOptions", load=False)

    @server.feature(types.INITIALIZED)
    def on_initialized(ls: DittoServer, params: types.InitializedParams):
        ls.loop = asyncio.get_running_loop()
        ls.request_load()

    @server.feature(types.SHUTDOWN)
    def on_shutdown(ls: DittoServer, params):
        ls.scheduler.close()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def on_configuration(ls: DittoServer, params: types.DidChangeConfigurationParams):
        ls.apply_settings(params.settings, "workspace/didChangeConfiguration")

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def on_open(ls: DittoServer, params: types.DidOpenTextDocumentParams):
        ls.mark_dirty(params.text_document.uri, params.text_document.text)
        ls.aim(params.text_document.uri, types.Position(line=0, character=0))

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def on_change(ls: DittoServer, params: types.DidChangeTextDocumentParams):
        doc = ls.document(params.text_document.uri)
        if doc is not None:
            ls.mark_dirty(doc.uri, doc.source)
            ls.note_change(params.text_document.uri, params)
            end = edit_end(params.content_changes, ls.workspace.position_codec.client_num_units)
            if end is not None:
                ls.aim(params.text_document.uri, end)

    @server.feature(CURSOR)
    def on_cursor(ls: DittoServer, params):
        uri = _get(params, "textDocument", "uri")
        line, char = _get(params, "position", "line"), _get(params, "position", "character")
        if isinstance(uri, str) and isinstance(line, int) and isinstance(char, int) and line >= 0 and char >= 0:
            ls.aim(uri, types.Position(line=line, character=char))

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def on_close(ls: DittoServer, params: types.DidCloseTextDocumentParams):
        ls.mark_dirty(params.text_document.uri, None)
        ls.traces.pop(params.text_document.uri, None)
        ls._request_seq.pop(params.text_document.uri, None)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: DittoServer, params: types.InlineCompletionParams):
        snap = ls.snapshot(params.text_document.uri, params.position)
        if snap is None:
            ls.counters.invalid += 1
            return None
        sel = params.context.selected_completion_info if params.context else None
        replace = _selected_range(ls, snap, sel)
        if replace is not None:
            start_col, end_col = replace
            line_text = snap.text.split("\n")[snap.line]
            new_line = line_text[:start_col] + sel.text + line_text[end_col:]
            lines = snap.text.split("\n")
            lines[snap.line] = new_line
            snap = Snapshot(snap.uri, snap.version, "\n".join(lines), snap.line, start_col + len(sel.text),
                            snap.position)
        text = await ls.suggest(snap)
        if not text:
            return None
        if replace is not None:
            items = [types.InlineCompletionItem(insert_text=sel.text + text, range=sel.range)]
        else:
            here = types.Range(start=snap.position, end=snap.position)
            items = [types.InlineCompletionItem(insert_text=text, range=here)]
            first = text.split("\n", 1)[0]
            invoked = params.context and params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
            if invoked and "\n" in text and first.strip():
                items.append(types.InlineCompletionItem(insert_text=first, range=here))
        return types.InlineCompletionList(items=items)

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[".", "(", " "]))
    async def completion(ls: DittoServer, params: types.CompletionParams):
        snap = ls.snapshot(params.text_document.uri, params.position)
        if snap is None:
            ls.counters.invalid += 1
            return None
        text = await ls.suggest(snap)
        if not text:
            return None
        line_text = snap.text.split("\n")[snap.line]
        start = snap.col
        while start > 0 and (line_text[start - 1].isalnum() or line_text[start - 1] == "_"):
            start -= 1
        word = line_text[start:snap.col]
        first = text.split("\n", 1)[0]
        edit_range = types.Range(start=ls.to_client(snap.text, snap.line, start), end=snap.position)
        item = types.CompletionItem(
            label=first if first.strip() else text.strip().split("\n", 1)[0],
            kind=types.CompletionItemKind.Text,
            detail="Ditto",
            documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=text) if "\n" in text else None,
            filter_text=word + first,
            sort_text="0",
            insert_text_format=types.InsertTextFormat.PlainText,
            text_edit=types.TextEdit(range=edit_range, new_text=word + text),
        )
        return types.CompletionList(is_incomplete=True, items=[item])

    @server.feature(STATS)
    def stats(ls: DittoServer, params):
        return ls.stats(intervals=bool(_get(params, "remoteIntervals", default=False)))

    @server.feature(TRACE)
    def trace(ls: DittoServer, params):
        uri = _get(params, "uri") or _get(params, "textDocument", "uri")
        if uri is not None and not isinstance(uri, str):
            raise JsonRpcInvalidParams("ditto/trace: uri must be a string")
        if uri is None:
            return None
        return ls.traces.get(uri)

    @server.feature(DEBUG_DOCUMENT)
    def debug_document(ls: DittoServer, params):
        if not ls.settings.debug_documents:
            raise JsonRpcMethodNotFound(f"{DEBUG_DOCUMENT} is off: needs `serve --debug-hooks` and debugDocuments")
        uri = _get(params, "uri")
        if not isinstance(uri, str):
            raise JsonRpcInvalidParams(f"{DEBUG_DOCUMENT}: uri must be a string")
        doc = ls.document(uri)
        return None if doc is None else {"uri": uri, "version": doc.version, "text": doc.source}

    return server


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _selected_range(ls: DittoServer, snap: Snapshot, sel) -> tuple[int, int] | None:
    """(start, end) code-point columns of the selected completion's range, if it can be honoured."""
    if sel is None:
        return None
    r = sel.range
    if r.start.line != snap.line or r.end.line != snap.line or "\n" in sel.text:
        log.info("selectedCompletionInfo not on the cursor line: ignored")
        return None
    line_text = snap.text.split("\n")[snap.line].removesuffix("\r")
    codec = ls.workspace.position_codec
    start = codec.position_from_client_units([line_text], types.Position(0, min(r.start.character,
                                                                               codec.client_num_units(line_text))))
    end = codec.position_from_client_units([line_text], types.Position(0, min(r.end.character,
                                                                             codec.client_num_units(line_text))))
    if not (start.character <= snap.col <= end.character):
        log.info("selectedCompletionInfo range does not contain the cursor: ignored")
        return None
    return start.character, end.character

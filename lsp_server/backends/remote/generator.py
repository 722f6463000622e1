"""`RemoteGenerator`: the Completer's generation step for a remote engine (one streaming
request per completion, closed as soon as the suggestion has ended).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

from lsp_server.backends.base import Generator
from lsp_server.backends.remote.http import RemoteError, Request, Stop
from lsp_server.decoding.types import Completion, Generated, Stats
from lsp_server.numbers import percentile

log = logging.getLogger(__name__)


class RemoteGenerator(Generator):
    """The Completer's generation step for a remote engine (lsp_server/backends/base.py, `Generator`).

    Streams the completion, hands the Completer's `done(text)` every new piece, and closes
    the connection as soon as it says the suggestion has ended, or when `cancel` is set
    (cancelled or superseded) or the time budget is spent. A failure gives an empty
    suggestion; the first failure of an outage is logged once and carries a `notice`
    (the server shows it once); the next success logs that the engine is back.
    """

    drafts = False  # the engine speculates on its own; Ditto's drafters are not used
    # Token healing's mask is not sent (an OpenAI-style engine takes no per-token mask): the
    # prompt keeps the typed word and only trailing blanks are healed (docs/team.md).
    constrains = False
    # `stats` may be read from the server's event loop while a request streams on the model worker:
    # what it reads is behind `_counted`, the lock of the counts (lsp_server/lsp/threads.py).
    live_stats = True

    def __init__(self, model):  # a RemoteModel (lsp_server/backends/remote/model.py)
        self.model = model
        self.problem: str | None = None  # kind of failure that began the current outage, None while healthy
        # ok: the engine answered (whether the suggestion then ran out, was cut by the stop rules, timed
        # out or was cancelled); errors: it failed. cancelled, stop_rule and time say how requests ended.
        self.counts = {"requests": 0, "ok": 0, "errors": 0, "cancelled": 0, "stop_rule": 0, "time": 0}
        self.first_piece_ms: deque = deque(maxlen=1000)
        self.intervals: deque = deque(maxlen=4000)  # (start, first piece or None, end, outcome), wall clock
        self.in_flight = 0
        self.pieces = 0  # streamed pieces received, counted as they arrive (tests wait on it)
        self._counted = threading.Lock()  # counts, in_flight, pieces, first_piece_ms, intervals, problem
        stop_texts = {model.token_text(t) for t in model.stop_ids}
        self.stop_texts = sorted(t for t in stop_texts if t.strip())

    def forget(self, key: str) -> None:
        pass  # the engine keeps its own prefix cache

    def body(self, prompt_text: str, opts) -> dict:
        ep = self.model.endpoint
        if ep.engine == "ollama":
            o = {"num_predict": opts.max_new_tokens, "temperature": opts.temperature, "repeat_penalty": 1.0,
                 "stop": self.stop_texts}
            if not opts.greedy:
                o.update(top_p=opts.top_p, **({"top_k": opts.top_k} if opts.top_k else {}))
            if opts.seed is not None:
                o["seed"] = opts.seed
            body = {"model": ep.served, "prompt": prompt_text, "raw": True, "stream": True, "options": o}
        else:
            body = {"prompt": prompt_text, "max_tokens": opts.max_new_tokens, "temperature": opts.temperature,
                    "stream": True}
            if ep.served:
                body["model"] = ep.served
            if self.stop_texts:
                body["stop"] = self.stop_texts
            if not opts.greedy:
                body["top_p"] = opts.top_p
                if opts.top_k:
                    body["top_k"] = opts.top_k
            if opts.seed is not None:
                body["seed"] = opts.seed
            if ep.engine == "llama.cpp":
                body.update(repeat_penalty=1.0, top_k=opts.top_k if not opts.greedy else 0, min_p=0.0)
                if opts.greedy:
                    body["top_p"] = 1.0
            elif ep.engine == "vllm":
                body["skip_special_tokens"] = False
        return _merge(body, self.model.transport.body)

    def generate(self, prompt, *, options, done: Callable[[str], bool], cancel: threading.Event | None = None,
                 **_ignored):
        opts = options
        t0 = time.perf_counter()
        wall0 = time.time()
        stats = Stats(prefill_tokens=len(prompt.ids))
        cancel = cancel or threading.Event()
        deadline = None if opts.time_budget_s is None else time.monotonic() + opts.time_budget_s
        text = ""
        first = [None]
        pieces = [0]

        def on_piece(piece: str) -> bool:
            nonlocal text
            if cancel.is_set():  # checked here too, so a stream that keeps coming stops at once
                raise Stop("cancelled")
            if deadline is not None and time.monotonic() >= deadline:
                raise Stop("time")
            if first[0] is None:
                first[0] = time.perf_counter()
            pieces[0] += 1  # one event is one token on llama.cpp; vLLM may send several in one
            with self._counted:
                self.pieces += 1
            if not piece:
                return False
            text += piece
            cut = _first_stop(text, self.stop_texts)
            if cut is not None:
                text = text[:cut]
                raise _StopText()
            return done(text)

        with self._counted:
            self.counts["requests"] += 1
            self.in_flight += 1
        req = Request(self.model.endpoint, self.model.transport, cancel, deadline)
        notice = None
        outcome = "ok"
        try:
            finish = req.run(self.body(self.model.decode(prompt.ids), opts), on_piece)
            stats.stop_reason = {"stop": "eos", "length": "length", "stop-rule": "stop-rule"}.get(finish or "", finish or "eos")
            if finish == "stop-rule":
                with self._counted:
                    self.counts["stop_rule"] += 1
        except _StopText:
            stats.stop_reason = "eos"
        except Stop as stop:
            stats.stop_reason = str(stop)
            outcome = stats.stop_reason
            if stats.stop_reason == "time" and first[0] is None:
                # Nothing at all in the whole time budget: the engine is stuck or swamped.
                notice = self._failed(RemoteError("slow", f"{self.model.endpoint.url} sent nothing in "
                                                          f"{opts.time_budget_s:.1f} s"))
                stats.stop_reason, outcome, text = "error", "error", ""
            else:
                with self._counted:
                    self.counts["cancelled" if stats.stop_reason == "cancelled" else "time"] += 1
        except RemoteError as err:
            notice = self._failed(err)
            stats.stop_reason, outcome, text = "error", "error", ""
        finally:
            with self._counted:
                self.in_flight -= 1
        if outcome != "error" and req.answered:
            # Only an answer ends an outage: a request superseded while it was still connecting to
            # a dead host proves nothing (and must not make the next failure a new message).
            with self._counted:
                self.counts["ok"] += 1
                if first[0] is not None:
                    self.first_piece_ms.append((first[0] - t0) * 1000)
                back, self.problem = self.problem is not None, None
            if back:
                log.info("the engine at %s answers again", self.model.endpoint.url)
        end = time.perf_counter()
        stats.tokens = stats.generated = pieces[0]
        stats.wall_ms = (end - t0) * 1000
        stats.prefill_ms = ((first[0] or end) - t0) * 1000
        stats.decode_ms = stats.wall_ms - stats.prefill_ms
        with self._counted:
            self.intervals.append((round(wall0, 4), None if first[0] is None else round(wall0 + first[0] - t0, 4),
                                   round(wall0 + end - t0, 4), outcome))
        return Generated(text, Completion([], stats, []), notice)

    def _failed(self, err: RemoteError) -> str | None:
        """Count a failure; log it and return the notice only when it starts an outage.

        An outage lasts until a request succeeds, whatever its failures are (an engine going
        down resets the open stream, then refuses connections: one outage, one message).
        """
        with self._counted:
            self.counts["errors"] += 1
            ongoing = self.problem is not None
            if not ongoing:
                self.problem = err.kind
        if ongoing:
            log.debug("engine still failing: %s", err)
            return None
        msg = f"Ditto: the remote engine failed: {err} (suggestions are empty until it answers)"
        log.error("%s", msg)
        return msg

    def stats(self, intervals: bool = False) -> dict:
        """The counts; from any thread (`live_stats`)."""
        with self._counted:
            counts, in_flight, pieces, problem = dict(self.counts), self.in_flight, self.pieces, self.problem
            firsts = list(self.first_piece_ms)
            spans = list(self.intervals) if intervals else None
        out = {**counts, "in_flight": in_flight, "pieces": pieces, "url": self.model.endpoint.url,
               "engine": self.model.endpoint.engine, "tokenizer": self.model.tokenizer.source, "failing": problem,
               "first_piece_ms": {"p50": percentile(firsts, 50, 1), "p95": percentile(firsts, 95, 1)}}
        if intervals:
            out["intervals"] = spans
        return out


class _StopText(Exception):
    """A stop token's text arrived in the stream."""


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out

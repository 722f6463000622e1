"""Run the systems over harvested tasks and produce per-task records (see metrics.py).

Completion mode runs every system on one task before the next task, on the same prompt
and token budget: `off` first (it prefills the prompt under the task's cache key and is
the reference), then the other Ditto systems (reusing that prefill), then the
transformers systems (budget = the tokens `off` generated). Keystroke mode types the
ground truth one character at a time and requests a completion after each keystroke.
Session mode replays several tasks of one file in sequence with one cache (session.py).

Every system starts each task (session) with a fresh prompt window for the document
(context.py), so a system's prompts never depend on which system or task ran before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from ditto_bench.quality import completion_quality, typed_quality
from ditto_bench.systems import DITTO, fixed_k, generated_ids, run_ditto, run_hf


def same_output(run, ref) -> bool:
    """Same suggestion as `off`, token for token up to where the stop rules cut.

    The engine applies the Completer's stop rule after each round, so a system that gains
    several tokens per pass may return a few tokens past the point where `off` stopped;
    those never reach the user (the ghost-text rules cut them). So: equal text, and one
    token list a prefix of the other.
    """
    n = min(len(run.tokens), len(ref.tokens))
    return run.text == ref.text and run.tokens[:n] == ref.tokens[:n]


class Bench:
    def __init__(self, lm, completer, options, lookup_tokens: int = 10):
        self.lm = lm
        self.completer = completer
        self.options = options
        self.lookup_tokens = lookup_tokens
        self.drafters: dict = {}  # the drafting systems' drafters, one each (systems.py `bench_drafter`)

    def open(self, path: str, text: str, buffers) -> None:
        """The files open in the editor for a task, as the server's drafter sees them: the document
        and the other buffers are the n-gram drafters' named sources (the prompt's snippets come from
        the task itself). Files of an earlier task are closed."""
        c = self.completer
        wanted = {path: text, **dict(buffers)}
        for name in [n for n in c.buffer_names() if n not in wanted]:
            c.forget_buffer(name)
        for name, body in wanted.items():
            if c.buffer_text(name) != body:
                c.set_buffer(name, body)

    def _index(self, system: str) -> None:
        """Index the open buffers now for a drafting system, as the server's idle work has by the
        time a request comes (lsp_server/completion/buffers.py; it indexes only for a lookup drafter)."""
        if system.removesuffix("-noreuse").startswith("ngram"):
            self.completer.drafting("ngram", self.options)  # the drafter the user has (Completer.index_wanted)
            ob = self.completer.buffers
            while ob.step():
                pass

    def forget_generations(self) -> None:
        """The drafters forget what they saw generated (after the warm-up: its runs are not the user's)."""
        for d in [self.completer.ngram, *self.drafters.values()]:
            if hasattr(d, "forget_memory"):
                d.forget_memory()

    # -- warm-up ---------------------------------------------------------------------------
    def warm_up(self, task, systems: list[str], mode: str) -> None:
        """Run each system once on a short budget (results discarded)."""
        short = replace(self.options, max_new_tokens=min(4, self.options.max_new_tokens))
        ref = None
        for s in systems:
            base = s.removesuffix("-noreuse")
            if base in DITTO or fixed_k(base):
                _, sug = run_ditto(self.completer, task, base, short, None, reference=ref, drafters=self.drafters,
                                   name=s)
                ref = sug if base == "off" else ref
            elif ref is not None:
                run_hf(self.lm, ref.prompt.ids, s, 4, self.lookup_tokens)
        self.completer.engine.clear_cache()
        self.completer.forget_window(task.path)
        self.forget_generations()

    # -- completion mode --------------------------------------------------------------------
    def completion_task(self, task, systems: list[str]) -> list[dict]:
        key = f"bench:{task.id}"
        base = {"task": task.id, "copyable": task.copyable, "copyable_buffers": task.copyable_buffers,
                "truth_lines": task.truth.count("\n") + 1}
        records = []
        ref = None
        ref_run = None
        self.completer.forget_window(task.path)
        self.open(task.path, task.document, task.buffers)
        try:
            for s in systems:
                if s in DITTO or fixed_k(s):
                    self._index(s)
                    run, sug = run_ditto(self.completer, task, s, self.options, key, reference=ref,
                                         drafters=self.drafters)
                    if s == "off":
                        ref, ref_run = sug, run
                    else:
                        # Comparable end-to-end latency: the task's prefill (done once, by off) + own decode.
                        run.prefill_ms = ref_run.prefill_ms
                        run.latency_ms = ref_run.prefill_ms + run.decode_ms
                else:
                    budget = len(generated_ids(ref.completion))
                    _, run = run_hf(self.lm, ref.prompt.ids, s, budget, self.lookup_tokens)
                    from lsp_server.completion.stops import finish

                    run.text = finish(self.lm.decode(run.tokens), ref.prompt, self.completer.settings.multiline)
                rec = {**base, "system": s, **run.as_dict(), "raw": self.lm.decode(run.tokens)}
                if s == "off":  # the prompt, so that drafting policies can be replayed offline on off's tokens
                    rec["prompt_ids"] = list(ref.prompt.ids)
                rec["identical"] = same_output(run, ref_run)
                if s != "off" and not rec["identical"]:
                    rec["reference_text"] = ref_run.text
                rec.update(completion_quality(run.text, task.truth))
                records.append(rec)
        finally:
            self.completer.engine.forget(key)
        return records

    # -- keystroke mode ---------------------------------------------------------------------
    def keystroke_task(self, task, systems: list[str], max_keystrokes: int | None,
                       on_request: Callable[[], None] | None = None) -> Iterator[dict]:
        """One record per request: the empty block first, then after each typed character."""
        n = len(task.truth) if max_keystrokes is None else min(len(task.truth), max_keystrokes)
        for s in systems:
            base = s.removesuffix("-noreuse")
            key = None if s.endswith("-noreuse") else f"doc:{task.path}"
            self.completer.forget_window(task.path)
            try:
                for i in range(n + 1):
                    text, line, col = task.typed(i)
                    self.open(task.path, text, task.buffers)
                    self._index(s)
                    run, sug = run_ditto(self.completer, task, base, self.options, key, text=text, line=line, col=col,
                                         drafters=self.drafters, name=s)
                    rec = {"task": task.id, "system": s, "keystroke": i, "copyable": task.copyable,
                           "tts_ms": round(run.latency_ms, 2), "typethrough": bool(getattr(sug, "typethrough", False)),
                           **run.as_dict(), **typed_quality(task.typing, i, run.text)}
                    if on_request:
                        on_request()
                    yield rec
            finally:
                if key is not None:
                    self.completer.engine.forget(key)

    # -- session mode -----------------------------------------------------------------------
    def session(self, session, systems: list[str], max_keystrokes: int | None,
                on_request: Callable[[], None] | None = None, idle_prefill: bool = True) -> Iterator[dict]:
        """One record per request of the session replay (session.py), each system in turn.

        A system with a cache key keeps one KV cache for the whole session (`doc:<path>`),
        as the server keeps one per document; a -noreuse system passes none. Both follow
        the same prompt windows (the Completer keys them by the document's name).

        `idle_prefill`: the user pauses where they arrive (a `move`) before typing, and the
        server prefills the prompt there meanwhile (server.py idle prefill, Completer.warm);
        that prefill is the record's `idle_prefill_tokens` / `idle_prefill_ms` and is not part
        of its time to suggestion. Systems without a cache key have nothing to prefill into.
        """
        from ditto_bench.session import events

        refs: dict[int, object] = {}  # off's suggestion per request, for the oracle (the n-th request of each)
        for s in systems:
            base = s.removesuffix("-noreuse")
            key = None if s.endswith("-noreuse") else f"doc:{session.path}"
            self.completer.forget_window(session.path)
            self.completer.engine.clear_cache()
            prev = None  # the previous prompt of this system in this session
            try:
                for n, ev in enumerate(events(session, max_keystrokes)):
                    task = ev.task
                    idle_tokens, idle_ms = 0, 0.0
                    if idle_prefill and key is not None and ev.kind == "move":
                        warm = self.completer.warm(ev.text, ev.line, ev.col, name=task.path, cache_key=key,
                                                   others=list(session.buffers))
                        idle_tokens, idle_ms = warm.prefill_tokens, warm.prefill_ms
                    self.open(session.path, ev.text, session.buffers)
                    self._index(s)
                    # The oracle drafts off's tokens of the same request (its prompt checked: OracleDrafter).
                    ref = refs.get(n) if base == "oracle" else None
                    run, sug = run_ditto(self.completer, _with_buffers(task, session.buffers), base, self.options, key,
                                         text=ev.text, line=ev.line, col=ev.col, drafters=self.drafters, name=s,
                                         reference=ref)
                    typethrough = bool(getattr(sug, "typethrough", False))
                    if s == "off":
                        refs[n] = sug
                    rec = {"session": session.id, "task": task.id, "system": s, "event": ev.kind,
                           "keystroke": ev.keystroke, "line": ev.line, "copyable": task.copyable,
                           "tts_ms": round(run.latency_ms, 2), "typethrough": typethrough,
                           "start_line": None if typethrough else sug.prompt.start_line,
                           "window_moved": (not typethrough and prev is not None
                                            and sug.prompt.start_line != prev.start_line),
                           # Prompt tokens an idle prefill computed while the user paused before this request.
                           "idle_prefill_tokens": idle_tokens, "idle_prefill_ms": round(idle_ms, 1),
                           **run.as_dict(), **typed_quality(task.truth, ev.keystroke, run.text)}
                    if not typethrough:
                        prev = sug.prompt
                    if on_request:
                        on_request()
                    yield rec
            finally:
                if key is not None:
                    self.completer.engine.forget(key)
                self.completer.forget_window(session.path)


def _with_buffers(task, buffers):
    """The task with the session's open buffers (one session: one set of buffers)."""
    return task if task.buffers == buffers else replace(task, buffers=list(buffers))

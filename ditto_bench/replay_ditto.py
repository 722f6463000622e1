"""Ditto in the editor replay: `ditto-lsp serve` over LSP, driven as Ditto's editor plugins drive it.

`DittoDriver` starts the server (pinned to the replay's first core, one thread) with the
initializationOptions its system name says (`ditto_options`: `-nodraft`, `-whole`, `@N`, `~SOURCE`,
`#KEY=VALUE`; `replay_model`: `+MODEL`), sends didOpen, incremental didChange in UTF-16 units,
`ditto/didMoveCursor` 150 ms into every pause and `textDocument/inlineCompletion`, and reads each
answer's `ditto/trace` for the record. `ditto-base` runs another checkout's server at its own
defaults, but for its `#KEY=VALUE`s.

Left out on purpose: the script (replay_script.py), the peer (replay_peer.py), the loop over a
session (replay.py) and the raw LSP client itself (client.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from ditto_bench.replay_script import Ask, Edit, Open, Pause, ReplayOptions
from ditto_bench.systems import is_base, name_options, replay_snippets, replay_system

CURSOR_NOTICE_S = 0.15  # Ditto's plugins send ditto/didMoveCursor this long into a pause
QUIET_WAIT_S = 20.0  # the longest wait, after a system's session, for its server's idle work to end


def replay_model(name: str, default: str) -> str:
    """The model spec of a Ditto system: what follows `+` in its name (before any `#KEY=VALUE`), else
    the bench's --model."""
    head = name.split("#", 1)[0]
    return head.split("+", 1)[1] if "+" in head else default


def ditto_options(name: str) -> dict:
    """initializationOptions of a Ditto system beyond the server's defaults: what its base and
    suffixes say, then each `#KEY=VALUE` (systems.name_options)."""
    base, context = replay_system(name)
    out = {}
    if base == "ditto-nodraft":
        out["drafter"] = "none"
    if base == "ditto-whole":
        out["wholeFile"] = True  # the whole file above from a warm KV per file (issue 40)
    if context is not None:
        out["contextTokens"] = context
    if replay_snippets(name) is not None:
        out["snippets"] = replay_snippets(name)
    return {**out, **(name_options(name) or {})}  # `#KEY=VALUE` last: it wins


def log_name(system: str) -> str:
    """The file of a system's server log: its name, with what a file name should not hold replaced."""
    return re.sub(r"[^\w.@~+#=-]", "_", system) + ".log"


@contextlib.contextmanager
def pinned(core: int | set[int] | None):
    """Run the block with this thread pinned to `core` (or a set of cores): a process started inside
    inherits it, exactly as `taskset -c core` pins what it starts. The thread's affinity is restored after."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, core if isinstance(core, set) else {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _commit(directory: str) -> str | None:
    import subprocess

    out = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class DittoDriver:
    """`ditto-lsp serve` over LSP, as Ditto's editor plugins drive it."""

    def __init__(self, system: str, options: ReplayOptions):
        self.system = system
        self.opts = options
        self.client = None
        self.info: dict = {}
        self.uris: list[str] = []
        self.uri = ""
        self.version = 0
        self.lines: list[str] = []

    def start(self) -> None:
        from ditto_bench.client import RawClient

        o = self.opts
        args = ["--model", replay_model(self.system, o.model), "--backend", o.backend]
        if o.check_continuations and not is_base(self.system):
            args.append("--debug-hooks")
        threads = o.ditto_threads
        env = {"OMP_NUM_THREADS": str(threads), "DITTO_LLAMA_THREADS": str(threads)}
        cwd = None
        if is_base(self.system):
            if o.baseline is None:
                raise RuntimeError("ditto-base runs the server of another checkout: give --baseline DIR")
            cwd = str(Path(o.baseline).resolve())  # `python -m lsp_server.cli` there imports that checkout's code
            env["PYTHONPATH"] = cwd
        log = open(o.log_dir / log_name(self.system), "ab") if o.log_dir else None
        try:
            with pinned(None if o.cores[0] is None else
                        {(o.cores[0] + i) % (os.cpu_count() or 1) for i in range(threads)}):
                self.client = RawClient(args, env=env, stderr=log, cwd=cwd)
        finally:
            if log is not None:
                log.close()
        settings = ditto_options(self.system)
        if "--debug-hooks" in args:
            settings["debugCheckPlaces"] = True
        self.client.initialize(settings, root=Path(o.repo).as_uri() if o.repo else None)
        end = self.client.wait_ready(timeout=900)
        st = self.client.stats()
        if end["params"]["value"].get("message") != "ready":
            raise RuntimeError(f"{self.system}: the model did not load: {st.get('model_error')}")
        self.info = {"system": self.system, "serve": ["ditto-lsp", "serve", *args], "initializationOptions": settings,
                     "name_options": name_options(self.system),
                     **({"checkout": cwd, "commit": _commit(cwd)} if cwd else {}),
                     "core": o.cores[0], "threads": threads, "env": env, "pid": self.client.pid,
                     **{k: st.get(k) for k in ("model", "backend", "device", "dtype", "context_tokens",
                                               "context_fitted_to")}}

    def stop(self) -> None:
        if self.client is not None:
            try:
                # The drafter's index work over the whole run (lsp_server/completion/buffers.py): slices run,
                # buffers indexed, and whether indexing was wanted at the end (no draft pays: not).
                st = self.client.stats()
                idx = st.get("index") or {}
                self.info["index"] = {k: idx.get(k) for k in ("wanted", "steps", "indexings", "tokens")}
                # The budget at the end: requests whose prefill cost less per token than the load's measurement fit
                # it again (lsp_server/completion/fitting.py `Fit.observe`), so the load's context_tokens above
                # need not be the one most requests ran at.
                self.info["context_tokens_at_end"] = st.get("context_tokens")
                self.info["context_fitted_to_at_end"] = st.get("context_fitted_to")
                # What the prompts held beside the document over the run (docs/design.md, "Definitions and recent
                # edits in the prompt"): the resolver's jobs and time, the share of prompts with each section.
                self.info["definitions"] = st.get("definitions")
                self.info["recent_edits"] = st.get("recent_edits")
            except Exception:  # noqa: BLE001  (a server that died: nothing to read, stop it anyway)
                pass
            try:
                self.client.shutdown_and_exit(timeout=30)
            except (OSError, TimeoutError, EOFError):
                pass
            self.client.kill()
            self.client = None

    def open(self, step: Open, repo: str) -> dict:
        c = self.client
        before = c.stats()["idle_prefill"]
        root = Path(repo).resolve()
        self.uris = []
        for path, text in [*step.buffers, (step.path, step.text)]:
            uri = (root / path).as_uri()
            c.open(uri, text)
            self.uris.append(uri)
        self.uri, self.version, self.lines = self.uris[-1], 1, step.text.split("\n")
        # Wait until idle: nothing pending, and an idle prefill finished unstopped since the opens.
        t0 = time.monotonic()
        idle = False
        while True:
            st = c.stats()
            now = st["idle_prefill"]
            if st["worker_pending"] == 0 and now["runs"] - now["stopped"] > before["runs"] - before["stopped"]:
                idle = True
                break
            if time.monotonic() - t0 >= self.opts.idle_wait_s * self.opts.pause_scale:
                break
            time.sleep(0.05)
        return {"idle_wait_ms": round((time.monotonic() - t0) * 1000, 1), "idle_reached": idle}

    def close(self) -> None:
        for uri in self.uris:
            self.client.close_doc(uri)
        self.uris = []
        # Let the server finish its own idle work (a suggestion's continuation, idle prefill, indexing)
        # before another system's turn: all Ditto servers share one core, and one's background work
        # must not run inside another's requests.
        t0 = time.monotonic()
        while time.monotonic() - t0 < QUIET_WAIT_S:
            st = self.client.stats()
            # .get: an older checkout's server (ditto-base) has no worker_idle_work; it then waits for its queue only.
            if st["worker_pending"] == 0 and not st.get("worker_idle_work", False):
                break
            time.sleep(0.05)

    def edit(self, step: Edit) -> None:
        start = {"line": step.line, "character": _utf16(self.lines[step.line][: step.col])}
        end = {"line": step.end_line, "character": _utf16(self.lines[step.end_line][: step.end_col])}
        self.version += 1
        self.client.change(self.uri, self.version, [{"range": {"start": start, "end": end}, "text": step.text}])
        self.lines = step.document.split("\n")

    def pause(self, step: Pause) -> None:
        total = step.seconds * self.opts.pause_scale
        first = min(CURSOR_NOTICE_S * self.opts.pause_scale, total)
        time.sleep(first)
        line, col = step.cursor
        self.client.notify("ditto/didMoveCursor", {"textDocument": {"uri": self.uri},
                                                   "position": {"line": line, "character": _utf16(self.lines[line][:col])}})
        time.sleep(total - first)

    def ask(self, step: Ask) -> dict:
        c = self.client
        char = _utf16(self.lines[step.line][: step.col])
        t0 = time.monotonic()
        rid = c.inline(self.uri, step.line, char)
        try:
            msg = c.wait(rid, self.opts.answer_timeout_s)
        except TimeoutError:
            return {"timeout": True, "tts_ms": None, "text": ""}
        tts = (c.responses[rid][1] - t0) * 1000
        result = msg.get("result")
        items = (result.get("items") if isinstance(result, dict) else result) or []
        text = items[0].get("insertText", "") if items else ""
        if isinstance(text, dict):  # a StringValue
            text = text.get("value", "")
        rec = {"timeout": False, "tts_ms": round(tts, 1), "text": text, "error": msg.get("error")}
        trace = c.call("ditto/trace", {"uri": self.uri}, timeout=60).get("result") or {}
        same = (trace.get("version") == self.version
                and trace.get("position") == {"line": step.line, "character": char})
        stats = (trace.get("stats") or {}) if same else {}
        rec.update({
            # The server keeps no trace for a type-through answer (the suggestion on screen): its trace is an older one.
            "typethrough": bool(text) and not same,
            "prompt_tokens_processed": stats.get("prefill_tokens"),
            "prompt_tokens": trace.get("prompt_tokens") if same else None,  # the context the model saw
            "prompt_sections": trace.get("prompt_sections") if same else None,  # tokens of each part of the prompt
            "whole_file": trace.get("whole_file") if same else None,  # the whole file above (issue 40)
            "reused_tokens": stats.get("reused_tokens"),
            "prefill_ms": stats.get("prefill_ms"),
            "decode_ms": stats.get("decode_ms"),
            "generated": stats.get("generated"),
            "drafted": stats.get("drafted"),
            "stop_reason": trace.get("stop_reason") if same else None,
            "raw": trace.get("raw") if same else None,
            "sure": trace.get("sure") if same else None,
            "withheld": trace.get("withheld") if same else None,  # what `show` held back (completion/show.py)  # [text, probability, lead] per token of `raw`
            "server_latency_ms": trace.get("latency_ms") if same else None,
            "waited_ms": trace.get("waited_ms") if same else None,
            "job_ms": trace.get("job_ms") if same else None,
            "ahead": bool(trace.get("ahead")) if same else None,  # answered from a suggestion generated while idle
        })
        if self.opts.check_continuations and not is_base(self.system) and rec["stop_reason"] == "paused":
            rec["continuation"] = c.call("ditto/debug/checkPlace", {"uri": self.uri}, timeout=600).get("result")
        return rec

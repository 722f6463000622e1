"""Editor replay: the same edits, pauses and requests sent to real servers the way editors drive them.

The systems (`ditto-lsp bench --mode session --systems ditto,llama-server`):

- ``ditto`` (and ``ditto-nodraft``, ``ditto@N``): `ditto-lsp serve` over LSP through the raw
  client (ditto_bench/client.py), as Ditto's editor plugins drive it: didOpen, incremental
  didChange, `textDocument/inlineCompletion`, and `ditto/didMoveCursor` 150 ms into every
  pause. Its settings are the server's defaults, the bench's --model/--backend, and what the
  name says (`-nodraft`: drafter none; `@N`: contextTokens N).
- ``llama-server``: llama.cpp's own server (ditto_bench/peer.py) driven as the llama.vim
  plugin drives it: the other buffers entered and the ring of extra context flushed before
  the first block, then one CursorMovedI per request; its suggestion is llama.vim's own
  rendering of `content`. llama.vim's speculative follow-up is sent only with `followup`.

Each runs in its own process pinned to one core (`taskset -c`), one thread, one request at a
time: every answer (or a timeout) is waited for before the next event.

The event script (`script`), the same for every system, from a session of session.py (one
file of one commit, its blocks replaced by one empty line each, the commit's other files
open):

1. open the other buffers, then the session document; cursor on line 1; wait until the server
   is idle (Ditto: `ditto/stats` shows no pending work and an idle prefill finished, or 5 s;
   the peer: the ring flushed); then, with `open_rest` (`--open-rest SECONDS`), rest that long
   with the cursor on line 1 (a developer reads a file before typing: Ditto's idle work fills
   the file's prefix KV, llama.vim sends its ring updates as in any pause);
2. for each block, top down (a place not visited yet):
   a. ``arrive`` (cold): the cursor jumps to the block's empty line, which gets the first
      line's indentation, and a request is made at once (the editor's own arrival request);
   b. a rest of 1.0 s;
   c. for each line k of the block: for k >= 1 the rest of line k-1 is inserted at once, then
      Enter and line k's indentation; then line k's first non-blank character is typed, a
      pause of 0.3 s, and a ``line`` request (warm: the place was visited). A blank line gets
      its Enter and no request;
   d. the rest of the last line is inserted at once. Typed blocks stay in the document.

Pauses are multiplied by `pause_scale` (tests run at 0.01). Every request's record has the
time to suggestion (request sent -> answer received, client wall clock), the idle time the
system had before it, the suggestion and its quality against the truth (`request_quality`).

Left out on purpose: aggregation (metrics.summarise_replay) and tables (report.py); the
in-process session systems (runner.Bench.session).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ditto_bench.metrics import edit_similarity, normalise
from ditto_bench.systems import REPLAY_PEER as PEER
from ditto_bench.systems import replay_snippets, replay_system

REST_S = 1.0  # the rest after arriving at a block
LINE_PAUSE_S = 0.3  # the pause after a line's first character, before its request
CURSOR_NOTICE_S = 0.15  # Ditto's plugins send ditto/didMoveCursor this long into a pause
QUIET_WAIT_S = 20.0  # the longest wait, after a system's session, for its server's idle work to end
IDLE_WAIT_S = 5.0  # the longest wait for the server to go idle after opening a session
ANSWER_TIMEOUT_S = 120.0  # a request not answered by then is recorded as a timeout


# -- the event script ------------------------------------------------------------------------
@dataclass(frozen=True)
class Open:
    path: str
    text: str
    buffers: tuple  # ((path, text), ...): the other open files, entered first


@dataclass(frozen=True)
class Edit:
    """One didChange: `text` replaces (line, col)-(end_line, end_col) of the document before it."""

    what: str  # arrive | char | rest | enter
    line: int
    col: int
    end_line: int
    end_col: int
    text: str
    cursor: tuple  # (line, col) after the edit
    document: str  # the whole document after the edit


@dataclass(frozen=True)
class Pause:
    seconds: float  # nominal (before pause_scale)
    cursor: tuple


@dataclass(frozen=True)
class Ask:
    """One completion request at the cursor and what the truth says it should suggest."""

    task: str
    block: int
    k: int  # line of the block (0-based)
    kind: str  # cold | warm
    event: str  # arrive | line
    line: int
    col: int
    typed: str  # the text on the line before the cursor
    true_line: str
    true_rest: str  # the rest of the true line and the block's later lines
    document: str


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def script(session, open_rest: float = 0.0) -> list:
    """The steps of the replay of `session` (session.Session), in order (module docstring)."""
    lines = session.document.split("\n")
    steps: list = [Open(session.path, session.document, tuple(session.buffers))]
    if open_rest > 0:
        steps.append(Pause(open_rest, (0, 0)))

    def edit(what, line, col, end_line, end_col, text, cursor):
        head, tail = lines[line][:col], lines[end_line][end_col:]
        lines[line : end_line + 1] = (head + text + tail).split("\n")
        steps.append(Edit(what, line, col, end_line, end_col, text, cursor, "\n".join(lines)))

    def ask(block_i, block, k, kind, event, line, col):
        truth = block.lines
        true_line = truth[k]
        typed = lines[line][:col]
        rest = "\n".join([true_line[len(typed):], *truth[k + 1:]])
        steps.append(Ask(block.task.id, block_i, k, kind, event, line, col, typed, true_line, rest, "\n".join(lines)))

    shift = 0  # lines added above the next block by the blocks typed so far
    for bi, block in enumerate(session.blocks):
        at = block.line + shift
        truth = block.lines
        first = _indent(truth[0])
        edit("arrive", at, 0, at, len(lines[at]), first, (at, len(first)))
        ask(bi, block, 0, "cold", "arrive", at, len(first))
        steps.append(Pause(REST_S, (at, len(first))))
        done = len(first)  # characters of the current line typed so far
        for k, target in enumerate(truth):
            row = at + k
            indent = _indent(target)
            if k >= 1:
                prev = truth[k - 1]
                if done < len(prev):
                    edit("rest", row - 1, done, row - 1, done, prev[done:], (row - 1, len(prev)))
                edit("enter", row - 1, len(prev), row - 1, len(prev), "\n" + indent, (row, len(indent)))
                done = len(indent)
            if len(target) == len(indent):  # a blank line: Enter only, no request
                continue
            edit("char", row, done, row, done, target[done], (row, done + 1))
            done += 1
            steps.append(Pause(LINE_PAUSE_S, (row, done)))
            ask(bi, block, k, "warm", "line", row, done)
        last = truth[-1]
        if done < len(last):
            row = at + len(truth) - 1
            edit("rest", row, done, row, done, last[done:], (row, len(last)))
        shift += len(truth) - 1
    return steps


# -- quality ---------------------------------------------------------------------------------
def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def first_line_exact(typed: str, suggestion: str, true_line: str) -> bool:
    """Does the typed text plus the suggestion's first line give back the true line (trailing blanks aside)?"""
    return (typed + suggestion.split("\n", 1)[0]).rstrip() == true_line.rstrip()


def misfire(typed: str, true_line: str, suggestion: str) -> bool | None:
    """Issue 25's whole-word misfire: None where it cannot happen (the typed text does not end
    with a letter, or the true line does not continue that word); else whether the suggestion
    went on as if the typed letters were a whole word (non-empty, first character not alnum/_)."""
    if not typed or not typed[-1].isalpha() or len(true_line) <= len(typed) or not _word(true_line[len(typed)]):
        return None
    return bool(suggestion) and not _word(suggestion[0])


def request_quality(typed: str, suggestion: str, true_line: str, true_rest: str) -> dict:
    return {
        "first_line_exact": first_line_exact(typed, suggestion, true_line),
        "edit_similarity": round(edit_similarity(normalise(suggestion), normalise(true_rest)), 4),
        "empty": not suggestion,
        "misfire": misfire(typed, true_line, suggestion),
    }


def typed_quality(truth: str, n: int, suggestion: str) -> dict:
    """`request_quality` where the first n characters of the block `truth` are typed (keystroke
    mode, the in-process session mode): the typed part of the cursor's line, its true line, and
    the rest of the block after the cursor."""
    typed = truth[:n]
    line_typed = typed.rsplit("\n", 1)[-1]
    return request_quality(line_typed, suggestion, truth.split("\n")[typed.count("\n")], truth[n:])


# -- systems ---------------------------------------------------------------------------------
def replay_model(name: str, default: str) -> str:
    """The model spec of a Ditto system: what follows `+` in its name, else the bench's --model."""
    return name.split("+", 1)[1] if "+" in name else default


def ditto_options(name: str) -> dict:
    """initializationOptions of a Ditto system beyond the server's defaults."""
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
    return out


@contextlib.contextmanager
def pinned(core: int | None):
    """Run the block with this thread pinned to `core`: a process started inside inherits it,
    exactly as `taskset -c core` pins what it starts. The thread's affinity is restored after."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
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


@dataclass
class ReplayOptions:
    model: str = "default"
    backend: str = "auto"
    cores: tuple = (0, 1)  # (Ditto's core, the peer's core); None: not pinned
    pause_scale: float = 1.0
    followup: bool = False  # llama.vim's speculative follow-up
    answer_timeout_s: float = ANSWER_TIMEOUT_S
    idle_wait_s: float = IDLE_WAIT_S
    log_dir: Path | None = None  # the servers' stderr
    peer_ctx: int = 32768
    peer_gguf: str | None = None  # default: the GGUF of `model`
    baseline: Path | None = None  # a checkout whose server `ditto-base` runs (e.g. a git worktree of an older commit)
    # After each request answered at a deadline, outside the timing: finish that generation and compare it with the
    # same one uninterrupted (`ditto/debug/checkPlace`). It changes what the server has done by the next request
    # (the continuation always finishes), so the times of a checked run are not those of a plain one.
    check_continuations: bool = False


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
        if o.check_continuations and self.system != "ditto-base":
            args.append("--debug-hooks")
        env = {"OMP_NUM_THREADS": "1", "DITTO_LLAMA_THREADS": "1"}
        cwd = None
        if self.system == "ditto-base":
            if o.baseline is None:
                raise RuntimeError("ditto-base runs the server of another checkout: give --baseline DIR")
            cwd = str(Path(o.baseline).resolve())  # `python -m lsp_server.cli` there imports that checkout's code
            env["PYTHONPATH"] = cwd
        log = open(o.log_dir / f"{self.system}.log", "ab") if o.log_dir else None
        try:
            with pinned(o.cores[0]):
                self.client = RawClient(args, env=env, stderr=log, cwd=cwd)
        finally:
            if log is not None:
                log.close()
        settings = ditto_options(self.system)
        if "--debug-hooks" in args:
            settings["debugCheckPlaces"] = True
        self.client.initialize(settings)
        end = self.client.wait_ready(timeout=900)
        st = self.client.stats()
        if end["params"]["value"].get("message") != "ready":
            raise RuntimeError(f"{self.system}: the model did not load: {st.get('model_error')}")
        self.info = {"system": self.system, "serve": ["ditto-lsp", "serve", *args], "initializationOptions": settings,
                     **({"checkout": cwd, "commit": _commit(cwd)} if cwd else {}),
                     "core": o.cores[0], "threads": 1, "env": env, "pid": self.client.pid,
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
            "whole_file": trace.get("whole_file") if same else None,  # the whole file above (issue 40)
            "reused_tokens": stats.get("reused_tokens"),
            "prefill_ms": stats.get("prefill_ms"),
            "decode_ms": stats.get("decode_ms"),
            "generated": stats.get("generated"),
            "drafted": stats.get("drafted"),
            "stop_reason": trace.get("stop_reason") if same else None,
            "raw": trace.get("raw") if same else None,
            "server_latency_ms": trace.get("latency_ms") if same else None,
            "waited_ms": trace.get("waited_ms") if same else None,
            "job_ms": trace.get("job_ms") if same else None,
            "ahead": bool(trace.get("ahead")) if same else None,  # answered from a suggestion generated while idle
        })
        if self.opts.check_continuations and self.system != "ditto-base" and rec["stop_reason"] == "paused":
            rec["continuation"] = c.call("ditto/debug/checkPlace", {"uri": self.uri}, timeout=600).get("result")
        return rec


class PeerDriver:
    """llama-server (ditto_bench/peer.py) driven as llama.vim drives it."""

    system = PEER

    def __init__(self, options: ReplayOptions, gguf: str):
        self.opts = options
        self.gguf = gguf
        self.server = None
        self.client = None
        self.info: dict = {}
        self._followup: threading.Thread | None = None

    def start(self) -> None:
        from ditto_bench.peer import PeerServer

        o = self.opts
        self.server = PeerServer(self.gguf, core=o.cores[1], n_ctx=o.peer_ctx,
                                 log_path=o.log_dir / f"{PEER}.log" if o.log_dir else None)
        url = self.server.start()
        try:
            from importlib import metadata

            version = metadata.version("xllamacpp")
        except Exception:  # noqa: BLE001  (only a label)
            version = None
        self.info = {"system": PEER, "command": self.server.command, "url": url, "gguf": str(self.gguf),
                     "core": o.cores[1], "threads": 1, "n_ctx": o.peer_ctx, "n_batch": 1024, "n_ubatch": 1024,
                     "n_cache_reuse": 256, "xllamacpp": version, "followup": o.followup,
                     "client": "ditto_bench/peer.py, llama.vim a1c8e6e4"}

    def stop(self) -> None:
        self._join_followup()
        if self.server is not None:
            self.server.stop()
            self.server = None

    def open(self, step: Open, repo: str) -> dict:
        from ditto_bench.peer import LlamaVimClient

        self.client = LlamaVimClient(self.server.url, seed=0, timeout=self.opts.answer_timeout_s,
                                     extra_fields=("stop_type", "tokens_evaluated"))
        t0 = time.monotonic()
        for path, text in step.buffers:
            self.client.buf_enter(path, text, 1)
        self.client.buf_enter(step.path, step.text, 1)
        n = self.client.ring_flush()
        return {"ring_updates": n, "ring_flush_ms": round((time.monotonic() - t0) * 1000, 1),
                "ring_chunks": len(self.client.ring_chunks)}

    def close(self) -> None:
        self._join_followup()
        self.client = None

    def edit(self, step: Edit) -> None:
        self.client.set_current(step.document, step.cursor[0] + 1, modified=True)

    def pause(self, step: Pause) -> None:
        total = step.seconds * self.opts.pause_scale
        # Ring ticks (every ring_update_ms) send in insert mode only once the cursor rested 3 s (L531).
        from ditto_bench.peer import RING_IDLE_S

        if total < RING_IDLE_S:
            time.sleep(total)
            return
        time.sleep(RING_IDLE_S)
        waited = RING_IDLE_S
        while waited + 1.0 <= total:
            t = time.monotonic()
            self.client.ring_update(insert_mode=True, idle_s=waited)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
            waited += 1.0
        time.sleep(max(0.0, total - waited))

    def _join_followup(self) -> None:
        if self._followup is not None:
            self._followup.join()
            self._followup = None

    def ask(self, step: Ask) -> dict:
        t0 = time.perf_counter()
        self._join_followup()  # llama.vim defers a request while one is in flight (L714-722)
        try:
            res = self.client.on_insert_move(step.col, step.line + 1, followup=self.opts.followup, t0=t0)
        except TimeoutError:
            return {"timeout": True, "tts_ms": None, "text": ""}
        if self.opts.followup and res.followup is not None:
            self._followup = threading.Thread(target=self.client.send_followup, args=res.followup, daemon=True)
            self._followup.start()
        text = res.text if res.can_accept else ""
        sent = res.sent_fim
        return {
            "timeout": False, "tts_ms": round(res.wall_ms, 1), "text": text,
            "typethrough": res.from_cache,  # shown from llama.vim's cache before any answer
            "prompt_tokens_processed": sent.timings.get("prompt_n") if sent else None,
            "prompt_tokens": sent.tokens_evaluated if sent else None,  # the context the model saw
            "tokens_cached": sent.tokens_cached if sent else None,
            "generated": sent.timings.get("predicted_n") if sent else None,
            "prefill_ms": sent.timings.get("prompt_ms") if sent else None,
            "decode_ms": sent.timings.get("predicted_ms") if sent else None,
            "stop_reason": sent.stop_type if sent else None,
            "raw": res.content,
            "request_sent": sent is not None,
            "request_ms": round(sent.wall_ms, 1) if sent else None,
        }


def peer_gguf(model: str, workdir: Path) -> str:
    """The GGUF file the peer loads for Ditto's model spec (the same file Ditto's llama.cpp backend reads)."""
    from lsp_server.backends.specs import parse_spec

    spec = parse_spec(model)
    if spec.kind == "packaged":
        from lsp_server.backends.packaged import PACKAGED, packaged_gguf

        return str(packaged_gguf(PACKAGED[spec.spec], lambda *a, **k: None))
    if spec.kind == "gguf":
        return str(spec.path)
    if spec.kind == "tiny":  # tests: the tiny random model written as a GGUF
        from lsp_server.backends.tiny_gguf import write_tiny_gguf

        workdir.mkdir(parents=True, exist_ok=True)
        return str(write_tiny_gguf(workdir / "tiny-random.gguf"))
    if spec.kind == "ollama":
        from lsp_server.backends.ollama import resolve

        return str(resolve(spec.spec)[0])
    raise ValueError(f"{PEER} needs a GGUF model (got {model!r}, a {spec.kind} model)")


# -- the replay ------------------------------------------------------------------------------
@dataclass
class SessionRun:
    records: list = field(default_factory=list)
    opened: dict = field(default_factory=dict)


def replay_session(driver, session, steps: list | None = None, on_request=None) -> SessionRun:
    """Run the event script of `session` on one started driver; one record per request."""
    steps = script(session) if steps is None else steps
    out = SessionRun()
    repo = session.blocks[0].task.repo
    pause_s = 0.0  # pauses (scaled) since the previous answer
    t_last = time.monotonic()
    try:
        for step in steps:
            if isinstance(step, Open):
                out.opened = driver.open(step, repo)
                t_last = time.monotonic()
            elif isinstance(step, Edit):
                driver.edit(step)
            elif isinstance(step, Pause):
                driver.pause(step)
                pause_s += step.seconds * driver.opts.pause_scale
            else:
                idle_ms = (time.monotonic() - t_last) * 1000
                rec = driver.ask(step)
                t_last = time.monotonic()
                suggestion = rec.get("text") or ""
                out.records.append({
                    "session": session.id, "task": step.task, "system": driver.system, "block": step.block,
                    "k": step.k, "kind": step.kind, "event": step.event, "line": step.line, "col": step.col,
                    "pause_ms": round(pause_s * 1000, 1), "idle_ms": round(idle_ms, 1), **rec,
                    "typed": step.typed, "true_line": step.true_line, "true_rest": step.true_rest,
                    **request_quality(step.typed, suggestion, step.true_line, step.true_rest),
                })
                pause_s = 0.0
                if on_request is not None:
                    on_request(out.records[-1])
    finally:
        driver.close()
    return out


def make_drivers(systems: list[str], options: ReplayOptions) -> list:
    drivers = []
    for name in systems:
        if replay_system(name) is None:
            raise ValueError(f"not a replay system: {name!r}")
        if name == PEER:
            gguf = options.peer_gguf or peer_gguf(options.model, (options.log_dir or Path("/tmp")) / "peer-model")
            drivers.append(PeerDriver(options, gguf))
        else:
            drivers.append(DittoDriver(name, options))
    return drivers

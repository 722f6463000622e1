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

The user accepts only what they would keep: where an answer's text is a prefix of what the edits
right after it insert (the rest of its line, and the next line's Enter and first character), it is
sent as one insert at the cursor, what an editor's accept sends, and then the remainder
(replay_script.py `accepted`); the requests and the document at each are the same for every
system. The record's `acceptance_sent` says so. The peer's client sends nothing on an edit.

Pauses are multiplied by `pause_scale` (tests run at 0.01). Every request's record has the
time to suggestion (request sent -> answer received, client wall clock), the idle time the
system had before it, the suggestion and its quality against the truth (`request_quality`).

This module runs a session's script on one driver (`replay_session`) and makes the drivers
(`make_drivers`). Left out on purpose: the script and its settings (replay_script.py), the drivers
(replay_ditto.py, replay_peer.py), the run's step in `ditto-lsp bench` (replay_run.py), what a
suggestion is worth (quality.py), aggregation (metrics.summarise_replay) and tables (report.py);
the in-process session systems (runner.Bench.session).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ditto_bench.quality import request_quality
from ditto_bench.replay_ditto import DittoDriver
from ditto_bench.replay_peer import PeerDriver, peer_gguf
from ditto_bench.replay_script import Edit, Open, Pause, ReplayOptions, accepted, script
from ditto_bench.systems import REPLAY_PEER as PEER
from ditto_bench.systems import replay_system


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
    i = 0
    try:
        while i < len(steps):
            step = steps[i]
            i += 1
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
                # A kept answer that fits before the next request is accepted (one insert), then the rest typed.
                accept = accepted(step, suggestion, steps[i:])
                out.records.append({
                    "session": session.id, "task": step.task, "system": driver.system, "block": step.block,
                    "k": step.k, "kind": step.kind, "event": step.event, "line": step.line, "col": step.col,
                    "pause_ms": round(pause_s * 1000, 1), "idle_ms": round(idle_ms, 1), **rec,
                    "typed": step.typed, "true_line": step.true_line, "true_rest": step.true_rest,
                    **request_quality(step.typed, suggestion, step.true_line, step.true_rest),
                    "acceptance_sent": accept is not None,
                })
                pause_s = 0.0
                if accept is not None:
                    edits, replaced = accept
                    for e in edits:
                        driver.edit(e)
                    i += replaced
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

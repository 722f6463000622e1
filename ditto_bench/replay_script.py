"""The editor replay's event script and settings: what is sent when, the same for every system.

`script(session)` turns a session (session.py: one file of one commit, its blocks replaced by one
empty line each, the commit's other files open) into steps: `Open`, `Edit` (one didChange),
`Pause` and `Ask` (one completion request, with what the truth says it should suggest). Every step
carries the document after it, so a driver can send either the change or the whole text.
`ReplayOptions` holds the replay's settings that every driver reads (model, cores, pauses' scale,
timeouts, logs). `accepted` turns the edits after a kept answer into what an editor sends when the
user accepts it (the answer as one insert, then the rest): the same requests, the same document.

Left out on purpose: sending anything (the drivers, replay_ditto.py and replay_peer.py), the run's
loop (replay.py `replay_session`) and what a suggestion is worth (quality.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REST_S = 1.0  # the rest after arriving at a block
LINE_PAUSE_S = 0.3  # the pause after a line's first character, before its request
IDLE_WAIT_S = 5.0  # the longest wait for the server to go idle after opening a session
ANSWER_TIMEOUT_S = 120.0  # a request not answered by then is recorded as a timeout


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
    ditto_threads: int = 1  # Ditto's servers' threads, pinned to as many cores from cores[0] on
    # The replayed repository: Ditto's servers get it as the workspace's root, as an editor opened on it sends
    # (the prompt's definitions are resolved in it; lsp_server/lsp/definitions.py). None: no root.
    repo: str | None = None


@dataclass(frozen=True)
class Open:
    path: str
    text: str
    buffers: tuple  # ((path, text), ...): the other open files, entered first


@dataclass(frozen=True)
class Edit:
    """One didChange: `text` replaces (line, col)-(end_line, end_col) of the document before it."""

    what: str  # arrive | char | rest | enter | accept
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


def accepted(ask: Ask, text: str, following: list) -> tuple[list[Edit], int] | None:
    """What an editor sends where the user accepts the answer `text` given at `ask`: None unless
    `text` is a non-empty prefix of what the edits right after the answer insert at the cursor (the
    run of inserts before the next pause, request or jump; a kept suggestion that fits before the
    next request). Else the edits sent in place of that run, and how many steps of `following` they
    replace: `text` as one insert at the cursor (an accept), then the remainder of the edit it ends
    in and the run's later edits. The document after them is the run's."""
    if not text:
        return None
    cursor, run = (ask.line, ask.col), []
    for step in following:
        if not isinstance(step, Edit) or (step.line, step.col) != cursor or (step.end_line, step.end_col) != cursor:
            break
        run.append(step)
        cursor = step.cursor
    if not "".join(e.text for e in run).startswith(text):
        return None
    lines = ask.document.split("\n")
    row = lines[ask.line]
    lines[ask.line : ask.line + 1] = (row[: ask.col] + text + row[ask.col :]).split("\n")
    last = text.rsplit("\n", 1)
    at = (ask.line + text.count("\n"), (ask.col if len(last) == 1 else 0) + len(last[-1]))
    out, done = [Edit("accept", ask.line, ask.col, ask.line, ask.col, text, at, "\n".join(lines))], 0
    for e in run:
        cut = min(max(len(text) - done, 0), len(e.text))
        done += len(e.text)
        if cut == len(e.text):  # accepted whole
            continue
        out.append(Edit(e.what, *at, *at, e.text[cut:], e.cursor, e.document) if cut else e)
    return out, len(run)

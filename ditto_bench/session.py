"""Session replay: several tasks of one file, visited in sequence with one cache, as a person edits.

A session is one file of one commit with the pure-addition blocks the harvester found in
it (harvest.py). Its document is the post-commit file with every block replaced by one
empty line. The replay visits the blocks from the top of the file down, the way a user
moves from one edit to the next, and makes a request at each of these events:

- ``move``: the cursor arrives at the next block's empty line, and its first line's
  indentation is put there (as opening a line in an editor indents it);
- ``type``: one character of a line typed (after the indentation);
- ``enter``: Enter at the end of a block line, and the next line's indentation.

With ``max_keystrokes`` the first N characters of each line are typed one request at a
time and the rest of the line is inserted at once, without a request (a fast typist
whose editor waits for a pause). Blocks typed stay in the document, so later blocks see
them. Everything here is text; the runner (runner.py) sends each event's document to the
Completer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Iterator

from ditto_bench.harvest import Task


@dataclass
class Block:
    task: Task
    line: int  # 0-based line of the block's empty line in the session document

    @property
    def lines(self) -> list[str]:
        return self.task.truth.split("\n")


@dataclass
class Session:
    id: str  # "<sha10>:<path>"
    path: str
    document: str  # post-commit file, every block replaced by one empty line
    blocks: list[Block]  # top of the file first
    buffers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def tasks(self) -> list[Task]:
        return [b.task for b in self.blocks]

    def public(self) -> dict:
        return {"id": self.id, "path": self.path, "lines": self.document.count("\n") + 1,
                "tasks": [b.task.id for b in self.blocks], "block_lines": [b.line for b in self.blocks]}


@dataclass
class Event:
    kind: str  # move | type | enter
    task: Task
    text: str  # the document at the request
    line: int
    col: int
    keystroke: int  # characters of the block typed so far (indentation and newlines included)


def post_commit_text(task: Task) -> str:
    """The post-commit file a task was cut from (its document with the block typed in)."""
    return task.typed(len(task.truth))[0]


def build_sessions(tasks: list[Task], max_tasks: int, seed: int = 0, min_blocks: int = 2) -> list[Session]:
    """Group tasks by (commit, file) into sessions of at least `min_blocks` blocks.

    Sessions are drawn with `seed` until they hold `max_tasks` tasks (at least one
    session); the last one is cut to fit. The same tasks and seed give the same sessions.
    """
    groups: dict[tuple[str, str], list[Task]] = {}
    for t in tasks:
        groups.setdefault((t.commit, t.path), []).append(t)
    keys = sorted(k for k, g in groups.items() if len(g) >= min_blocks)
    random.Random(seed).shuffle(keys)
    out: list[Session] = []
    taken = 0
    for key in keys:
        if taken >= max_tasks:
            break
        group = sorted(groups[key], key=lambda t: t.line)[: max(1, max_tasks - taken)]
        if len(group) < min(min_blocks, max_tasks - taken):
            continue
        session = _session(group)
        if session is not None:
            out.append(session)
            taken += len(session.blocks)
    return out


def _session(group: list[Task]) -> Session | None:
    """One session from tasks of the same commit and file; None when their blocks overlap."""
    post = post_commit_text(group[0]).split("\n")
    spans = [(t.line, t.truth.count("\n") + 1, t) for t in group]  # 0-based post-commit lines
    for (l0, n0, _), (l1, _, _) in zip(spans, spans[1:]):
        if l0 + n0 > l1:
            return None
    for l, n, t in spans:
        if post[l : l + n] != t.truth.split("\n"):
            return None  # the tasks were not cut from the same file version
    doc = post[:]
    for l, n, _ in reversed(spans):
        doc[l : l + n] = [""]
    blocks, removed = [], 0
    for l, n, t in spans:
        blocks.append(Block(t, l - removed))
        removed += n - 1
    first = group[0]
    return Session(f"{first.commit[:10]}:{first.path}", first.path, "\n".join(doc), blocks, list(first.buffers))


def events(session: Session, max_keystrokes: int | None = None) -> Iterator[Event]:
    """The requests of the session replay, in order (see the module docstring)."""
    lines = session.document.split("\n")
    shift = 0  # lines added above the next block by the blocks typed so far
    for block in session.blocks:
        at = block.line + shift
        typed_chars = 0
        for k, target in enumerate(block.lines):
            indent = target[: len(target) - len(target.lstrip(" \t"))]
            body = target[len(indent) :]
            if k == 0:
                lines[at] = indent
                kind = "move"
            else:
                lines.insert(at + k, indent)
                kind = "enter"
                typed_chars += 1  # the newline
            typed_chars += len(indent)
            yield Event(kind, block.task, "\n".join(lines), at + k, len(indent), typed_chars)
            n = len(body) if max_keystrokes is None else min(len(body), max_keystrokes)
            for i in range(1, n + 1):
                lines[at + k] = indent + body[:i]
                yield Event("type", block.task, "\n".join(lines), at + k, len(indent) + i, typed_chars + i)
            lines[at + k] = target  # the rest of the line at once (nothing left when every key was typed)
            typed_chars += len(body)
        shift += len(block.lines) - 1

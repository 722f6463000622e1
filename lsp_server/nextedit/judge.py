"""The file as the judge of propagation's proposal (docs/nextedit.md, "The file as the judge").

Propagation (propagate.py) finds where the user's change applies again; which of those places the user
means is what it gets wrong. The model, shown no example and no diff, only the document as code, can
tell: after a rename at a definition the old name reads as unlikely code at its uses, while after a
one-off change the other places read as they were. So `Judged` shows propagation's proposal only where
the model finds the proposal's lines more likely with the change made than unchanged (by `MARGIN`),
given the document's last `CONTEXT` tokens above them (the user's edited lines put first where they lie
outside those), scoring those lines and the `FOLLOWING` lines after them (the same text in both, so that
what follows the place has its say). Where propagation's rules find no place, the places looser rules find
(propagate.py `accepts_loosely`: one agreeing token) are judged the same way: the rules' thresholds guard
precision without a model, and here the model guards it.

The cost is two scorings after one shared prefill of the context (the KV cropped back between them):
about `CONTEXT` + 2 x (the lines) tokens; measured at 6.4-7.0 s a proposal (p50, three held-out sets) on
one CPU core with llama.cpp and the default model, whose passes over several rows run one token at a time
(docs/nextedit.md, "Rules loosened, then judged").

Left out on purpose: LSP (lsp_server/lsp/nextedit.py runs it on the model worker), the rules of where a
change applies (propagate.py, lines.py).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from lsp_server.nextedit.history import EditGroup
from lsp_server.nextedit.learn import edits, line_at
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.types import NextEdit

MARGIN = 0.0  # nats: chosen before the held-out runs (the model prefers the change), not tuned on them
CONTEXT = 256  # tokens of the document above the proposal's lines
FOLLOWING = 2  # lines after the proposal's lines scored with them
CHUNK = 64  # tokens of the context prefilled between checks of `cancel` (about 1 s on one CPU core)


def logps(lm, context: list[int], answers: list[list[int]],
          cancel: threading.Event | None = None) -> list[float] | None:
    """The log-probability of each of `answers` after `context` (one shared prefill, cropped back after each);
    None when `cancel` is set meanwhile (checked every `CHUNK` tokens of the prefill and between answers)."""
    cache = lm.new_cache()
    try:
        for i in range(0, len(context) - 1, CHUNK):
            if cancel is not None and cancel.is_set():
                return None
            lm.forward(context[i : min(i + CHUNK, len(context) - 1)], cache, 1)
        out = []
        for answer in answers:
            if cancel is not None and cancel.is_set():
                return None
            if not answer:  # nothing left (lines deleted at the document's end): the empty text is certain
                out.append(0.0)
                continue
            lg = np.asarray(lm.forward([context[-1], *answer[:-1]], cache, len(answer)), dtype=np.float64)
            lm.crop(cache, len(context) - 1)
            lg -= lg.max(axis=1, keepdims=True)
            lsm = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
            out.append(float(lsm[np.arange(len(answer)), answer].sum()))
        return out
    finally:
        lm.release(cache)


def scores(lm, doc: str, start: int, end: int, new_text: str, user: tuple[int, int] | None,
           context: int = CONTEXT, cancel: threading.Event | None = None) -> tuple[float, float] | None:
    """(log-probability with doc[start:end] replaced by `new_text`, unchanged) of the lines holding it and the
    `FOLLOWING` lines after them, after the document above them; `user`: the span of the user's edit in
    `doc` (put first where it lies outside the context), or None (it is in another document). None when
    `cancel` is set meanwhile."""
    a, tail = line_at(doc, start)[0], line_at(doc, end)[1]
    for _ in range(FOLLOWING):
        if tail < len(doc):
            tail = line_at(doc, tail + 1)[1]
    above = lm.encode(doc[max(0, a - 32 * context):a])[-context:] if a else []  # (a 5 MB file: its tail only)
    if user is not None:
        ua, ub = line_at(doc, user[0])[0], line_at(doc, user[1])[1]
        if not (a - len(lm.decode(above)) <= ua and ub <= a):  # the user's lines are not in view
            above = lm.encode(doc[ua:ub] + "\n\n") + above
    if not above:
        above = lm.encode("\n")
    made = doc[a:start] + new_text + doc[end:tail]
    got = logps(lm, above, [lm.encode(made), lm.encode(doc[a:tail])], cancel)
    return None if got is None else tuple(got)


class Judged:
    """Propagation's proposal, shown only where the model finds it more likely code than the lines unchanged."""

    name = "judged"

    def __init__(self, propagator, lm, margin: float = MARGIN, context: int = CONTEXT,
                 loose: bool = True):
        self.propagator = propagator
        # where `propagator` finds nothing, the places looser rules find (propagate.py `accepts_loosely`)
        self.loose = Propagator(loose=True) if loose else None
        self.lm = lm
        self.margin = margin
        self.context = context

    def propose(self, groups: list[EditGroup], uri: str, text: str, cursor: int,
                others: list[tuple[str, str]] = (), version: int | None = None,
                cancel: threading.Event | None = None) -> NextEdit | None:
        edit = self.propagator.propose(groups, uri, text, cursor, others, version)
        loosely = edit is None and self.loose is not None
        if loosely:
            edit = self.loose.propose(groups, uri, text, cursor, others, version)
        if edit is None or (cancel is not None and cancel.is_set()):
            return None
        doc = text if edit.uri == uri else dict(others).get(edit.uri)
        learnt = edits(groups, text, 1)
        if doc is None or not learnt:
            return None
        t0 = time.perf_counter()
        got = scores(self.lm, doc, edit.start, edit.end, edit.new_text,
                     (learnt[0].start, learnt[0].end) if edit.uri == uri else None, self.context, cancel)
        if got is None:  # cancelled: the document changed, or a newer request came (lsp_server/lsp/nextedit.py)
            return None
        made, unchanged = got
        edit.stats = {"judge_margin": round(made - unchanged, 3), "ms": round((time.perf_counter() - t0) * 1000, 1),
                      "loose": loosely}
        return edit if made - unchanged >= self.margin else None

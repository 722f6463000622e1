"""The model's next-edit proposers on the model worker (`EditProposers`): `rewrite`, `both` and `judged`
(lsp_server/nextedit/, docs/nextedit.md), run on the loaded model's engine.

Runs on the model worker thread only; owned by the worker's state (state.py). The loop side
(lsp_server/lsp/nextedit.py) submits a job with copies of the edit history and the texts, and sets the
job's cancel event when the document changes; the answer comes back as the job's result:
an edit, None, `CANCELLED` (stopped early: changed, superseded or cancelled) or `NO_MODEL` (no local
engine, or a model without <|file_sep|>: the loop proposes by propagation instead).
Left out on purpose: propagation (no model; the loop runs it on a thread of its own), LSP.
"""

from __future__ import annotations

import logging

from lsp_server.nextedit.propagate import Propagator

log = logging.getLogger(__name__)

REWRITE_CACHE = "nextedit"  # the engine's KV cache key of every model rewrite
CANCELLED = "cancelled"
NO_MODEL = "no model"


class EditProposers:
    def __init__(self):
        self._rewriter = None  # (engine, Rewriter or None) of the loaded model, made on first use

    def propose(self, name: str, completer, args: tuple, cancel):
        """`name`'s proposal for `args` (Propagator.propose's: groups, uri, text, cursor, others, version)."""
        if cancel.is_set():
            return CANCELLED
        proposer = self._proposer(name, completer)
        if proposer is None:
            return NO_MODEL
        edit = proposer.propose(*args, cancel=cancel)
        return CANCELLED if cancel.is_set() else edit

    def _proposer(self, name: str, completer):
        from lsp_server.nextedit.judge import Judged
        from lsp_server.nextedit.rewrite import Checked, Rewriter

        engine = getattr(getattr(completer, "generator", None), "engine", None)
        if engine is None:
            return None
        if name == "judged":  # scores on a cache of its own, released after each proposal (judge.py)
            return Judged(Propagator(), engine.lm)
        if self._rewriter is None or self._rewriter[0] is not engine:
            try:
                self._rewriter = (engine, Rewriter(engine.lm, engine, cache_key=REWRITE_CACHE))
            except ValueError as err:  # the model has no <|file_sep|> token
                log.warning("next-edit %s needs the model: %s; proposing by propagation", name, err)
                self._rewriter = (engine, None)
        rewriter = self._rewriter[1]
        if rewriter is None:
            return None
        return rewriter if name == "rewrite" else Checked(Propagator(), rewriter)

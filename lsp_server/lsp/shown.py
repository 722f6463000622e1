"""What the user does with the suggestions shown (`ShownLog`), and the bias it gives the `show` limit
(lsp_server/completion/show.py) in this workspace. On the event loop only (lsp_server/lsp/threads.py).

A suggestion the model made (not a type-through answer, which goes on with one already shown) waits
for its outcome, decided by the user's next edits of its document:
- **accepted**: they insert or type, at its place, its start up to the end of its first word, or all
  of it (Tab, a word or line accept, typing through it);
- **typed over**: an edit at its place that departs from it, or any other edit of the document first.
A newer suggestion for the same document, or closing it, leaves the older one undecided.

The bias follows the acceptance of the last outcomes (an exponential average, `ALPHA`) against
`TARGETS[show]`, the share of the suggestions shown whose first word was right on the tuning replays
with that setting: a user who accepts more than that sees a little more (the limit rises), one who
accepts less sees less, by at most show.py `BIAS_LIMIT`. The average starts at the target of the
setting the first suggestion was shown with (no evidence: no bias), so one outcome moves it by
`ALPHA` of its distance, not all the way: started at the first outcome, as it was, one typed-over
suggestion put the limit at its bound for the next twenty (on the held-out replays of
docs/perf/replay.md three of four workspaces ended there with 4-13 outcomes). The counts and the average are kept per workspace
(its root's hash) in the cache directory, so the next session starts where this one ended;
`ditto/stats` reports them under `shown`. With the `learn_show` setting off the bias is 0.
Left out on purpose: what is shown (show.py), where a suggestion came from (suggest.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types

from lsp_server.completion.show import BIAS_LIMIT
from lsp_server.lsp.threads import on_loop

log = logging.getLogger(__name__)

ALPHA = 0.1  # weight of the newest outcome in the average
# Per `show` setting, the share of shown suggestions whose first word was right on the tuning replays
# (flask, packaging, click, httpx; 310 requests: 179/308 shown with all, 163/223 sure, 155/201 surest).
TARGETS = {"all": 0.58, "sure": 0.73, "surest": 0.77}
GAIN = 0.4  # bias = GAIN * (average - target), bounded by BIAS_LIMIT
SAVE_EVERY = 10  # outcomes between writes of the workspace's file (and at shutdown)


@dataclass
class _Waiting:
    line: int
    character: int  # where the suggestion starts, in client units
    text: str
    target: float  # the acceptance expected with the `show` setting it was shown with (`TARGETS`)
    typed: str = ""  # what the user has typed of it so far


class ShownLog:
    def __init__(self, path: Path | None = None):
        self.path = path  # the workspace's file, or None (no workspace: kept for this session only)
        self.accepted = 0
        self.typed_over = 0
        self.average: float | None = None  # no outcome yet: no bias
        self._waiting: dict[str, _Waiting] = {}
        self._unsaved = 0
        if path is not None:
            self._load()

    @staticmethod
    def for_workspace(root: str | None, cache: Path) -> "ShownLog":
        """The log of the workspace at `root` (a URI or path), kept under `cache`/show/."""
        if not root:
            return ShownLog()
        return ShownLog(cache / "show" / (hashlib.sha256(root.encode("utf-8")).hexdigest()[:16] + ".json"))

    # -- events -------------------------------------------------------------------------------
    @on_loop
    def shown(self, uri: str, position: tuple[int, int], text: str, show: str = "sure") -> None:
        """A suggestion the model made, with the `show` setting `show`, is on screen at `position`
        (line, character) of `uri`."""
        first = text.split("\n", 1)[0]
        if first.strip():
            self._waiting[uri] = _Waiting(position[0], position[1], text, TARGETS.get(show, TARGETS["sure"]))
        else:
            self._waiting.pop(uri, None)

    @on_loop
    def changed(self, uri: str, changes, units) -> None:
        """A didChange of `uri` (its content changes; `units` counts a string's client units)."""
        w = self._waiting.get(uri)
        if w is None:
            return
        for change in changes:
            rng = getattr(change, "range", None)
            at = (w.line, w.character + units(w.typed))
            inserting = rng is not None and (rng.start.line, rng.start.character) == at and rng.start == rng.end
            if not inserting:
                return self._decide(uri, accepted=False)
            typed = w.typed + change.text
            if typed.startswith(w.text) or (w.text.startswith(typed) and len(typed) >= _first_word(w.text)):
                return self._decide(uri, accepted=True)
            if not w.text.startswith(typed):
                return self._decide(uri, accepted=False)
            w.typed = typed

    @on_loop
    def closed(self, uri: str) -> None:
        self._waiting.pop(uri, None)

    def _decide(self, uri: str, accepted: bool) -> None:
        w = self._waiting.pop(uri)
        self.accepted += accepted
        self.typed_over += not accepted
        a = self.average if self.average is not None else w.target  # (the prior: no bias before evidence)
        self.average = a + ALPHA * (float(accepted) - a)
        self._unsaved += 1
        if self._unsaved >= SAVE_EVERY:
            self.save()

    # -- what it gives ----------------------------------------------------------------------------
    def bias(self, show: str, learn: bool) -> float:
        """How much the `show` limit moves in this workspace (show.py `ShowRule.biased`)."""
        if not learn or self.average is None:
            return 0.0
        return max(-BIAS_LIMIT, min(BIAS_LIMIT, GAIN * (self.average - TARGETS.get(show, TARGETS["sure"]))))

    def report(self, show: str, learn: bool) -> dict:
        return {"accepted": self.accepted, "typed_over": self.typed_over,
                "acceptance": None if self.average is None else round(self.average, 4),
                "bias": round(self.bias(show, learn), 4), "learning": learn,
                "workspace_file": str(self.path) if self.path is not None else None}

    # -- the workspace's file -------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.accepted, self.typed_over = int(data["accepted"]), int(data["typed_over"])
            self.average = None if data["average"] is None else min(1.0, max(0.0, float(data["average"])))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as err:  # unreadable: start afresh, say so once
            log.warning("ignored %s: %s", self.path, err)

    def save(self) -> None:
        self._unsaved = 0
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"accepted": self.accepted, "typed_over": self.typed_over,
                                       "average": self.average}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as err:
            log.warning("could not write %s: %s", self.path, err)


def _first_word(text: str) -> int:
    """Characters of `text` up to the end of its first word (what comes before the word included)."""
    i = 0
    while i < len(text) and not (text[i].isalnum() or text[i] == "_"):
        i += 1
    while i < len(text) and (text[i].isalnum() or text[i] == "_"):
        i += 1
    return max(1, i)


def root_of(params: types.InitializeParams) -> str | None:
    """The workspace's root from `initialize` (its first folder, else rootUri, else rootPath)."""
    folders = getattr(params, "workspace_folders", None)
    if folders:
        return folders[0].uri
    return getattr(params, "root_uri", None) or getattr(params, "root_path", None)

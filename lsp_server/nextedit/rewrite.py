"""The model rewrite: a few lines near the user's edit written anew by the model, the lines themselves the draft.

The prompt is the repository format Qwen2.5-Coder was trained on, with Sweep's next-edit blocks
(docs/nextedit.md): the file around the region, then the user's edit as an `original/` block (its
lines before) and an `updated/` block (after), then the region as an `original/` block and the
header of its `updated/` block, which the model writes; it ends at the next `<|file_sep|>` (a stop
token). One example of the change in front of the region to change is how an untrained model is
told what to do; no model trained for edit prediction is in the package registries.

The region's own tokens are the draft (drafters/region.py `RegionDrafter`): most of a rewritten
region is a copy. Drafts change only how many passes the rewrite takes, never what it writes: the
engine's greedy rule keeps a drafted token only where it is the model's own argmax
(tests/nextedit/test_rewrite.py checks the output against plain greedy decoding, token for token).

A rewrite is shown only where it differs from the region and passes the checks a suggestion passes
(lsp_server/completion/stops.py): no character an editor cannot insert, the same brackets left
open as the region leaves, at most one line more or less. `Rewriter` proposes alone, at the places
propagation looks at without its acceptance rules (`candidates`, the nearest `CANDIDATES` lines in
the direction of travel); `Checked` shows propagation's proposal only where the model's rewrite of
its lines is that proposal.

Left out on purpose: LSP, threads (the server calls this on its model worker: one generation at a
time, the engine's lock), settings (the caller passes what it wants).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from drafters.region import RegionDrafter
from lsp_server.completion.stops import uninsertable, open_brackets
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.types import DecodeOptions
from lsp_server.nextedit.history import EditGroup, changed_span
from lsp_server.nextedit.learn import Edit, Kinds, line_at, edits
from lsp_server.nextedit.lines import line_places
from lsp_server.nextedit.propagate import match_at, change_pattern
from lsp_server.nextedit.types import NextEdit

CANDIDATES = 2  # places rewritten at most per request
AROUND = 0  # lines of the region above and below the candidate line
CONTEXT_ABOVE, CONTEXT_BELOW = 24, 8  # lines of the file shown around the region ...
CONTEXT_CHARS = 1600  # ... at most this many characters
EXTRA_TOKENS = 24  # a rewrite may write this many tokens more than the region has


@dataclass
class Rewritten:
    start: int  # the region [start, end) of the text
    end: int
    region: str
    text: str  # what the model wrote for it
    stats: dict


class Rewriter:
    """The model proposer (module docstring). `engine`: the server's engine (one per loaded model)."""

    name = "rewrite"

    FORMATS = ("chat", "repo")

    def __init__(self, lm, engine: Engine | None = None, *, draft: bool = True, candidates: int = CANDIDATES,
                 format: str = "chat", cache_key: str | None = None):
        if lm.fim is None or lm.fim.file_sep is None:
            raise ValueError(f"{lm.name} has no <|file_sep|> token: the rewrite's prompt needs one")
        self.lm = lm
        self.engine = engine or Engine(lm)
        self.draft = draft
        self.candidates_at_most = candidates
        if format not in self.FORMATS:
            raise ValueError(f"unknown rewrite prompt format {format!r}: use one of {', '.join(self.FORMATS)}")
        self.format = format
        self.spent: list[dict] = []  # statistics of every rewrite run (the caller empties it when it wants to)
        # The engine's KV cache the rewrites use: one per document (None), or this one key for all (the server:
        # one slot of the engine's bounded cache, so that rewrites never push out the completions' caches).
        self.cache_key = cache_key

    def key_for(self, uri: str) -> str:
        return self.cache_key or f"nextedit:{uri}"

    # -- the prompt ---------------------------------------------------------------------------
    def prompt(self, path: str, text: str, start: int, end: int, edit: Edit) -> tuple[list[int], str]:
        """(token ids of the prompt rewriting text[start:end] (whole lines) after `edit`, the text that
        ends the rewrite) in the format `self.format` (module docstring)."""
        old, new = "\n".join(edit.old_lines), "\n".join(edit.new_lines)
        region = text[start:end]
        if self.format == "chat":
            lang = "python" if path.endswith((".py", ".pyi")) else ""
            user = (f"I made this change in {path}:\n```{lang}\n{old}\n```\nbecame\n```{lang}\n{new}\n```\n"
                    f"Make the same change to the lines below if it applies to them, else repeat them unchanged. "
                    f"Answer with the lines only.\n```{lang}\n{region}\n```")
            return (self.lm.encode(f"<|im_start|>system\nYou are a precise code editor.<|im_end|>\n"
                                   f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n```{lang}\n"), "\n```")
        sep = self.lm.fim.file_sep
        above = text[:start].split("\n")[-CONTEXT_ABOVE - 1 : -1]
        below = text[end:].split("\n")[1 : CONTEXT_BELOW + 1]
        context = ("\n".join(above)[-CONTEXT_CHARS // 2 :] + "\n" + region + "\n" + "\n".join(below))[:CONTEXT_CHARS]
        la = text.count("\n", 0, edit.line_start) + 1
        ra = text.count("\n", 0, start) + 1
        rb = ra + region.count("\n")
        blocks = [f"{path}\n{context}\n",
                  f"original/{path}:{la}:{la + len(edit.old_lines) - 1}\n{old}\n",
                  f"updated/{path}:{la}:{la + len(edit.new_lines) - 1}\n{new}\n",
                  f"original/{path}:{ra}:{rb}\n{region}\n", f"updated/{path}:{ra}:{rb}\n"]
        ids: list[int] = []
        for b in blocks:
            ids.append(sep)
            ids.extend(self.lm.encode(b))
        return ids, "\n" + self.lm.decode([sep])

    def rewrite(self, path: str, text: str, start: int, end: int, edit: Edit, cache_key: str | None = None,
                cancel: threading.Event | None = None) -> Rewritten:
        """The model's rewrite of text[start:end] (whole lines), greedy, drafted by the region when `draft`."""
        region = text[start:end]
        ids, closing = self.prompt(path, text, start, end, edit)
        region_ids = self.lm.encode(region + closing)
        lines = region.count("\n") + 1
        decode = self.lm.decode

        def stop(out: list[int]) -> int | None:
            """Ends at the closing text, or more than two lines past the region's (it has run off)."""
            written = decode(out)
            return len(out) if closing.strip() in written or written.count("\n") > lines + 2 else None

        opts = DecodeOptions(max_new_tokens=len(region_ids) + EXTRA_TOKENS, draft_max=8 if self.draft else 0,
                             adaptive=False)
        drafter = RegionDrafter(region_ids, len(ids)) if self.draft else None
        t0 = time.perf_counter()
        done = self.engine.generate(ids, drafter=drafter, options=opts, stop=stop, cancel=cancel, cache_key=cache_key)
        out = decode(done.tokens)
        cut = out.find(closing.strip())
        out = out[:cut] if cut >= 0 else out
        if out.endswith("\n"):
            out = out[:-1]
        st = done.stats
        stats = {"tokens": st.tokens, "generated": st.generated, "passes": st.target_passes, "drafted": st.drafted,
                 "accepted": st.accepted, "prompt_tokens": len(ids), "prefill_tokens": st.prefill_tokens,
                 "stop": st.stop_reason, "ms": round((time.perf_counter() - t0) * 1000, 1),
                 "tokens_per_pass": round(st.tokens_per_pass, 3), "ids": list(done.tokens)}
        self.spent.append(stats)
        return Rewritten(start, end, region, out, stats)

    # -- proposing ------------------------------------------------------------------------------
    def candidates(self, edit: Edit, uri: str, text: str, cursor: int, down: bool = True) -> list[tuple[int, int]]:
        """Regions (whole lines) around the places propagation looks at, nearest first in the direction of travel."""
        kinds = Kinds(text)
        spots = [p.start for p in line_places(edit, uri, text, kinds)]
        for c in edit.changes:
            for n, m in enumerate(change_pattern(c).finditer(text)):
                if n >= 200:
                    break
                found = match_at(c, text, m.start(), m.end())
                if found is not None:
                    spots.append(found[0])
        lines = sorted({text.count("\n", 0, s) for s in spots if not edit.start <= s <= edit.end})
        here = text.count("\n", 0, cursor)
        ahead = [n for n in lines if n > here] if down else [n for n in lines if n < here][::-1]
        behind = [n for n in lines if n < here][::-1] if down else [n for n in lines if n > here]
        out = []
        for n in ahead + behind:
            out.append(region_of(text, n))
        return out

    def propose(self, groups: list[EditGroup], uri: str, text: str, cursor: int,
                others: list[tuple[str, str]] = (), version: int | None = None,
                cancel: threading.Event | None = None) -> NextEdit | None:
        learnt = edits(groups, text, 2)
        if not learnt:
            return None
        down = len(learnt) < 2 or learnt[0].start >= learnt[1].start
        spent: list[dict] = []
        for start, end in self.candidates(learnt[0], uri, text, cursor, down)[: self.candidates_at_most]:
            got = self.rewrite(uri, text, start, end, learnt[0], cache_key=self.key_for(uri), cancel=cancel)
            spent.append(got.stats)
            edit = shown(got, uri, text, version)
            if edit is not None:
                edit.stats = _sum(spent)
                return edit
        return None


class Checked:
    """Propagation's proposal, shown only where the model's rewrite of its lines writes exactly it."""

    name = "both"

    def __init__(self, propagator, rewriter: Rewriter):
        self.propagator = propagator
        self.rewriter = rewriter

    def propose(self, groups: list[EditGroup], uri: str, text: str, cursor: int,
                others: list[tuple[str, str]] = (), version: int | None = None,
                cancel: threading.Event | None = None) -> NextEdit | None:
        edit = self.propagator.propose(groups, uri, text, cursor, others, version)
        if edit is None:
            return None
        doc = text if edit.uri == uri else dict(others).get(edit.uri)
        learnt = edits(groups, text, 1)
        if doc is None or not learnt:
            return None
        start, end = line_at(doc, edit.start)[0], line_at(doc, edit.end)[1]
        start, end = region_of(doc, doc.count("\n", 0, start), doc.count("\n", 0, end))
        got = self.rewriter.rewrite(edit.uri, doc, start, end, learnt[0], cache_key=self.rewriter.key_for(edit.uri),
                                    cancel=cancel)
        edit.stats = got.stats
        return edit if got.text == doc[start : edit.start] + edit.new_text + doc[edit.end : end] else None


def region_of(text: str, line: int, last: int | None = None) -> tuple[int, int]:
    """[start, end) of lines line - AROUND .. (last or line) + AROUND of `text` (the last one's break left out)."""
    lines = text.split("\n")
    first = max(0, line - AROUND)
    final = min(len(lines) - 1, (line if last is None else last) + AROUND)
    a = sum(len(x) + 1 for x in lines[:first])
    return a, a + sum(len(x) + 1 for x in lines[first : final + 1]) - 1


def shown(got: Rewritten, uri: str, text: str, version: int | None) -> NextEdit | None:
    """The edit a rewrite makes, where it passes the checks (module docstring); None where it changes nothing."""
    region, out = got.region, got.text
    if out == region or uninsertable(out, True) is not None:
        return None
    if open_brackets(out) != open_brackets(region) or abs(out.count("\n") - region.count("\n")) > 1:
        return None
    a, b, c = changed_span(region, out)
    return NextEdit(uri, got.start + a, got.start + b, out[a:c], got.start + c, "rewrite", region[a:b], version,
                    "model rewrite", got.stats)


def _sum(spent: list[dict]) -> dict:
    out = dict(spent[-1])
    for k in ("tokens", "generated", "passes", "drafted", "accepted", "prompt_tokens", "prefill_tokens", "ms"):
        out[k] = sum(s[k] for s in spent)
    out["rewrites"] = len(spent)
    out["tokens_per_pass"] = round(out["generated"] / out["passes"], 3) if out["passes"] else 0.0
    return out

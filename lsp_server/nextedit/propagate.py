"""Edit propagation: the change the user just made (learn.py), proposed where it still applies.

No model. A token-level `Change` applies at a place of an open document where the removed tokens
(an insertion: its two neighbours) stand between the same region, and enough agrees around them
(`accepts`):
- a renamed identifier that is distinctive (`distinctive`: `KeepOpenFile`, `get_binary_stream`)
  needs one token of context, none where the user renamed its definition (`def`, `class`, a name
  given a value at the module's level), in a string or comment only where the user's edit was in one
  too; a plain word (`text`, `name`) or a builtin type needs three;
- a change removing a name needs three tokens of context (an attribute: its object and the dot);
- the rest (an insertion, punctuation, numbers, keywords) needs four tokens of context on one side,
  two on the other and a line like the user's (`SIMILAR_LINE`);
and on a line every change of the edit must apply (`_whole`; unless the edit is only renames of
distinctive names): where the user changed two things and a line holds one of them, it most likely
needs the other in a form the edit does not tell. In strings and comments (data, prose) only renames
of distinctive names carry over, and whole lines. Line templates (lines.py) add the places whose lines are the user's lines
before the edit, or differ from them in one token.

Among the places, the nearest in the direction the user is moving in this document comes first, then
the other open documents in the order given (distinctive renames only). The proposal is that place's
line with every change of the edit that applies on it made, so one key press does there what the user
did. Most edits (new code, a fixed typo) apply nowhere and propose nothing; the thresholds were tuned
on the commits of seven repositories and judged on four others (docs/nextedit.md, "Measured").

Left out on purpose: the model (rewrite.py), LSP, keeping the edits (history.py).
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

from lsp_server.nextedit.history import EditGroup
from lsp_server.nextedit.learn import TOKEN, WINDOW, Change, Edit, Kinds, Place, after_dot, line_at, lex, \
    distinctive, edits, informative, is_rename
from lsp_server.nextedit.lines import literal, line_places
from lsp_server.nextedit.types import NextEdit

EDITS = 3  # the user's newest edits learnt from
MAX_HITS = 2000  # places of one change looked at in one document at most
MAX_INSERTIONS = 4  # an insertion that applies on more lines than this applies nowhere (`_few`)
SIMILAR_LINE = 0.8  # an insertion or a change of punctuation applies on lines this like the user's


def free(c: Change) -> bool:
    """A distinctive name renamed: it applies wherever the name stands, whatever else the edit did."""
    return is_rename(c) and distinctive(c.removed[0])


def accepts(c: Change, left: int, right: int, kind: str, line: tuple[str, ...]) -> bool:
    """Whether a place (its context matched `left` tokens before and `right` after, its kind of text and
    the tokens of its line) is one where the user would make the change too (module docstring)."""
    if free(c):  # a name changed in a docstring may be changed in code; one neighbour must agree, unless the
        return (kind == "code" or kind == c.kind) and (left + right >= 1 or c.defines)  # user renamed its definition
    if kind != c.kind or c.kind != "code":
        return False  # in strings and comments (data, prose) only names and whole lines (lines.py) carry over
    if c.removed and c.added and all(literal(t) for t in c.removed + c.added):
        return False  # one value for another (True -> False, 1 -> 2): data, changed where it is wrong
    if c.removed and informative(c.removed):
        if c.dotted and left >= 2:
            return True  # the same attribute of the same object (`ctx.session`)
        return left + right >= 3
    return (max(left, right) >= 4 and min(left, right) >= 2 and
            SequenceMatcher(None, c.line, line, autojunk=False).ratio() >= SIMILAR_LINE)


def accepts_loosely(c: Change, left: int, right: int, kind: str, line: tuple[str, ...]) -> bool:
    """`accepts` with its thresholds dropped: a distinctive rename anywhere in code (or text of the user's
    kind), any other change in code where one neighbouring token agrees. Right about two times in five on
    the tuning repositories where `accepts` finds nothing: only for a proposer that judges each place
    (judge.py `Judged`, docs/nextedit.md "The file as the judge")."""
    if free(c):
        return kind == "code" or kind == c.kind
    return kind == c.kind == "code" and left + right >= 1


def change_pattern(c: Change) -> re.Pattern:
    """A regex for the change's removed tokens (an insertion: its neighbours), blanks between them free."""
    toks = c.removed or (c.before[-1:] + c.after[:1])
    parts = []
    for i, t in enumerate(toks):
        piece = re.escape(t)
        if t[0].isalnum() or t[0] == "_":
            if i == 0:
                piece = r"(?<!\w)" + piece
            if i == len(toks) - 1:
                piece = piece + r"(?!\w)"
        parts.append(piece)
    return re.compile(r"\s*".join(parts))


def match_at(c: Change, text: str, a: int, b: int) -> tuple[int, int, int] | None:
    """At a hit [a, b) of `change_pattern(c)`: (where the edit starts, left context matched, right context
    matched), or None where the region between the unchanged neighbours is not the change's."""
    if c.removed:  # the hit is the removed tokens; the region runs from the token before to the one after
        back = lex(text, max(0, a - WINDOW), a)
        fwd = lex(text, b, min(len(text), b + WINDOW))
        lo = back[-1][2] if back else 0
        hi = fwd[0][1] if fwd else len(text)
    else:  # the hit is the two neighbours of an insertion and what lies between them
        lo = a + len(c.before[-1])
        hi = b - len(c.after[0])
        back = lex(text, max(0, lo - WINDOW), lo)
        fwd = lex(text, hi, min(len(text), hi + WINDOW))
        if TOKEN.findall(text, hi, min(len(text), hi + 2 * len(c.new) + 1))[: len(c.added)] == list(c.added):
            return None  # what the insertion adds is there already
    region = text[lo:hi]
    if c.inner:
        if region.strip() != c.region.strip():
            return None
        start = lo + (len(region) - len(region.lstrip())) + c.at - (len(c.region) - len(c.region.lstrip()))
    elif region != c.region:
        return None
    else:
        start = lo + c.at
    if text[start : start + len(c.old)] != c.old or (after_dot(text, start) != c.dotted and not free(c)):
        return None  # not the same text, or an attribute where the user changed a plain name (or the reverse)
    end = start + len(c.old)
    a0 = back[-1][1] if back else lo
    z0 = fwd[0][2] if fwd else hi
    region_new = text[lo:start] + c.new + text[end:hi]
    if TOKEN.findall(text[a0:lo] + region_new + text[hi:z0]) != \
            TOKEN.findall(text[a0:lo]) + TOKEN.findall(region_new) + TOKEN.findall(text[hi:z0]):
        return None  # the new text would run into a neighbouring word
    left = 0
    while left < len(c.before) and left < len(back) and back[-1 - left][0] == c.before[-1 - left]:
        left += 1
    right = 0
    while right < len(c.after) and right < len(fwd) and fwd[right][0] == c.after[right]:
        right += 1
    return start, left, right


def places(c: Change, uri: str, text: str, kinds: Kinds | None = None, rule=accepts) -> list[Place]:
    """Every place of `text` where the change applies (`rule`: `accepts` or `accepts_loosely`), in text order."""
    kinds = kinds or Kinds(text)
    out = []
    for n, m in enumerate(change_pattern(c).finditer(text)):
        if n >= MAX_HITS:
            break
        found = match_at(c, text, m.start(), m.end())
        if found is None:
            continue
        start, left, right = found
        ls, le = line_at(text, start)
        if rule(c, left, right, kinds.at(start), tuple(TOKEN.findall(text, ls, le))):
            out.append(Place(uri, start, start + len(c.old), c.new, c, left, right, c.describe()))
    return out


class Propagator:
    """The proposer without a model: `propose` on the document's recent edit groups (history.py)."""

    name = "propagate"
    last = None  # (the edit, the places found) of the last proposal, for traces and the benchmark's notes

    def __init__(self, loose: bool = False):
        # loose: `accepts_loosely` and insertions on any number of lines, for a proposer that judges each place
        self.rule = accepts_loosely if loose else accepts
        self.max_insertions = None if loose else MAX_INSERTIONS

    def propose(self, groups: list[EditGroup], uri: str, text: str, cursor: int,
                others: list[tuple[str, str]] = (), version: int | None = None) -> NextEdit | None:
        """The next edit after `groups` (oldest first) in `text` (the document `uri` now, the cursor at
        offset `cursor`), else in one of `others` ((uri, text) of the other open documents, most
        relevant first); None where the change applies nowhere."""
        self.last = None
        learnt = edits(groups, text, EDITS)
        if not learnt:
            return None
        # Moving up when the newest edit lies above the one before it; down otherwise.
        down = len(learnt) < 2 or learnt[0].start >= learnt[1].start
        kinds = Kinds(text)
        for edit in learnt:
            found = self.found(edit, learnt, uri, text, kinds)
            if found:
                self.last = (edit, found)  # for traces and the benchmark's notes
                return _proposal(found, text, cursor, down, version)
        for edit in learnt:
            changes = [c for c in edit.changes if free(c)]  # other documents: distinctive renames only
            for other, other_text in others:
                if other == uri or not changes:
                    continue
                found = [p for c in changes for p in places(c, other, other_text, rule=self.rule)]
                if found:
                    return _proposal(found, other_text, 0, True, None)
        return None

    def found(self, edit: Edit, learnt: list[Edit], uri: str, text: str, kinds: Kinds) -> list[Place]:
        """The places in the document `uri` where `edit` (one of `learnt`, the user's newest edits) applies
        by this propagator's rule, not touching what the user's edits changed."""
        # An edit with runs that are no Change (learn.py) propagates by tokens only as renames of distinctive names.
        changes = [c for c in edit.changes if free(c)] if edit.partial else edit.changes
        found = _whole([p for c in changes for p in _few(places(c, uri, text, kinds, self.rule), c, text,
                                                          self.max_insertions)], changes, text)
        return _outside(found + line_places(edit, uri, text, kinds), learnt)


def _few(found: list[Place], c: Change, text: str, most: int | None = MAX_INSERTIONS) -> list[Place]:
    """The places of an insertion, where it applies on at most `most` lines (None: any number): on more, the
    neighbours it was found by are a common shape (`x: bool = ...,`), and which of them the user means is a guess."""
    if c.removed or most is None or len({line_at(text, p.start)[0] for p in found}) <= most:
        return found
    return []


def _outside(found: list[Place], learnt: list[Edit]) -> list[Place]:
    """The places that do not touch what the user's edits changed (their own text is done)."""
    return [p for p in found if not any(p.start <= e.end and p.end >= e.start for e in learnt)]


def _whole(found: list[Place], changes: list[Change], text: str) -> list[Place]:
    """The places on lines where the whole edit applies: every change of it that is not a distinctive
    rename (`free`) has a place on the line (module docstring)."""
    if all(free(c) for c in changes):
        return found  # renames only: each applies wherever its name stands
    needed = {(c.removed, c.added) for c in changes}
    lines: dict[int, set] = {}
    for p in found:
        lines.setdefault(line_at(text, p.start)[0], set()).add((p.change.removed, p.change.added))
    return [p for p in found if needed <= lines[line_at(text, p.start)[0]]]


def _proposal(found: list[Place], text: str, cursor: int, down: bool, version: int | None) -> NextEdit:
    """The place nearest the cursor in the direction of travel (wrapping round), with every token place
    on its line changed too (a line template's place is the whole edit there)."""
    found = sorted({(p.start, p.end, p.new): p for p in found}.values(), key=lambda p: (p.start, p.end))
    ahead = [p for p in found if p.start >= cursor] if down else [p for p in found if p.end <= cursor][::-1]
    behind = [p for p in found if p.start < cursor][::-1] if down else [p for p in found if p.end > cursor]
    target = (ahead or behind)[0]
    if target.change is None:
        return NextEdit(target.uri, target.start, target.end, target.new, target.start + len(target.new),
                        "propagate", text[target.start : target.end], version, target.why)
    ls, le = line_at(text, target.start)
    parts, pos, first = [], None, None
    for p in found:
        if p.change is None or p.start < ls or p.end > le or (pos is not None and p.start < pos):
            continue
        if first is None:
            first = p.start
        else:
            parts.append(text[pos : p.start])
        parts.append(p.new)
        pos = p.end
    new_text = "".join(parts)
    why = "; ".join(dict.fromkeys(p.why for p in found if p.change is not None and ls <= p.start and p.end <= le))
    return NextEdit(target.uri, first, pos, new_text, first + len(new_text), "propagate", text[first:pos], version, why)

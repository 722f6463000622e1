"""What the user's edit was: the newest edit groups near one another, and the token-level changes in them.

The newest edit group (history.py) and the other recent groups near it (within `NEAR` characters and
`NEAR_LINES` lines of it or of one another) are one `Edit`: the text around
them before and after is split into lexical tokens (`\\w+` or one other character) and diffed, and
every run of tokens that changed is a `Change`: the tokens removed and added, the characters between the
unchanged tokens on either side (the region, blanks included) with the smallest edit inside it, up to
`CONTEXT` unchanged tokens on each side, the line it stood on and whether it was code, a comment or a
string (`Kinds`). A rename, a changed argument, an added keyword, a changed call shape are all such
runs. The edit also keeps the whole lines it touched, before and after, for line templates (lines.py).

Changes that add or remove a line break are new code, not a substitution: they are left out of
`changes` (a line template may still carry them). Left out on purpose: where a change applies
(propagate.py, lines.py), LSP, keeping the edits (history.py).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher

from lsp_server.nextedit.history import EditGroup

TOKEN = re.compile(r"\w+|[^\w\s]")
CONTEXT = 6  # unchanged tokens kept (and compared) on each side of a change
WINDOW = 200  # characters lexed on each side of an edit or a place (CONTEXT tokens fit easily)
NEAR = 400  # older groups this close to the newest one (characters) ...
NEAR_LINES = 2  # ... and at most this many lines from it, or from another group of it, are part of the same edit
MAX_REGION = 4000  # an edit group with more text than this teaches nothing (a paste)
MAX_TOKENS = 12  # a change removing or adding more tokens is new code, not a substitution
PLAIN = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {"self", "cls", "this", "def", "return"}


@dataclass(frozen=True)
class Change:
    """One token-level change learnt from an edit (module docstring)."""

    removed: tuple[str, ...]
    added: tuple[str, ...]
    region: str  # the old text between the unchanged tokens either side
    at: int  # the edit inside the region: region[at:at + len(old)] becomes new
    old: str
    new: str
    before: tuple[str, ...]  # unchanged tokens before, nearest last
    after: tuple[str, ...]  # unchanged tokens after, nearest first
    line: tuple[str, ...] = ()  # the tokens of the line it stood on, before the edit
    dotted: bool = False  # the removed tokens (an insertion: its place) follow a "." (an attribute)
    defines: bool = False  # the removed name was defined where the user changed it (`def`, `class`, module `x =`)
    kind: str = "code"  # "code", "comment" or "string": where it stood
    edit: int = 0  # 0: learnt from the newest edit

    def describe(self) -> str:
        return f"{' '.join(self.removed) or '∅'} -> {' '.join(self.added) or '∅'}"

    @property
    def inner(self) -> bool:
        """The edit lies inside the region's non-blank part: a place's region may differ in its blanks."""
        lead = len(self.region) - len(self.region.lstrip())
        trail = len(self.region) - len(self.region.rstrip())
        return self.region.strip() != "" and self.at >= lead and self.at + len(self.old) <= len(self.region) - trail


@dataclass
class Edit:
    """One edit of the user (module docstring). Offsets are of the current text."""

    index: int  # 0: the newest edit
    start: int  # the span of its groups now
    end: int
    changes: list[Change] = field(default_factory=list)
    partial: bool = False  # some run of it is no Change (too long, or it breaks a line): its changes are not all of it
    line_start: int = 0  # where the first line it touched starts now
    old_lines: list[str] = field(default_factory=list)  # the lines it touched, before and after it
    new_lines: list[str] = field(default_factory=list)


@dataclass
class Place:
    """Where a change applies (propagate.py) or a line template (lines.py): text[start:end] becomes `new`."""

    uri: str
    start: int  # the edit at this place: text[start:end] -> new
    end: int
    new: str
    change: Change | None  # None: a line template's place (lines.py)
    left: int = 0  # context tokens matched before and after
    right: int = 0
    why: str = ""


def edits(groups: list[EditGroup], text: str, most: int) -> list[Edit]:
    """The user's newest edits in `text` (the document now), newest first: each is the newest group not
    yet taken and the groups near it. Groups the text does not agree with are left out."""
    pending = [g for g in groups if not g.large and len(g.old) <= MAX_REGION and text[g.start : g.end] == g.new]
    out: list[Edit] = []
    kinds = Kinds(text)
    while pending and len(out) < most:
        newest = pending[-1]
        near = _near(newest, pending, text)
        pending = [x for x in pending if x not in near]
        edit = learn(near, text, len(out), kinds)
        if edit is not None:
            out.append(edit)
    return out


def _near(newest: EditGroup, pending: list[EditGroup], text: str) -> list[EditGroup]:
    """The groups of one edit: the newest, and the others within `NEAR` characters of it that are at most
    `NEAR_LINES` lines from it or from another group taken (two arguments changed on one line, a block of
    lines rewritten). An older change further down is another edit (the user's previous rename, a next
    edit they applied), however few characters away."""
    close = [x for x in pending if x.start >= newest.start - NEAR and x.end <= newest.end + NEAR]
    base = min(x.start for x in close)  # lines counted from here: within 2 * NEAR characters, not the document
    lines = {id(x): (text.count("\n", base, x.start), text.count("\n", base, x.end)) for x in close}
    taken = {id(newest)}
    lo, hi = lines[id(newest)]
    grew = True
    while grew:
        grew = False
        for x in close:
            a, b = lines[id(x)]
            if id(x) not in taken and a <= hi + NEAR_LINES and b >= lo - NEAR_LINES:
                taken.add(id(x))
                lo, hi, grew = min(lo, a), max(hi, b), True
    return [x for x in pending if id(x) in taken]


def learn(near: list[EditGroup], text: str, index: int = 0, kinds: "Kinds | None" = None) -> Edit | None:
    """The edit made of the groups `near` (they agree with `text`, the document now); None when they
    changed nothing."""
    kinds = kinds or Kinds(text)
    s, e = min(x.start for x in near), max(x.end for x in near)
    w0 = 0 if s <= WINDOW else text.rfind("\n", 0, s - WINDOW) + 1
    w1 = text.find("\n", min(len(text), e + WINDOW))
    w1 = len(text) if w1 < 0 else w1
    new_w = text[w0:w1]
    old_w = new_w
    for x in sorted(near, key=lambda x: x.start, reverse=True):  # put back what each group replaced
        old_w = old_w[: x.start - w0] + x.old + old_w[x.end - w0 :]
    if old_w == new_w:
        return None
    ls = text.rfind("\n", 0, s) + 1
    le = text.find("\n", e)
    le = len(text) if le < 0 else le
    shift = len(new_w) - len(old_w)
    edit = Edit(index, s, e, line_start=ls, old_lines=old_w[ls - w0 : le - w0 - shift].split("\n"),
                new_lines=text[ls:le].split("\n"))
    ot, nt = lex(old_w), lex(new_w)
    matcher = SequenceMatcher(None, [t[0] for t in ot], [t[0] for t in nt], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if max(i2 - i1, j2 - j1) > MAX_TOKENS:
            edit.partial = True
            continue
        lo = ot[i1 - 1][2] if i1 > 0 else 0
        hi = ot[i2][1] if i2 < len(ot) else len(old_w)
        nlo = nt[j1 - 1][2] if j1 > 0 else 0
        nhi = nt[j2][1] if j2 < len(nt) else len(new_w)
        region, new_region = old_w[lo:hi], new_w[nlo:nhi]
        p = 0
        while p < min(len(region), len(new_region)) and region[p] == new_region[p]:
            p += 1
        q = 0
        while q < min(len(region), len(new_region)) - p and region[-1 - q] == new_region[-1 - q]:
            q += 1
        old, new = region[p : len(region) - q], new_region[p : len(new_region) - q]
        if old == new:
            continue
        if "\n" in old or "\n" in new or (i1 == i2 and (i1 == 0 or i2 == len(ot))):
            edit.partial = True  # a line break changed (new code), or an insertion with no neighbour to find it by
            continue
        a, b = line_at(old_w, lo + p)
        change = Change(tuple(t[0] for t in ot[i1:i2]), tuple(t[0] for t in nt[j1:j2]), region, p, old, new,
                        tuple(t[0] for t in ot[max(0, i1 - CONTEXT) : i1]), tuple(t[0] for t in ot[i2 : i2 + CONTEXT]),
                        line=tuple(TOKEN.findall(old_w, a, b)), kind=kinds.at(w0 + nlo + p),
                        dotted=after_dot(old_w, lo + p), edit=index)
        line = TOKEN.findall(old_w, a, b)
        change = replace(change, defines=bool(change.removed) and (
            change.before[-1:] in (("def",), ("class",)) or
            (a < len(old_w) and not old_w[a].isspace() and line[:1] == [change.removed[0]] and change.after[:1] in (("=",), (":",)))))
        if change not in edit.changes:
            edit.changes.append(change)
    return edit


def after_dot(text: str, pos: int) -> bool:
    """Whether the word at `pos` follows a "." (an attribute, not a name of its own)."""
    while pos > 0 and (text[pos - 1].isalnum() or text[pos - 1] == "_"):
        pos -= 1
    return text[:pos].rstrip().endswith(".")


def lex(text: str, a: int = 0, b: int | None = None) -> list[tuple[str, int, int]]:
    return [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(text, a, len(text) if b is None else b)]


def line_at(text: str, pos: int) -> tuple[int, int]:
    ls = text.rfind("\n", 0, pos) + 1
    le = text.find("\n", pos)
    return ls, len(text) if le < 0 else le


class Kinds:
    """Whether an offset of a text is in code, a comment or a string (Python-like: `#` comments, quotes
    and triple quotes; a line's scan starts in a triple-quoted string where the quotes before it are odd)."""

    def __init__(self, text: str):
        self.text = text
        self._triples: list[int] | None = None

    def at(self, pos: int) -> str:
        text = self.text
        ls = text.rfind("\n", 0, pos) + 1
        if self._triples is None:
            self._triples = [m.start() for m in re.finditer(r'"""|\'\'\'', text)]
        opened = None
        before = [t for t in self._triples if t < ls]
        if len(before) % 2:  # inside a triple-quoted string at the line's start
            opened = text[before[-1] : before[-1] + 3]
        i = ls
        while i < pos:
            c = text[i]
            if opened is not None:
                if c == "\\":
                    i += 2
                    continue
                if text.startswith(opened, i):
                    i += len(opened)
                    opened = None
                    continue
            elif c == "#":
                return "comment"
            elif c in "'\"":
                opened = c * 3 if text.startswith(c * 3, i) else c
                i += len(opened)
                continue
            i += 1
        return "code" if opened is None else "string"


# Builtin types and typing's Any: one of many, naming nothing in particular.
BUILTINS = frozenset({"int", "str", "bool", "float", "bytes", "list", "dict", "set", "tuple", "object", "type", "Any"})


def informative(tokens) -> bool:
    """Whether the tokens name something: a word of three or more characters that is not a keyword, a builtin
    type or a number."""
    return any(len(t) >= 3 and (t[0].isalpha() or t[0] == "_") and t not in PLAIN and t not in BUILTINS
               for t in tokens)


def distinctive(word: str) -> bool:
    """A name unlikely to mean two things in one file: joined words (`KeepOpenFile`, `get_stream`), a
    digit inside, or ten characters and more; not a plain word (`text`, `value`, `Sequence`)."""
    if not (word[:1].isalpha() or word[:1] == "_") or word in PLAIN:
        return False
    core = word.strip("_")
    return (len(core) >= 4 and (any(c.isupper() for c in core[1:]) or "_" in core or any(c.isdigit() for c in core))
            or len(core) >= 10)


def is_rename(c: Change) -> bool:
    return (len(c.removed) == 1 and len(c.added) == 1 and informative(c.removed) and
            (c.added[0][0].isalpha() or c.added[0][0] == "_"))



"""Line templates: the user's edit, as whole lines, proposed where the same lines stand.

The lines an edit touched, before and after it (learn.py `Edit`), less the lines at either end that
it left as they were, are a template:
- lines changed into others: a place is a run of lines equal to the old ones (blanks at the line
  starts aside, relative indentation kept), and, for one line changed, a line that differs from the
  old one in one word only (a sibling, in code: `exit_code = 1` and `exit_code = 2`; not a keyword,
  a builtin type or the name a `def` or `class` defines; and only where at most `MAX_SIBLINGS` lines
  are siblings), that word kept where the user's new line has it;
- lines deleted: a place is a run of lines equal to them, deleted there too (not where the lines
  leave a bracket open or close one they did not open: that is the first step of a bigger change);
- lines only inserted: a place is where the two lines around the user's inserted lines stand together
  again (blanks at the line starts aside; each line more than trivial: `MIN_ANCHOR` characters), at
  most `MAX_ANCHORED` times; the lines go in between, indented as the line below them there (a
  parameter added to two signatures, a keyword argument to two calls that share their neighbours).
  Elsewhere nothing tells where they would go.
A template names something (`informative`) and has three tokens at least; its places are in the same
kind of text (code, comment, string) as the edit, and a template whose lines stand more than
`MAX_SAME` times elsewhere proposes none of them (a common statement: which one is meant is a guess). This catches what token changes cannot: an
insertion next to a word that differs (`exit_code = 2` -> `exit_code: t.ClassVar[int] = 2`), deleted
comment lines.

Left out on purpose: choosing among places (propagate.py), LSP.
"""

from __future__ import annotations

import re

from lsp_server.completion.stops import open_brackets
from lsp_server.nextedit.learn import PLAIN, BUILTINS, CONTEXT, TOKEN, WINDOW, Edit, Kinds, Place, informative, line_at

MAX_LINES = 8  # templates of more lines are new code
MIN_TOKENS = 3
MAX_SAME = 9  # lines that stand more often than this are a common statement, proposed nowhere
MAX_SIBLINGS = 8  # a template with more sibling lines than this proposes none of them
MIN_ANCHOR = 4  # characters (blanks aside) of each line around inserted lines, to find where they go again
MAX_ANCHORED = 3  # inserted lines whose neighbours stand together more often than this propose none
# Words a sibling line may not differ in: keywords and builtin types are one of many, not a family.
COMMON = PLAIN | BUILTINS
WORD = re.compile(r"\w+")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _trimmed(edit: Edit) -> tuple[list[str], list[str], int]:
    """(old lines, new lines) of the edit less the lines it left as they were at either end, and how many
    were left at the start."""
    old, new = list(edit.old_lines), list(edit.new_lines)
    top = 0
    while old and new and old[0] == new[0]:
        old.pop(0), new.pop(0)
        top += 1
    while old and new and old[-1] == new[-1]:
        old.pop(), new.pop()
    return old, new, top


def template(edit: Edit) -> tuple[list[str], list[str]] | None:
    """(old lines, new lines) of the edit, less the lines it left as they were at either end; None when
    it is no template (module docstring)."""
    old, new, _ = _trimmed(edit)
    if not old or max(len(old), len(new)) > MAX_LINES or not any(line.strip() for line in old):
        return None
    tokens = TOKEN.findall("\n".join(old))
    if len(tokens) < MIN_TOKENS or not informative(tokens):
        return None
    if not new and (open_brackets("\n".join(old)) or not _closes("\n".join(old))):
        return None  # deleting part of a bracketed expression: the first step of a bigger change
    return old, new


def line_places(edit: Edit, uri: str, text: str, kinds: Kinds) -> list[Place]:
    """The places of `text` where the edit's template applies (module docstring)."""
    found = template(edit)
    if found is None:
        return _inserted(edit, uri, text, kinds)
    old, new = found
    offset = edit.line_start + _line_offset(edit, old)
    kind = kinds.at(offset + len(_indent(old[0])))
    base = min((_indent(x) for x in old if x.strip()), key=len)
    first = next(x for x in old if x.strip())
    skip = old.index(first)
    out = []
    # The tokens around the user's lines (unchanged by the edit), to count how much a place's surroundings agree.
    mine_end = offset + len("\n".join(new))
    before = TOKEN.findall(text, max(0, offset - WINDOW), offset)[-CONTEXT:]
    after = TOKEN.findall(text, mine_end, mine_end + WINDOW)[:CONTEXT]
    pattern = re.compile(r"(?m)^([ \t]*)" + re.escape(first.strip()) + r"[ \t]*$")
    for m in pattern.finditer(text):
        start = m.start() - sum(len(x) + 1 for x in old[:skip])
        if start < 0 or kinds.at(m.start(1) + len(m.group(1))) != kind:
            continue
        block = _lines(text, start, len(old))
        if len(block) < len(old):
            continue
        here = m.group(1)
        if any(_reindent(x, base, here) != y.rstrip() for x, y in zip(old, block)):
            continue
        end = start + sum(len(x) + 1 for x in block) - 1
        left = _agree(before[::-1], TOKEN.findall(text, max(0, start - WINDOW), start)[::-1])
        right = _agree(after, TOKEN.findall(text, end, end + WINDOW))
        if new:
            out.append(Place(uri, start, end, "\n".join(_reindent(x, base, here) for x in new), None, left, right,
                             why="lines: " + " / ".join(x.strip() for x in old)[:80]))
        else:  # deleted lines go with their line breaks
            out.append(Place(uri, start, min(len(text), end + 1), "", None, left, right,
                             why="delete lines: " + " / ".join(x.strip() for x in old)[:80]))
    values = edit.changes and all(c.removed and c.added and all(literal(t) for t in c.removed + c.added)
                                  for c in edit.changes)
    if len(out) > MAX_SAME:
        out = []  # a common statement (`response = client.get("/")`): which of them the user means is a guess
    if len(old) == 1 and len(new) == 1 and not values:  # one value for another is data: identical lines only
        siblings = _siblings(old[0], new[0], uri, text, kinds, kind)
        if len(siblings) <= MAX_SIBLINGS:  # more: the line is a common shape, not a family the user is going through
            out += siblings
    return out


def _inserted(edit: Edit, uri: str, text: str, kinds: Kinds) -> list[Place]:
    """The places of lines the edit only inserted: between the same two lines as the user's (module docstring)."""
    old, new, top = _trimmed(edit)
    if old or not new or len(new) > MAX_LINES:
        return []
    tokens = TOKEN.findall("\n".join(new))
    if len(tokens) < MIN_TOKENS or not informative(tokens):
        return []
    start = edit.line_start + sum(len(x) + 1 for x in edit.new_lines[:top])  # the first inserted line
    end = start + sum(len(x) + 1 for x in new)  # the line below them
    if start == 0 or end >= len(text):
        return []
    above, below = text[slice(*line_at(text, start - 1))], text[slice(*line_at(text, end))]
    if min(len(above.strip()), len(below.strip())) < MIN_ANCHOR:
        return []
    base = _indent(below)
    kind = kinds.at(end + len(base))  # where the line below stands, here and at a place (the lines are not there)
    pattern = re.compile(r"(?m)^[ \t]*" + re.escape(above.strip()) + r"[ \t]*\n([ \t]*)" + re.escape(below.strip()) +
                         r"[ \t]*$")
    out = []
    for m in pattern.finditer(text):
        if kinds.at(m.start(1) + len(m.group(1))) != kind:
            continue
        # At the end of the line above, each line after a break: the Neovim plugin draws a proposal's lines
        # after its first as virtual lines below it (tests/editors/test_editor_nvim_next_edit.py); an insertion
        # at the start of the line below would be drawn on that line, before its text.
        at = m.start(1) - 1
        lines = "".join("\n" + _reindent(x, base, m.group(1)) for x in new)
        out.append(Place(uri, at, at, lines, None, why="insert lines: " + " / ".join(x.strip() for x in new)[:80]))
        if len(out) > MAX_ANCHORED:
            return []  # neighbours that stand together this often are a common shape: which place is meant is a guess
    return out


def literal(token: str) -> bool:
    return token in ("True", "False", "None") or token[0].isdigit() or token in "\"'"


def _lines(text: str, start: int, n: int) -> list[str]:
    """The n lines of `text` from offset `start` (fewer at its end)."""
    out = []
    while len(out) < n and start <= len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        out.append(text[start:end])
        start = end + 1
    return out


def _agree(a: list[str], b: list[str]) -> int:
    """How many tokens two sequences share from their start."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def _closes(text: str) -> bool:
    """Whether `text` closes no bracket it did not open (strings not told apart: a rough count)."""
    depth = 0
    for c in text:
        depth += (c in "([{") - (c in ")]}")
        if depth < 0:
            return False
    return True


def _line_offset(edit: Edit, old: list[str]) -> int:
    """Where the template's first line starts, counted from the edit's first line (lines dropped at the
    start were the same before and after)."""
    dropped = 0
    for a, b in zip(edit.old_lines, edit.new_lines):
        if a != b or dropped >= len(edit.new_lines) - 1:
            break
        dropped += 1
    return sum(len(x) + 1 for x in edit.new_lines[:dropped])


def _reindent(line: str, base: str, here: str) -> str:
    """`line` of a block indented at `base`, moved to a block indented at `here`."""
    line = line.rstrip()
    return here + line[len(base) :] if line.startswith(base) else line


def _siblings(old: str, new: str, uri: str, text: str, kinds: Kinds, kind: str) -> list[Place]:
    """Lines that differ from `old` in one word the user did not change, changed as `new` with that word."""
    from difflib import SequenceMatcher

    ot = [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(old)]
    nt = [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(new)]
    kept: dict[int, int] = {}  # old token index -> new token index, where the user left the token
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, [t[0] for t in ot], [t[0] for t in nt], autojunk=False).get_opcodes():
        if tag == "equal":
            kept.update({i1 + d: j1 + d for d in range(i2 - i1)})
    strip = old.strip()
    lead = len(old) - len(old.lstrip(" \t"))
    out = []
    for k, (tok, a, b) in enumerate(ot):
        if k not in kept or not WORD.fullmatch(tok) or (k and ot[k - 1][0] in ("def", "class")) or tok in COMMON:
            continue  # a definition's name is another definition, a builtin type one of many
        rest = [t for i, (t, _, _) in enumerate(ot) if i != k]
        if not informative(rest) and len(rest) < 4:
            continue
        pattern = re.compile(r"(?m)^([ \t]*)" + re.escape(strip[: a - lead]) + r"(\w+)" +
                             re.escape(strip[b - lead :]) + r"[ \t]*$")
        for m in pattern.finditer(text):
            word = m.group(2)
            if word == tok or word[0].isdigit() != tok[0].isdigit() or word in COMMON:
                continue
            if kinds.at(m.start(1) + len(m.group(1))) != "code":
                continue
            j = kept[k]
            changed = new[: nt[j][1]] + word + new[nt[j][2] :]
            start = m.start(1)
            end = start + len(m.group(0).rstrip())
            out.append(Place(uri, start, end, m.group(1) + changed.strip(), None,
                             why=f"sibling line ({tok} -> {word}): {strip[:60]}"))
    return out

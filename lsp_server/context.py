"""Document snapshot -> prompt token ids in a fill-in-the-middle layout.

Layout (DESIGN.md section 4), stable parts first so the KV cache covers them:

    [<file_sep>other.py\\n<snippet of another open buffer>]...
    [<file_sep>this.py\\n]<fim_prefix>lines above the cursor line
    <fim_suffix>rest of the cursor line + lines below<fim_middle>text typed on the cursor line

Typing on one line changes only the tail (the typed text after <fim_middle>), and the
rest of the cursor line inside the suffix. Each part is tokenized on its own, so the
tokens of an unchanged part never change.

Also here: the text-level stop rules of ghost text (end of block, repeating the suffix).
Left out on purpose: the model, the engine, LSP types.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Prompt:
    ids: list[int]
    above: str  # lines above the cursor line, as included (possibly cut at the top)
    typed: str  # the cursor line up to the cursor
    after: str  # the cursor line after the cursor
    below: str  # lines below the cursor line, as included (possibly cut at the bottom)
    snippets: list[str] = field(default_factory=list)  # names of other buffers included

    @property
    def indent(self) -> str:
        return _indent_of(self.typed)


@dataclass
class ContextBudget:
    total: int = 2048  # prompt tokens at most
    above: int = 1024  # of which lines above the cursor
    below: int = 384  # of which the rest of the line and lines below
    snippets: int = 512  # of which other open buffers (only when they fit)


def split_at(text: str, line: int, col: int) -> tuple[str, str, str, str]:
    """(lines above incl. newline, typed part of cursor line, rest of cursor line, lines below incl. leading newline).

    line and col are 0-based; col counts code points in the line. ValueError if outside the text.
    """
    lines = text.split("\n")
    if line < 0 or line >= len(lines):
        raise ValueError(f"line {line + 1} is outside the text, which has {len(lines)} lines")
    cur = lines[line]
    bare = cur[:-1] if cur.endswith("\r") else cur
    if col < 0 or col > len(bare):
        raise ValueError(f"column {col + 1} is outside line {line + 1}, which has {len(bare)} characters")
    above = "".join(l + "\n" for l in lines[:line])
    below = "".join("\n" + l for l in lines[line + 1 :])
    return above, cur[:col], cur[col:], below


def build_prompt(lm, text: str, line: int, col: int, others: list[tuple[str, str]] | None = None,
                 path: str | None = None, budget: ContextBudget | None = None) -> Prompt:
    """Prompt ids for a completion at (line, col) of `text` (see the module docstring).

    `lm` needs encode(), and fim (prefix/suffix/middle ids, file_sep or None). A model
    without FIM tokens gets a plain left-to-right prompt (above + typed).
    """
    b = budget or ContextBudget()
    above, typed, after, below = split_at(text, line, col)
    # Never tokenize more than the budgets can hold (a token is rarely under 1 character).
    cap = 4 * max(b.above, b.below, b.total)
    above, typed = above[-cap:], typed[-cap:]
    after, below = after[:cap], below[: max(0, cap - len(after))]
    typed_ids = lm.encode(typed)[-b.above :]
    # Lines above: keep whole lines from the bottom up within the budget.
    above_lines = above.splitlines(keepends=True)
    kept: list[list[int]] = []
    used = 0
    for l in reversed(above_lines):
        ids = lm.encode(l)
        if used + len(ids) > b.above:
            break
        kept.append(ids)
        used += len(ids)
    kept.reverse()
    above_kept = "".join(above_lines[len(above_lines) - len(kept) :])
    above_ids = [t for ids in kept for t in ids]
    # Rest of line and lines below: keep whole lines from the top down.
    below_lines = (after + below).splitlines(keepends=True)
    below_ids: list[int] = []
    below_kept = ""
    for l in below_lines:
        ids = lm.encode(l)
        if len(below_ids) + len(ids) > b.below:
            break
        below_ids.extend(ids)
        below_kept += l
    fim = lm.fim
    if fim is None:
        ids = above_ids + typed_ids
        return Prompt(ids, above_kept, typed, after, below_kept[len(after):])
    head: list[int] = []
    names: list[str] = []
    room = min(b.snippets, b.total - len(above_ids) - len(below_ids) - len(typed_ids) - 8)
    if others and fim.file_sep is not None:
        for name, other in others:
            ids = [fim.file_sep, *lm.encode(f"{name}\n{other[: 4 * max(room, 0)]}")]
            if len(ids) > room:
                ids = ids[:room]
            if len(ids) <= 2:
                break
            head.extend(ids)
            names.append(name)
            room -= len(ids)
    if fim.file_sep is not None and (head or path):
        head.extend([fim.file_sep, *lm.encode(f"{path or 'untitled'}\n")])
    ids = [*head, fim.prefix, *above_ids, fim.suffix, *below_ids, fim.middle, *typed_ids]
    return Prompt(ids, above_kept, typed, after, below_kept[len(after):] if below_kept.startswith(after) else "", names)


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def ghost_cut(generated: str, prompt: Prompt, multiline: bool = True, final: bool = False) -> int | None:
    """Where ghost text should end, as a character index into `generated`; None to go on.

    Stops at: the end of the current block (a complete later line indented less than
    the cursor line), the first line when `multiline` is off, a line that repeats the
    next non-blank line below the cursor, a line that repeats one of the suggestion's
    own earlier lines (`_repeats`), and a first line that ends by re-typing the rest of
    the cursor line (the cut keeps what comes before it). `final` says the generation
    has ended, so the last line counts as complete.
    """
    typed = prompt.typed
    lines = generated.split("\n")
    after = prompt.after.rstrip("\r").strip()
    first_complete = len(lines) > 1 or final
    if after and first_complete and lines[0].rstrip().endswith(after):
        return len(lines[0].rstrip()) - len(after)
    if not multiline:
        return len(lines[0]) if len(lines) > 1 else None
    cursor_line = typed + lines[0]
    base = len(_indent_of(cursor_line)) if cursor_line.strip() else len(_indent_of(typed))
    next_below = next((l for l in prompt.below.split("\n") if l.strip()), None)
    pos = len(lines[0]) + 1
    for i in range(1, len(lines)):
        l = lines[i]
        complete = i < len(lines) - 1 or final
        if l.strip() and len(_indent_of(l)) < base:
            return pos - 1  # its indentation is known as soon as it has content
        if complete and l.strip() and next_below is not None and l.strip() == next_below.strip():
            return pos - 1
        if complete and _repeats(l, [cursor_line, *lines[1:i]]):
            return pos - 1
        pos += len(l) + 1
    return None


# Words that name nothing: a line made only of these (`return None`, `pass`, `break`), of
# brackets or of punctuation legitimately repeats within one suggestion.
_PLAIN_WORDS = frozenset("return None True False null nil pass break continue else elif try except finally "
                         "end fi done do then raise yield await self this".split())


def _repeats(line: str, earlier: list[str]) -> bool:
    """`line` is a whole statement the suggestion already wrote: equal to an earlier line,
    indentation included, naming something, its brackets balanced and not a header.

    A model that starts looping writes the same import or call again. Lines that differ
    anywhere (two `parser.add_argument("--x")` calls) are not repeats; nor are the lines
    that legitimately recur: blank and closing-bracket lines, `return None`, the head of a
    multi-line call (`parser.add_argument(`), a block header (`with lock:`), a list item (`x,`).
    """
    text = line.rstrip()
    if not text or text[-1] in ":{[(,\\" or sum(text.count(c) for c in "([{") != sum(text.count(c) for c in ")]}"):
        return False
    words = "".join(c if c.isalnum() or c == "_" else " " for c in text).split()
    if all(w[0].isdigit() or w in _PLAIN_WORDS for w in words):
        return False
    return any(text == e.rstrip() for e in earlier)


def finish(generated: str, prompt: Prompt, multiline: bool = True) -> str:
    """The ghost text to show for `generated`: cut by the stop rules, trailing blank lines dropped.

    Empty when the suggestion would only re-type what already follows the cursor.
    """
    cut = ghost_cut(generated, prompt, multiline, final=True)
    text = generated if cut is None else generated[:cut]
    text = text.rstrip()
    if not text.strip():
        return ""
    after = prompt.after.rstrip("\r")
    if after and after.startswith(text):
        return ""
    return text

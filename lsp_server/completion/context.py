"""Document snapshot -> prompt token ids in a fill-in-the-middle layout.

Layout (docs/design.md section 4), stable parts first so the KV cache covers them:

    [<file_sep>other.py\\n<snippet of another open buffer>]...
    [<file_sep>this.py\\n]<fim_prefix>[this file's head][definitions][recent edits]
    [what followed the lines above the cursor further up]
    lines above the cursor line
    <fim_suffix>rest of the cursor line + lines below<fim_middle>[lines typed at this place]text typed on the cursor line

Each part is tokenized on its own, and the lines above line by line, so the tokens of an
unchanged part never change. The engine reuses the longest common token prefix of the
previous prompt of the same document (engine.py, `prefill`), so what matters for speed is
that the *start* of the prompt stays the same across the edits people make.

Windows that survive editing. The lines-above window used to be filled from the cursor
upwards up to its budget, so every Enter, new line or cursor move dropped or added a line
at its top: its first token changed and the whole prompt was prefilled again (8 of 1,415
tokens reused after Enter in a 1,900-line file). Now its start moves in coarse steps and
only when it must:

- The start of the window is remembered per document in a small `Window` object that the
  caller keeps (the Completer holds one per document). A stateless rule cannot do this:
  any function of (text, cursor line) alone that is piecewise constant still jumps at
  some line, and a move across that line re-prefills everything; keeping the start until
  the cursor leaves a slack is hysteresis, which needs the last start.
- The start is kept while the window from it to the cursor line holds at most `above`
  tokens and at least a quarter of that (or starts at line 0). Enter, typing new lines,
  deleting lines and moving within that range change only the tokens from the edit on.
  The start follows its first lines when lines are added or removed above it (an import
  added at the top of the file), so the window keeps its text.
- Otherwise it is re-anchored: at the nearest multiple of `chunk_lines` at or below the
  first line from which the window holds at most `above - slack` tokens. The slack is
  room for lines added below (Enter, moving down) before the next move; a multiple of
  `chunk_lines` does not depend on the exact cursor line, so two histories that
  re-anchor near the same place agree. Without a `Window` (a one-shot request) the start
  is chosen by that rule every time.
- The snippets of other buffers get a share computed from the budget alone (not from the
  size of this document's windows or the typed text), so their cut and order change only
  when their text changes.
- Code repeats within a file (a sync method and its async twin). When the lines just above the
  cursor stand elsewhere in the file, outside the windows, the lines that followed them there open
  the prefix (lsp_server/completion/retrieval.py `repeat_ids`, `repeated_at`): the model copies
  from them as it would from lines it sees above. They take at most `ContextBudget.repeat` tokens,
  in place of as many at the top of the window above; chosen when the place is new and kept while
  it stays, so they do not move the prompt's start while lines are typed there.
- This file's head (its first lines after leading comments: imports, usually) opens the prefix
  when the window starts below it (head.py `file_head_ids`). It is the same at every place in the file, so
  a place not visited yet reuses its cache and costs only its own lines: the head's tokens are
  taken from the window (`ContextBudget.file_head`), so a new place costs that many fewer.
- After the head, the definitions of the names used around the cursor and the user's recent edits,
  as comment lines (extras.py): each within its share (`ContextBudget.definitions`, `.edits`), in
  place of as many tokens at the top of the window, chosen when the place is new and kept while it stays.
- The lines-below window is filled from the cursor line down (whole lines, up to
  `below`). In prefix-suffix-middle order it follows the lines above, so whenever
  anything above the cursor changes its tokens sit at new positions and are recomputed
  anyway: anchoring its end would save nothing, and an end fixed to a line would make the
  suffix grow by every line the cursor moves up. Typing on the cursor line leaves it
  unchanged (only the typed text after <fim_middle> changes). What Enter would cost is
  therefore the suffix plus the new line: that is why `below` is small (see
  ContextBudget).
- Lines typed one after another at a place stay in the middle (`_middle_from`): the prefix
  ends, and the suffix starts, where the place was first asked, and Enter costs only the
  new line. The place moves on when the text after the cursor is not the place's any more
  (the cursor moved; typing new lines keeps it), the cursor goes above the place or jumps
  more than two lines down, or its lines pass MIDDLE tokens.

The text-level stop rules of ghost text are lsp_server/completion/stops.py.
Left out on purpose: the model, the engine, LSP types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lsp_server.completion.extras import PromptExtras, room_at_top, take
from lsp_server.completion.head import file_head_ids
from lsp_server.completion.typed import healed_tail  # (the typed text's end; wholefile.py and tests import it here)
from lsp_server.completion.retrieval import repeat_ids, similar_snippets


@dataclass
class Prompt:
    ids: list[int]
    above: str  # lines above the cursor line, as included (possibly cut at the top)
    typed: str  # the cursor line up to the cursor
    after: str  # the cursor line after the cursor
    below: str  # lines below the cursor line, as included (possibly cut at the bottom)
    snippets: list[str] = field(default_factory=list)  # names of other buffers included
    start_line: int = 0  # 0-based first line of the lines-above window
    healed: str = ""  # the end of `typed` left out of the ids: the model writes it (token healing)
    # The ids the prompt of every place below the file's head starts with (snippets, header, <fim_prefix>,
    # the head: head.py `file_head_ids`), and the line after the head; idle prefill at the top warms these.
    stable: list[int] = field(default_factory=list)
    stable_end: int = 0
    whole: bool = False  # the whole file above the place, from its prefix KV (lsp_server/completion/wholefile.py)
    sections: dict = field(default_factory=dict)  # tokens of each part of `ids` (`ditto/trace`), by name
    # The definitions' and edits' lines as written (stripped): the prompt's own comments, which a
    # suggestion never copies into the file (stops.py `ghost_cut`; extras.py `take`).
    written: frozenset = frozenset()


@dataclass
class ContextBudget:
    """Prompt budget in tokens. `below` is small on purpose: the suffix is recomputed after
    every Enter, deleted line or move (module docstring). On torch's nn/modules/conv.py with
    the default model's tokenizer, Enter recomputes 66 tokens on average (85 at most) of a
    ~1,280-token prompt with these defaults; with the former 1024 above / 384 below and a
    window sliding line by line it recomputed 884 on average (1,398 at most) of ~1,400."""

    total: int = 2048  # prompt tokens at most
    above: int = 1536  # of which lines above the cursor
    below: int = 64  # of which the rest of the line and lines below (recomputed after every edit above: keep it small)
    snippets: int = 352  # of which other open buffers (only when they fit)
    snippet_source: str = "heads"  # heads: each buffer's start; similar: chunks like the code around the cursor
    slack: int | None = None  # room left below the lines-above window when it is re-anchored; None: above // 6
    chunk_lines: int = 8  # the lines-above window starts at a multiple of this when it can
    repeat: int = 0  # of which what followed the lines above the cursor elsewhere in the file (retrieval.py)
    file_head: int = 0  # of which this file's first lines, opening the prefix below them (head.py `file_head_ids`)
    definitions: int = 0  # of which, at most, the definitions of names used around the cursor (extras.py)
    edits: int = 0  # of which, at most, the user's recent edits (extras.py)

    def room_for_slack(self) -> int:
        return self.above // 6 if self.slack is None else max(0, min(self.slack, self.above))

    FILE_HEAD_MAX = 128  # `file_head` at most
    REPEAT_MAX = 128  # `repeat` at most (what followed one match; its lines nearest the match count most)
    SNIPPETS_FROM = 1024  # smaller totals give other buffers no room (below)
    DEFAULT_TOTAL = 256  # the `context_tokens` default (lsp_server/settings.py): the server's and Completer's budget

    @classmethod
    def default(cls) -> "ContextBudget":
        """The budget a server, `ditto-lsp complete` and a bare Completer use unless told otherwise."""
        return cls.scaled(cls.DEFAULT_TOTAL)

    SOURCES = ("heads", "similar", "none")  # the `snippets` setting (lsp_server/settings.py)

    @classmethod
    def scaled(cls, total: int, snippets: str = "heads", definitions: float = 0.0,
               edits: float = 0.0) -> "ContextBudget":
        """A budget of `total` tokens in the proportions of 2048 (the `context_tokens` setting),
        with snippets of the other open buffers from `snippets` (one of SOURCES), and at most these
        shares of `total` for the definitions and the recent edits (extras.py; taken from the lines above).

        "heads" (each buffer's start): below SNIPPETS_FROM tokens the other buffers get no room:
        on held-out code (tqdm, 73 requests, default model) their heads cost quality at a small
        total (typed + first line right 12/73 at 320 tokens with them, 14/73 without;
        docs/design.md, "Prompt layout and windows"). "similar" (retrieval.py) gets its share at every total, taken from
        the lines above; "none" gives other buffers no room. The window's start moves in steps
        of fewer lines at a small total, so that rounding it to a step does not drop a large
        share of the lines above."""
        if snippets not in cls.SOURCES:
            raise ValueError(f"snippets must be one of {', '.join(cls.SOURCES)}, got {snippets!r}")
        full = cls(total=2048, above=1536, below=64, snippets=352)
        share = total * full.snippets // full.total
        if snippets == "none":
            share = 0
        elif snippets == "heads" and total < cls.SNIPPETS_FROM:
            share = 0
        above = total * full.above // full.total
        if total < cls.SNIPPETS_FROM:  # below it the lines above and the snippets would not both fit
            above -= share
        # The file's head comes out of the lines above: a place not visited yet reuses its cache, so it
        # costs that many tokens less, for the same first lines right
        # (docs/design.md, "Prompt layout and windows", `[head]`).
        head = min(cls.FILE_HEAD_MAX, total // 4)
        return cls(total=total, above=above - head, below=min(full.below, max(8, total // 16)), snippets=share,
                   repeat=min(cls.REPEAT_MAX, total // 4), file_head=head,
                   definitions=int(total * definitions), edits=int(total * edits),
                   snippet_source="similar" if snippets == "similar" else "heads",
                   chunk_lines=_power_of_two(max(2, min(full.chunk_lines, above // 60))))


def _power_of_two(n: int) -> int:
    """The largest power of two <= n: window starts then fall on the grid of the server's snapshot
    windows of long documents too (lsp_server/lsp/documents.py WINDOW_GRID, a multiple of it), so a
    prompt through a snapshot is the prompt of the whole text."""
    return 1 << (max(1, n).bit_length() - 1)


@dataclass
class Window:
    """Where the lines-above window of one document starts; kept between requests by the caller."""

    start: int | None = None  # 0-based line; None before the first prompt
    anchored: int = 0  # times the start was chosen afresh (the first time included)
    head: tuple[str, ...] = ()  # the text of the window's first lines, to follow them when lines above move
    chosen: tuple = ()  # (window start, buffer names, [(name, first line)]): retrieved snippets (retrieval.py)
    repeat: tuple = ()  # (middle line, lines): what followed the lines above the cursor further up (retrieval.py)
    extras: tuple = ()  # (middle line, PromptExtras): the definitions and edits chosen at the place (extras.py)
    middle: int | None = None  # first line of the middle: lines typed at this place go after <fim_middle> (`_middle_from`)
    last_line: int | None = None  # the cursor line of the last prompt
    suffix: str | None = None  # the text after the cursor that prompt held (the place's, while lines are typed there)
    # Token ids of recently used lines, by their text (tokenizing ~150 lines per keystroke
    # through a tokenizer wrapper costs ~20 ms; a line's ids depend on its text only).
    lines: dict[str, list[int]] = field(default_factory=dict, repr=False)

    MAX_LINES = 8192

    def encode(self, lm, line: str) -> list[int]:
        ids = self.lines.get(line)
        if ids is None:
            if len(self.lines) >= self.MAX_LINES:
                self.lines.clear()
            ids = self.lines[line] = lm.encode(line)
        return ids


TYPED_RESERVE = 64  # tokens of the budget kept for the typed text (the snippets never take them)


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


HEAD_LINES = 4  # lines of the window's start remembered to follow it
FOLLOW = 64  # lines up or down searched for them


def _followed(lines: list[str], window: Window) -> int | None:
    """The window's start in `lines`: where it was, or where its first lines moved to when
    lines were added or removed above it (an import added at the top of the file)."""
    start = window.start
    if start is None or not window.head:
        return start
    n = len(window.head)
    if tuple(lines[start : start + n]) == window.head:
        return start
    for d in range(1, FOLLOW + 1):
        for s in (start + d, start - d):
            if 0 <= s and tuple(lines[s : s + n]) == window.head:
                return s
    return start


def _above_start(enc, lines: list[str], line: int, above: int, slack: int, chunk: int,
                 window: Window | None) -> tuple[int, int]:
    """(first line of the lines-above window, its tokens) for a cursor on `line`.

    enc(i): the token ids of line i with its newline. Tokenizes at most the lines of the
    window and one more chunk: never the whole document.
    """
    low = above // 4
    start = _followed(lines, window) if window is not None else None
    if start is not None and start <= line:
        n = _tokens_between(enc, start, line, above)
        if n <= above and (n >= low or start == 0):
            _keep(window, lines, start, anchored=False)
            return start, n
    start, n = _anchor(enc, line, above, slack, chunk)
    if window is not None:
        _keep(window, lines, start, anchored=True)
    return start, n


def _keep(window: Window, lines: list[str], start: int, anchored: bool) -> None:
    window.start = start
    window.head = tuple(lines[start : start + HEAD_LINES])
    window.anchored += int(anchored)


def _tokens_between(enc, start: int, line: int, limit: int) -> int:
    """Tokens of lines start..line-1, counted from the bottom; stops once past `limit`."""
    n = 0
    for i in range(line - 1, start - 1, -1):
        n += len(enc(i))
        if n > limit:
            break
    return n


def _anchor(enc, line: int, above: int, slack: int, chunk: int) -> tuple[int, int]:
    """A fresh start for the lines-above window of a cursor on `line`, and its tokens."""
    # The lowest line m from which the window holds at most `above - slack` tokens ...
    target = above - slack
    n, m = 0, line
    while m > 0 and n + len(enc(m - 1)) <= target:
        m -= 1
        n += len(enc(m))
    if m == 0:
        return 0, n
    # ... moved down to the next multiple of `chunk` (fewer tokens, never more).
    start = -(-m // max(1, chunk)) * max(1, chunk)
    if start < line:
        return start, _tokens_between(enc, start, line, above)
    # Lines too long for chunks: whole lines within the full budget.
    n, start = 0, line
    while start > 0 and n + len(enc(start - 1)) <= above:
        start -= 1
        n += len(enc(start))
    return start, n


def build_prompt(lm, text: str, line: int, col: int, others: list[tuple[str, str]] | None = None,
                 path: str | None = None, budget: ContextBudget | None = None,
                 window: Window | None = None, heal: str = "none", extras: PromptExtras | None = None) -> Prompt:
    """Prompt ids for a completion at (line, col) of `text` (see the module docstring).

    `lm` needs encode(), and fim (prefix/suffix/middle ids, file_sep or None). A model
    without FIM tokens gets a plain left-to-right prompt (above + typed). `window` is
    the document's window state: read, and updated when the window moves.
    The prompt holds at most `budget.total` tokens, and the lines typed at the place asked last
    (`_middle_from`, at most MIDDLE tokens).

    `heal` says how the typed text ends the prompt (`healed_tail`): "token" backs it up to
    the last token boundary (the generation is then constrained to write the rest,
    lsp_server/decoding/healing.py; needs `lm.token_bytes()`), "blanks" leaves out trailing
    blanks only (the model writes them; for engines that cannot be constrained), "none"
    keeps it all. What is left out is `Prompt.healed`. `extras`: the definitions and recent edits offered
    (extras.py), taken at a new place within the budget's shares.
    """
    b = budget or ContextBudget.default()
    _, typed, after, _ = split_at(text, line, col)  # validates line and col
    lines = text.split("\n")
    fim = lm.fim
    # This file's header and the parts' budgets come from the budget and the path only, so
    # that they do not move while the user edits.
    header: list[int] = []
    if fim is not None and fim.file_sep is not None and (others or path):
        header = [fim.file_sep, *lm.encode(f"{path or 'untitled'}\n")]
    specials = 3 if fim is not None else 0
    avail = max(0, b.total - len(header) - specials - min(TYPED_RESERVE, b.total // 8))
    above_budget, below_budget = max(0, b.above), max(0, b.below)
    if fim is None:  # lines below serve only the stop rules: not in the prompt
        above_budget = min(above_budget, avail)
    elif above_budget + below_budget > avail:  # a budget whose parts exceed its total: shrink them
        below_budget = min(below_budget, avail // 4)
        above_budget = min(above_budget, avail - below_budget)
    snippet_room = max(0, min(b.snippets, avail - above_budget - below_budget))
    # A line of more than 8 characters per token of the budget almost never fits (code
    # averages 3-4 characters a token): it is left out untokenized, so a megabyte line is cheap.
    too_long = 8 * max(above_budget, below_budget, 1) + 64
    cache: dict[int, list[int]] = {}
    encode = lm.encode if window is None else (lambda part: window.encode(lm, part))

    def enc(i: int) -> list[int]:
        if i not in cache:
            part = lines[i] + "\n"
            cache[i] = encode(part) if len(part) <= too_long else _UNFIT * (above_budget + 1)
        return cache[i]

    # Rest of the cursor line and lines below: whole lines from the top down.
    below_ids: list[int] = []
    below_kept = ""
    for i in range(line, len(lines)):
        last = i + 1 == len(lines)
        part = (after if i == line else lines[i]) + ("" if last else "\n")
        if len(part) > too_long:
            break
        ids = lm.encode(part) if i == line else encode(part)
        if len(below_ids) + len(ids) > below_budget:
            break
        below_ids.extend(ids)
        below_kept += part
    mid = _middle_from(enc, lines, window, line, below_kept) if fim is not None else line
    start, _ = _above_start(enc, lines, mid, above_budget, min(b.room_for_slack(), above_budget), b.chunk_lines,
                            window)
    above_ids = [t for i in range(start, mid) for t in enc(i)]
    above_kept = "".join(lines[i] + "\n" for i in range(start, mid))
    middle_ids = [t for i in range(mid, line) for t in enc(i)]
    above_kept += "".join(lines[i] + "\n" for i in range(mid, line))
    head: list[int] = []
    names: list[str] = []
    defs, edits, written = [], [], frozenset()
    if fim is not None:  # written after the head, before [repeat]; their tokens come from the window's top
        # first (it keeps half its tokens), and [repeat] takes what it needs of what is left, or is left out:
        # at a fitted budget the window above holds 100-150 tokens, and [repeat] taking first left the
        # sections none (docs/design.md, "Definitions and recent edits in the prompt").
        defs, edits, top, cut, written = take(enc, encode, extras, window, start, mid, b.definitions, b.edits)
        above_ids, above_kept = above_ids[cut:], above_kept[sum(len(lines[i]) + 1 for i in range(start, top)):]
        start = top
    repeat: list[int] = []
    if fim is not None and b.repeat > 0:
        repeat = repeat_ids(encode, lines, line, typed, start, mid, line + below_kept.count("\n"), b.repeat, window)
        # It takes the place of as many tokens at the top of the window above (the lines nearest the
        # cursor stay), so a prompt with it costs what one without it does: on httpx the same first
        # lines right as when it came on top of the window, and cold prompts of 168 tokens, not 211
        # (docs/design.md, "Prompt layout and windows", `[repeat]`). The same lines each time while the place stays: the prompt does not move.
        cut, top = room_at_top(enc, start, mid, len(repeat))
        if cut < len(repeat):
            repeat = []  # a window too small to take it from: left out
        elif repeat:
            above_ids = above_ids[cut:]
            above_kept = above_kept[sum(len(lines[i]) + 1 for i in range(start, top)):]
            start = top
    file_head, stable, head_end = file_head_ids(encode, text, lines, start, b.file_head if fim else 0, too_long)
    if fim is not None and fim.file_sep is not None and snippet_room > 0 and b.snippet_source == "similar":
        # This document's lines above the window are searched too (code repeats within a file: a sync
        # and an async twin, a sibling test); only those, so a choice stays right while the user types.
        own = [(path or "untitled", "\n".join(lines[:start]))] if start > 0 else []
        others = similar_snippets([*(others or []), *own], lines, start, line, typed, window)
    if fim is not None and others and fim.file_sep is not None:
        room = snippet_room
        for name, other in others:
            ids = [fim.file_sep, *lm.encode(f"{name}\n{other[: 4 * max(room, 0)]}")]
            if len(ids) > room:
                ids = ids[:room]
            if len(ids) <= 2:
                break
            head.extend(ids)
            names.append(name)
            room -= len(ids)
    head.extend(header)
    # The typed text comes last and takes what the total leaves (its end, nearest the cursor).
    left = (b.total - len(head) - specials - len(file_head) - len(defs) - len(edits) - len(repeat)
            - len(above_ids) - (len(below_ids) if fim is not None else 0))
    typed_ids, healed = healed_tail(lm, typed[-(4 * left + 64) :] if left > 0 else "", heal)
    typed_ids = typed_ids[-left:] if left > 0 else []
    below_text = below_kept[len(after) :] if below_kept.startswith(after) else ""
    if fim is None:
        return Prompt(above_ids + typed_ids, above_kept, typed, after, below_text, start_line=start, healed=healed)
    ids = [*head, fim.prefix, *file_head, *defs, *edits, *repeat, *above_ids, fim.suffix, *below_ids, fim.middle,
           *middle_ids, *typed_ids]
    sections = {"snippets": len(head) - len(header), "header": len(header), "file_head": len(file_head),
                "definitions": len(defs), "edits": len(edits), "repeat": len(repeat), "above": len(above_ids),
                "below": len(below_ids), "middle": len(middle_ids), "typed": len(typed_ids)}
    if b.snippet_source == "similar":  # snippets chosen per place: no start every place shares
        return Prompt(ids, above_kept, typed, after, below_text, names, start, healed, sections=sections,
                      written=written)
    return Prompt(ids, above_kept, typed, after, below_text, names, start, healed, [*head, fim.prefix, *stable],
                  head_end, sections=sections, written=written)


_UNFIT = [-1]  # stands for the tokens of a line too long to tokenize (never enters a prompt)

MIDDLE = 256  # tokens of lines typed at one place that the middle holds before the place moves on
NEXT_LINES = 2  # a request this many lines below the last one (Enter, or Enter twice) stays at the place


def _middle_from(enc, lines: list[str], window: Window | None, line: int, suffix: str) -> int:
    """The first line of the middle for a cursor on `line`: where the user started typing at this place.

    Lines typed one after another at a place go after <fim_middle>, before the text typed on the
    cursor line, so the prefix and the suffix stay as they were when the place was first
    asked: Enter costs the new line only, not the suffix after it (and when the model had
    written that line, its tokens are the generated ones, already in the KV cache). That is
    fill-in-the-middle as the model learnt it: the middle is the text between prefix and
    suffix, and the lines typed so far are its start. The place moves on (the middle starts
    at the cursor line) when the text after the cursor (`suffix`, as the prompt holds it) is
    not the place's any more (the cursor moved, or an edit elsewhere: typing new lines keeps
    it), when the cursor goes above the place or more than NEXT_LINES below the last request,
    or when the middle would exceed MIDDLE tokens; the prompt then holds at most the budget's
    total again. A one-shot request (no
    `window`) has no middle lines. Lines added or removed above the window move the place with it."""
    if window is None:
        return line
    a, last = window.middle, window.last_line
    if a is not None and last is not None and window.start is not None:  # lines added or removed above the window:
        shift = (_followed(lines, window) or 0) - window.start  # the place moves with it
        a, last = a + shift, last + shift
    if a is None or last is None or a > line or not 0 <= line - last <= NEXT_LINES or line - a > MIDDLE \
            or suffix != window.suffix or sum(len(enc(i)) for i in range(a, line)) > MIDDLE \
            or any(enc(i)[:1] == _UNFIT for i in range(a, line)):
        a = line  # (a line too long to tokenize never enters the middle: it goes where the window leaves it out)
    window.middle, window.last_line, window.suffix = a, line, suffix
    return a


middle_from = _middle_from  # the first line of the middle, for the whole-file prompt too (wholefile.py)

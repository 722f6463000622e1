"""The whole file above the cursor: a file's prefix sequence and the prompts served from its KV (issue 40).

In prefix-suffix-middle order the prefix at every place of a file is a prefix of one sequence:

    [<file_sep>path\\n]<fim_prefix>line s, line s+1, ...        (each line tokenized on its own)

from the sequence's first line `s` (0, or for a file longer than `WholeFile.tokens` a multiple of
ANCHOR_LINES chosen when the cursor leaves it). A file's `FilePrefix` (kept in its FileState,
lsp_server/completion/files.py) holds that first line and the KV of the sequence as far as idle
work filled it (lsp_server/decoding/prefix.py `PrefixKV`). Once it holds the sequence up to the
cursor's place but for at most `gap` tokens, a request gets the whole-file prompt

    [<file_sep>path\\n]<fim_prefix>line s .. the place<fim_suffix>rest of line + lines below<fim_middle>[lines typed here]typed

and the engine starts its cache from a copy of the file's KV (prefix.py `seed`): the request
computes what is new (the rest of the last block, the lines the KV lacks, suffix and middle). Until
then the prompt is context.py's window, unchanged. The middle (lines typed at one place) and token
healing are context.py's. docs/design.md, "The whole file above the cursor", has the cost model.

Left out on purpose: the engine and caches (lsp_server/decoding/prefix.py), when to fill (idle work,
lsp_server/lsp/idle.py), other open files (not in the sequence yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from lsp_server.completion.context import Prompt, Window, healed_tail, middle_from, split_at
from lsp_server.decoding.prefix import PrefixKV, common

ANCHOR_LINES = 64  # a long file's sequence starts at a multiple of this
LONG_LINE = 20000  # characters: a line this long is left to the window (whole-file prompts stop above it)


class FilePrefix:
    """One file's prefix sequence: where it starts and its KV (module docstring)."""

    __slots__ = ("kv", "start")

    def __init__(self):
        self.kv = PrefixKV()
        self.start = 0  # first line of the sequence in the text the Completer is given

    def shift(self, lines: int) -> None:
        """The text starts `lines` later (files.py `FileState.shift`): the sequence's first line moves with it."""
        self.start = max(0, self.start - lines)


@dataclass
class WholeFile:
    """How long a file's sequence may grow and when a request uses it."""

    tokens: int = 3584  # the sequence's tokens at most (and room for suffix, middle and generation in a cache)
    below: int = 64  # tokens of the rest of the line and lines below in a whole-file prompt (the peer: 64 lines)
    gap: int = 192  # a request uses the whole file when the KV lacks at most this many of its prefix's tokens
    reserve: int = 512  # tokens a cache keeps free after the sequence: suffix, middle, typed text, generation

    def limit(self, lm) -> int:
        """The sequence's length at most for `lm` (its caches' size less the reserve)."""
        cap = lm.max_sequence
        return self.tokens if cap is None else max(0, min(self.tokens, int(cap) - self.reserve))


def _header(lm, path: str | None, encode) -> list[int]:
    fim = lm.fim
    head = [fim.file_sep, *encode(f"{path or 'untitled'}\n")] if fim.file_sep is not None else []
    return [*head, fim.prefix]


def anchor(prefix: FilePrefix, lines: list[str], line: int, enc, limit: int) -> int:
    """The sequence's first line for a cursor on `line`: kept while the lines from it to the cursor fit
    the limit (less room to move down), else the lowest multiple of ANCHOR_LINES from which they take at
    most half of it (so that the cursor can go on down before the next move)."""
    def tokens(a: int, b: int, stop: int) -> int:
        n = 0
        for i in range(a, b):
            n += len(enc(i))
            if n > stop:
                break
        return n

    s = prefix.start
    if s <= line and tokens(s, line, limit) <= limit - limit // 8:
        return s
    s = line - line % ANCHOR_LINES
    n = tokens(s, line, limit)
    while s > 0:
        more = tokens(s - ANCHOR_LINES, s, limit)
        if n + more > limit // 2:
            break
        s, n = s - ANCHOR_LINES, n + more
    while s < line and n > limit // 2:  # lines too long for the grid: a finer step
        n -= tokens(s, min(s + 8, line), limit)
        s = min(s + 8, line)
    return s


def sequence(lm, lines: list[str], start: int, path: str | None, encode, limit: int,
             stop_line: int | None = None) -> tuple[list[int], list[int]]:
    """(the sequence's ids from line `start`, the length after each line) up to `limit` tokens, whole
    lines only, ending before `stop_line` when given or before a line too long to tokenize."""
    ids = _header(lm, path, encode)
    ends: list[int] = []
    end = len(lines) if stop_line is None else min(stop_line, len(lines))
    for i in range(start, end):
        if len(lines[i]) > LONG_LINE:
            break
        part = encode(lines[i] + "\n")
        if len(ids) + len(part) > limit:
            break
        ids.extend(part)
        ends.append(len(ids))
    return ids, ends


def whole_prompt(lm, text: str, line: int, col: int, prefix: FilePrefix, *, path: str | None, window: Window | None,
                 heal: str, rules: WholeFile, block: int) -> Prompt | None:
    """The whole-file prompt at (line, col) when the file's KV holds its prefix but for at most
    `rules.gap` tokens (counted in whole blocks of `block` tokens); None otherwise (the window serves)."""
    fim = lm.fim
    if fim is None or prefix.kv.cache is None:
        return None
    _, typed, after, _ = split_at(text, line, col)
    lines = text.split("\n")
    encode = lm.encode if window is None else (lambda part: window.encode(lm, part))
    start = prefix.start
    if start > line:
        return None
    seq, ends = sequence(lm, lines, start, path, encode, rules.limit(lm), stop_line=line)
    if len(ends) < line - start:
        return None  # the lines above do not fit (or hold a line too long): the window serves
    have = common(prefix.kv.ids, seq)
    if block:
        have -= have % block
    if len(seq) - have > rules.gap:
        return None
    below_ids: list[int] = []
    below_kept = ""
    for i in range(line, len(lines)):
        part = (after if i == line else lines[i]) + ("" if i + 1 == len(lines) else "\n")
        ids = lm.encode(part) if i == line else encode(part)
        if len(part) > LONG_LINE or len(below_ids) + len(ids) > rules.below:
            break
        below_ids.extend(ids)
        below_kept += part

    def enc(i: int) -> list[int]:
        return encode(lines[i] + "\n")

    mid = max(start, middle_from(enc, lines, window, line, below_kept))
    head = len(_header(lm, path, encode))
    cut = head if mid == start else ends[mid - start - 1]
    middle_ids = seq[cut:]
    typed_ids, healed = healed_tail(lm, typed[-4096:], heal)
    ids = [*seq[:cut], fim.suffix, *below_ids, fim.middle, *middle_ids, *typed_ids]
    above = "".join(l + "\n" for l in lines[start:line])
    below_text = below_kept[len(after):] if below_kept.startswith(after) else ""
    return Prompt(ids, above, typed, after, below_text, [], start, healed, whole=True)


def next_fill(lm, rules: WholeFile, prefix: FilePrefix, window: Window, text: str, line: int,
              path: str | None) -> list[int] | None:
    """The sequence a file's prefix KV is to hold for a cursor on `line` (its first line chosen by
    `anchor`, which it sets on `prefix`), or None where the KV holds it already."""
    lines = text.split("\n")
    limit = rules.limit(lm)
    prefix.start = anchor(prefix, lines, min(line, len(lines) - 1), lambda i: window.encode(lm, lines[i] + "\n"), limit)
    ids, _ = sequence(lm, lines, prefix.start, path, lambda part: window.encode(lm, part), limit)
    return None if prefix.kv.ids == ids else ids

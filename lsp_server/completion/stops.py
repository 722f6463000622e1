"""The ghost-text stop rules: where a suggestion ends, and what of it is shown.

`ghost_cut` ends it at the end of the current block (a later line indented less than the
cursor line), the first line when multi-line suggestions are off, a line that repeats the
next line below the cursor or one of the suggestion's own lines, a first line that ends by
re-typing the rest of the cursor line, before a line of the prompt's own definitions or
edits sections (comments of Ditto's, not the user's code), and before the first character
no editor can insert.
`finish` applies them to a finished generation, drops trailing blank lines, and
`well_formed` cuts a multi-line suggestion back to a line after which nothing it (or the
typed line) opened is left open, unless the code after the cursor closes it.

Left out on purpose: prompts (context.py), the model.
"""

from __future__ import annotations

from lsp_server.completion.context import Prompt


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def ghost_cut(generated: str, prompt: Prompt, multiline: bool = True, final: bool = False) -> int | None:
    """Where ghost text should end, as a character index into `generated`; None to go on.

    Stops at: the end of the current block (a complete later line indented less than
    the cursor line), the first line when `multiline` is off, a line that repeats the
    next non-blank line below the cursor, a line that repeats one of the suggestion's
    own earlier lines (`_repeats`), a line that is one of the prompt's definitions or edits
    lines (`prompt.written`: the model copied a `# edit in F:` header after a typed `#` on a
    held-out replay), and a first line that ends by re-typing the rest of
    the cursor line (the cut keeps what comes before it). `final` says the generation
    has ended, so the last line counts as complete. Ghost text also ends before the first
    character no editor can insert (`uninsertable`).
    """
    bad = uninsertable(generated, final)
    if bad is not None:
        cut = ghost_cut(generated[:bad], prompt, multiline, final=True)
        return bad if cut is None else cut
    typed = prompt.typed
    lines = generated.split("\n")
    after = prompt.after.rstrip("\r").strip()
    first_complete = len(lines) > 1 or final
    if after and first_complete and lines[0].rstrip().endswith(after):
        return len(lines[0].rstrip()) - len(after)
    cursor_line = typed + lines[0]
    if first_complete and prompt.written and cursor_line.strip() in prompt.written:
        return 0
    if not multiline:
        return len(lines[0]) if len(lines) > 1 else None
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
        if complete and l.strip() in prompt.written:
            return pos - 1
        if complete and _repeats(l, [cursor_line, *lines[1:i]]):
            return pos - 1
        pos += len(l) + 1
    return None


# Control characters other than tab, newline and carriage return (C0, DEL, C1). A small or
# quantised model can emit byte tokens for them; an editor cannot show them as ghost text and
# some reject them outright (Emacs's JSON parser refuses "\u0000"; Neovim's complete() takes a
# string with NUL for a Blob and fails), so the suggestion ends before the first one.
_CONTROL = frozenset(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]) - set("\t\n\r")
_REPLACEMENT = "\ufffd"


def uninsertable(generated: str, final: bool) -> int | None:
    """Index of the first character of `generated` that must not reach the editor, or None.

    A control character (`_CONTROL`) ends the text at once. U+FFFD is what decoding leaves for
    bytes that are not UTF-8; while generating, a U+FFFD run at the very end may still be the
    first bytes of a character that the next token completes (the caller decodes all tokens
    again each step), so only a U+FFFD followed by other text, or any once `final`, ends it.
    """
    for i, c in enumerate(generated):
        if c in _CONTROL:
            return i
        if c == _REPLACEMENT and (final or generated[i:].strip(_REPLACEMENT)):
            return i
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
    text = well_formed(text.rstrip(), prompt)
    if not text.strip():
        return ""
    after = prompt.after.rstrip("\r")
    if after and after.startswith(text):
        return ""
    return text


_OPEN, _CLOSE = "([{", ")]}"


def open_brackets(text: str, stack: list[str] | None = None, low: list[int] | None = None) -> list[str]:
    """The brackets and quotes `text` leaves open, innermost last, read on from `stack`. Strings
    ('', "", triple-quoted) and `#` comments are skipped (Python-like; elsewhere a `#` is rare in
    code a suggestion writes); a closing bracket with no opener here closes one from above the
    cursor and is passed over. `low`, when given, gets the smallest depth reached."""
    stack = list(stack or [])
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        top = stack[-1] if stack else None
        if top is not None and top[0] in "'\"":  # inside a string
            if c == "\\":
                i += 2
                continue
            if text.startswith(top, i):
                stack.pop()
                i += len(top)
                continue
            if c == "\n" and len(top) == 1:
                stack.pop()  # a one-line string ends at the line's end (an error the user sees anyway)
            i += 1
            continue
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "'\"":
            quote = c * 3 if text.startswith(c * 3, i) else c
            stack.append(quote)
            i += len(quote)
            continue
        if c in _OPEN:
            stack.append(c)
        elif c in _CLOSE and stack and stack[-1] == _OPEN[_CLOSE.index(c)]:
            stack.pop()
            if low is not None:
                low[0] = min(low[0], len(stack))
        i += 1
    return stack


def well_formed(text: str, prompt: Prompt) -> str:
    """A multi-line suggestion cut back to its last line after which no bracket or string opened on
    the cursor line (by the user or the suggestion) is left open, unless the code after the cursor
    closes it (issue 25). The first line is always kept: the user may be in the middle of an
    expression the rest of the line closes."""
    if "\n" not in text:
        return text
    lines = text.split("\n")
    stack = open_brackets(prompt.typed.rstrip("\r"))
    good = len(lines[0])  # characters of `text` after which it is well-formed
    pos = 0
    for k, line in enumerate(lines):
        last = k == len(lines) - 1
        stack = open_brackets(line if last else line + "\n", stack)
        pos += len(line) + (0 if last else 1)
        if not stack:
            good = len(text) if last else pos - 1
    if good >= len(text) or (stack and _closed_after(stack, prompt)):
        return text
    return text[:good].rstrip()


def _closed_after(stack: list[str], prompt: Prompt) -> bool:
    """Whether the code after the cursor closes everything the suggestion leaves open."""
    low = [len(stack)]
    open_brackets(prompt.after + prompt.below[:2000], stack, low)
    return low[0] == 0

"""What one suggestion is worth against the truth: the definitions every mode's records use.

Completion mode compares a suggestion with the whole block (`completion_quality`); keystroke mode,
the in-process session mode and the editor replay compare it with what the user types next from the
cursor (`request_quality`, `typed_quality`). Edit similarity is 1 - Levenshtein distance / the
longer length.

What the user keeps (`keep_quality`, issue 58), against `rest`, the rest of the true line and the
block's later lines (what the user types next):

- *shown*: the suggestion is not empty;
- *kept*: shown, and the suggestion is a prefix of `rest` (Tab, then keep typing);
- *wrong*: shown, and its first line is not a prefix of the rest of the true line, trailing blanks
  of both aside;
- *kept characters*: the longest common prefix of the suggestion and `rest`, cut back to a word
  boundary of the suggestion (accepting word by word never stops between two word characters,
  letters, digits or `_`); all of it when the suggestion is kept, 0 when nothing is shown.

Left out on purpose: sums and rates over many requests (metrics.py `quality_summary`) and tables
(report.py).
"""

from __future__ import annotations


def levenshtein(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def edit_similarity(a: str, b: str) -> float:
    """1 - Levenshtein distance / length of the longer string (1.0 for two empty strings)."""
    if not a and not b:
        return 1.0
    return 1.0 - levenshtein(a, b) / max(len(a), len(b))


def normalise(text: str) -> str:
    """Trailing whitespace of each line and trailing blank lines dropped."""
    return "\n".join(l.rstrip() for l in text.rstrip().split("\n"))


def first_line(text: str) -> str:
    return normalise(text).split("\n")[0].strip()


def completion_quality(suggestion: str, truth: str) -> dict:
    """Completion mode: the suggestion for a whole block against the block (trailing blanks aside)."""
    s, t = normalise(suggestion), normalise(truth)
    return {
        "exact_match": s == t,
        "first_line_exact": first_line(suggestion) == first_line(truth),
        "edit_similarity": round(edit_similarity(s, t), 4),
        "first_line_edit_similarity": round(edit_similarity(first_line(suggestion), first_line(truth)), 4),
        "empty": not suggestion,
        **keep_quality(suggestion, truth),
    }


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def first_line_exact(typed: str, suggestion: str, true_line: str) -> bool:
    """Does the typed text plus the suggestion's first line give back the true line (trailing blanks aside)?"""
    return (typed + suggestion.split("\n", 1)[0]).rstrip() == true_line.rstrip()


def misfire(typed: str, true_line: str, suggestion: str) -> bool | None:
    """Issue 25's whole-word misfire: None where it cannot happen (the typed text does not end
    with a letter, or the true line does not continue that word); else whether the suggestion
    went on as if the typed letters were a whole word (non-empty, first character not alnum/_)."""
    if not typed or not typed[-1].isalpha() or len(true_line) <= len(typed) or not _word(true_line[len(typed)]):
        return None
    return bool(suggestion) and not _word(suggestion[0])


def kept_chars(suggestion: str, rest: str) -> int:
    """Characters of `suggestion` a user accepting word by word keeps before it leaves `rest` (module
    docstring): the common prefix, cut back to where a word-by-word accept can stop."""
    n = 0
    for a, b in zip(suggestion, rest):
        if a != b:
            break
        n += 1
    if n == len(suggestion):
        return n
    while n > 0 and _word(suggestion[n - 1]) and _word(suggestion[n]):
        n -= 1
    return n


def keep_quality(suggestion: str, rest: str) -> dict:
    """shown, kept, wrong and kept_chars of one suggestion against `rest`, what the user types next
    from the cursor (module docstring)."""
    shown = suggestion != ""
    line_rest = rest.split("\n", 1)[0].rstrip()
    return {
        "shown": shown,
        "kept": shown and rest.startswith(suggestion),
        "wrong": shown and not line_rest.startswith(suggestion.split("\n", 1)[0].rstrip()),
        "kept_chars": kept_chars(suggestion, rest),
    }


def request_quality(typed: str, suggestion: str, true_line: str, true_rest: str) -> dict:
    """One request's quality: `typed` is the text before the cursor on its line, `true_line` that
    line as the commit wrote it, `true_rest` the rest of it and the block's later lines."""
    return {
        "first_line_exact": first_line_exact(typed, suggestion, true_line),
        "edit_similarity": round(edit_similarity(normalise(suggestion), normalise(true_rest)), 4),
        "empty": not suggestion,
        "misfire": misfire(typed, true_line, suggestion),
        **keep_quality(suggestion, true_rest),
    }


def typed_quality(truth: str, n: int, suggestion: str) -> dict:
    """`request_quality` where the first n characters of the block `truth` are typed (keystroke
    mode, the in-process session mode): the typed part of the cursor's line, its true line, and
    the rest of the block after the cursor."""
    typed = truth[:n]
    line_typed = typed.rsplit("\n", 1)[-1]
    return request_quality(line_typed, suggestion, truth.split("\n")[typed.count("\n")], truth[n:])

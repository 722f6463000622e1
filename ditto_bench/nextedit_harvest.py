"""Next-edit cases from a git repository's history (`ditto-lsp bench --mode next-edit`; docs/nextedit.md).

A commit's change to a file is split into units: the line ranges a line diff of the parent and the
commit's version finds, each changed line of an equal-sized replacement its own unit (a rename on
five neighbouring lines is five units). A unit's signature is the token-level changes inside it
(tokens removed, tokens added: `\\w+` or one other character, blanks left out). A case is one
(commit, file):

- **repeated**: two or more of its units share a signature (the commit made the same change at two
  or more places: a rename, a changed argument, an added keyword). The first unit in the file with
  a shared signature is the edit the user makes; the right next edit is any other unit of the
  commit, done exactly (in this file or in another file of the commit that is open).
- **ordinary**: no two units share a signature (most commits): the first unit is the user's edit; a
  proposal is right only where it does a remaining unit exactly, and "nothing" is often the right
  answer.

The other Python files the commit changed are open, at their parent version (at most
`max_buffers`); their units are right next edits too. Mechanical commits are skipped as the
completion harvester skips them (harvest.py `is_mechanical`). Cases come newest commit first, at
most `per_commit` from one commit, until `max_cases` of each kind are found.

Plain git and difflib; no model. Left out on purpose: proposing and judging (nextedit.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path

from ditto_bench.harvest import HarvestError, HarvestOptions, scan_commits, run_git, show_file, check_repo, is_mechanical, \
    language_of, parse_diff

LEX = re.compile(r"\w+|[^\w\s]")
TYPE = re.compile(r"\w+|\s+|[^\w\s]")  # what the typing replay edits at a time: a word, a run of blanks, a character


@dataclass
class Unit:
    """Lines [a, b) of the old text become `new` (lines with their ends)."""

    a: int
    b: int
    old: list[str]
    new: list[str]

    def signature(self) -> frozenset:
        """The token-level changes inside the unit: (tokens removed, tokens added) for each changed run."""
        o, n = LEX.findall("".join(self.old)), LEX.findall("".join(self.new))
        out = set()
        for tag, i1, i2, j1, j2 in SequenceMatcher(None, o, n, autojunk=False).get_opcodes():
            if tag != "equal":
                out.add((tuple(o[i1:i2]), tuple(n[j1:j2])))
        return frozenset(out)


def units(old: str, new: str) -> list[Unit]:
    """The units of the change from `old` to `new` (module docstring), in line order."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out: list[Unit] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "replace":
            _pair(a, i1, i2, b, j1, j2, out)
        elif tag != "equal":
            out.append(Unit(i1, i2, a[i1:i2], b[j1:j2]))
    return out


SIMILAR = 0.6  # two lines this alike (difflib's ratio) are one line changed, not one removed and one added


def _pair(a: list[str], i1: int, i2: int, b: list[str], j1: int, j2: int, out: list[Unit]) -> None:
    """Split a replacement of lines a[i1:i2] by b[j1:j2] where lines pair up: equal counts line by line,
    else around the most alike pair (as difflib.Differ's fancy replace), the rest as plain units."""
    if i2 - i1 == j2 - j1:
        out.extend(Unit(i1 + k, i1 + k + 1, [a[i1 + k]], [b[j1 + k]]) for k in range(i2 - i1))
        return
    best, at = SIMILAR, None
    m = SequenceMatcher(autojunk=False)
    for j in range(j1, j2):
        m.set_seq2(b[j])
        for i in range(i1, i2):
            m.set_seq1(a[i])
            if m.real_quick_ratio() > best and m.quick_ratio() > best and m.ratio() > best:
                best, at = m.ratio(), (i, j)
    if at is None:
        out.append(Unit(i1, i2, a[i1:i2], b[j1:j2]))
        return
    i, j = at
    if i > i1 or j > j1:
        _pair(a, i1, i, b, j1, j, out) if i > i1 and j > j1 else out.append(Unit(i1, i, a[i1:i], b[j1:j]))
    out.append(Unit(i, i + 1, [a[i]], [b[j]]))
    if i + 1 < i2 or j + 1 < j2:
        if i + 1 < i2 and j + 1 < j2:
            _pair(a, i + 1, i2, b, j + 1, j2, out)
        else:
            out.append(Unit(i + 1, i2, a[i + 1 : i2], b[j + 1 : j2]))


def apply_units(old: str, chosen: list[Unit]) -> str:
    """`old` with the chosen units (of `units(old, ...)`) applied."""
    lines = old.splitlines(keepends=True)
    for u in sorted(chosen, key=lambda u: u.a, reverse=True):
        lines[u.a : u.b] = u.new
    return "".join(lines)


@dataclass
class Case:
    id: str  # "<sha10>:<path>"
    kind: str  # "repeated" | "ordinary"
    commit: str
    parent: str
    subject: str
    path: str
    before: str  # the file at the parent
    after: str  # the file at the commit
    first: int  # index (in units(before, after)) of the unit the user makes
    others: list[tuple[str, str, str]] = field(default_factory=list)  # (path, parent text, commit text)
    shared: int = 0  # units sharing a signature with the first (repeated cases)

    def public(self) -> dict:
        return {"id": self.id, "kind": self.kind, "commit": self.commit, "subject": self.subject, "path": self.path,
                "first": self.first, "units": len(units(self.before, self.after)), "shared": self.shared,
                "others": [p for p, _, _ in self.others]}


def typing(old: str, new: str, at: int) -> list[tuple[int, int, str, str]]:
    """The changes an editor sends while a user turns `old` (at offset `at` of the document) into `new`,
    left to right: each changed run of words and blanks selected and deleted at once, then its
    replacement typed one character at a time. (start, end, inserted text, removed text), offsets in
    the document as it is when the change comes."""
    o, n = TYPE.findall(old), TYPE.findall(new)
    events = []
    shift = 0  # characters the changes so far added before the next run
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, o, n, autojunk=False).get_opcodes():
        start = at + sum(map(len, o[:i1])) + shift
        if tag == "equal":
            continue
        removed = "".join(o[i1:i2])
        if removed:
            events.append((start, start + len(removed), "", removed))
        typed = "".join(n[j1:j2])
        for k, ch in enumerate(typed):
            events.append((start + k, start + k, ch, ""))
        shift += len(typed) - len(removed)
    return events


def first_unit(us: list[Unit]) -> tuple[str, int, int]:
    """(kind, index of the user's unit, units sharing its signature)."""
    sigs = [u.signature() for u in us]
    for i, s in enumerate(sigs):
        shared = sum(1 for j, t in enumerate(sigs) if j != i and s & t)
        if s and shared:
            return "repeated", i, shared
    return "ordinary", 0, 0


def cases(repo: str | Path, max_cases: int = 40, per_commit: int = 2, since: str | None = None,
          max_buffers: int = 4, max_commits: int = 3000, max_file_bytes: int = 200_000,
          max_first_lines: int = 12) -> tuple[list[Case], dict]:
    """Up to `max_cases` repeated and `max_cases` ordinary cases, newest commit first, and what was skipped."""
    path = check_repo(repo)
    opts = HarvestOptions(since=since, max_commits=max_commits)
    found: dict[str, list[Case]] = {"repeated": [], "ordinary": []}
    skipped: dict[str, int] = {}
    scanned = 0
    for sha, parent, _date, subject in scan_commits(path, opts):
        if all(len(v) >= max_cases for v in found.values()):
            break
        scanned += 1
        files = parse_diff(run_git(path, "diff", "--unified=0", "--no-color", "--no-ext-diff", "-M", parent, sha,
                                check=False))
        why = is_mechanical(files, opts)
        if why:
            key = why.split(" ")[0]
            skipped[key] = skipped.get(key, 0) + 1
            continue
        texts = []
        for f in files:
            if f.old is None or f.new is None or language_of(f.new, ("python",)) is None or not f.hunks:
                continue
            before, after = show_file(path, parent, f.old), show_file(path, sha, f.new)
            if before is None or after is None or max(len(before), len(after)) > max_file_bytes or before == after:
                continue
            texts.append((f.new, before, after))
        taken = 0
        for name, before, after in texts:
            us = units(before, after)
            if not us:
                continue
            kind, i, shared = first_unit(us)
            u = us[i]
            if max(len(u.old), len(u.new)) > max_first_lines or len(found[kind]) >= max_cases or taken >= per_commit:
                continue
            others = [(p, b, a) for p, b, a in texts if p != name][:max_buffers]
            found[kind].append(Case(f"{sha[:10]}:{name}", kind, sha, parent, subject, name, before, after, i,
                                    others, shared))
            taken += 1
    if not any(found.values()):
        raise HarvestError(f"no next-edit case in {path}: {scanned} commits scanned, none changed a Python file")
    return found["repeated"] + found["ordinary"], {"commits_scanned": scanned, "commits_skipped": skipped}

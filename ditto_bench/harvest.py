"""Completion tasks from a git repository's history (commit replay; docs/design.md, "Benchmarks", and docs/benchmark.md).

For each non-merge commit and each small added block (1-8 consecutive added lines, a
pure addition in a zero-context diff) in a source file:

- the document is the post-commit file with the block replaced by one empty line (the
  line the user has opened to type it);
- the cursor is at column 0 of that line (the block, typed there, gives back the
  post-commit file);
- the open buffers are the other files the commit touched, at their parent version
  (files the commit created have no parent version and are left out);
- the ground truth is the block.

Mechanical commits (mass reformatting, renames only, huge sweeps) are skipped, at most
`per_commit` tasks are taken from one commit, and the sample is reproducible: the same
repository, options and seed give the same tasks in the same order.

Plain `git` subprocesses only; no torch, no model. Left out on purpose: tokenization and
prompts (the systems build prompts through the Completer, as the server does).
"""

from __future__ import annotations

import random
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

LANGUAGES: dict[str, tuple[str, ...]] = {
    "python": (".py", ".pyi"),
    "javascript": (".js", ".jsx", ".mjs", ".cjs"),
    "typescript": (".ts", ".tsx"),
    "rust": (".rs",),
    "go": (".go",),
    "c": (".c", ".h"),
    "cpp": (".cc", ".cpp", ".cxx", ".hpp", ".hh"),
    "java": (".java",),
    "ruby": (".rb",),
    "lua": (".lua",),
    "shell": (".sh", ".bash"),
}


class HarvestError(Exception):
    """The repository cannot be read, or it yields no task; the message says why."""


@dataclass
class Task:
    id: str  # "<sha[:10]>:<path>:<line>" (1-based line where the block starts)
    repo: str
    commit: str
    parent: str
    subject: str
    date: int  # commit time, unix seconds
    path: str
    language: str
    line: int  # 0-based line of the cursor in `document`
    col: int  # always 0: the block starts a line
    document: str  # post-commit file with the block replaced by an empty line (the cursor's)
    truth: str  # the added block, lines joined with "\n" (no trailing newline)
    buffers: list[tuple[str, str]] = field(default_factory=list)  # (path, parent-version text)
    copyable: float = 0.0  # share of the truth's lexical tokens found in runs of >= 4 in document + buffers
    copyable_buffers: float = 0.0  # the same, counting only the open buffers

    @property
    def prefix(self) -> str:
        """Document text before the cursor."""
        lines = self.document.split("\n")
        return "".join(l + "\n" for l in lines[: self.line])

    @property
    def suffix(self) -> str:
        """Document text after the cursor (the cursor's line is empty)."""
        return "".join("\n" + l for l in self.document.split("\n")[self.line + 1 :])

    @property
    def typing(self) -> str:
        """What the user types (all of it gives back the post-commit file)."""
        return self.truth

    def typed(self, n: int) -> tuple[str, int, int]:
        """The document after typing the first n characters of the block: (text, line, col)."""
        typed = self.typing[:n]
        text = self.prefix + typed + self.suffix
        parts = typed.split("\n")
        return text, self.line + len(parts) - 1, len(parts[-1])

    def public(self, with_text: bool = False) -> dict:
        d = asdict(self)
        d["buffers"] = [p for p, _ in self.buffers]
        if not with_text:
            d.pop("document")
        return d


@dataclass
class HarvestOptions:
    since: str | None = None  # passed to git log --since (e.g. "2023-01-01", "6 months ago")
    max_tasks: int = 50
    seed: int = 0
    languages: tuple[str, ...] = ("python",)  # keys of LANGUAGES, or ("all",)
    per_commit: int = 3  # tasks taken from one commit at most
    min_lines: int = 1
    max_lines: int = 8
    min_chars: int = 8  # a block with fewer non-blank characters is not a task
    max_files: int = 40  # a commit touching more files is a sweep: skipped
    max_changed_lines: int = 2000  # likewise for changed lines
    max_file_bytes: int = 200_000  # larger documents and buffers are skipped
    max_buffers: int = 4
    max_commits: int = 5000  # newest commits scanned at most


def run_git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, encoding="utf-8",
                          errors="replace")
    if check and proc.returncode != 0:
        raise HarvestError(f"git {' '.join(args[:2])} failed in {repo}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def check_repo(repo: str | Path) -> Path:
    path = Path(repo).expanduser()
    if not path.exists():
        raise HarvestError(f"no such directory: {path}")
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise HarvestError(f"{path} is not a git repository (git rev-parse failed): give --repo a git work tree or clone")
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        raise HarvestError(f"{path} is a git repository without commits")
    return path.resolve()


def language_of(path: str, languages: tuple[str, ...]) -> str | None:
    suffix = Path(path).suffix.lower()
    for lang, exts in LANGUAGES.items():
        if suffix in exts and ("all" in languages or lang in languages):
            return lang
    return None


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class _FileDiff:
    old: str | None
    new: str | None
    hunks: list[tuple[int, int, int, int, list[str], list[str]]] = field(default_factory=list)  # os, oc, ns, nc, -, +


def parse_diff(text: str) -> list[_FileDiff]:
    """Parse `git diff --unified=0 --no-color` output into files and hunks."""
    files: list[_FileDiff] = []
    cur: _FileDiff | None = None
    hunk = None
    for line in text.split("\n"):
        if line.startswith("diff --git "):
            cur = _FileDiff(None, None)
            files.append(cur)
            hunk = None
        elif cur is None:
            continue
        elif hunk is None and line.startswith("--- "):
            cur.old = None if line[4:] == "/dev/null" else line[4:].removeprefix("a/")
        elif hunk is None and line.startswith("+++ "):
            cur.new = None if line[4:] == "/dev/null" else line[4:].removeprefix("b/")
        elif hunk is None and line.startswith("rename from "):
            cur.old = line[len("rename from "):]
        elif hunk is None and line.startswith("rename to "):
            cur.new = line[len("rename to "):]
        elif (m := _HUNK.match(line)) is not None:
            os_, oc, ns, nc = m.groups()
            hunk = (int(os_), 1 if oc is None else int(oc), int(ns), 1 if nc is None else int(nc), [], [])
            cur.hunks.append(hunk)
        elif hunk is not None and line.startswith("-"):
            hunk[4].append(line[1:])
        elif hunk is not None and line.startswith("+"):
            hunk[5].append(line[1:])
    return files


_WS = re.compile(r"\s+")


def is_mechanical(files: list[_FileDiff], opts: HarvestOptions) -> str | None:
    """Why a commit is a mechanical sweep (None if it is not)."""
    if len(files) > opts.max_files:
        return f"touches {len(files)} files"
    changed = sum(len(h[4]) + len(h[5]) for f in files for h in f.hunks)
    if changed > opts.max_changed_lines:
        return f"changes {changed} lines"
    if files and all(not f.hunks for f in files):
        return "renames or mode changes only"
    # Reformatting: most removed lines come back with only whitespace/quotes/commas changed.
    removed = [_WS.sub("", l).replace("'", '"').rstrip(",") for f in files for h in f.hunks for l in h[4] if l.strip()]
    added = {_WS.sub("", l).replace("'", '"').rstrip(",") for f in files for h in f.hunks for l in h[5] if l.strip()}
    if len(removed) >= 20 and sum(r in added for r in removed) >= 0.6 * len(removed):
        return "reformatting"
    return None


_LEX = re.compile(r"\w+|[^\w\s]")


def copyable_fraction(truth: str, sources: list[str], n: int = 4) -> float:
    """Share of the truth's lexical tokens covered by a run of >= n tokens found verbatim in a source."""
    toks = _LEX.findall(truth)
    if not toks:
        return 0.0
    grams: set[tuple[str, ...]] = set()
    for s in sources:
        st = _LEX.findall(s)
        grams.update(tuple(st[i : i + n]) for i in range(len(st) - n + 1))
    if len(toks) < n:
        return 1.0 if any(tuple(toks) == g[: len(toks)] for g in grams) else 0.0
    covered = [False] * len(toks)
    for i in range(len(toks) - n + 1):
        if tuple(toks[i : i + n]) in grams:
            for j in range(i, i + n):
                covered[j] = True
    return sum(covered) / len(toks)


def scan_commits(repo: Path, opts: HarvestOptions) -> list[tuple[str, str, int, str]]:
    args = ["log", "--no-merges", "--format=%H%x00%P%x00%ct%x00%s", f"-n{opts.max_commits}"]
    if opts.since:
        args.append(f"--since={opts.since}")
    out = []
    for line in run_git(repo, *args).splitlines():
        parts = line.split("\x00")
        if len(parts) != 4 or not parts[1].strip():
            continue  # root commit: nothing to replay against
        out.append((parts[0], parts[1].split()[0], int(parts[2]), parts[3]))
    return out


def show_file(repo: Path, rev: str, path: str) -> str | None:
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True)
    if proc.returncode != 0:
        return None
    try:
        return proc.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tasks_from_commit(repo: Path, sha: str, parent: str, date: int, subject: str, opts: HarvestOptions,
                      rng: random.Random) -> tuple[list[Task], str | None]:
    """The tasks of one commit (at most opts.per_commit, sampled with rng) and why it was skipped, if it was."""
    diff = run_git(repo, "diff", "--unified=0", "--no-color", "--no-ext-diff", "-M", parent, sha, check=False)
    files = parse_diff(diff)
    why = is_mechanical(files, opts)
    if why:
        return [], why
    candidates = []
    for f in files:
        if f.new is None:
            continue
        lang = language_of(f.new, opts.languages)
        if lang is None:
            continue
        for os_, oc, ns, nc, minus, plus in f.hunks:
            if oc != 0 or not (opts.min_lines <= nc <= opts.max_lines) or minus:
                continue
            # Blank lines at the block's edges stay in the document: the task is the code.
            lead = next((i for i, l in enumerate(plus) if l.strip()), len(plus))
            trail = next((i for i, l in enumerate(reversed(plus)) if l.strip()), 0)
            block = "\n".join(plus[lead : len(plus) - trail])
            if len(_WS.sub("", block)) < opts.min_chars:
                continue
            candidates.append((f, lang, ns + lead, nc - lead - trail, block))
    if not candidates:
        return [], None
    picked = candidates if len(candidates) <= opts.per_commit else rng.sample(candidates, opts.per_commit)
    tasks = []
    post_cache: dict[str, str | None] = {}
    for f, lang, ns, nc, block in picked:
        if f.new not in post_cache:
            post_cache[f.new] = show_file(repo, sha, f.new)
        post = post_cache[f.new]
        if post is None or len(post) > opts.max_file_bytes:
            continue
        lines = post.split("\n")
        start = ns - 1  # 0-based first line of the block in the post-commit file
        if "\n".join(lines[start : start + nc]) != block:
            continue  # diff and file disagree (e.g. CRLF): not a clean task
        document = "\n".join(lines[:start] + [""] + lines[start + nc :])
        buffers = []
        for other in files:
            if other is f or other.old is None or len(buffers) >= opts.max_buffers:
                continue
            if language_of(other.old, ("all",)) is None and not other.old.endswith((".md", ".rst", ".txt", ".toml")):
                continue
            text = show_file(repo, parent, other.old)
            if text is not None and len(text) <= opts.max_file_bytes:
                buffers.append((other.old, text))
        task = Task(id=f"{sha[:10]}:{f.new}:{ns}", repo=str(repo), commit=sha, parent=parent, subject=subject,
                    date=date, path=f.new, language=lang, line=start, col=0, document=document, truth=block,
                    buffers=buffers)
        task.copyable_buffers = round(copyable_fraction(block, [t for _, t in buffers]), 4)
        task.copyable = round(copyable_fraction(block, [document, *(t for _, t in buffers)]), 4)
        tasks.append(task)
    return tasks, None


@dataclass
class HarvestResult:
    tasks: list[Task]
    commits_scanned: int
    commits_skipped: dict[str, int]  # reason -> count
    candidates: int  # tasks found before sampling down to max_tasks


def harvest(repo: str | Path, opts: HarvestOptions | None = None) -> HarvestResult:
    """Replay the repository's commits into tasks; raises HarvestError when there are none."""
    opts = opts or HarvestOptions()
    for lang in opts.languages:
        if lang != "all" and lang not in LANGUAGES:
            raise HarvestError(f"unknown language {lang!r}: use all or one of {', '.join(LANGUAGES)}")
    path = check_repo(repo)
    commits = scan_commits(path, opts)
    found: list[Task] = []
    skipped: dict[str, int] = {}
    for sha, parent, date, subject in commits:
        # One rng per commit, seeded by the run seed and the commit: the choice inside a
        # commit does not depend on which other commits were scanned.
        rng = random.Random(f"{opts.seed}:{sha}")
        tasks, why = tasks_from_commit(path, sha, parent, date, subject, opts, rng)
        if why:
            key = {"touches": "many files", "changes": "many lines"}.get(why.split(" ")[0], why.split(" ")[0])
            skipped[key] = skipped.get(key, 0) + 1
        found.extend(tasks)
    if not found:
        since = f" since {opts.since}" if opts.since else ""
        raise HarvestError(f"no tasks in {path}{since}: {len(commits)} non-merge commits scanned, no small added "
                           f"block ({opts.min_lines}-{opts.max_lines} lines) in a {'/'.join(opts.languages)} file "
                           f"(try --lang all or an earlier --since)")
    candidates = len(found)
    found.sort(key=lambda t: t.id)
    if len(found) > opts.max_tasks:
        found = random.Random(opts.seed).sample(found, opts.max_tasks)
    found.sort(key=lambda t: (-t.date, t.id))  # newest first, stable
    return HarvestResult(found, len(commits), skipped, candidates)

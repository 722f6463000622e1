"""Every `ditto-lsp` command written in the README and docs/ still parses as written.

Issue 23 moved the code; the commands users copy from the documentation must keep working. Each
command line in a fenced code block (continuation lines joined, comments and shell pipes cut) goes
through the real argument parser (lsp_server/cli.py `build_parser`): an option renamed or removed,
a subcommand or a choice that no longer exists fails here. Placeholders (`<clone>`) become a word;
usage synopses with `[...]` alternatives are skipped (they are not commands).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "editors").rglob("*.md"))]
FENCE = re.compile(r"^```(sh|bash|shell|console|)\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`((?:\S*/)?ditto-lsp [^`\n]*)`")
# A command: at a line's start (after a prompt or a path to the venv), or after `&&`.
COMMAND = re.compile(r"(?:^|&&)\s*(?:\$\s*)?(?:\S*/)?(ditto-lsp .*)$")


def _usable(line: str) -> str | None:
    m = COMMAND.search(line.strip())
    if m and not any(s in m.group(1) for s in ("[", "...", "(same options)", "|")):
        return m.group(1)
    return None


def commands(path: Path) -> list[str]:
    """Whole commands: the lines of shell blocks."""
    lines = []
    for _, block in FENCE.findall(path.read_text(encoding="utf-8")):
        lines += re.sub(r"\\\n\s*", " ", block).splitlines()
    return [c for c in map(_usable, lines) if c]


def references(path: Path) -> list[str]:
    """Commands named in the prose (`ditto-lsp bench --mode session`): maybe without their required arguments."""
    return [c for c in map(_usable, SPAN.findall(FENCE.sub("", path.read_text(encoding="utf-8")))) if c]


def argv_of(line: str) -> list[str]:
    line = re.sub(r"<[^>]*>", "PLACEHOLDER", line)
    words = shlex.split(line, comments=True)
    for i, w in enumerate(words):
        if w in ("&&", "||", "|", ";", ">", "2>", "&") or w.startswith((">", "2>")):
            words = words[:i]
            break
    return words[1:]


CASES = [(p.relative_to(ROOT).as_posix(), c) for p in DOCS for c in commands(p)]
REFS = [(p.relative_to(ROOT).as_posix(), c) for p in DOCS for c in references(p)]


def test_the_documentation_has_commands_to_check():
    assert len(CASES) >= 10 and any(path == "README.md" for path, _ in CASES) and len(REFS) >= 20


@pytest.mark.parametrize("where,line", REFS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(REFS)])
def test_a_command_named_in_the_prose_has_its_subcommand_and_options(where, line):
    from lsp_server.cli import build_parser

    argv = argv_of(line)
    if not argv or argv[0].isupper():  # `ditto-lsp COMMAND --help`
        return
    subparsers = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert argv[0] in subparsers, f"{where}: `{line}`: no subcommand {argv[0]!r}"
    known = subparsers[argv[0]]._option_string_actions
    unknown = [w for w in argv[1:] if w.startswith("-") and w.split("=")[0] not in known]
    assert not unknown, f"{where}: `{line}`: {argv[0]} has no option {unknown}"


@pytest.mark.parametrize("where,line", CASES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(CASES)])
def test_a_documented_command_parses(where, line):
    from lsp_server.cli import build_parser

    argv = argv_of(line)
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code == 0, f"{where}: `{line}` does not parse (argv {argv})"

"""What the tracked tree must be as a whole: no path of the machine it was written on, every file a
document or a comment cites present, and the sizes the README, docs/ and the tree are held to.

Only tracked files count (`git ls-files`), read as text where they are text. Skipped where the tree is
not a git checkout (an sdist).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ditto_bench.pages import OLDER_REPORTS_AT

ROOT = Path(__file__).resolve().parents[1]

# Paths that name one machine's files: a checkout or mirror under /work, a home directory (`/home/me/`
# is the documentation's example user), root's home, and scratch under /tmp, except a `file:///tmp/...`
# URI (a document's name in a test or a benchmark, no file is touched) and the `/tmp/ditto...` folders
# a script makes for itself wherever it runs (editors/vscode/test/e2e.sh).
MACHINE = re.compile("|".join([
    "/" + "work/", "/" + "root/", "/" + "home/(?!me/)", "(?<!file://)/" + "tmp/(?!ditto)",
]))


def tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def text_of(path: Path) -> str | None:
    raw = path.read_bytes()
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def machine_paths(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        text = text_of(path)
        for n, line in enumerate((text or "").splitlines(), 1):
            if MACHINE.search(line):
                found.append(f"{path.relative_to(ROOT).as_posix()}:{n}: {line.strip()[:160]}")
    return found


def test_no_tracked_file_names_a_path_of_this_machine():
    assert machine_paths(tracked()) == []


def test_the_machine_path_check_finds_each_kind(tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_text("a\nsee /" "work/.mirror/x/repo\n/" "tmp/s49/bench\n/" "home/alice/x\n/" "root/.cache\n"
                   "fine: file:///" "tmp/a.py /" "tmp/ditto-e2e /" "home/me/src\n")
    found = [f.split(": ", 1)[0].rsplit(":", 1)[1] for f in machine_paths_in(bad)]
    assert found == ["2", "3", "4", "5"]


def machine_paths_in(path: Path) -> list[str]:
    """machine_paths for a file outside the tree (the check's own test)."""
    text = path.read_text()
    return [f"{path.name}:{n}: {line}" for n, line in enumerate(text.splitlines(), 1) if MACHINE.search(line)]


# -- cited files exist --------------------------------------------------------------------------------
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED = re.compile(r"(?<![\w/:.\"'-])((?:docs|editors|tests|lsp_server|drafters|ditto_bench)/[\w./+-]*\w)")
# A line that names the last commit that had the earlier reports (ditto_bench/pages.py) may name what was there.
GONE = OLDER_REPORTS_AT


def python_prose(text: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, line by line (what cites; string literals in code are
    data: a test's made-up paths)."""
    import ast
    import io
    import tokenize

    try:
        out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
               if t.type == tokenize.COMMENT]
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):  # a fixture that is not whole Python (an editor test's file)
        return []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            first = node.body[0].lineno
            out += [(first + i, line) for i, line in enumerate(node.body[0].value.value.splitlines())]
    return out


def missing_citations(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        if path.suffix not in (".md", ".py", ".sh", ".lua", ".el", ".ts", ".mjs", ".toml"):
            continue
        text = text_of(path) or ""
        lines = python_prose(text) if path.suffix == ".py" else enumerate(text.splitlines(), 1)
        for n, line in lines:
            if GONE in line:
                continue
            where = f"{path.relative_to(root).as_posix()}:{n}"
            if path.suffix == ".md":
                for target in LINK.findall(line):
                    if re.match(r"[a-z]+:|#", target):
                        continue
                    if not (path.parent / target.split("#")[0]).exists():
                        found.append(f"{where}: link {target}")
            for cited in CITED.findall(line):
                if "*" in cited or "<" in cited or cited.endswith((".", "/")):
                    continue
                if not (root / cited).exists() and not (root / cited).with_suffix(".py").exists():
                    found.append(f"{where}: {cited}")
    return found


def test_every_file_a_document_or_comment_cites_is_in_the_tree():
    assert missing_citations(tracked()) == []


def test_the_citation_check_finds_a_missing_link_and_a_comment_citing_a_gone_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# here\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[here](here.md) and [gone](gone.md#x)\nsee docs/here.md and docs/gone.md\n"
                    "git has it: `git show " + GONE + ":docs/old.md`\n")
    code = tmp_path / "m.py"
    code.write_text('"""Cites docs/here.md."""\n\nX = "docs/data.json"  # the made-up path is data\n# docs/gone.md\n')
    assert missing_citations([page, code], tmp_path) == [
        "docs/page.md:1: link gone.md#x", "docs/page.md:2: docs/gone.md", "m.py:4: docs/gone.md"]


# -- sizes --------------------------------------------------------------------------------------------
def test_the_readme_docs_and_the_tree_keep_their_sizes():
    files = tracked()
    assert (ROOT / "README.md").stat().st_size <= 10_000, "README.md over 10 KB: a user's guide, the rest in docs/"
    docs = sum(p.stat().st_size for p in (ROOT / "docs").rglob("*") if p.is_file())
    assert docs <= 1_500_000, f"docs/ holds {docs:,} bytes (at most 1.5 MB: the current record only)"
    tree = sum(p.stat().st_size for p in files if p.as_posix() != (ROOT / "editors/vscode/package-lock.json").as_posix())
    assert tree <= 3_000_000, f"the tracked tree holds {tree:,} bytes (at most 3 MB, package-lock.json aside)"


def test_the_readme_tells_no_history():
    """A user's guide: no commit hashes and no issue numbers (git and the issues hold the history)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert hashes == [] and re.findall(r"\bissues? \d+|#\d+\b", text, re.I) == []

"""The commit-replay harvester on a small git repository built here: known commits -> known tasks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ditto_bench.harvest import HarvestError, HarvestOptions, copyable_fraction, harvest, is_mechanical, parse_diff

BASE_A = """import os


def first():
    return 1


def second():
    return 2
"""

BUF_B = """def helper(x):
    return x * 2
"""


def git(repo: Path, *args: str, date: str = "2024-01-01T00:00:00") -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def commit(repo: Path, files: dict[str, str], msg: str, date: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", msg, date=date)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def repo(tmp_path: Path) -> dict:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    shas = {}
    shas["init"] = commit(r, {"a.py": BASE_A, "b.py": BUF_B, "notes.txt": "hello\n"}, "init", "2024-01-01T00:00:00")
    # Adds a 2-line block to a.py and changes b.py: one task, b.py (parent version) open.
    a2 = BASE_A.replace("def second():", "def middle():\n    return helper(3)\n\n\ndef second():")
    shas["block"] = commit(r, {"a.py": a2, "b.py": BUF_B + "\n\nLIMIT = 3\n"}, "add middle", "2024-02-01T00:00:00")
    # A 10-line block is too long; a non-source file is ignored.
    long = "\n".join(f"    value_{i} = {i}" for i in range(10))
    a3 = a2 + "\n\ndef big():\n" + long + "\n"
    shas["long"] = commit(r, {"a.py": a3, "notes.txt": "hello\nworld and more words\n"}, "big", "2024-03-01T00:00:00")
    # Rename only: mechanical, skipped.
    git(r, "mv", "b.py", "c.py")
    git(r, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "rename", date="2024-04-01T00:00:00")
    # Two separate one-line additions in one commit (cap per commit applies to these).
    a4 = a3.replace("import os\n", "import os\nimport sys\n").replace("def first():\n", "def first():\n    print('first one')\n")
    shas["two"] = commit(r, {"a.py": a4}, "two additions", "2024-05-01T00:00:00")
    return {"path": r, "shas": shas, "a2": a2, "a4": a4}


def test_known_commits_give_known_tasks(repo):
    res = harvest(repo["path"], HarvestOptions(max_tasks=50, per_commit=3))
    by_commit = {}
    for t in res.tasks:
        by_commit.setdefault(t.commit, []).append(t)
    assert set(by_commit) == {repo["shas"]["block"], repo["shas"]["two"]}  # init is a root commit; long/rename give none
    (t,) = by_commit[repo["shas"]["block"]]
    assert t.path == "a.py" and t.language == "python"
    assert t.truth == "def middle():\n    return helper(3)"
    assert t.document == BASE_A.replace("def second():", "\n\n\ndef second():")  # block -> one empty line
    assert (t.line, t.col) == (7, 0)
    assert t.document.split("\n")[t.line] == ""  # cursor where the block started
    assert t.buffers == [("b.py", BUF_B)]  # other touched file, at its parent version
    assert t.id == f"{repo['shas']['block'][:10]}:a.py:8"
    # Typing the whole block gives back the post-commit file.
    assert t.typed(0) == (t.document, t.line, 0)
    assert t.typed(5) == (t.document.replace("\n\n\n\n\n", "\n\n\ndef m\n\n"), t.line, 5)
    text, line, col = t.typed(len(t.truth))
    assert text == repo["a2"] and (line, col) == (t.line + 1, len("    return helper(3)"))
    truths = sorted(x.truth for x in by_commit[repo["shas"]["two"]])
    assert truths == ["    print('first one')", "import sys"]
    assert res.commits_skipped.get("renames") == 1


def test_per_commit_cap_and_reproducible_sampling(repo):
    capped = harvest(repo["path"], HarvestOptions(per_commit=1))
    assert sum(t.commit == repo["shas"]["two"] for t in capped.tasks) == 1
    a = [t.id for t in harvest(repo["path"], HarvestOptions(max_tasks=2, seed=7)).tasks]
    b = [t.id for t in harvest(repo["path"], HarvestOptions(max_tasks=2, seed=7)).tasks]
    assert a == b and len(a) == 2
    seeds = {tuple(t.id for t in harvest(repo["path"], HarvestOptions(max_tasks=1, seed=s)).tasks) for s in range(8)}
    assert len(seeds) > 1  # the seed does choose


def test_since_and_language_filter(repo):
    res = harvest(repo["path"], HarvestOptions(since="2024-04-15"))
    assert {t.commit for t in res.tasks} == {repo["shas"]["two"]}
    with pytest.raises(HarvestError, match="no tasks"):
        harvest(repo["path"], HarvestOptions(languages=("rust",)))
    with pytest.raises(HarvestError, match="unknown language"):
        harvest(repo["path"], HarvestOptions(languages=("cobol",)))


def test_clear_errors_for_non_git_and_empty(tmp_path):
    with pytest.raises(HarvestError, match="not a git repository"):
        harvest(tmp_path)
    with pytest.raises(HarvestError, match="no such directory"):
        harvest(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(HarvestError, match="without commits"):
        harvest(empty)


def test_bench_cli_reports_non_git_path(tmp_path, capsys):
    from lsp_server.cli import main

    with pytest.raises(SystemExit) as err:
        main(["bench", "--repo", str(tmp_path), "--model", "tiny-random"])
    assert "not a git repository" in str(err.value)


def test_mechanical_reformat_is_skipped():
    old = [f"x = foo( {i} )" for i in range(30)]
    new = [f"x = foo({i})" for i in range(30)]
    diff = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,30 +1,31 @@\n" + "\n".join(
        "-" + l for l in old) + "\n" + "\n".join("+" + l for l in new) + "\n+y = 1\n"
    assert is_mechanical(parse_diff(diff), HarvestOptions()) == "reformatting"
    real = diff.replace("+x = foo(", "+z = bar(")
    assert is_mechanical(parse_diff(real), HarvestOptions()) is None


def test_copyable_fraction():
    assert copyable_fraction("return helper(x) + 1", ["y = helper(x) + 2"]) == pytest.approx(5 / 7)
    assert copyable_fraction("alpha beta gamma delta", ["nothing here at all"]) == 0.0
    assert copyable_fraction("a.b(c)", ["z = a.b(c)"]) == 1.0


def test_bench_command_end_to_end_on_tiny_random(repo, tmp_path, monkeypatch, capsys):
    import json

    from lsp_server.cli import main

    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))  # pass-cost calibration is stored there
    out = tmp_path / "out"
    rc = main(["bench", "--repo", str(repo["path"]), "--model", "tiny-random", "--max-tasks", "2", "--max-tokens", "4",
               "--systems", "ngram,oracle,hf-greedy", "--context-tokens", "256", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["tasks_run"] == 2 and res["meta"]["partial"] is False
    assert list(res["summary"]) == ["off", "ngram", "oracle", "hf-greedy"]
    for s in res["summary"].values():
        assert s["identical_rate"] == 1.0 and s["tasks"] == 2
    assert len(res["tasks"]) == 2 * 4
    assert "| oracle | 2 |" in (out / "report.md").read_text()

"""The performance pages (ditto_bench/pages.py) from small made-up runs: what the page and the README's
table hold, that the page's data file makes the same page again, and that no machine path gets in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ditto_bench import pages

SYSTEMS = ("ditto", "llama-server", "ditto-base", "ditto#show=all")


def _request(system: str, kind: str, ms: float, right: bool) -> dict:
    truth = "return x + 1\n"
    text = truth if right else "pass\n"
    return {"session": "s", "task": "t", "system": system, "kind": kind, "tts_ms": ms, "timeout": False,
            "text": text, "true_rest": truth, "first_line_exact": right,
            "shown": True, "kept": right, "wrong": not right, "kept_chars": len(truth) if right else 0}


def _run(tmp_path: Path, owner_name: str) -> Path:
    """A results.json as `ditto-lsp bench --mode session` writes it, for a clone under a mirror's folder."""
    clone = tmp_path / "mirror" / owner_name.replace("/", "+") / "repo"
    out = tmp_path / "runs" / owner_name.split("/")[1]
    tasks = []
    for i, system in enumerate(SYSTEMS):
        slow = 10.0 if system == "llama-server" else 1.0
        tasks += [_request(system, "cold", 1000 * slow + 10 * k, k % 2 == 0) for k in range(5)]
        tasks += [_request(system, "warm", 100 * slow + i, k == 0) for k in range(5)]
    results = {
        "meta": {"mode": "session", "repo": str(clone), "repo_commit": "0123456789abcdef",
                 "command": f"ditto-lsp bench --repo {clone} --mode session --systems {','.join(SYSTEMS)} --out {out}",
                 "machine": {"summary": "AMD EPYC, 2 cores"}, "model": "qwen2.5-coder-0.5b", "backend": "llama.cpp",
                 "dtype": "Q4_K_M", "versions": {"ditto-lsp": "0.1.0", "ditto_commit": "abc1234"},
                 "replay": {"systems": {s: {"context_tokens": 256, "threads": 1} for s in SYSTEMS}}},
        "summary": {s: {"cold": {}, "warm": {}} for s in SYSTEMS},
        "tasks": tasks,
    }
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps(results))
    return out / "results.json"


README = f"""# Project

Before.

{pages.MARK.format(kind="replay", end="start")}
old table
{pages.MARK.format(kind="replay", end="end")}

After.
"""


@pytest.fixture
def made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = [_run(tmp_path, "pypa/pipx"), _run(tmp_path, "jd/tenacity")]
    (tmp_path / "README.md").write_text(README)
    pages.main([*map(str, runs), "--kind", "replay", "--out", "docs/perf", "--readme", "README.md"])
    return tmp_path


def test_the_page_has_every_system_and_the_readme_three(made):
    page = (made / "docs/perf/replay.md").read_text()
    readme = (made / "README.md").read_text()
    table = readme.split("| |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ")[0] for line in table.splitlines()[2:]]
    assert rows == ["| Ditto", "| llama-server (llama.vim's client)", "| Ditto, previous version"]
    # 10 requests a system and repository: cold p50 of Ditto 1,020 ms, the peer's 10,020; 3 + 1 first lines right
    assert "| Ditto | 20 | 1,020 / 1,040 |" in table and "| llama-server (llama.vim's client) | 20 | 10,020 / 10,040 |" in table
    assert "| 8/20 | 0.60 | 5.2 |" in table
    assert readme.startswith("# Project\n\nBefore.\n\n") and readme.endswith("\n\nAfter.\n") and "old table" not in readme
    assert "![Time to suggestion, cold and warm, of each system](docs/perf/replay.png)" in readme
    assert "| ditto#show=all | 20 |" in page and "| jd/tenacity @ 0123456789 | Ditto | 10 |" in page
    assert "ditto-lsp bench --repo path/to/pipx --mode session" in page and "--out runs/pipx" in page
    assert "AMD EPYC, 2 cores; qwen2.5-coder-0.5b (Q4_K_M, llama.cpp); one core and 1 thread a server" in readme
    assert (made / "docs/perf/replay.png").stat().st_size > 1000


def test_the_data_file_makes_the_same_page_and_table(made):
    page, readme = (made / "docs/perf/replay.md").read_text(), (made / "README.md").read_text()
    data = (made / "docs/perf/data/replay.json").read_bytes()
    (made / "README.md").write_text(README)
    pages.main(["docs/perf/data/replay.json", "--kind", "replay", "--out", "docs/perf", "--readme", "README.md"])
    assert (made / "docs/perf/replay.md").read_text() == page and (made / "README.md").read_text() == readme
    assert (made / "docs/perf/data/replay.json").read_bytes() == data


def test_no_machine_path_gets_into_what_is_written(made):
    for rel in ("docs/perf/replay.md", "docs/perf/data/replay.json", "README.md"):
        text = (made / rel).read_text()
        assert str(made) not in text and "/mirror/" not in text, rel
    assert "python -m ditto_bench.pages docs/perf/data/replay.json --kind replay --out docs/perf --readme README.md" in \
        (made / "docs/perf/replay.md").read_text()


def test_a_readme_without_the_markers_and_a_run_of_another_kind_are_refused(made):
    (made / "README.md").write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no <!-- perf:replay:start"):
        pages.main(["docs/perf/data/replay.json", "--kind", "replay", "--readme", "README.md"])
    other = json.loads((made / "runs/pipx/results.json").read_text())
    other["meta"]["mode"] = "completion"
    (made / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="not an editor replay"):
        pages.main(["other.json", "--kind", "replay"])


def test_a_run_is_named_by_its_clone_s_origin_where_the_clone_is_here(tmp_path):
    import subprocess

    for name, origin in (("a", "https://github.com/pypa/pipx.git"), ("b", "git@github.com:jd/tenacity.git"),
                         ("c", str(tmp_path / "mirror" / "tkem+cachetools" / "repo"))):
        subprocess.run(["git", "init", "-q", str(tmp_path / name)], check=True)
        subprocess.run(["git", "-C", str(tmp_path / name), "remote", "add", "origin", origin], check=True)
    assert [pages.clone_label(str(tmp_path / n)) for n in "abc"] == ["pypa/pipx", "jd/tenacity", "tkem/cachetools"]
    assert pages.clone_label(str(tmp_path / "gone" / "sqlparse")) == "sqlparse"

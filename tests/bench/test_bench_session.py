"""Session replay (ditto_bench/session.py): several tasks of one file in sequence with one cache.

A small git repository built here, the tiny random model; no timing assertions.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ditto_bench import metrics, report
from ditto_bench.harvest import HarvestOptions, harvest
from ditto_bench.session import build_sessions, events, post_commit_text

BEFORE = "".join(f"def f{i}(x):\n    y = x + {i}\n    return y\n\n\n" for i in range(12))
BLOCKS = {
    "def f2(x):\n": "def f2(x):\n    if x < 0:\n        raise ValueError(x)\n",
    "def f6(x):\n": "def f6(x):\n    print('f6', x)\n",
    "def f10(x):\n": "def f10(x):\n    x = abs(x)\n    x = x * 2\n",
}


def git(repo: Path, *args: str, date: str = "2024-01-01T00:00:00") -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date,
           "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "m.py").write_text(BEFORE)
    (r / "util.py").write_text("def helper(x):\n    return abs(x) * 2\n")
    git(r, "add", "-A")
    git(r, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "init")
    after = BEFORE
    for k, v in BLOCKS.items():
        after = after.replace(k, v)
    (r / "m.py").write_text(after)
    (r / "util.py").write_text("def helper(x):\n    return abs(x) * 3\n")
    git(r, "add", "-A")
    git(r, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "three blocks", date="2024-02-01T00:00:00")
    return r


def sessions_of(repo, max_tasks=10):
    h = harvest(repo, HarvestOptions(max_tasks=10**9, per_commit=5))
    return build_sessions(h.tasks, max_tasks)


def test_a_session_holds_the_blocks_of_one_file_and_the_replay_rebuilds_it(repo):
    (s,) = sessions_of(repo)
    assert s.path == "m.py" and len(s.blocks) == 3
    assert [b.task.truth.split("\n")[0].strip() for b in s.blocks] == ["if x < 0:", "print('f6', x)", "x = abs(x)"]
    post = post_commit_text(s.blocks[0].task)
    assert s.document.count("\n") == post.count("\n") - (2 - 1) - (1 - 1) - (2 - 1)  # each block -> one empty line
    assert all(s.document.split("\n")[b.line] == "" for b in s.blocks)
    assert s.buffers == [("util.py", "def helper(x):\n    return abs(x) * 2\n")]
    evs = list(events(s))
    assert evs[-1].text == post  # every block typed: the post-commit file
    kinds = [e.kind for e in evs]
    assert kinds.count("move") == 3 and kinds.count("enter") == 2  # one Enter per extra line of a block
    assert kinds[0] == "move" and kinds[1] == "type"
    for e in evs:  # the cursor is where the text was just typed
        line = e.text.split("\n")[e.line]
        assert 0 <= e.col <= len(line)
        if e.kind == "move":
            assert line.strip() == "" and e.col == len(line)
    # Capped keystrokes: the rest of each line arrives at once, the end result is the same.
    capped = list(events(s, max_keystrokes=3))
    assert len(capped) < len(evs) and sum(e.kind == "type" for e in capped) <= 3 * 5
    doc = capped[-1].text.split("\n")
    assert doc[capped[-1].line] == "    x = x * 2"[: len("    ") + 3]
    assert [e.kind for e in capped if e.kind != "type"] == [k for k in kinds if k != "type"]


def test_sessions_are_cut_to_max_tasks_and_need_two_blocks(repo):
    assert sum(len(s.blocks) for s in sessions_of(repo, max_tasks=2)) == 2
    h = harvest(repo, HarvestOptions(max_tasks=10**9, per_commit=5))
    assert build_sessions(h.tasks[:1], 10) == []  # one block alone is no session


@pytest.fixture(scope="module")
def lm():
    from lsp_server.backends.loader import load

    return load("tiny-random")


def test_an_events_keystroke_count_is_where_the_cursor_stands_in_the_block(repo):
    """The quality of an in-process session request is read from truth[:keystroke]
    (quality.typed_quality): that must be the text before the cursor on its line."""
    from ditto_bench.quality import typed_quality

    (s,) = sessions_of(repo)
    n = 0
    for ev in events(s, 3):
        truth = ev.task.truth
        before = ev.text.split("\n")[ev.line][: ev.col]
        assert truth[: ev.keystroke].rsplit("\n", 1)[-1] == before
        true_line = truth.split("\n")[truth[: ev.keystroke].count("\n")]
        assert typed_quality(truth, ev.keystroke, true_line[len(before):])["first_line_exact"]
        n += 1
    assert n > 10


def test_session_replay_reuses_the_cache_across_enter_and_moves(repo, lm):
    from ditto_bench.runner import Bench
    from lsp_server.completion.completer import Completer
    from lsp_server.decoding.types import DecodeOptions

    (s,) = sessions_of(repo)
    completer = Completer(lm)
    bench = Bench(lm, completer, DecodeOptions(max_new_tokens=3))
    recs = list(bench.session(s, ["ngram", "ngram-noreuse"], max_keystrokes=4))
    per = {name: [r for r in recs if r["system"] == name] for name in ("ngram", "ngram-noreuse")}
    assert len(per["ngram"]) == len(per["ngram-noreuse"]) == len(list(events(s, 4)))
    assert [r["event"] for r in per["ngram"]] == [e.kind for e in events(s, 4)]
    assert all(r["reused_tokens"] == 0 and not r["typethrough"] for r in per["ngram-noreuse"])
    # Both systems follow the same prompt windows: same prompts where both asked the model.
    for a, b in zip(per["ngram"], per["ngram-noreuse"]):
        if not a["typethrough"]:
            assert a["prompt_tokens"] == b["prompt_tokens"]
    enters = [r for r in per["ngram"] if r["event"] == "enter" and not r["typethrough"]]
    assert enters and all(r["reused_tokens"] > 0.5 * r["prompt_tokens"] for r in enters)
    json.dumps(recs)
    summary = metrics.summarise_session(recs)
    v, nr = summary["ngram"], summary["ngram-noreuse"]
    assert v["sessions"] == 1 and v["tasks"] == 3 and v["requests"] == len(per["ngram"])
    assert v["prefill_tokens_mean_model"] < nr["prefill_tokens_mean_model"]
    assert nr["reused_share_enter_mean"] == 0.0 and v["reused_share_enter_mean"] > 0.5
    moves = [r for r in per["ngram"] if r["event"] == "move"]
    assert v["idle_prefill_hits"] == len(moves) == 3  # the user paused at each new place: prefilled there
    assert all(r["reused_tokens"] >= 0.9 * r["prompt_tokens"] for r in moves if not r["typethrough"])
    assert all(r["idle_prefill_tokens"] == 0 for r in per["ngram-noreuse"])
    assert "prefill_tokens_p95_gain_vs_noreuse" in v
    # Reuse never changes a result: every request the model answered in both is the same tokens.
    assert nr["identical_to_reuse_rate"] == 1.0 and nr["identical_to_reuse_compared"] == v["model_requests"]
    assert completer.engine.cached_keys() == []  # the session's cache entry is dropped afterwards
    # Every request carries its quality, and the summary counts them.
    assert all({"first_line_exact", "edit_similarity", "empty", "misfire"} <= set(r) for r in recs)
    assert v["quality"]["first_line_exact"] == sum(r["first_line_exact"] for r in per["ngram"])


def test_session_summary_from_hand_made_records():
    rs = []
    for sysname, reused, tts in (("ngram", 95, 100.0), ("ngram-noreuse", 0, 1000.0)):
        for i, ev in enumerate(["move", "type", "type", "enter", "type"]):
            rs.append({"session": "s", "task": "t", "system": sysname, "event": ev, "tts_ms": tts + i,
                       "typethrough": sysname == "ngram" and i == 2, "prefill_tokens": 100 - reused,
                       "reused_tokens": reused, "prompt_tokens": 100, "window_moved": False, "drafted": 0,
                       "accepted": 0, "idle_prefill_tokens": 7 if (sysname, i) == ("ngram", 4) else 0})
    s = metrics.summarise_session(rs)
    v = s["ngram"]
    assert v["requests"] == 5 and v["model_requests"] == 4 and v["typethrough_hits"] == 1
    assert v["reused_share_enter_mean"] == 0.95 and v["reused_share_move_mean"] == 0.95
    assert v["prefill_tokens_p95_model"] == 5 and s["ngram-noreuse"]["prefill_tokens_p95_model"] == 100
    assert v["prefill_tokens_p95_gain_vs_noreuse"] == 20.0
    assert v["idle_prefill_hits"] == 1
    assert v["tts_p95_model_gain_vs_noreuse"] == pytest.approx(s["ngram-noreuse"]["tts_ms_p95_model"] / v["tts_ms_p95_model"],
                                                               abs=1e-3)
    md = report.session_table(s)
    assert "| ngram | 1 | 1 | 5 |" in md and "95.0% (1)" in md


def test_session_same_output_rates_pair_the_nth_requests_and_skip_type_through():
    def rec(system, session, tokens, typethrough=False):
        return {"session": session, "task": "t", "system": system, "event": "type", "tts_ms": 1.0,
                "typethrough": typethrough, "prefill_tokens": 1, "reused_tokens": 0, "prompt_tokens": 10,
                "drafted": 0, "accepted": 0, "tokens": tokens}

    rs = [rec("off", "a", [1, 2]), rec("off", "a", [3]), rec("off", "a", [4], True), rec("off", "b", [5]),
          rec("ngram", "a", [1, 2]), rec("ngram", "a", [3, 9]), rec("ngram", "a", [7], True), rec("ngram", "b", [5]),
          rec("ngram-noreuse", "a", [1, 2]), rec("ngram-noreuse", "a", [3, 9]), rec("ngram-noreuse", "a", [8]),
          rec("ngram-noreuse", "b", [5])]
    s = metrics.summarise_session(rs)
    # ngram vs off: 3 requests compared (the type-through one left out), the second differs.
    assert (s["ngram"]["identical_to_off_rate"], s["ngram"]["identical_to_off_compared"]) == (round(2 / 3, 4), 3)
    assert (s["ngram-noreuse"]["identical_to_reuse_rate"], s["ngram-noreuse"]["identical_to_reuse_compared"]) == (1.0, 3)
    assert "identical_to_off_rate" not in s["off"] and "identical_to_off_rate" not in s["ngram-noreuse"]
    assert "66.7% (3)" in report.session_table(s)


def test_bench_session_command_end_to_end(repo, tmp_path, monkeypatch):
    from lsp_server.cli import main

    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = main(["bench", "--repo", str(repo), "--mode", "session", "--model", "tiny-random", "--max-tasks", "3",
               "--per-commit", "5", "--max-tokens", "3", "--max-keystrokes", "2", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["mode"] == "session" and res["meta"]["sessions_run"] == 1 and res["meta"]["tasks_run"] == 3
    from lsp_server.completion.context import ContextBudget

    assert res["meta"]["budget"]["total"] == ContextBudget.default().total  # the server's default budget
    assert list(res["summary"]) == ["ngram", "ngram-noreuse"]
    md = (out / "report.md").read_text()
    assert "## Session replay" in md and "| ngram | 1 | 3 |" in md


def test_same_suggestion_rate_leaves_out_tokens_past_the_stop_rule():
    """A drafting system may generate a few tokens past where the stop rules cut off's suggestion:
    the same text with a longer token list is the same suggestion; another text is not."""
    def rec(system, tokens, text, typethrough=False):
        return {"session": "a", "task": "t", "system": system, "event": "type", "tts_ms": 1.0, "typethrough": typethrough,
                "prefill_tokens": 1, "reused_tokens": 0, "prompt_tokens": 10, "drafted": 0, "accepted": 0,
                "tokens": tokens, "text": text}

    rs = [rec("off", [1, 2], "ab"), rec("off", [3], "c"), rec("off", [4], "d"), rec("off", [5], "e", True),
          rec("ngram", [1, 2, 7], "ab"), rec("ngram", [3], "c"), rec("ngram", [9], "x"), rec("ngram", [5], "e", True)]
    s = metrics.summarise_session(rs)
    assert (s["ngram"]["same_suggestion_as_off_rate"], s["ngram"]["same_suggestion_as_off_compared"]) == (round(2 / 3, 4), 3)
    assert s["ngram"]["identical_to_off_rate"] == round(1 / 3, 4)  # exact token lists: the stricter count


def test_session_oracle_drafts_offs_tokens_of_each_request(repo, lm):
    """Session mode's oracle (issue 42: the ceiling beside the default drafter) drafts what off generated
    at the same request: every request the model answered gives off's tokens in fewer passes."""
    from ditto_bench.runner import Bench
    from ditto_bench.systems import parse_systems
    from lsp_server.completion.completer import Completer
    from lsp_server.decoding.types import DecodeOptions

    with pytest.raises(ValueError, match="needs off before it"):
        parse_systems("oracle,off", "session")
    assert parse_systems("off,ngram,oracle", "session") == ["off", "ngram", "oracle"]
    (s,) = sessions_of(repo)
    bench = Bench(lm, Completer(lm), DecodeOptions(max_new_tokens=8))
    recs = list(bench.session(s, ["off", "oracle"], max_keystrokes=3))
    off = [r for r in recs if r["system"] == "off"]
    oracle = [r for r in recs if r["system"] == "oracle"]
    assert len(off) == len(oracle) > 3
    model = [(a, b) for a, b in zip(off, oracle) if not a["typethrough"]]
    # The same suggestion: a pass accepting several tokens may run past where the stop rules cut (never shown).
    assert model and all(a["text"] == b["text"] and b["tokens"][: len(a["tokens"])] == a["tokens"] for a, b in model)
    assert sum(b["target_passes"] for _, b in model) < sum(a["target_passes"] for a, _ in model)
    assert sum(b["accepted"] for _, b in model) > 0

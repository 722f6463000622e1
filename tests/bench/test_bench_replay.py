"""The editor replay (ditto_bench/replay.py): its event script, its quality measures, llama.vim's
requests (ditto_bench/peer.py), and the replay end to end on the tiny random model.

No timing assertions: the end-to-end runs scale the pauses down (--pause-scale 0.01).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ditto_bench import metrics, report
from ditto_bench.harvest import Task
from ditto_bench.peer import LlamaVimClient
from ditto_bench.peer_text import Buffer, chunk_sim
from ditto_bench.quality import first_line_exact, misfire
from ditto_bench.replay_ditto import DittoDriver, ditto_options
from ditto_bench.replay_script import Ask, Edit, Open, ReplayOptions, script
from ditto_bench.session import Block, Session, build_sessions
from ditto_bench.systems import is_base, parse_systems, replay_system

# -- a tiny session made by hand ---------------------------------------------------------------
DOC = "import os\n\ndef f(x):\n\n    return x\n\n\ndef g(y):\n\n"
# Block 0 at line 3 (two lines), block 1 at line 8 (three lines, the middle one blank).
TRUTH0 = "    if x:\n        x = 1"
TRUTH1 = "    z = '😀' + y\n\n    return z"


def _task(line: int, truth: str) -> Task:
    return Task(id=f"abc:m.py:{line + 1}", repo="/nowhere", commit="abc", parent="abb", subject="s", date=0,
                path="m.py", language="python", line=line, col=0, document=DOC, truth=truth)


def _session() -> Session:
    blocks = [Block(_task(3, TRUTH0), 3), Block(_task(8, TRUTH1), 8)]
    return Session("abc:m.py", "m.py", DOC, blocks, [("util.py", "def helper(x):\n    return x\n")])


def test_the_event_script_arrives_cold_then_types_each_line_warm():
    steps = script(_session())
    assert isinstance(steps[0], Open) and steps[0].buffers == (("util.py", "def helper(x):\n    return x\n"),)
    shape = [(type(s).__name__, getattr(s, "what", None) or getattr(s, "kind", None) or getattr(s, "seconds", None))
             for s in steps[1:]]
    assert shape == [
        # block 0: arrive (indent, ask cold), rest, first char, pause, ask; rest of line, Enter, char, pause, ask; rest
        ("Edit", "arrive"), ("Ask", "cold"), ("Pause", 1.0), ("Edit", "char"), ("Pause", 0.3), ("Ask", "warm"),
        ("Edit", "rest"), ("Edit", "enter"), ("Edit", "char"), ("Pause", 0.3), ("Ask", "warm"), ("Edit", "rest"),
        # block 1: a blank middle line gets its Enter and no request
        ("Edit", "arrive"), ("Ask", "cold"), ("Pause", 1.0), ("Edit", "char"), ("Pause", 0.3), ("Ask", "warm"),
        ("Edit", "rest"), ("Edit", "enter"), ("Edit", "enter"), ("Edit", "char"), ("Pause", 0.3), ("Ask", "warm"),
        ("Edit", "rest"),
    ]
    asks = [s for s in steps if isinstance(s, Ask)]
    assert [(a.block, a.k, a.kind, a.event, a.line, a.col, a.typed) for a in asks] == [
        (0, 0, "cold", "arrive", 3, 4, "    "),
        (0, 0, "warm", "line", 3, 5, "    i"),
        (0, 1, "warm", "line", 4, 9, "        x"),
        (1, 0, "cold", "arrive", 9, 4, "    "),  # block 1 moved down by the line block 0 added
        (1, 0, "warm", "line", 9, 5, "    z"),
        (1, 2, "warm", "line", 11, 5, "    r"),
    ]
    assert asks[0].true_line == "    if x:" and asks[0].true_rest == "if x:\n        x = 1"
    assert asks[2].true_rest == " = 1"
    assert asks[4].true_rest == " = '😀' + y\n\n    return z"
    for a in asks:  # the text before the cursor is what was typed
        assert a.document.split("\n")[a.line][: a.col] == a.typed
    # Every edit applied to the previous document gives the edit's document; the cursor follows.
    doc = DOC
    for s in steps:
        if isinstance(s, Edit):
            lines = doc.split("\n")
            head, tail = lines[s.line][: s.col], lines[s.end_line][s.end_col :]
            lines[s.line : s.end_line + 1] = (head + s.text + tail).split("\n")
            doc = "\n".join(lines)
            assert doc == s.document
            line, col = s.cursor
            assert len(doc.split("\n")[line]) >= col
    post = DOC.split("\n")
    post[8:9] = TRUTH1.split("\n")
    post[3:4] = TRUTH0.split("\n")
    assert doc == "\n".join(post)  # typed blocks stay: the post-commit file


def test_ditto_driver_sends_incremental_edits_in_utf16_units():
    """Applied by LSP's rules (UTF-16 positions), the didChanges rebuild each step's document."""

    class FakeClient:
        def __init__(self):
            self.changes = []

        def change(self, uri, version, changes):
            self.changes.append((version, changes))

    def apply(text: str, change: dict) -> str:
        lines = text.split("\n")

        def offset(pos):
            line = lines[pos["line"]]
            units, i = 0, 0
            while units < pos["character"]:
                units += len(line[i].encode("utf-16-le")) // 2
                i += 1
            return sum(len(l) + 1 for l in lines[: pos["line"]]) + i

        a, b = offset(change["range"]["start"]), offset(change["range"]["end"])
        return text[:a] + change["text"] + text[b:]

    d = DittoDriver("ditto", ReplayOptions())
    d.client = FakeClient()
    d.uri, d.version, d.lines = "file:///m.py", 1, DOC.split("\n")
    doc = DOC
    for s in script(_session()):
        if isinstance(s, Edit):
            d.edit(s)
            version, (change,) = d.client.changes[-1]
            doc = apply(doc, change)
            assert doc == s.document and version == d.version
    assert "😀" in doc and d.version == 1 + len(d.client.changes)


def test_first_line_exact_and_whole_word_misfire():
    assert first_line_exact("    i", "f x:\n        pass", "    if x:")
    assert first_line_exact("    i", "f x:   ", "    if x:  ")  # trailing blanks aside
    assert not first_line_exact("    i", " = 0", "    if x:")
    assert not first_line_exact("    ", "", "    if x:")
    assert first_line_exact("    retur", "n", "    return")
    # issue 25: a letter typed, the true line continues the word, the suggestion starts with a non-word character
    assert misfire("    e", "    else:", " = []") is True
    assert misfire("    s", "    self.x = 1", "(x)") is True
    assert misfire("    i", "    if x:", "f x:") is False
    assert misfire("    i", "    if x:", "") is False  # empty is not a misfire
    assert misfire("    i", "    i = 0", " = 0") is None  # the true line does not continue the word
    assert misfire("    (", "    (a, b) = c", " = 1") is None  # not a letter
    assert misfire("    ", "    x = 1", " = 1") is None
    assert misfire("    x", "    x", "y") is None  # nothing follows on the true line
    assert misfire("    f", "    foo_bar()", "_bar()") is False  # _ is a word character


def test_replay_system_names():
    assert replay_system("ditto") == ("ditto", None)
    assert replay_system("ditto@512") == ("ditto", 512)
    assert replay_system("ditto-nodraft@1024") == ("ditto-nodraft", 1024)
    assert replay_system("llama-server") == ("llama-server", None)
    assert replay_system("llama-server@512") is None and replay_system("ditto@") is None
    assert replay_system("ngram") is None
    assert replay_system("ditto@512+qwen2.5-coder-1.5b") == ("ditto", 512)  # another model for this system
    assert replay_system("ditto-base") == ("ditto-base", None)  # another checkout's server (--baseline)
    assert replay_system("ditto-base@512") is None and replay_system("llama-server+default") is None
    # options on the baseline (its own settings check them; a pinned budget makes two checkouts' prompts comparable)
    assert replay_system("ditto-base#context_tokens=384") == ("ditto-base", None)
    assert ditto_options("ditto-base#context_tokens=384") == {"context_tokens": 384}
    assert replay_system("llama-server#show=all") is None
    assert is_base("ditto-base#context_tokens=384") and is_base("ditto-base") and not is_base("ditto")
    assert replay_system("ditto@320~similar+qwen2.5-coder-1.5b") == ("ditto", 320)  # a snippets source
    assert replay_system("llama-server~similar") is None and replay_system("ditto~nearby") is None
    from ditto_bench.replay_ditto import replay_model

    assert replay_model("ditto@512+qwen2.5-coder-1.5b", "default") == "qwen2.5-coder-1.5b"
    assert replay_model("ditto@512", "default") == "default"
    assert parse_systems("ngram,ditto,llama-server", "session") == ["ngram", "ditto", "llama-server"]
    with pytest.raises(ValueError):
        parse_systems("ditto", "keystroke")
    assert ditto_options("ditto") == {}
    assert ditto_options("ditto-nodraft@512") == {"drafter": "none", "contextTokens": 512}
    assert ditto_options("ditto~similar") == {"snippets": "similar"}


def test_a_hash_suffix_passes_any_initialization_option():
    from ditto_bench.replay_ditto import log_name, replay_model
    from ditto_bench.systems import name_options

    assert replay_system("ditto#show=sure") == ("ditto", None)
    assert ditto_options("ditto#show=sure") == {"show": "sure"}
    # with the other suffixes; VALUE as JSON where it parses; the last word on a key wins
    name = "ditto-nodraft@512~similar+qwen2.5-coder-1.5b#show=surest#wholeFile=true#maxTokens=16#drafter=ngram"
    assert replay_system(name) == ("ditto-nodraft", 512) and replay_model(name, "default") == "qwen2.5-coder-1.5b"
    assert ditto_options(name) == {"drafter": "ngram", "contextTokens": 512, "snippets": "similar", "show": "surest",
                                   "wholeFile": True, "maxTokens": 16}
    assert name_options('ditto#note="a b"#x=[1]') == {"note": "a b", "x": [1]}
    assert replay_model("ditto#model=a+b", "default") == "default"  # a `+` in a value names no model
    for bad in ("ditto#show", "ditto#=1", "ditto#1x=2", "ditto#", "llama-server#show=sure", "ditto-base#show"):
        assert replay_system(bad) is None, bad
    # several settings of one system side by side in one run, each its own system
    assert parse_systems("ditto#show=all,ditto#show=sure,ditto#show=surest,llama-server", "session") == [
        "ditto#show=all", "ditto#show=sure", "ditto#show=surest", "llama-server"]
    assert log_name('ditto+a/b#note="x"') == "ditto+a_b#note=_x_.log"


# -- llama.vim's requests ------------------------------------------------------------------------
VIM_DOC = "import os\n\ndef f(x):\n    if x:\n        return 1\n    \n    return 2\n"


def _client(**config) -> LlamaVimClient:
    c = LlamaVimClient("http://127.0.0.1:1", config=config or None)
    c.buffers["a.py"] = c.cur = Buffer("a.py", VIM_DOC)
    return c


def test_llamavim_local_context_follows_its_rules():
    c = _client()
    assert c.cur.line_count() == 7  # the trailing newline is no line in Vim
    # Cursor after "    if x" on line 4: 256 lines above (all), the rest of the line and 64 below.
    ctx = c.fim_ctx_local(8, 4, None)
    assert (ctx["prefix"], ctx["middle"], ctx["suffix"], ctx["indent"]) == (
        "import os\n\ndef f(x):\n", "    if x", ":\n        return 1\n    \n    return 2\n", 4)
    # A line of blanks: the request starts at column 0 with no indentation.
    ctx = c.fim_ctx_local(4, 6, None)
    assert (ctx["middle"], ctx["indent"], ctx["suffix"]) == ("", 0, "\n    return 2\n")
    assert ctx["prefix"] == "import os\n\ndef f(x):\n    if x:\n        return 1\n"
    # Small windows: n_prefix 2 lines above, n_suffix 1 below.
    c = _client(n_prefix=2, n_suffix=1)
    ctx = c.fim_ctx_local(10, 5, None)
    assert (ctx["prefix"], ctx["middle"], ctx["suffix"], ctx["indent"]) == (
        "def f(x):\n    if x:\n", "        re", "turn 1\n    \n", 8)
    ctx = c.fim_ctx_local(0, 1, None)  # the first line: nothing above
    assert (ctx["prefix"], ctx["middle"], ctx["suffix"]) == ("\n", "", "import os\n\n")
    # The follow-up: the context as if a three-line suggestion were accepted at the end of line 4.
    c = _client()
    c.indent_last = 4
    ctx = c.fim_ctx_local(9, 4, [" and y:", "        pass", "    else:"])
    assert (ctx["prefix"], ctx["middle"], ctx["indent"]) == (
        "import os\n\ndef f(x):\n    if x: and y:\n        pass\n", "    else:", 4)
    assert ctx["suffix"] == "\n        return 1\n    \n    return 2\n"


def test_llamavim_request_and_rendering():
    c = _client()
    r = c.build_request(c.fim_ctx_local(8, 4, None), 250)
    assert r["samplers"] == ["top_k", "top_p", "infill"] and (r["top_k"], r["top_p"]) == (40, 0.90)
    assert (r["n_predict"], r["t_max_predict_ms"], r["t_max_prompt_ms"], r["n_indent"]) == (128, 250, 500, 4)
    assert r["cache_prompt"] is True and r["id_slot"] == 0 and r["model"] == "" and r["input_extra"] == []
    assert r["prompt"] == "    if x" and "stop_type" not in r["response_fields"]
    assert abs(chunk_sim(["a b c"], ["a b c"]) - 1.0) < 1e-9 and chunk_sim(["a"], ["b"]) == 0.0
    # Rendering on a line of blanks: the suggestion's indentation already there is not shown again.
    c.set_current(VIM_DOC, 6)
    shown = c.render(4, 6, json.dumps({"content": "    pass\n    x = 1\n"}))
    assert shown.lines == ["pass", "    x = 1"] and shown.text == "pass\n    x = 1" and shown.can_accept
    # A suggestion that repeats the next non-blank line is dropped.
    c.set_current("x = 1\n\nreturn y\n", 2)
    assert c.render(0, 2, json.dumps({"content": "return y"})).text == ""
    # Only blanks: shown but not acceptable.
    assert not c.render(0, 2, json.dumps({"content": "   "})).can_accept


def test_llamavim_ring_picks_on_buffer_enter():
    c = LlamaVimClient("http://127.0.0.1:1")
    c.buf_enter("a.py", VIM_DOC, 1)
    c.buf_enter("b.py", "\n".join(f"line_{i} = {i}" for i in range(100)), 50)
    # BufEnter a.py, then BufLeave a.py (the same chunk: not queued twice), BufEnter b.py: a 33-line chunk.
    assert [q["filename"] for q in c.ring_queued] == ["a.py", "b.py"] and len(c.ring_queued[1]["data"]) == 33


class _FakeInfill(BaseHTTPRequestHandler):
    """A /infill that records bodies and answers the next canned content."""

    bodies: list = []
    answers: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        content = type(self).answers.pop(0) if body.get("n_predict") and type(self).answers else ""
        out = json.dumps({"content": content, "timings/prompt_n": 7, "timings/predicted_n": 3, "tokens_cached": 9,
                          "stop_type": "limit"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.fixture
def fake_server():
    _FakeInfill.bodies, _FakeInfill.answers = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeInfill)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_llamavim_events_against_a_fake_server(fake_server):
    c = LlamaVimClient(fake_server, extra_fields=("stop_type",))
    c.buf_enter("util.py", "def helper(x):\n    return x\n    # end\n", 1)
    doc = "def f(x):\n    \n    return x\n"
    c.buf_enter("m.py", doc, 1)
    assert c.ring_flush() == 2  # one chunk per buffer, each sent with n_predict 0
    ring = _FakeInfill.bodies[:2]
    assert [b["n_predict"] for b in ring] == [0, 0] and [len(b["input_extra"]) for b in ring] == [1, 2]
    assert ring[0]["input_extra"][0]["filename"] == "util.py"
    # Arrival at a line of blanks: /infill at once, t_max_predict_ms 250, from column 0.
    _FakeInfill.answers = ["    if x:\n        y = 1\n"]
    c.set_current(doc, 2)
    shown = c.on_insert_move(4, 2)
    req = _FakeInfill.bodies[-1]
    assert (req["t_max_predict_ms"], req["prompt"], req["n_indent"], req["input_prefix"]) == (250, "", 0, "def f(x):\n")
    assert req["response_fields"][-1] == "stop_type"
    assert shown.sent and not shown.from_cache and shown.text == "if x:\n        y = 1"
    assert shown.timings["prompt_n"] == 7 and shown.stop_type == "limit" and shown.followup is not None
    # Typing "i", as the suggestion said: shown from the client cache, and a request is sent as well.
    _FakeInfill.answers = ["f x:\n"]
    n = len(_FakeInfill.bodies)
    c.set_current("def f(x):\n    i\n    return x\n", 2)
    shown = c.on_insert_move(5, 2)
    assert shown.from_cache and shown.text == "f x:\n        y = 1"
    assert len(_FakeInfill.bodies) == n + 1 and _FakeInfill.bodies[-1]["prompt"] == "    i"
    # The same context again: cached, nothing sent.
    c.on_insert_move(5, 2)
    assert len(_FakeInfill.bodies) == n + 1
    # With the follow-up on, the cached suggestion launches it first: the context as if accepted, 1000 ms.
    c.set_current("def f(x):\n    if\n    return x\n", 2)
    _FakeInfill.answers = [" x:\n", "\n        pass\n"]
    c.on_insert_move(6, 2, followup=True)
    spec = [b for b in _FakeInfill.bodies[n + 1 :] if b["t_max_predict_ms"] == 1000]
    assert len(spec) == 1 and spec[0]["prompt"] == "        y = 1"
    # A line suffix longer than max_line_suffix (8): no automatic request.
    n = len(_FakeInfill.bodies)
    c.set_current("def f(x):\n    return something_long\n", 2)
    assert c.on_insert_move(4, 2).sent_fim is None and len(_FakeInfill.bodies) == n


# -- summaries ---------------------------------------------------------------------------------
def _rec(system, kind, tts, exact=False, empty=False, mis=None, prompt=100, typethrough=False):
    return {"session": "s", "task": "t", "system": system, "kind": kind, "tts_ms": tts, "timeout": tts is None,
            "first_line_exact": exact, "empty": empty, "misfire": mis, "edit_similarity": 0.5,
            "prompt_tokens_processed": prompt, "typethrough": typethrough, "idle_ms": 10.0}


def test_replay_summary_from_hand_made_records():
    recs = [_rec("ditto", "cold", 3000, exact=True), _rec("ditto", "cold", 5000),
            _rec("ditto", "warm", 500, mis=True), _rec("ditto", "warm", 700, mis=False, empty=True),
            _rec("llama-server", "cold", 6000), _rec("llama-server", "cold", None),
            _rec("llama-server", "warm", 1400, exact=True), _rec("llama-server", "warm", 2100, typethrough=True)]
    s = metrics.summarise_replay(recs, timeout_ms=120_000)
    d, p = s["ditto"], s["llama-server"]
    assert d["requests"] == 4 and d["cold"]["n"] == 2 and d["all"]["n"] == 4
    assert d["cold"]["tts_ms_p50"] == 4000 and d["cold"]["first_line_exact"] == 1 and d["cold"]["first_line_exact_rate"] == 0.5
    assert d["warm"]["misfires"] == 1 and d["warm"]["misfire_eligible"] == 2 and d["warm"]["misfire_share"] == 0.5
    assert d["warm"]["empty_share"] == 0.5 and d["cold"]["misfire_share"] is None
    assert p["cold"]["timeouts"] == 1 and p["cold"]["tts_ms_p50"] == (6000 + 120_000) / 2  # a timeout counts at the limit
    assert p["warm"]["typethrough"] == 1
    assert d["vs_peer"]["warm_p50"] == round(1750 / 600, 3) and "vs_peer" not in p
    md = report.markdown({"meta": {"mode": "session", "replay": {"pause_scale": 1.0}}, "summary": s, "tasks": recs})
    assert "| ditto | cold | 2 | 4000 |" in md and "| llama-server | warm | 2 |" in md and "1/2 (50.0%)" in md
    assert md.count("| – |") >= 6  # the continuation check was not run: no column value
    recs[0]["continuation"] = {"identical": True}
    recs[1]["continuation"] = {"identical": False}
    assert metrics.summarise_replay(recs)["ditto"]["cold"]["continuations_identical"] == 1
    assert "| 1/2 |" in report.replay_table(metrics.summarise_replay(recs))
    recs[1]["continuation"] = {"identical": None}  # cut short before its first token: compared nothing
    cold = metrics.summarise_replay(recs)["ditto"]["cold"]
    assert (cold["continuations_checked"], cold["continuations_identical"], cold["continuations_empty"]) == (1, 1, 1)
    assert "| 1/1 (+1 cut short empty) |" in report.replay_table(metrics.summarise_replay(recs))


# -- end to end --------------------------------------------------------------------------------
def run_git(repo: Path, *args: str, date: str = "2024-01-01T00:00:00") -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date,
           "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(repo)}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    before = "".join(f"def f{i}(x):\n    y = x + {i}\n    return y\n\n\n" for i in range(10))
    blocks = {"def f2(x):\n": "def f2(x):\n    if x < 0:\n        raise ValueError(x)\n",
              "def f6(x):\n": "def f6(x):\n    total = helper(x)\n\n    print('f6', total)\n"}
    r = tmp_path / "repo"
    r.mkdir()
    run_git(r, "init", "-q", "-b", "main")
    (r / "m.py").write_text(before)
    (r / "util.py").write_text("def helper(x):\n    return abs(x) * 2\n")
    run_git(r, "add", "-A")
    run_git(r, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "init")
    after = before
    for k, v in blocks.items():
        after = after.replace(k, v)
    (r / "m.py").write_text(after)
    (r / "util.py").write_text("def helper(x):\n    return abs(x) * 3\n")
    run_git(r, "add", "-A")
    run_git(r, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "two blocks", date="2024-02-01T00:00:00")
    return r


def _cores() -> str:
    return f"0,{min(1, (os.cpu_count() or 1) - 1)}"


def _check_run(out: Path, systems: list[str]) -> dict:
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["partial"] is False and res["meta"]["sessions_run"] == 1
    assert list(res["summary"]) == systems
    asks = [s for s in script(build_sessions_from(res)) if isinstance(s, Ask)]
    for system in systems:
        recs = [r for r in res["tasks"] if r["system"] == system]
        # The same requests for every system, in the script's order, each answered.
        assert [(r["block"], r["k"], r["kind"], r["line"], r["col"]) for r in recs] == [
            (a.block, a.k, a.kind, a.line, a.col) for a in asks]
        assert all(not r["timeout"] and r["tts_ms"] is not None for r in recs)
        assert all(r["typed"] == a.typed and r["true_line"] == a.true_line for r, a in zip(recs, asks))
        v = res["summary"][system]
        assert v["cold"]["n"] == 2 and v["warm"]["n"] == len(asks) - 2
    assert "## Editor replay" in (out / "report.md").read_text()
    return res


def build_sessions_from(res: dict) -> Session:
    from ditto_bench.harvest import HarvestOptions, harvest

    h = harvest(res["meta"]["repo"], HarvestOptions(max_tasks=10**9, per_commit=3))
    (s,) = build_sessions(h.tasks, 10)
    return s


def test_replay_end_to_end_on_tiny_random(repo, tmp_path, monkeypatch):
    """`ditto` (the real server over LSP) and `llama-server` (the tiny model as a GGUF) on one session."""
    pytest.importorskip("xllamacpp")
    from lsp_server.cli import main

    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = main(["bench", "--repo", str(repo), "--mode", "session", "--systems", "ditto,llama-server", "--model",
               "tiny-random", "--max-tasks", "2", "--pause-scale", "0.01", "--cores", _cores(), "--out", str(out)])
    assert rc == 0
    res = _check_run(out, ["ditto", "llama-server"])
    rp = res["meta"]["replay"]
    assert rp["systems"]["ditto"]["backend"] and rp["systems"]["llama-server"]["command"][:2] == ["taskset", "-c"]
    # the budget is reported at load and again at the end (a request's cheaper prefill may fit it again)
    assert rp["systems"]["ditto"]["context_tokens_at_end"] >= rp["systems"]["ditto"]["context_tokens"] > 0
    assert "context_tokens_at_end" in (out / "report.md").read_text()
    assert {o["system"] for o in rp["opened"]} == {"ditto", "llama-server"}
    assert res["meta"]["repo_commit"] and "vs_peer" in res["summary"]["ditto"]
    ditto = [r for r in res["tasks"] if r["system"] == "ditto"]
    assert any(r["prompt_tokens_processed"] for r in ditto)  # from ditto/trace


def test_replay_beside_in_process_systems(repo, tmp_path, monkeypatch):
    """The in-process session systems keep working, and a replay system runs after them in the same run."""
    from lsp_server.cli import main

    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    systems = ["off", "ditto-nodraft@256", "ditto-nodraft@256#show=sure"]  # two settings of one system, side by side
    rc = main(["bench", "--repo", str(repo), "--mode", "session", "--systems", ",".join(systems), "--model",
               "tiny-random", "--max-tasks", "2", "--max-tokens", "4", "--max-keystrokes", "2", "--pause-scale", "0.01",
               "--cores", _cores(), "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert list(res["summary"]) == systems and res["meta"]["systems"] == systems
    assert res["summary"]["off"]["requests"] > 0 and res["summary"]["ditto-nodraft@256"]["cold"]["n"] == 2
    assert res["summary"]["ditto-nodraft@256#show=sure"]["cold"]["n"] == 2
    info = res["meta"]["replay"]["systems"]
    assert info["ditto-nodraft@256"]["initializationOptions"] == {"drafter": "none", "contextTokens": 256}
    assert info["ditto-nodraft@256#show=sure"]["initializationOptions"] == {"drafter": "none", "contextTokens": 256,
                                                                           "show": "sure"}
    assert info["ditto-nodraft@256#show=sure"]["name_options"] == {"show": "sure"}
    for s in systems:  # what the user keeps, for every system, in the summary and the report's headline
        g = res["summary"][s] if s == "off" else res["summary"][s]["all"]
        assert (g["quality"] if s == "off" else g)["wrong_per_request"] is not None
    assert "kept_vs_wrong.png" in res["plots"]
    md = (out / "report.md").read_text()
    assert "## Session replay" in md and "## Editor replay" in md and "## What the user keeps" in md


@pytest.mark.model
def test_replay_end_to_end_on_the_default_model(repo, tmp_path):
    """The same replay on the real GGUF, both systems (slow: seconds per request on one core)."""
    pytest.importorskip("xllamacpp")
    from lsp_server.backends.base import ModelError
    from lsp_server.backends.packaged import DEFAULT_SPEC, PACKAGED, packaged_gguf
    from lsp_server.cli import main

    try:
        packaged_gguf(PACKAGED[DEFAULT_SPEC], lambda *a, **k: None)
    except ModelError as err:
        pytest.skip(f"the default model is not installed ({err})")
    out = tmp_path / "out"
    rc = main(["bench", "--repo", str(repo), "--mode", "session", "--systems", "ditto,llama-server", "--model",
               "default", "--backend", "llama.cpp", "--max-tasks", "2", "--pause-scale", "0.1", "--cores", _cores(),
               "--check-continuations", "--out", str(out)])
    assert rc == 0
    res = _check_run(out, ["ditto", "llama-server"])
    for system in ("ditto", "llama-server"):
        assert any(r["text"] for r in res["tasks"] if r["system"] == system)
    # Every answer given at a deadline was checked against the same generation uninterrupted (issue 24).
    paused = [r for r in res["tasks"] if r["system"] == "ditto" and r["stop_reason"] == "paused"]
    assert paused and all(r["continuation"] and r["continuation"]["identical"] for r in paused)
    g = res["summary"]["ditto"]["all"]
    assert g["continuations_checked"] == g["continuations_identical"] == len(paused)
    assert f"{len(paused)}/{len(paused)} |" in (out / "report.md").read_text()


def test_truth_lines_says_where_each_true_line_already_stands():
    from ditto_bench.truth_lines import where

    doc = "def a(x):\n    x = 1\n    return x\n" + "# pad\n" * 30 + "def b(y):\n\n"
    line = doc.split("\n").index("def b(y):") + 1
    task = Task(id=f"abc:m.py:{line + 1}", repo="/nowhere", commit="abc", parent="abb", subject="s", date=0,
                path="m.py", language="python", line=line, col=0, document=doc,
                truth="    y = 1\n    return x\n    # pad\n    helper(y)\n    nothing_like_it()")
    session = Session("abc:m.py", "m.py", doc, [Block(task, line)], [("util.py", "def helper(x):\n    helper(y)\n")])
    rows = where(script(session), near=20)
    got = [(r["kind"], r["true_line"], r["where"]) for r in rows]
    assert got == [("cold", "y = 1", "nowhere"), ("warm", "y = 1", "nowhere"),
                   ("warm", "return x", "above"), ("warm", "# pad", "near"),
                   ("warm", "helper(y)", "other"), ("warm", "nothing_like_it()", "nowhere")]
    assert rows[2]["distance"] > 20 and rows[3]["distance"] <= 20

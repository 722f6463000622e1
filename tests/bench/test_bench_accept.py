"""The replay accepts what the user would keep (replay_script.accepted, replay.replay_session; issue 58):
a kept answer that fits before the next request goes as one insert, then the remainder, and the
requests and documents stay those of the script."""

from __future__ import annotations

from dataclasses import dataclass

from ditto_bench.replay import replay_session
from ditto_bench.replay_ditto import DittoDriver
from ditto_bench.replay_script import Ask, Edit, ReplayOptions, accepted, script

from test_bench_replay import _session


def _apply(doc: str, e: Edit) -> str:
    lines = doc.split("\n")
    head, tail = lines[e.line][: e.col], lines[e.end_line][e.end_col :]
    lines[e.line : e.end_line + 1] = (head + e.text + tail).split("\n")
    return "\n".join(lines)


def _ask(steps, n):
    """The n-th request of the script and its index."""
    return [(i, s) for i, s in enumerate(steps) if isinstance(s, Ask)][n]


def _check(ask, following, edits, replaced):
    """The edits sent end on the document the replaced ones did, each edit's document its own."""
    doc = ask.document
    for e in edits:
        doc = _apply(doc, e)
        assert doc == e.document
    assert doc == following[replaced - 1].document


def test_a_kept_answer_goes_as_one_insert_then_the_remainder():
    steps = script(_session())
    i, ask = _ask(steps, 1)  # block 0, line 0, after "    i": then rest "f x:", Enter + 8 blanks, "x"
    following = steps[i + 1 :]
    assert [(e.what, e.text) for e in following[:3]] == [("rest", "f x:"), ("enter", "\n        "), ("char", "x")]
    edits, n = accepted(ask, "f x:", following)  # the rest of the line: accepted whole
    assert n == 3 and [(e.what, e.text) for e in edits] == [("accept", "f x:"), ("enter", "\n        "), ("char", "x")]
    _check(ask, following, edits, n)
    edits, n = accepted(ask, "f", following)  # a word of it: the rest of the line typed after
    assert [(e.what, e.text, e.line, e.col) for e in edits[:2]] == [("accept", "f", 3, 5), ("rest", " x:", 3, 6)]
    _check(ask, following, edits, n)
    edits, n = accepted(ask, "f x:\n    ", following)  # into the next line's indentation
    assert [(e.what, e.text) for e in edits] == [("accept", "f x:\n    "), ("enter", "    "), ("char", "x")]
    assert edits[1].line == 4 and edits[1].col == 4
    _check(ask, following, edits, n)
    edits, n = accepted(ask, "f x:\n        x", following)  # all the run inserts before the next request
    assert [(e.what, e.text) for e in edits] == [("accept", "f x:\n        x")] and edits[0].cursor == (4, 9)
    _check(ask, following, edits, n)


def test_nothing_is_accepted_that_the_user_would_not_keep_or_that_runs_past_the_next_request():
    steps = script(_session())
    i, ask = _ask(steps, 1)
    for text in ("", "g", "f x: ", "f x:\n        x = 1", "f x:\n        x = 1\n"):
        assert accepted(ask, text, steps[i + 1 :]) is None, text
    i, ask = _ask(steps, 0)  # the arrival: a pause follows, the user types nothing at once
    assert accepted(ask, "if x:", steps[i + 1 :]) is None
    i, ask = _ask(steps, 2)  # the block's last line: its rest, then a jump to the next block (not an insert here)
    edits, n = accepted(ask, " = 1", steps[i + 1 :])
    assert n == 1 and [e.what for e in edits] == ["accept"]
    assert accepted(ask, " = 1\n", steps[i + 1 :]) is None


@dataclass
class _Opts:
    pause_scale: float = 0.0


class FakeDriver:
    """Answers each request with the first `chars` characters of what the truth says follows."""

    system = "fake"

    def __init__(self, chars: int):
        self.chars, self.opts, self.doc, self.sent = chars, _Opts(), None, []

    def open(self, step, repo):
        self.doc = step.text
        return {}

    def edit(self, step):
        self.doc = _apply(self.doc, step)
        assert self.doc == step.document
        self.sent.append(step.what)

    def pause(self, step):
        pass

    def ask(self, step):
        assert self.doc == step.document  # every request sees the script's document
        return {"timeout": False, "tts_ms": 1.0, "text": step.true_rest.split("\n")[0][: self.chars]}

    def close(self):
        pass


def test_the_replay_sends_acceptances_and_keeps_the_script_requests_and_document():
    session = _session()
    steps = script(session)
    asks = [s for s in steps if isinstance(s, Ask)]
    for chars, expected in ((100, [False, True, True, False, True, True]), (0, [False] * 6)):
        d = FakeDriver(chars)
        run = replay_session(d, session, steps)
        assert [(r["block"], r["k"], r["line"], r["col"]) for r in run.records] == [(a.block, a.k, a.line, a.col)
                                                                                   for a in asks]
        assert [r["acceptance_sent"] for r in run.records] == expected
        assert d.sent.count("accept") == sum(expected) and d.doc == steps[-1].document  # the post-commit file


def test_ditto_sends_the_accept_in_utf16_units():
    class FakeClient:
        def __init__(self):
            self.changes = []

        def change(self, uri, version, changes):
            self.changes.append(changes[0])

    steps = script(_session())
    i, ask = _ask(steps, 4)  # block 1, after "    z": the rest of the line holds an emoji
    edits, _ = accepted(ask, " = '😀' + y", steps[i + 1 :])
    d = DittoDriver("ditto", ReplayOptions())
    d.client, d.uri, d.version, d.lines = FakeClient(), "file:///m.py", 1, ask.document.split("\n")
    for e in edits:
        d.edit(e)
    accept, enter = d.client.changes[:2]
    assert accept["text"] == " = '😀' + y" and accept["range"]["start"] == {"line": 9, "character": 5}
    assert enter["range"]["start"] == {"line": 9, "character": 5 + len(" = '😀' + y") + 1}  # 😀 is two UTF-16 units

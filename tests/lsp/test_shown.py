"""What the user does with a suggestion shown (lsp_server/lsp/shown.py `ShownLog`): accepted or typed
over, decided by the document's next edits, and the bounded bias it gives the `show` limit, kept per
workspace. On the event loop, as in the server (the tests are async for the thread check)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from lsp_server.completion.show import BIAS_LIMIT
from lsp_server.lsp.shown import ALPHA, TARGETS, ShownLog

URI = "file:///tmp/ws/a.py"


def insert(line: int, character: int, text: str):
    p = SimpleNamespace(line=line, character=character)
    return SimpleNamespace(range=SimpleNamespace(start=p, end=p), text=text)


def replace(l1, c1, l2, c2, text):
    return SimpleNamespace(range=SimpleNamespace(start=SimpleNamespace(line=l1, character=c1),
                                                 end=SimpleNamespace(line=l2, character=c2)), text=text)


units = len  # (ASCII: one client unit a character)


async def test_inserting_it_or_typing_its_first_word_is_accepting_it():
    log = ShownLog()
    log.shown(URI, (3, 4), "self.width * 2")
    log.changed(URI, [insert(3, 4, "self.width * 2")], units)  # Tab
    log.shown(URI, (4, 4), "return total")
    for i, ch in enumerate("retu"):
        log.changed(URI, [insert(4, 4 + i, ch)], units)
    assert (log.accepted, log.typed_over) == (1, 0)  # not decided before the word is typed
    log.changed(URI, [insert(4, 8, "rn")], units)  # typed through its first word
    assert (log.accepted, log.typed_over) == (2, 0)


async def test_typing_something_else_or_editing_elsewhere_is_typing_over_it():
    log = ShownLog()
    log.shown(URI, (3, 4), "self.width")
    log.changed(URI, [insert(3, 4, "se"), ], units)
    log.changed(URI, [insert(3, 6, "t")], units)  # "set": not its start
    log.shown(URI, (5, 0), "import os")
    log.changed(URI, [replace(1, 0, 1, 3, "")], units)  # an edit somewhere else first
    assert (log.accepted, log.typed_over) == (0, 2)
    log.shown(URI, (6, 0), "x = 1")
    log.closed(URI)  # closed undecided: not counted
    log.changed(URI, [insert(6, 0, "y")], units)
    assert (log.accepted, log.typed_over) == (0, 2)


async def test_the_bias_follows_the_acceptance_bounded_and_off_when_not_learning():
    log = ShownLog()
    assert log.bias("sure", True) == 0.0  # nothing seen yet
    for i in range(40):
        log.shown(URI, (i, 0), "value = 1")
        log.changed(URI, [insert(i, 0, "zzz")], units)
    assert log.average < TARGETS["sure"] and log.bias("sure", True) == pytest.approx(-BIAS_LIMIT)
    assert log.bias("sure", False) == 0.0
    for i in range(200):
        log.shown(URI, (i, 0), "value = 1")
        log.changed(URI, [insert(i, 0, "value = 1")], units)
    assert 0 < log.bias("sure", True) <= BIAS_LIMIT
    one = ShownLog()
    one.shown(URI, (0, 0), "x")
    one.changed(URI, [insert(0, 0, "x")], units)
    first = TARGETS["sure"] + ALPHA * (1.0 - TARGETS["sure"])  # from the prior, a step towards 1
    assert one.average == pytest.approx(first)
    one.shown(URI, (1, 0), "y")
    one.changed(URI, [insert(1, 0, "z")], units)
    assert one.average == pytest.approx(first * (1 - ALPHA))


async def test_a_first_outcome_moves_the_limit_a_little_from_the_settings_target():
    """No evidence, no bias: one typed-over suggestion must not put the limit at its bound (it did when
    the average started at the first outcome, and then held it there for the next twenty)."""
    for show in ("all", "sure", "surest"):
        log = ShownLog()
        log.shown(URI, (0, 0), "value = 1", show)
        log.changed(URI, [insert(0, 0, "zzz")], units)
        assert log.average == pytest.approx(TARGETS[show] * (1 - ALPHA))
        assert -BIAS_LIMIT < log.bias(show, True) < 0
        log.shown(URI, (1, 0), "value = 1", show)
        log.changed(URI, [insert(1, 0, "value = 1")], units)
        assert log.average > TARGETS[show] * (1 - ALPHA)


async def test_a_workspace_keeps_its_counts_across_sessions_and_survives_a_bad_file(tmp_path):
    log = ShownLog.for_workspace("file:///home/me/project", tmp_path)
    log.shown(URI, (0, 0), "value")
    log.changed(URI, [insert(0, 0, "value")], units)
    log.save()
    again = ShownLog.for_workspace("file:///home/me/project", tmp_path)
    assert (again.accepted, again.typed_over, again.average) == (1, 0, pytest.approx(log.average))
    assert log.average > TARGETS["sure"]
    other = ShownLog.for_workspace("file:///home/me/other", tmp_path)
    assert (other.accepted, other.average) == (0, None)
    again.path.write_text("{not json")
    broken = ShownLog.for_workspace("file:///home/me/project", tmp_path)
    assert (broken.accepted, broken.average) == (0, None)
    assert ShownLog.for_workspace(None, tmp_path).path is None
    broken.shown(URI, (0, 0), "value")
    broken.changed(URI, [insert(0, 0, "other")], units)
    broken.save()  # written afresh over the bad file
    assert json.loads(broken.path.read_text()) == {"accepted": 0, "typed_over": 1,
                                                   "average": pytest.approx(TARGETS["sure"] * (1 - ALPHA))}

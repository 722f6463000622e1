"""The file as the judge (lsp_server/nextedit/judge.py): its scores are the model's log-probabilities of the
document's lines, and propagation's proposal is shown exactly where the margin is met (tiny random model,
both backends)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lsp_server.nextedit.judge import Judged, logps, scores
from lsp_server.nextedit.propagate import Propagator

from tests.nextedit.test_rewrite import SRC, edited, lm  # noqa: F401  (lm: the fixture, both backends)


def plain_logp(lm, context: list[int], answer: list[int]) -> float:
    """The same log-probability from one pass over context and answer on a fresh cache, no crop."""
    cache = lm.new_cache()
    lg = np.asarray(lm.forward(context + answer[:-1], cache, len(answer)), dtype=np.float64)
    lm.release(cache)
    return float(sum(x[t] - x.max() - math.log(np.exp(x - x.max()).sum()) for x, t in zip(lg, answer)))


def test_each_answer_is_scored_after_the_shared_context_as_if_alone(lm):
    context = lm.encode(SRC[:40])
    answers = [lm.encode("    return load_file(path)\n"), lm.encode("    return read_file(path)\n"), lm.encode("x")]
    got = logps(lm, context, answers)
    assert got == pytest.approx([plain_logp(lm, context, a) for a in answers], abs=1e-3)
    assert got[0] != pytest.approx(got[1], abs=1e-6)  # the two lines differ for the model too
    assert logps(lm, context, [[], answers[2]]) == pytest.approx([0.0, got[2]], abs=1e-3)  # nothing left: certain


def test_a_proposal_that_changes_nothing_scores_the_same_both_ways(lm):
    d = edited()
    i = d.text.index("return read_file")
    made, unchanged = scores(lm, d.text, i, i + 6, "return", (0, 10))
    assert made == pytest.approx(unchanged, abs=1e-6)


def test_the_users_lines_come_first_where_the_context_does_not_reach_them(lm):
    d = edited()
    seen = []
    forward = lm.forward

    class Recording:
        def __getattr__(self, name):
            return getattr(lm, name)

        def forward(self, ids, cache, last):
            seen.append(list(ids))
            return forward(ids, cache, last)

    i = d.text.index("return read_file")
    user = d.text.index("load_file")
    scores(Recording(), d.text, i, i + len("return read_file"), "return load_file", (user, user + 9), context=4)
    assert "data = load_file(path)" in lm.decode(seen[0])  # 4 tokens above would not hold it
    seen.clear()
    scores(Recording(), d.text, i, i + len("return read_file"), "return load_file", None, context=4)
    assert "load_file" not in lm.decode(seen[0])  # another document's edit: nothing put first


def test_propagations_proposal_is_shown_exactly_where_the_margin_is_met(lm):
    d = edited()
    cursor = d.h.last().end
    alone = Propagator().propose(d.h.groups(), "a.py", d.text, cursor)
    assert alone is not None and "return load_file(path)" in alone.apply(d.text)
    shown = Judged(Propagator(), lm, margin=-math.inf).propose(d.h.groups(), "a.py", d.text, cursor)
    assert (shown.start, shown.end, shown.new_text, shown.source) == (alone.start, alone.end, alone.new_text,
                                                                      "propagate")
    margin = shown.stats["judge_margin"]
    at = Judged(Propagator(), lm, margin=margin - 1e-3).propose(d.h.groups(), "a.py", d.text, cursor)
    assert at is not None and at.new_text == alone.new_text
    assert Judged(Propagator(), lm, margin=margin + 1e-2).propose(d.h.groups(), "a.py", d.text, cursor) is None
    assert Judged(Propagator(), lm).propose(d.h.groups(), "a.py", "x = 1\n", 0) is None  # nothing learnt


def test_where_the_rules_find_nothing_the_looser_places_are_judged(lm):
    from tests.nextedit.test_propagate import LOOSE, edit_once

    d = edit_once(LOOSE, "if ty is str or ty is None", "if guessed is str or guessed is None")
    cursor = d.h.last().end
    assert Propagator().propose(d.h.groups(), "a.py", d.text, cursor) is None
    loose = Propagator(loose=True).propose(d.h.groups(), "a.py", d.text, cursor)
    shown = Judged(Propagator(), lm, margin=-math.inf).propose(d.h.groups(), "a.py", d.text, cursor)
    assert (shown.start, shown.end, shown.new_text) == (loose.start, loose.end, loose.new_text)
    assert shown.stats["loose"] is True
    margin = shown.stats["judge_margin"]
    assert Judged(Propagator(), lm, margin=margin + 1e-2).propose(d.h.groups(), "a.py", d.text, cursor) is None
    assert Judged(Propagator(), lm, margin=-math.inf, loose=False).propose(
        d.h.groups(), "a.py", d.text, cursor) is None  # the strict rules alone


def test_a_cancelled_judge_stops_within_a_chunk(lm):
    """The server sets `cancel` when the document changes (lsp_server/lsp/nextedit.py): the prefill stops at
    the next chunk, and the proposal is None rather than a stale one."""
    import threading

    from lsp_server.nextedit import judge

    cancel = threading.Event()
    calls = []
    forward = lm.forward

    class Cancelling:
        def __getattr__(self, name):
            return getattr(lm, name)

        def forward(self, ids, cache, last):
            calls.append(len(ids))
            cancel.set()  # the user typed while the first chunk ran
            return forward(ids, cache, last)

    context = lm.encode(SRC * 8)[: 3 * judge.CHUNK]
    assert len(context) == 3 * judge.CHUNK
    assert logps(Cancelling(), context, [lm.encode("x")], cancel) is None
    assert calls == [judge.CHUNK]  # one chunk of three
    cancel.clear()
    calls.clear()
    got = logps(lm, context, [lm.encode("x")], cancel)  # not cancelled: chunked, the same as one pass
    assert got == pytest.approx([plain_logp(lm, context, lm.encode("x"))], abs=1e-3)
    d = edited()
    cancel.set()
    assert Judged(Propagator(), lm, margin=-math.inf).propose(d.h.groups(), "a.py", d.text, d.h.last().end,
                                                              cancel=cancel) is None

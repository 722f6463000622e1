"""What the user keeps (ditto_bench/quality.py `keep_quality`, metrics.keep_summary, the report's
headline and plot; issue 58) on hand-made suggestions and records."""

from __future__ import annotations

import pytest

from ditto_bench import metrics, report
from ditto_bench.quality import completion_quality, keep_quality, kept_chars, request_quality, typed_quality


def k(suggestion: str, rest: str) -> tuple:
    q = keep_quality(suggestion, rest)
    return q["shown"], q["kept"], q["wrong"], q["kept_chars"]


def test_a_suggestion_that_is_what_the_user_types_next_is_kept_whole():
    assert k("f x:", "f x:\n        y = 1") == (True, True, False, 4)
    # across lines: the rest of the true line and the block's later lines
    assert k("f x:\n        y", "f x:\n        y = 1") == (True, True, False, 14)
    assert k("f", "f x:") == (True, True, False, 1)  # a word cut short is still a prefix: Tab, keep typing


def test_nothing_shown_is_neither_kept_nor_wrong_and_keeps_nothing():
    assert k("", "f x:") == (False, False, False, 0)
    assert k("", "") == (False, False, False, 0)


def test_wrong_reads_the_first_line_only_and_trailing_blanks_aside():
    assert k(" = 0", "f x:")[2] is True
    assert k("f x:   ", "f x:\n    y") == (True, False, False, 4)  # trailing blanks: not wrong, not kept
    assert k("f x:", "f x:  \n    y")[2] is False  # the true line's trailing blanks aside too
    # the first line right, a later one not: neither kept nor wrong, and the first line is kept
    assert k("f x:\n    z = 2", "f x:\n    y = 1") == (True, False, False, 9)
    assert k("\n    y = 1", "f x:\n    y = 1")[1:3] == (False, False)  # an empty first line is a prefix of anything


def test_kept_characters_stop_at_a_word_boundary():
    assert kept_chars("foobar()", "foobaz()") == 0  # inside a word: a word-by-word accept never stops there
    assert kept_chars("foo(x)", "foo(y)") == 4  # "foo(" : punctuation stops a word
    assert kept_chars("x = 1", "x = 2") == 4
    assert kept_chars("self.value", "self.values") == 10  # all of it: the suggestion is a prefix
    # the suggestion's word "val" ends where it leaves the truth: accepted, then "ues" typed
    assert kept_chars("self.val + 1", "self.values") == 8
    assert kept_chars("self.valid + 1", "self.values") == 5  # "self." and no part of the word after it
    assert kept_chars("a_b", "a_c") == 0  # `_` is a word character


def test_whitespace_and_a_suggestion_longer_than_the_block():
    assert k("    ", "    return x") == (True, True, False, 4)
    assert k("  \n", "x") == (True, False, False, 0)
    # longer than the block: its end is not what the user types, so not kept; the block's part is kept
    assert k("return x\n\ndef g():", "return x") == (True, False, False, 8)
    assert k("return x\n", "return x") == (True, False, False, 8)


def test_every_mode_records_the_same_fields():
    assert keep_quality("f x:", "f x:\n    y").items() <= request_quality("    i", "f x:", "    if x:", "f x:\n    y").items()
    # typed_quality: two characters of the block typed, the rest of the block is what follows
    assert typed_quality("if x:\n    y", 2, " x:")["kept"] is True and typed_quality("if x:\n    y", 2, " x:")["kept_chars"] == 3
    q = completion_quality("if x:\n    z", "if x:\n    y")
    assert (q["shown"], q["kept"], q["wrong"], q["kept_chars"]) == (True, False, False, 10)


def _recs(system: str, pairs, kind: str = "warm") -> list[dict]:
    return [{"session": "s", "task": "t", "system": system, "kind": kind, "tts_ms": 10.0, "idle_ms": 1.0,
             **request_quality("", s, rest.split("\n")[0], rest)} for s, rest in pairs]


def test_the_summary_averages_kept_characters_over_all_requests_and_counts_wrong_a_request():
    recs = (_recs("ditto", [("x = 1", "x = 1"), ("", "y = 2")], kind="cold")
            + _recs("ditto", [("z", "y = 2"), ("y = 3", "y = 2")])
            + _recs("ditto#show=sure", [("x = 1", "x = 1"), ("", "y = 2"), ("", "y = 2"), ("", "y = 2")]))
    s = metrics.summarise_replay(recs)
    d = s["ditto"]["all"]
    assert (d["shown"], d["kept"], d["wrong"]) == (3, 1, 2)
    assert d["wrong_per_request"] == 0.5 and d["kept_chars_per_request"] == pytest.approx((5 + 0 + 0 + 4) / 4, abs=1e-3)
    assert s["ditto"]["cold"]["wrong_per_request"] == 0.0 and s["ditto"]["warm"]["wrong"] == 2
    sure = s["ditto#show=sure"]["all"]
    assert (sure["shown"], sure["wrong_per_request"], sure["kept_chars_per_request"]) == (1, 0.0, 1.25)
    # keystroke / session mode: inside `quality`; completion mode: the system's own figures
    assert metrics.quality_summary(recs[:2])["wrong"] == 0
    old = [{k: v for k, v in r.items() if k not in ("shown", "kept", "wrong", "kept_chars")} for r in recs[:2]]
    assert metrics.keep_summary(old)["wrong_per_request"] is None  # a results.json from before: unknown, not 0


def test_the_report_leads_with_wrong_a_request_and_plots_it_against_kept_characters(tmp_path):
    recs = (_recs("ditto", [("x = 1", "x = 1"), ("z", "y = 2")]) + _recs("ditto#show=sure", [("x = 1", "x = 1"), ("", "y")])
            + _recs("llama-server", [("q", "x = 1"), ("y", "y")]))
    results = {"meta": {"mode": "session", "replay": {"pause_scale": 1.0}}, "summary": metrics.summarise_replay(recs),
               "tasks": recs}
    report.write(results, tmp_path)
    md = (tmp_path / "report.md").read_text()
    head = md.split("## What the user keeps")[1].split("##")[0]
    assert "| ditto | all | 2 | 0.500 | 2.50 | 2 | 1 | 1 |" in head
    assert "| ditto#show=sure | all | 2 | 0.000 | 2.50 | 1 | 1 | 0 |" in head
    assert "| llama-server | all | 2 | 0.500 | 0.50 | 2 | 1 | 1 |" in head
    assert "kept_vs_wrong.png" in results["plots"] and (tmp_path / "kept_vs_wrong.png").stat().st_size > 0
    assert "| 2/2 | 1 | 1 | 2.50 | 0.500 |" in md  # beside the replay table's other columns

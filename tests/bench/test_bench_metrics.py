"""Metrics and report on hand-made results (no model)."""

from __future__ import annotations

import json
import math

import pytest

from ditto_bench import metrics, quality, report


def rec(task, system, latency, decode, generated=10, passes=10, drafted=0, accepted=0, identical=True, text="x = 1",
        copyable=0.0, drafted_at=(), accepted_at=()):
    r = {"task": task, "system": system, "copyable": copyable, "copyable_buffers": 0.0, "latency_ms": latency,
         "prefill_ms": latency - decode, "decode_ms": decode, "generated": generated, "target_passes": passes,
         "drafted": drafted, "accepted": accepted, "drafted_at": list(drafted_at), "accepted_at": list(accepted_at),
         "identical": identical, "text": text}
    r.update(quality.completion_quality(text, "x = 1"))
    return r


RECORDS = [
    rec("t1", "off", 1000, 800, copyable=0.1),
    rec("t2", "off", 2000, 1600, copyable=0.9),
    rec("t1", "ngram", 500, 300, passes=5, drafted=8, accepted=5, copyable=0.1, drafted_at=[4, 4], accepted_at=[3, 2]),
    rec("t2", "ngram", 2000, 1600, passes=10, drafted=2, accepted=0, identical=False, text="x = 2", copyable=0.9,
        drafted_at=[2], accepted_at=[0]),
]


def test_completion_summary_from_hand_made_records():
    s = metrics.summarise_completion(RECORDS)
    off, ng = s["off"], s["ngram"]
    assert off["tasks"] == 2 and off["speedup_median"] == 1.0 and off["identical_rate"] == 1.0
    assert ng["speedup_median"] == pytest.approx(1.5)  # ratios 2.0 and 1.0
    assert ng["speedup_geomean"] == pytest.approx(math.sqrt(2), abs=1e-4)
    assert ng["decode_speedup_median"] == pytest.approx((800 / 300 + 1) / 2, abs=1e-4)
    assert ng["acceptance_rate"] == pytest.approx(0.5)  # 5 of 10 drafts
    assert ng["passes_per_token"] == pytest.approx(15 / 20)
    assert ng["tokens_per_s"] == pytest.approx(20 / 1.9, abs=1e-3)
    assert ng["identical_rate"] == 0.5
    assert ng["exact_match"] == 0.5 and off["exact_match"] == 1.0
    assert ng["latency_ms_p50"] == pytest.approx(1250.0)
    assert ng["acceptance_by_position"] == [{"position": 1, "drafted": 6, "accepted": 3, "rate": 0.5},
                                            {"position": 2, "drafted": 4, "accepted": 2, "rate": 0.5}]
    b = ng["buckets"]
    assert b["0.00-0.25"]["tasks"] == 1 and b["0.00-0.25"]["speedup_geomean"] == pytest.approx(2.0)
    assert b["0.75-1.00"]["speedup_geomean"] == pytest.approx(1.0)
    assert b["0.25-0.50"]["tasks"] == 0 and b["0.25-0.50"]["speedup_geomean"] is None
    assert [m["task"] for m in metrics.mismatches(RECORDS)] == ["t2"]


def test_steps_by_draft_source_are_summed_and_reported():
    recs = [dict(r) for r in RECORDS]
    recs[2]["steps"] = {"ngram": 3, "model": 1, "plain": 1}
    recs[3]["steps"] = {"ngram": 2, "model": 0, "plain": 8}
    s = metrics.summarise_completion(recs)
    assert s["ngram"]["steps"] == {"ngram": 5, "model": 1, "plain": 9}
    assert s["ngram"]["tasks_with_model_draft"] == 1 and s["off"]["steps"] is None
    table = report.steps_table(s)
    assert "| ngram | 15 | 33.3% | 6.7% | 60.0% | 1 |" in table and "| off |" not in table


def test_unfinished_tasks_do_not_count():
    s = metrics.summarise_completion(RECORDS + [rec("t3", "off", 9000, 8000)])  # ngram never ran t3
    assert s["off"]["tasks"] == 2


def test_percentile_geomean_and_similarity():
    assert metrics.percentile([1, 2, 3, 4], 50) == 2.5
    assert metrics.percentile([10], 95) == 10
    assert metrics.percentile([], 50) is None
    assert metrics.percentile(range(1, 101), 95) == pytest.approx(95.05)
    assert metrics.geomean([1, 4]) == pytest.approx(2.0)
    assert quality.levenshtein("kitten", "sitting") == 3
    assert quality.edit_similarity("abc", "abc") == 1.0
    assert quality.edit_similarity("", "") == 1.0
    assert quality.edit_similarity("abcd", "abxd") == 0.75
    q = quality.completion_quality("foo(a)  \nbar()\n\n", "foo(a)\nbaz()")
    assert q["first_line_exact"] is True and q["exact_match"] is False
    assert q["edit_similarity"] == pytest.approx(1 - 1 / 12, abs=1e-4)


def test_keystroke_summary():
    rs = []
    for i in range(4):
        rs.append({"task": "t", "system": "ngram", "tts_ms": 100 + i, "prefill_tokens": 2, "reused_tokens": 98,
                   "prompt_tokens": 100, "prefill_ms": 10, "decode_ms": 90, "drafted": 2, "accepted": 1})
        rs.append({"task": "t", "system": "ngram-noreuse", "tts_ms": 1000 + i, "prefill_tokens": 99, "reused_tokens": 0,
                   "prompt_tokens": 100, "prefill_ms": 900, "decode_ms": 100, "drafted": 2, "accepted": 1})
    s = metrics.summarise_keystroke(rs)
    assert s["ngram"]["requests"] == 4 and s["ngram"]["typethrough_hits"] == 0
    assert s["ngram"]["tts_ms_p50"] == 101.5 and s["ngram-noreuse"]["tts_ms_p50"] == 1001.5
    assert s["ngram"]["prefill_tokens_mean"] == 2.0
    assert s["ngram"]["prefill_tokens_gain_vs_noreuse"] == pytest.approx(49.5)
    assert s["ngram"]["tts_p50_gain_vs_noreuse"] == pytest.approx(1001.5 / 101.5, abs=1e-3)


def test_typed_quality_reads_the_typed_part_of_the_line_the_true_line_and_the_rest_of_the_block():
    from ditto_bench.quality import typed_quality

    truth = "if ok:\n    return é_value\n"
    # One letter typed: a suggestion that completes the word is right; one that starts anew misfires.
    q = typed_quality(truth, 1, "f ok:\n    return é_value")
    assert q == {"first_line_exact": True, "edit_similarity": 1.0, "empty": False, "misfire": False,
                 "shown": True, "kept": True, "wrong": False, "kept_chars": 24}
    q = typed_quality(truth, 1, " = 0")
    assert q["first_line_exact"] is False and q["misfire"] is True and q["edit_similarity"] < 0.5
    # On the second line after its indentation (7 + 4 characters typed): the typed part is the
    # indentation, and nothing typed ends in a letter, so no misfire can happen.
    q = typed_quality(truth, 11, "return é_value")
    assert q["first_line_exact"] is True and q["misfire"] is None
    # Inside a word with a non-ASCII letter: "é" typed, the rest of the word suggested.
    q = typed_quality(truth, 19, "_value")
    assert q["first_line_exact"] is True and q["misfire"] is False
    assert typed_quality(truth, 19, "")["empty"] is True


def _quality_fields(typed_right: bool, misfire, empty=False):
    return {"first_line_exact": typed_right, "edit_similarity": 1.0 if typed_right else 0.25, "empty": empty,
            "misfire": misfire}


def test_keystroke_and_session_summaries_report_quality_per_system():
    rs = []
    for i, (right, mis, empty) in enumerate([(True, False, False), (False, True, False), (False, None, True),
                                             (False, None, False)]):
        base = {"task": "t", "tts_ms": 10.0, "prefill_tokens": 1, "reused_tokens": 0, "prompt_tokens": 5,
                "prefill_ms": 1, "decode_ms": 9, "drafted": 0, "accepted": 0, "session": "s", "event": "type"}
        rs.append({**base, "system": "ngram", **_quality_fields(right, mis, empty)})
    for summarise, table in ((metrics.summarise_keystroke, report.keystroke_table),
                             (metrics.summarise_session, report.session_table)):
        s = summarise(rs)
        q = s["ngram"]["quality"]
        assert (q["first_line_exact"], q["first_line_exact_rate"]) == (1, 0.25)
        assert q["edit_similarity_mean"] == pytest.approx((1.0 + 3 * 0.25) / 4, abs=1e-4)
        assert q["empty_share"] == 0.25 and (q["misfires"], q["misfire_eligible"]) == (1, 2)
        assert "| 1/4 (25.0%) | 0.438 | 25.0% | 1/2 (50.0%) |" in table(s)


def test_completion_summary_reports_the_share_of_empty_suggestions():
    recs = [rec("t1", "off", 1000, 800), rec("t2", "off", 1000, 800, text="")]
    s = metrics.summarise_completion(recs)
    assert s["off"]["empty_share"] == 0.5
    assert "| 50.0% |" in report.completion_table(s)


def test_report_writes_json_markdown_and_plots(tmp_path):
    results = {"meta": {"mode": "completion", "repo": "r", "command": "ditto-lsp bench"},
               "summary": metrics.summarise_completion(RECORDS), "tasks": RECORDS,
               "mismatches": metrics.mismatches(RECORDS)}
    report.write(results, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["summary"]) == {"off", "ngram"}
    md = (tmp_path / "report.md").read_text()
    assert "| ngram | 2 |" in md and "1.414" in md  # the geomean speedup shows in the table
    assert "t2" in md  # the mismatch is listed
    for png in ("latency.png", "speedup_vs_copyable.png", "acceptance_by_position.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""The propose/verify trace: data, terminal view and HTML page."""

from __future__ import annotations

import json

import pytest

from lsp_server.decoding.types import Completion, Round, Stats
from lsp_server.commands.trace import render_html, render_terminal, trace_data

TEXT = {1: "foo", 2: "(", 3: ")", 4: "\n", 5: "bar", 6: "<x>"}


def hand_made() -> Completion:
    rounds = [
        Round(proposed=[1, 2, 3], source="context", match_len=3, accepted=2, token=6, kind="correction", ms=12.5),
        Round(proposed=[4, 5], source="other.py", match_len=2, accepted=2, token=1, kind="bonus", ms=10.0),
        Round(proposed=[], source="", match_len=0, accepted=0, token=4, kind="plain", ms=8.0),
    ]
    stats = Stats(tokens=7, generated=7, target_passes=3, drafted=5, accepted=4, prefill_tokens=20, prefill_ms=100.0,
                  decode_ms=30.5, wall_ms=130.5, stop_reason="length")
    return Completion([1, 2, 6, 4, 5, 1, 4], stats, rounds)


def test_trace_data_is_json_and_faithful():
    data = trace_data(hand_made(), TEXT.__getitem__, text="foo(<x>", model="m", drafter="ngram")
    assert json.loads(json.dumps(data)) == data
    r0, r1, r2 = data["rounds"]
    assert [p["accepted"] for p in r0["proposed"]] == [True, True, False]
    assert r0["token"] == {"id": 6, "text": "<x>"} and r0["kind"] == "correction" and r0["gained"] == 3
    assert r1["kind"] == "bonus" and r1["gained"] == 3 and r1["source"] == "other.py"
    assert r2["proposed"] == [] and r2["gained"] == 1
    assert sum(r["gained"] for r in data["rounds"]) == data["stats"]["generated"]
    assert data["stats"]["tokens_per_pass"] == pytest.approx(7 / 3, abs=1e-4)


def test_terminal_view_shows_rounds_and_colours():
    from rich.console import Console

    console = Console(record=True, width=120, force_terminal=True, color_system="truecolor")
    render_terminal(trace_data(hand_made(), TEXT.__getitem__, text="foo(<x>"), console=console)
    plain = console.export_text(clear=False)
    assert "foo·(·)·[<x>]" in plain  # proposed tokens, then the correction token in brackets
    assert "⏎·bar·[foo]" in plain  # a newline is made visible; the bonus token
    assert "7 tokens in 3 target passes (2.33 tokens/pass), 4/5 drafts accepted" in plain
    styled = console.export_text(styles=True)
    assert "\x1b[" in styled and "\x1b[9" in styled  # colours and the strike-through of the rejected draft


def test_html_page_is_self_contained_and_escaped():
    page = render_html(trace_data(hand_made(), TEXT.__getitem__, text="a < b"), title="t")
    assert page.startswith("<!doctype html>") and "</html>" in page
    assert "&lt;x&gt;" in page and "<x>" not in page.split("<script")[0]  # token text escaped
    assert 'class="tok rej"' in page and 'class="tok correction"' in page and 'class="tok bonus"' in page
    assert "http://" not in page and "https://" not in page and "<link" not in page  # nothing external


def test_trace_command_on_tiny_random(tmp_path, capsys):
    from lsp_server.cli import main

    src = tmp_path / "m.py"
    src.write_text("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    \n")
    out = tmp_path / "trace.html"
    rc = main(["trace", f"{src}:6:5", "--model", "tiny-random", "--max-tokens", "12", "--html", str(out), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rounds"] and sum(r["gained"] for r in data["rounds"]) == data["stats"]["generated"]
    assert data["stats"]["target_passes"] == len(data["rounds"])
    page = out.read_text()
    assert page.count("<tr>") == len(data["rounds"]) + 1

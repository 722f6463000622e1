"""The `show` setting in the server (lsp_server/completion/show.py, lsp_server/lsp/shown.py): what the
default model shows with `sure` is a prefix of what it shows with `all` at the same places; an accepted
suggestion and a typed-over one reach `ditto/stats` (`shown`); the random test model, whose
probabilities are noise, shows everything whatever the setting."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from ditto_bench.client import RawClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WAIT = 300  # only so that a broken server cannot hang the run
CODE = (ROOT / "examples" / "shapes.py").read_text()


def serve(tmp_path, *args, options=None) -> RawClient:
    c = RawClient(["--max-tokens", "24", *args], stderr=open(tmp_path / "err", "w"))
    c.initialize(options or {})
    assert c.wait_ready(WAIT)["params"]["value"]["message"] == "ready"
    return c


def answer(c: RawClient, uri: str, line: int, col: int) -> str:
    res = c.wait(c.inline(uri, line, col), WAIT)["result"]
    return res["items"][0]["insertText"] if res and res.get("items") else ""


def test_an_accepted_and_a_typed_over_suggestion_are_counted(tmp_path):
    c = serve(tmp_path, "--model", "tiny-random", options={"show": "sure"})
    try:
        uri = "file:///tmp/ditto-shown/a.py"
        c.open(uri, "def f(x):\n    \n")
        text = answer(c, uri, 1, 4)
        assert text  # tiny-random: shown whole whatever `show` says
        c.change(uri, 2, [{"range": {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 4}},
                           "text": text}])
        s = c.stats()["shown"]
        assert (s["accepted"], s["typed_over"], s["learning"]) == (1, 0, True)
        end = len(text.split("\n")[-1]) + (4 if "\n" not in text else 0)
        line = 1 + text.count("\n")
        c.change(uri, 3, [{"range": {"start": {"line": line, "character": end}, "end": {"line": line, "character": end}},
                           "text": "\n    "}])
        second = answer(c, uri, line + 1, 4)
        if second:  # something else typed over it
            c.change(uri, 4, [{"range": {"start": {"line": line + 1, "character": 4},
                                         "end": {"line": line + 1, "character": 4}}, "text": "\x01"}])
            assert c.stats()["shown"]["typed_over"] == 1
    finally:
        c.kill()


@pytest.mark.model
def test_sure_shows_a_prefix_of_what_all_shows_with_the_default_model(tmp_path):
    places = [(i, len(line) - len(line.lstrip())) for i, line in enumerate(CODE.split("\n"))
              if line.strip() and i > 5][:6]
    shown = {}
    for show in ("all", "sure"):
        c = serve(tmp_path, "--model", "default", options={"show": show, "idlePrefill": False, "firstAnswerS": None,
                                                                 "timeBudgetS": None})  # (no timing in the text)
        try:
            uri = "file:///tmp/ditto-shown/shapes.py"
            c.open(uri, CODE)
            shown[show] = [answer(c, uri, line, col) for line, col in places]
        finally:
            c.kill()
    for everything, sure in zip(shown["all"], shown["sure"]):
        assert everything.startswith(sure)
    assert sum(len(s) for s in shown["sure"]) < sum(len(s) for s in shown["all"])  # it did cut somewhere

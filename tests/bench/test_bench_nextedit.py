"""`ditto-lsp bench --mode next-edit` on a small git repository built here: known commits -> known cases, the
typing replay, the judge, and results.json's summary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ditto_bench.nextedit import judge, replay, run_case, summarise
from ditto_bench.nextedit_harvest import apply_units, cases, typing, units
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.types import NextEdit

from tests.bench.test_bench_harvest import commit, git

A0 = '''import os


def fetch_items(path):
    return os.listdir(path)


def first(path):
    items = fetch_items(path)
    return items[0]


def last(path):
    return fetch_items(path)[-1]
'''

B0 = '''from a import fetch_items


def count(path):
    return len(fetch_items(path))
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("nextedit") / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    commit(r, {"a.py": A0, "b.py": B0}, "init", "2024-01-01T00:00:00")
    # Repeated: a rename at three places of a.py and two of b.py.
    commit(r, {"a.py": A0.replace("fetch_items", "list_items"), "b.py": B0.replace("fetch_items", "list_items")},
           "rename", "2024-02-01T00:00:00")
    # Ordinary: one new line and one changed value, nothing alike.
    a2 = A0.replace("fetch_items", "list_items").replace("import os\n", "import os\nimport sys\n")
    commit(r, {"a.py": a2.replace("items[0]", "items[1]")}, "tweak", "2024-03-01T00:00:00")
    return r


def test_units_split_replacements_and_give_back_the_new_text():
    old = "a\nb = f(x)\nc\nd = g(y)\n"
    new = "a\nb = f(x, z)\nc\nd = g(y)\ne = 1\n"
    us = units(old, new)
    assert [(u.a, u.b) for u in us] == [(1, 2), (4, 4)]
    assert apply_units(old, us) == new and apply_units(old, us[:1]) == "a\nb = f(x, z)\nc\nd = g(y)\n"
    old, new = "x = 1\nreturn f(a, g, c)\ny\n", "x = 1\nreturn f(a, c)\nif z:\n    q()\ny\n"
    assert [(u.a, u.b, len(u.new)) for u in units(old, new)] == [(1, 2, 1), (2, 2, 2)]  # the alike line paired


def test_typing_events_turn_the_old_text_into_the_new():
    rng = random.Random(1)
    for _ in range(50):
        old = "".join(rng.choice(["foo", "bar", " ", "(", ")", "x", "\n"]) for _ in range(rng.randrange(0, 12)))
        new = "".join(rng.choice(["foo", "baz", " ", "(", ")", "y", "\n"]) for _ in range(rng.randrange(0, 12)))
        doc = "pre " + old + " post"
        for start, end, text, removed in typing(old, new, 4):
            assert doc[start:end] == removed and (not removed or not text) and len(text) <= 1
            doc = doc[:start] + text + doc[end:]
        assert doc == "pre " + new + " post"


def test_the_judge():
    doc = "a = foo(1)\nb = foo(2)\nc = 3\n"
    target = "a = bar(1)\nb = bar(2)\nc = 4\n"
    assert judge(doc, target, 4, 7, "bar") == (True, True)
    assert judge(doc, target, 15, 18, "bar") == (True, True)
    assert judge(doc, target, 4, 7, "baz") == (True, False)  # the right place, the wrong text
    assert judge(doc, target, 0, 1, "z") == (True, False)
    assert judge("x\n" + doc, "x\n" + target, 0, 1, "y") == (False, False)  # a line the commit left alone
    # Both units of two neighbouring lines at once is exact too.
    assert judge(doc, target, 4, 18, "bar(1)\nb = bar") == (True, True)


def test_harvest_finds_the_repeated_change_and_the_ordinary_one(repo):
    found, info = cases(repo, max_cases=5)
    kinds = {(c.path, c.kind) for c in found}
    assert ("a.py", "repeated") in kinds and ("b.py", "repeated") in kinds and ("a.py", "ordinary") in kinds
    rep = next(c for c in found if c.kind == "repeated" and c.path == "a.py")
    assert rep.shared == 2 and rep.subject == "rename" and [p for p, _, _ in rep.others] == ["b.py"]
    history, text, cursor = replay(rep)
    assert text.count("list_items") == 1 and text[cursor - len("list_items") : cursor] == "list_items"
    (g,) = history.groups()
    assert (g.old, g.new) == ("fetch_items", "list_items")
    ordinary = next(c for c in found if c.kind == "ordinary")
    assert ordinary.subject == "tweak" and info["commits_scanned"] == 2  # the root commit has no parent to replay against


def test_a_case_run_and_summarised(repo):
    found, _ = cases(repo, max_cases=5)

    class Nothing:
        def propose(self, *args):
            return None

    class Wrong:
        def propose(self, groups, uri, text, cursor, others=()):
            return NextEdit(uri, 0, 6, "import", 6, "wrong")

    records = [r for c in found for r in run_case(c, {"propagate": Propagator(), "none": Nothing(), "wrong": Wrong()})]
    s = summarise(records)
    assert s["default"] == "propagate"
    for name in ("propagate", "none", "wrong"):
        for kind in ("repeated", "all"):
            assert {"n", "exact", "shown_wrong", "tts_ms_p50", "tts_ms_p95"} <= set(s[name][kind])
    rep = s["propagate"]["repeated"]
    # a.py: the definition renamed, its uses follow; b.py: the import renamed, no neighbour agrees at its use.
    assert rep["n"] == 2 and rep["exact"] == 1 and rep["shown_wrong"] == 0
    assert s["none"]["all"]["shown"] == 0 and s["wrong"]["all"]["shown_wrong"] == s["wrong"]["all"]["n"]
    assert s["propagate"]["all"]["n"] == len(found)


def test_the_command_writes_results(repo, tmp_path, capsys):
    from lsp_server.cli import main

    out = tmp_path / "out"
    assert main(["bench", "--repo", str(repo), "--mode", "next-edit", "--systems", "propagate", "--max-tasks", "5",
                 "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["default"] == "propagate" and results["meta"]["mode"] == "next-edit"
    assert results["summary"]["propagate"]["repeated"]["exact"] == 1
    assert "| propagate (default) | repeated |" in (out / "report.md").read_text()
    assert "| propagate (default) | all |" in capsys.readouterr().out


def test_the_rewrites_passes_are_priced_at_the_gpus_costs(tmp_path):
    """`python -m ditto_bench.projection` on a next-edit run: the model rewrites' passes at T(9) each
    (region drafts of up to 8 tokens), against a token a pass at T(9) and at T(1)."""
    import json

    from ditto_bench.projection import main, project_rewrites

    gpu = {"device": "G", "source": "g.json", "costs_ms": {1: 5.0, 9: 6.0, 16: 8.0}}
    records = [
        {"system": "propagate", "case": "a"},
        {"system": "rewrite", "case": "a", "model": {"rewrites": 2, "generated": 30, "passes": 12}},
        {"system": "rewrite", "case": "b", "model": {"rewrites": 1, "generated": 10, "passes": 4}},
        {"system": "rewrite", "case": "c"},  # nothing to rewrite there
    ]
    p = project_rewrites(records, gpu)["proposers"]
    assert list(p) == ["rewrite"]
    r = p["rewrite"]
    assert (r["requests"], r["rewrites"], r["tokens"], r["passes"]) == (2, 3, 40, 16)
    assert r["tokens_per_pass"] == 2.5 and r["vs_off"] == 2.5
    assert r["ms_per_rewrite"] == round(16 * 6.0 / 3, 2) and r["ms_per_rewrite_off"] == 80.0
    assert r["ms_per_rewrite_off_1row"] == round(40 * 5.0 / 3, 2) and r["vs_off_1row"] == round(200 / 96, 2)
    run, costs = tmp_path / "results.json", tmp_path / "gpu.json"
    run.write_text(json.dumps({"records": records}))
    costs.write_text(json.dumps({"1": 5.0, "9": 6.0}))
    assert main([str(run), "--gpu", str(costs)]) == 0

"""The benchmark systems end to end on the tiny random model (fast; no real model)."""

from __future__ import annotations

import json

import pytest

from drafters.base import Proposal
from ditto_bench.harvest import Task
from ditto_bench.systems import OracleDrafter, parse_systems

DOC = '''def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b

'''


@pytest.fixture(scope="module")
def lm():
    from lsp_server.backends.loader import load

    return load("tiny-random")


def make_task(tid="t0:m.py:11"):
    lines = DOC.split("\n")
    return Task(id=tid, repo="r", commit="c" * 40, parent="p" * 40, subject="s", date=0, path="m.py",
                language="python", line=11, col=0, document=DOC, truth="def div(a, b):\n    return a / b",
                buffers=[("ops.py", "def div(a, b):\n    return a / b\n")], copyable=1.0, copyable_buffers=1.0)


def test_parse_systems():
    assert parse_systems("ngram,oracle", "completion") == ["off", "ngram", "oracle"]  # off is the reference, first
    assert parse_systems("off,ngram-noreuse", "keystroke") == ["off", "ngram-noreuse"]
    with pytest.raises(ValueError, match="unknown system"):
        parse_systems("ngram,magic", "completion")
    with pytest.raises(ValueError, match="keystroke"):
        parse_systems("hf-greedy", "keystroke")


def test_oracle_drafter_follows_the_reference_only():
    o = OracleDrafter(prompt_len=3, target=[7, 8, 9, 10])
    assert o.propose([1, 2, 3], 2).tokens == [7, 8]
    assert o.propose([1, 2, 3, 7, 8], 8).tokens == [9, 10]
    assert o.propose([1, 2, 3, 7, 5], 8).tokens == []  # left the reference: nothing to propose
    assert isinstance(o.propose([1, 2, 3], 0), Proposal) and o.propose([1, 2, 3], 0).tokens == []


def test_completion_systems_identical_to_off_and_share_prefill(lm):
    from ditto_bench.runner import Bench
    from lsp_server.completion.completer import Completer
    from lsp_server.decoding.types import DecodeOptions

    completer = Completer(lm)
    bench = Bench(lm, completer, DecodeOptions(max_new_tokens=12, draft_max=4))
    systems = ["off", "ngram", "oracle", "hf-greedy", "hf-prompt-lookup"]
    task = make_task()
    bench.warm_up(task, systems, "completion")
    recs = {r["system"]: r for r in bench.completion_task(task, systems)}
    assert set(recs) == set(systems)
    off = recs["off"]
    assert off["prefill_tokens"] > 0 and off["generated"] >= 1
    for s in systems:
        assert recs[s]["identical"] is True, (s, recs[s]["text"], off["text"])
        assert recs[s]["text"] == off["text"]
    # The other Ditto systems reuse off's prefill of the same prompt.
    assert recs["ngram"]["prefill_tokens"] == 0 and recs["ngram"]["reused_tokens"] == off["prompt_tokens"] - 1
    # The oracle's drafts are all accepted and it needs fewer passes whenever it drafts.
    o = recs["oracle"]
    assert o["accepted"] == o["drafted"]
    if off["generated"] > 1:
        assert o["target_passes"] < off["target_passes"]
    # Passes by draft source add up to the target passes; off never drafts, the oracle only drafts its reference.
    for s in ("off", "ngram", "oracle"):
        assert sum(recs[s]["steps"].values()) == recs[s]["target_passes"]
    assert recs["off"]["steps"]["plain"] == off["target_passes"]
    assert recs["oracle"]["steps"]["ngram"] == recs["oracle"]["steps"]["model"] == 0
    assert recs["hf-greedy"]["steps"] is None
    assert completer.engine.cached_keys() == []  # the task's cache entry is dropped afterwards
    json.dumps(list(recs.values()))  # records are JSON-able


def test_keystroke_mode_reuse_prefills_less(lm):
    from ditto_bench import metrics
    from ditto_bench.runner import Bench
    from lsp_server.completion.completer import Completer
    from lsp_server.decoding.types import DecodeOptions

    bench = Bench(lm, Completer(lm), DecodeOptions(max_new_tokens=2))
    recs = list(bench.keystroke_task(make_task(), ["ngram", "ngram-noreuse"], max_keystrokes=6))
    assert len(recs) == 2 * 7  # the empty block, then one request per keystroke
    s = metrics.summarise_keystroke(recs)
    assert s["ngram"]["requests"] == 7
    assert s["ngram-noreuse"]["typethrough_hits"] == 0  # no cache key: no type-through
    hits = [r for r in recs if r["typethrough"]]
    assert s["ngram"]["typethrough_hits"] == len(hits)
    assert all(r["system"] == "ngram" and r["target_passes"] == 0 for r in hits)
    assert s["ngram-noreuse"]["reused_tokens_mean"] == 0
    assert s["ngram"]["prefill_tokens_mean"] < s["ngram-noreuse"]["prefill_tokens_mean"] / 3


def test_fixed_length_systems_are_named_and_validated():
    from ditto_bench.systems import fixed_k, parse_systems

    assert fixed_k("ngram-k4") == 4 and fixed_k("ngram-k0") is None and fixed_k("ngram") is None
    assert parse_systems("ngram-k2,ngram", "completion") == ["off", "ngram-k2", "ngram"]
    with pytest.raises(ValueError, match="ngram-kN"):
        parse_systems("ngram-kx", "completion")


def test_todays_drafter_runs_beside_the_default_each_with_its_own_memory(lm):
    """ngram-v1 (today's chain lookup) and fixed-length systems run beside ngram on the same task,
    each with a drafter of its own over the same open buffers, all identical to off; the default
    drafter's memory of earlier generations holds only its own system's generations."""
    from ditto_bench import metrics
    from ditto_bench.runner import Bench
    from ditto_bench.systems import V1Drafter
    from lsp_server.completion.completer import Completer
    from lsp_server.decoding.types import DecodeOptions

    completer = Completer(lm)
    bench = Bench(lm, completer, DecodeOptions(max_new_tokens=12, draft_max=4, adaptive=False))
    systems = ["off", "ngram", "ngram-v1", "ngram-k3", "ngram-v1-k2"]
    task = make_task()
    bench.warm_up(task, systems, "completion")
    assert completer.ngram.memory() == []  # the warm-up's generations are forgotten
    recs = {r["system"]: r for r in bench.completion_task(task, systems)}
    assert all(recs[s]["identical"] for s in systems)
    assert isinstance(bench.drafters["ngram-v1"], V1Drafter) and bench.drafters["ngram"] is completer.ngram
    assert bench.drafters["ngram-k3"] is not completer.ngram
    assert bench.drafters["ngram-k3"]._sources is completer.ngram._sources  # the open buffers, shared
    assert set(completer.ngram.source_names()) == {"m.py", "ops.py"}  # the document and the other buffer
    for s in systems[1:]:
        assert recs[s]["draft_ms"] is not None and all(len(x) == 6 for x in recs[s]["rounds"])
        assert all(x[2] <= 3 for x in recs[s]["rounds"] if s == "ngram-k3" and not x[5])
    from dataclasses import replace

    other = replace(make_task("t1:m.py:12"), document="import math\n" + DOC, line=12)
    bench.completion_task(other, systems)  # a second place: the first one's generation is remembered
    mem, mem_k3 = completer.ngram.memory(), bench.drafters["ngram-k3"].memory()
    assert mem and mem_k3 and bench.drafters["ngram-k3"] is not completer.ngram
    s = metrics.summarise_completion([r for r in recs.values()])
    assert s["off"]["tokens_per_pass"] == 1.0 and s["off"]["no_draft_passes"] == s["off"]["passes"]
    assert s["ngram"]["tokens_per_pass"] == round(recs["ngram"]["generated"] / recs["ngram"]["target_passes"], 4)
    assert s["ngram"]["tree_passes"] == sum(1 for x in recs["ngram"]["rounds"] if x[5])


def test_bench_prices_passes_with_a_gpus_costs(tmp_path, monkeypatch):
    """--pass-costs: the policy prices drafts with the given device's fixed shape (and learns no
    costs from this machine); the report says so and projects tokens/s there."""
    import subprocess

    from lsp_server.cli import main

    repo = tmp_path / "repo"
    repo.mkdir()
    def git(*a):
        subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "a@b")
    git("config", "user.name", "a")
    (repo / "m.py").write_text(DOC)
    git("add", ".")
    git("commit", "-qm", "one")
    (repo / "m.py").write_text(DOC + "def div(a, b):\n    return a / b\n")
    git("commit", "-qam", "two")
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    costs = tmp_path / "gpucheck.json"
    costs.write_text(json.dumps({"environment": {"device_name": "Test GPU"}, "pass_costs": {"graphed_static": {
        str(n): {"best_ms": 3.0 + 0.05 * n, "median_ms": 3.1} for n in range(1, 17)}}}))
    out = tmp_path / "out"
    rc = main(["bench", "--repo", str(repo), "--model", "tiny-random", "--max-tasks", "1", "--max-tokens", "6",
               "--systems", "off,ngram,ngram-v1", "--pass-costs", str(costs), "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    priced = res["meta"]["priced_with"]
    assert priced["device"] == "Test GPU" and priced["rows"] == 16 and priced["costs_ms"] == {"1": 3.8, "16": 3.8}
    assert res["meta"]["speculation"]["learning_costs"] is False
    md = (out / "report.md").read_text()
    assert "priced with the pass costs of Test GPU" in md and "**A projection, not a measurement**" in md
    assert "| ngram-v1 |" in md

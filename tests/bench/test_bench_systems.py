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

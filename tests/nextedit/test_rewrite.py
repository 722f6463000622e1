"""The model rewrite: the region is its own draft, and drafting changes how many passes it takes, never what
it writes (tiny random model, both backends); what is shown passes the checks."""

from __future__ import annotations

import pytest

from drafters.region import RegionDrafter
from lsp_server.backends.tiny import tiny_random
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.types import DecodeOptions
from lsp_server.nextedit.learn import edits
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.rewrite import Checked, Rewriter, Rewritten, region_of, shown

from tests.nextedit.test_history import Doc


@pytest.fixture(scope="module", params=["torch", "llama.cpp"])
def lm(request):
    if request.param == "torch":
        return tiny_random()
    from lsp_server.backends.llama import library as llama_library
    from lsp_server.backends.loader import load

    if not llama_library.available():  # (the prebuilt wheel's library: lsp_server/backends/llama/library.py)
        pytest.skip("no llama.cpp library")

    return load("tiny-random", backend="llama.cpp")


def test_the_drafter_follows_the_region_through_a_change():
    region = [10, 11, 12, 13, 14, 15, 16, 17]
    d = RegionDrafter(region, prompt_len=3)
    assert d.propose([1, 2, 3], 4).tokens == [10, 11, 12, 13]  # nothing written: the region's start
    assert d.propose([1, 2, 3, 10, 11, 99], 3).tokens == [13, 14, 15]  # 99 matches nothing: the same offset
    assert d.propose([1, 2, 3, 10, 11, 99, 98, 13], 3).tokens == [14, 15, 16]  # realigned after the change
    assert d.propose([1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17], 3).tokens == []  # the region is done
    assert RegionDrafter([], 0).propose([1], 3).tokens == [] and d.propose([1, 2, 3], 0).tokens == []


def test_the_drafter_prefers_the_occurrence_where_it_was():
    region = [5, 6, 7, 5, 6, 8]
    d = RegionDrafter(region, prompt_len=0)
    d.propose([], 3)
    assert d.propose([5, 6, 7, 5, 6], 2).tokens == [8]  # the second "5 6", where writing has got to


SRC = '''def load(path):
    data = read_file(path)
    return data


def save(path, data):
    write_file(path, data)
    return read_file(path)
'''


def edited() -> Doc:
    d = Doc(SRC)
    i = d.text.index("read_file")
    d.change(i, i + len("read_file"), "")
    d.type(i, "load_file")
    return d


@pytest.mark.parametrize("fmt", Rewriter.FORMATS)
def test_drafting_changes_nothing_the_rewrite_writes(lm, fmt):
    """Drafted by the region (every draft verified) and not drafted at all: the same tokens, on every line."""
    d = edited()
    edit = edits(d.h.groups(), d.text, 1)[0]
    drafted, plain = Rewriter(lm, draft=True, format=fmt), Rewriter(lm, draft=False, format=fmt)
    for line in range(len(d.text.split("\n")) - 1):
        a, b = region_of(d.text, line)
        x = drafted.rewrite("a.py", d.text, a, b, edit)
        y = plain.rewrite("a.py", d.text, a, b, edit)
        assert x.stats["ids"] == y.stats["ids"] and x.text == y.text
        assert y.stats["drafted"] == 0 and y.stats["passes"] == y.stats["generated"]


def test_a_region_the_model_writes_itself_is_accepted_whole(lm):
    """Where the region is what the model writes (its own greedy output put in the prompt's place), every drafted
    token is accepted: the draft is aligned, and the output is still plain greedy decoding's."""
    engine = Engine(lm)
    rw = Rewriter(lm, engine=engine, draft=False)
    d = edited()
    edit = edits(d.h.groups(), d.text, 1)[0]
    a, b = region_of(d.text, 6)
    ids, _ = rw.prompt("a.py", d.text, a, b, edit)
    plain = engine.generate(ids, options=DecodeOptions(max_new_tokens=24, draft_max=0))
    drafted = engine.generate(ids, drafter=RegionDrafter(plain.tokens, len(ids)),
                              options=DecodeOptions(max_new_tokens=24, draft_max=8, adaptive=False))
    assert drafted.tokens == plain.tokens
    assert drafted.stats.accepted == drafted.stats.drafted > 0 and drafted.stats.target_passes < plain.stats.target_passes


def rewritten(region: str, text: str) -> Rewritten:
    return Rewritten(10, 10 + len(region), region, text, {})


def test_what_is_shown_passes_the_checks():
    assert shown(rewritten("x = f(a)", "x = f(a)"), "a.py", " " * 30, None) is None  # unchanged
    assert shown(rewritten("x = f(a)", "x = f(a\x00)"), "a.py", " " * 30, None) is None  # a control character
    assert shown(rewritten("x = f(a)", "x = f(a, (b)"), "a.py", " " * 30, None) is None  # a bracket left open
    assert shown(rewritten("x = f(a)", "x = 1\ny = 2\nz = 3"), "a.py", " " * 30, None) is None  # lines added
    e = shown(rewritten("x = f(a)", "x = g(a)"), "a.py", " " * 10 + "x = f(a)", 7)
    assert (e.start, e.end, e.old_text, e.new_text, e.version, e.source) == (14, 15, "f", "g", 7, "rewrite")


class FakeRewriter:
    """Writes a fixed text for any region (the `Checked` proposer's agreement rule, without a model)."""

    def __init__(self, write):
        self.write = write
        self.keys = []  # the KV cache keys it was asked to rewrite in

    def rewrite(self, path, text, start, end, edit, cache_key=None, cancel=None):
        self.keys.append(cache_key)
        return Rewritten(start, end, text[start:end], self.write(text[start:end]), {"ms": 1.0})

    def key_for(self, uri):
        return f"one cache for {uri}"


def test_propagation_is_shown_only_where_the_model_writes_it_too():
    d = edited()
    cursor = d.h.last().end
    agree = Checked(Propagator(), FakeRewriter(lambda region: region.replace("read_file", "load_file")))
    e = agree.propose(d.h.groups(), "a.py", d.text, cursor)
    assert e is not None and "return load_file(path)" in e.apply(d.text)
    assert agree.rewriter.keys == ["one cache for a.py"]  # the rewriter's own cache key (the server: one for all)
    disagree = Checked(Propagator(), FakeRewriter(lambda region: region))
    assert disagree.propose(d.h.groups(), "a.py", d.text, cursor) is None


@pytest.mark.model
@pytest.mark.parametrize("fmt", Rewriter.FORMATS)
def test_on_the_default_model_drafting_changes_nothing_either(fmt):
    """The default model on llama.cpp (what the benchmark measured): the region as the draft, every draft verified,
    writes plain greedy decoding's tokens; and where the change applies, the region's tokens are mostly accepted."""
    from lsp_server.backends.base import ModelError
    from lsp_server.backends.loader import load

    try:
        lm = load("default", backend="llama.cpp")
    except ModelError as err:
        pytest.skip(f"the default model is not installed ({err}); the README's first command installs it")
    d = edited()
    edit = edits(d.h.groups(), d.text, 1)[0]
    drafted, plain = Rewriter(lm, draft=True, format=fmt), Rewriter(lm, draft=False, format=fmt)
    for line in (1, 6, 7):
        a, b = region_of(d.text, line)
        x = drafted.rewrite("a.py", d.text, a, b, edit)
        y = plain.rewrite("a.py", d.text, a, b, edit)
        assert x.stats["ids"] == y.stats["ids"]
        assert x.stats["passes"] <= y.stats["passes"]

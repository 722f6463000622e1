"""The Completer: type-through and KV reuse across keystrokes, on the tiny model."""

import copy
import threading
from dataclasses import replace

import pytest

from lsp_server.completion.completer import Completer
from lsp_server.completion.context import ContextBudget
from lsp_server.decoding.types import DecodeOptions
from lsp_server.backends.tiny import tiny_random

OPTS = DecodeOptions(max_new_tokens=12, draft_max=0)


@pytest.fixture(scope="module")
def lm():
    return tiny_random()


def first_nonempty(c, docs):
    for doc in docs:
        lines = doc.split("\n")
        for line, text in enumerate(lines):
            sug = c.complete(doc, line, len(text), options=OPTS, cache_key=None)
            if len(sug.text) >= 3 and "\n" not in sug.text[:3]:
                return doc, line, len(text), sug
    pytest.skip("tiny-random suggested nothing usable")


DOCS = ["def area(width, height):\n    return wid\n", "class Point:\n    x = 1\n    y = \n", "import os\nprint(os.pa\n"]


def test_typing_the_suggestion_serves_its_rest_without_the_model(lm):
    c = Completer(lm)
    doc, line, col, probe = first_nonempty(c, DOCS)
    shown = c.complete(doc, line, col, options=OPTS, cache_key="doc")
    assert shown.text == probe.text and not shown.typethrough
    lines = doc.split("\n")
    typed = shown.text[:2]
    lines[line] = lines[line][:col] + typed + lines[line][col:]
    doc2 = "\n".join(lines)
    hit = c.complete(doc2, line, col + 2, options=OPTS, cache_key="doc")
    assert hit.typethrough
    assert hit.text == shown.text[2:]
    assert hit.completion.stats.target_passes == 0 and hit.completion.stats.prefill_tokens == 0


def test_a_stopped_request_where_a_suggestion_is_shown_keeps_it_for_type_through(lm):
    """The editor asks again where a suggestion is on screen (a new generation), and that request is
    cancelled: typing the start of the suggestion on screen is still answered from it."""
    c = Completer(lm)
    doc, line, col, probe = first_nonempty(c, DOCS)
    shown = c.complete(doc, line, col, options=OPTS, cache_key="doc")
    stopped = threading.Event()
    stopped.set()
    again = c.complete(doc, line, col, options=OPTS, cache_key="doc", cancel=stopped)
    assert again.completion.stats.stop_reason == "cancelled"
    lines = doc.split("\n")
    lines[line] = lines[line][:col] + shown.text[:2] + lines[line][col:]
    hit = c.complete("\n".join(lines), line, col + 2, options=OPTS, cache_key="doc")
    assert hit.typethrough and hit.text == shown.text[2:]


def test_type_through_never_serves_other_surrounding_text(lm):
    c = Completer(lm)
    doc, line, col, probe = first_nonempty(c, DOCS)
    shown = c.complete(doc, line, col, options=OPTS, cache_key="doc")
    lines = doc.split("\n")
    ch = shown.text[0]
    # 1. the same character typed, but the text after the cursor changed too
    changed = lines[:]
    changed[line] = changed[line][:col] + ch + changed[line][col:]
    changed.append("extra = 1")
    miss = c.complete("\n".join(changed), line, col + 1, options=OPTS, cache_key="doc")
    assert not miss.typethrough
    # 2. a character that does not continue the suggestion
    c2 = Completer(lm)
    c2.complete(doc, line, col, options=OPTS, cache_key="doc")
    other = "\x01" if ch != "\x01" else "\x02"
    wrong = lines[:]
    wrong[line] = wrong[line][:col] + other + wrong[line][col:]
    assert not c2.complete("\n".join(wrong), line, col + 1, options=OPTS, cache_key="doc").typethrough
    # 3. no key (another document, or reuse switched off): never
    c3 = Completer(lm)
    c3.complete(doc, line, col, options=OPTS, cache_key=None)
    typed = lines[:]
    typed[line] = typed[line][:col] + ch + typed[line][col:]
    assert not c3.complete("\n".join(typed), line, col + 1, options=OPTS, cache_key=None).typethrough
    # 4. switched off in the settings
    c4 = Completer(lm)
    c4.settings.type_through = False
    c4.complete(doc, line, col, options=OPTS, cache_key="doc")
    assert not c4.complete("\n".join(typed), line, col + 1, options=OPTS, cache_key="doc").typethrough


def test_reused_cache_across_real_edits_gives_the_same_completion(lm):
    """KV reuse per document never changes a result: edits before, at and after the cursor, a new line, a paste."""
    reuse = Completer(lm)
    doc = "import os\n\n\ndef main(path):\n    data = os.listdir(path)\n    return da\n\nmain('.')\n"
    edits = [
        (5, 13, doc),
        (5, 14, doc.replace("return da", "return dat")),  # typing at the cursor
        (5, 12, doc.replace("return da", "return ")),  # deleting
        (6, 4, doc.replace("return da\n", "return data\n    \n")),  # a new line
        (5, 13, doc.replace("import os\n", "import os\nimport sys\nimport re\n").replace("return da", "return da")),
        (4, 8, doc.replace("def main(path):", "def main(path, extra=None):")),  # an edit above
        (5, 13, doc + "\n\ndef helper():\n    return 42\n"),  # a paste below
    ]
    for line, col, text in edits:
        lines = text.split("\n")
        col = min(col, len(lines[line]))
        # The fresh completer gets the same prompt window (so the same prompt: lines typed at a place
        # stay in its middle, context.py `_middle_from`) and no KV cache.
        fresh = Completer(lm)
        fresh.files.get("main.py").window = copy.deepcopy(reuse.window("main.py"))
        a = reuse.complete(text, line, col, options=OPTS, cache_key="main.py")
        b = fresh.complete(text, line, col, options=OPTS, cache_key="main.py")
        assert a.typethrough or a.prompt.ids == b.prompt.ids
        if a.typethrough:
            continue
        assert a.completion.tokens == b.completion.tokens, (line, col)
        assert a.text == b.text
    assert reuse.engine.cached_keys() == ["main.py"]


def test_reuse_prefills_only_the_changed_tail_when_typing(lm):
    c = Completer(lm)
    c.settings.type_through = False  # measure the model path on every keystroke
    doc = "def total(items):\n    result = 0\n    for item in items:\n        result += item\n    return res\n"
    first = c.complete(doc, 4, 14, options=OPTS, cache_key="d")
    second = c.complete(doc.replace("return res", "return resu"), 4, 15, options=OPTS, cache_key="d")
    s = second.completion.stats
    assert s.reused_tokens > 0.8 * len(second.prompt.ids)
    assert s.prefill_tokens < first.completion.stats.prefill_tokens / 4


def test_time_budget_returns_whole_lines(lm):
    import time

    from lsp_server.completion.stops import uninsertable

    # No end-of-text tokens, no token with a character no editor can insert (the ghost text
    # would end before it), and a cursor at column 0 of the last line (no block to end,
    # nothing below to repeat): only the time budget can stop this completion.
    slow_lm = copy.copy(lm)
    slow_lm.stop_ids = frozenset()
    real = slow_lm.forward
    banned = [t for t in range(lm.vocab_size) if uninsertable(lm.token_text(t), True) is not None]

    def forward(ids, cache, last):
        time.sleep(0.02)
        logits = real(ids, cache, last=last).clone()
        logits[..., banned] = float("-inf")
        return logits

    slow_lm.forward = forward
    c = Completer(slow_lm)
    doc = "def f():\n    return 1\n"
    sug = c.complete(doc, 2, 0, options=DecodeOptions(max_new_tokens=200, draft_max=0, time_budget_s=0.5))
    assert sug.completion.stats.stop_reason == "time"
    assert sug.completion.stats.target_passes < 200
    rel = lm.decode(sug.completion.tokens)
    assert rel.startswith(sug.text)
    # Cut at a line end: what follows the shown text is a line break, unless nothing had one.
    assert sug.text == "" or "\n" not in rel or rel[len(sug.text)] == "\n"


def test_fim_layout_keeps_edits_near_the_cursor_in_the_tail(lm):
    """Typing, deleting, Enter and a paste below change only a tail of the prompt; the KV cache keeps the rest."""
    c = Completer(lm)
    c.settings.type_through = False
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))
    doc = body + "def g(y):\n    total = y\n    retu\n\nprint(g(1))\n"
    line = doc.split("\n").index("    retu")
    steps = [
        ("typing", doc.replace("    retu\n", "    retur\n"), line, 9),
        ("deleting", doc.replace("    retu\n", "    ret\n"), line, 7),
        ("new line", doc.replace("    retu\n", "    retu\n    \n"), line + 1, 4),
        ("paste below", doc.replace("print(g(1))\n", "print(g(1))\nfor k in range(3):\n    print(g(k))\n"), line, 8),
    ]
    for name, text, l, col in steps:
        c.complete(doc, line, 8, options=OPTS, cache_key="doc")  # back to the base state
        base_ids = list(c.engine._kv["doc"].ids)  # a copy: the engine edits its list in place
        sug = c.complete(text, l, col, options=OPTS, cache_key="doc")
        ids = sug.prompt.ids
        common = 0
        while common < min(len(base_ids), len(ids) - 1) and base_ids[common] == ids[common]:
            common += 1
        s = sug.completion.stats
        assert s.reused_tokens == common, name  # the engine keeps exactly the longest common prefix
        assert s.prefill_tokens == len(ids) - 1 - common, name
        above_end = ids.index(lm.fim.suffix)
        if name in ("typing", "deleting"):
            assert common >= len(ids) - 8, name  # only the typed text after <fim_middle> changed
        elif name == "new line":
            assert common >= above_end - 12, name  # the old cursor line joined the lines above
        else:
            assert common > above_end, name  # the lines above and the start of the suffix are kept


def _conv_text() -> str:
    import torch.nn.modules.conv as conv

    with open(conv.__file__, encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_window_reuse_paths_give_the_fresh_result(lm, drafter):
    """Enter, typing a new line, deleting the line above, moving up 20 lines and down one, and a
    jump far away, through one cache key: every completion equals a computation without any cache
    (same document window, new prefill), token for token; and the edits did reuse the cache."""
    lines = _conv_text().split("\n")[:900]
    reuse, fresh = Completer(lm), Completer(lm)
    for c in (reuse, fresh):
        c.settings.type_through = False  # every request goes through the model
        c.settings.drafter = drafter
        # A GPU-sized prompt (2,048 tokens): the shares below are of a long prompt, where an edit
        # near the cursor leaves most of it cached (at the small CPU default a typed word is a larger share).
        c.settings.budget = ContextBudget()
    opts = DecodeOptions(max_new_tokens=10, draft_max=4 if drafter == "ngram" else 0, prefill_chunk=64)
    line = 600
    steps = [("start", lines[:], line, len(lines[line]))]
    cur = lines[:line + 1] + [""] + lines[line + 1:]
    steps.append(("enter", cur, line + 1, 0))
    new = "        out = self.weight"
    for n in range(1, len(new) + 1, 6):
        steps.append(("typing", cur[:line + 1] + [new[:n]] + cur[line + 2:], line + 1, n))
    cur = cur[:line + 1] + [new] + cur[line + 2:]
    steps.append(("new line typed", cur, line + 1, len(new)))
    cur = cur[:line] + cur[line + 1:]  # the line above the cursor deleted
    steps.append(("line above deleted", cur, line, len(new)))
    steps.append(("up 20", cur, line - 20, 0))
    steps.append(("down 1", cur, line - 19, 0))
    steps.append(("far away", cur, 150, 0))
    for name, doc_lines, l, col in steps:
        doc = "\n".join(doc_lines)
        a = reuse.complete(doc, l, col, name="conv.py", options=opts, cache_key="conv.py")
        b = fresh.complete(doc, l, col, name="conv.py", options=opts, cache_key=None)
        assert a.prompt.ids == b.prompt.ids, name  # the same window: a fair comparison
        assert b.completion.stats.reused_tokens == 0
        assert a.completion.tokens == b.completion.tokens, name
        assert a.text == b.text, name
        share = a.completion.stats.reused_tokens / len(a.prompt.ids)
        if name in ("enter", "typing", "new line typed", "line above deleted", "up 20"):
            assert share >= 0.9, (name, share)
    assert reuse.engine.cached_keys() == ["conv.py"]


def test_prompt_for_is_the_prompt_complete_sends(lm):
    """What an idle prefill warms (prompt_for) is what the next completion at that place prefills."""
    c = Completer(lm)
    doc = "import os\n\n\ndef main(path):\n    data = os.listdir(path)\n    return \n\nmain('.')\n"
    p = c.prompt_for(doc, 5, 11, name="main.py", cache_key="main.py")
    sug = c.complete(doc, 5, 11, name="main.py", options=OPTS, cache_key="main.py")
    assert sug.prompt.ids == p.ids
    # The blank typed after "return" is healed: not in the ids after <fim_middle>, not in the suffix.
    assert lm.decode(p.ids[p.ids.index(lm.fim.middle) + 1 :]) == "    return"
    assert p.typed == "    return " and p.healed == " " and p.after == ""


def test_the_completer_drafts_at_a_token_the_cursor_split(lm):
    """At `self.items.p` ("p" of "pop") the prompt ends before the split token (token healing,
    lsp_server/decoding/healing.py), the n-gram drafter proposes at the first step, and the text
    equals drafting off's. (The drafter's own healed lookup, for contexts that end inside a
    token, is tested in tests/drafters/test_drafters.py.)"""
    doc = ("class Stack:\n    def pop(self):\n        return self.items.pop()\n\n"
           "    def top(self):\n        return self.items.p\n")
    line, col = 5, len("        return self.items.p")
    out = {}
    for drafter in ("none", "ngram"):
        c = Completer(lm)
        c.settings.type_through = False
        opts = DecodeOptions(max_new_tokens=8, draft_max=4 if drafter == "ngram" else 0, adaptive=False)
        out[drafter] = c.complete(doc, line, col, options=opts, drafter=drafter, cache_key=None)
    assert out["ngram"].completion.tokens == out["none"].completion.tokens
    assert out["ngram"].text == out["none"].text
    first = out["ngram"].completion.rounds[0]
    assert out["ngram"].prompt.healed and first.proposed


# -- answering at a deadline, finishing later (issue 24) -------------------------------------------

DEADLINE_DOCS = [
    ("class Stack:\n    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n        \n", 5, 8),
    ("import os\n\n\ndef main(path):\n    data = os.listdir(path)\n    return sorted(d\n", 5, 19),
    ("def area(width, height):\n    return wi\n", 1, 13),
]


@pytest.mark.parametrize("doc,line,col", DEADLINE_DOCS)
@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_an_answer_at_the_deadline_and_its_continuation_give_the_uninterrupted_suggestion(lm, doc, line, col,
                                                                                         drafter):
    """With first_answer_s = 0 the answer comes at the first whole word; continue_place (the
    server's idle work) finishes it: the tokens and the text are those of one uninterrupted
    generation, and every answer was a start of that text."""
    opts = DecodeOptions(max_new_tokens=24, draft_max=4, adaptive=False)
    ref = Completer(lm).complete(doc, line, col, options=opts, drafter=drafter, cache_key="a")
    c = Completer(lm)
    first = c.complete(doc, line, col, options=replace(opts, first_answer_s=0.0), drafter=drafter, cache_key="a")
    assert ref.text.startswith(first.text)
    runs = 0
    while c.pending("a"):
        assert first.continuing and c.continue_place("a")
        runs += 1
    place = c.place("a")
    if place is not None:
        assert place.completion.tokens == ref.completion.tokens and place.text == ref.text
    assert first.completion.stats.prefill_tokens == len(first.prompt.ids) - 1 or runs == 0


def test_a_request_that_typed_the_answer_resumes_the_paused_generation(lm):
    doc, line, col = DEADLINE_DOCS[0]
    opts = DecodeOptions(max_new_tokens=24, draft_max=0)
    ref = Completer(lm).complete(doc, line, col, options=opts, cache_key="a")
    c = Completer(lm)
    first = c.complete(doc, line, col, options=replace(opts, first_answer_s=0.0), cache_key="a")
    assert first.continuing and first.text and len(first.text) < len(ref.text)
    typed = first.text  # the user accepts the first words (or types them)
    lines = doc.split("\n")
    lines[line] = lines[line][:col] + typed + lines[line][col:]
    second = c.complete("\n".join(lines), line, col + len(typed), options=replace(opts, first_answer_s=0.0),
                        cache_key="a")
    assert second.resumed and second.completion.stats.prefill_tokens == first.completion.stats.prefill_tokens
    assert ref.text[len(typed):].startswith(second.text) and second.text
    while c.pending("a"):
        c.continue_place("a")
    assert c.place("a").completion.tokens == ref.completion.tokens
    assert c.continued >= 1


def test_a_request_elsewhere_ends_the_paused_generation(lm):
    doc, line, col = DEADLINE_DOCS[0]
    c = Completer(lm)
    first = c.complete(doc, line, col, options=DecodeOptions(max_new_tokens=24, first_answer_s=0.0), cache_key="a")
    assert first.continuing and c.pending("a")
    c.complete(doc, 1, 4, options=DecodeOptions(max_new_tokens=4), cache_key="a")  # another place, same document
    assert not c.pending("a") and not c.continue_place("a")


class _HeldAfter:
    """A `hold` event that turns set after `n` looks: a request arriving after n passes of the idle generation."""

    def __init__(self, n: int):
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


@pytest.mark.parametrize("doc,line,col", DEADLINE_DOCS)
@pytest.mark.parametrize("held_after", [None, 1, 3])
def test_a_suggestion_generated_ahead_answers_the_request_there_with_the_plain_generation(lm, doc, line, col,
                                                                                         held_after):
    """Idle work generates the suggestion where the user is (Completer.ahead) until its first line is
    complete, or until a request comes (`hold`, here after 1 or 3 looks); the request at that place is
    answered from it (resuming it where it stopped) and what it shows is a start of the plain
    generation's suggestion, whose tokens the finished generation has exactly. A request elsewhere or
    one with text typed differently is not served from it."""
    opts = DecodeOptions(max_new_tokens=24, draft_max=0, first_answer_s=1e9)
    ref = Completer(lm).complete(doc, line, col, options=replace(opts, first_answer_s=None), cache_key="a")
    c = Completer(lm)
    assert not c.ahead(doc, line, col, options=opts, cache_key="a", hold=threading.Event())  # not prefilled yet
    assert c.engine.cached_ids("a") == []
    c.warm(doc, line, col, cache_key="a")  # idle prefill, then:
    hold = threading.Event() if held_after is None else _HeldAfter(held_after + 1)  # (+1: ahead's first look)
    kept = c.ahead(doc, line, col, options=opts, cache_key="a", hold=hold)
    if not kept:
        assert not ref.text.strip() or held_after is not None  # nothing shown yet when held at once
        return
    assert c.place("a").ahead
    answer = c.complete(doc, line, col, options=opts, cache_key="a")
    assert answer.ahead and not answer.typethrough
    assert ref.text.startswith(answer.text)
    assert answer.text == ref.text.split("\n")[0] or "\n" in answer.text or c.place("a").finished
    while c.pending("a"):
        c.continue_place("a")
    assert c.place("a").completion.tokens == ref.completion.tokens and c.place("a").text == ref.text
    again = c.complete(doc, line, col, options=opts, cache_key="a")  # asked again where it was shown: generated anew
    assert not again.ahead and again.text.startswith(answer.text[:1])


def test_a_suggestion_generated_ahead_whose_finishing_a_request_stopped_still_answers_that_request(lm):
    """Idle work finishing the suggestion made ahead is stopped by the request that comes (its
    generation stays paused, stop reason "cancelled"): the request is answered from it all the same,
    not taken for a cancelled one (the server shows nothing for those)."""
    doc, line, col = DOCS[1], 0, 6
    opts = DecodeOptions(max_new_tokens=32, draft_max=0, first_answer_s=1e9)
    ref = Completer(lm).complete(doc, line, col, options=replace(opts, first_answer_s=None), cache_key="a")
    assert "\n" in ref.text and ref.text.split("\n")[0].strip()  # what the test needs: a complete first line
    c = Completer(lm)
    c.engine.warm(c.prompt_for(doc, line, col, cache_key="a").ids, "a")  # (`warm` at line 1 warms the file head)
    assert c.ahead(doc, line, col, options=opts, cache_key="a", hold=threading.Event()) and c.pending("a")
    stopped = threading.Event()
    stopped.set()
    c.continue_place("a", stopped)  # the idle work finishing it, stopped at once by the request
    sug = c.complete(doc, line, col, options=opts, cache_key="a")
    assert sug.ahead and sug.completion.stats.stop_reason != "cancelled"
    assert sug.text == ref.text.split("\n")[0]


def test_a_suggestion_generated_ahead_is_not_made_where_one_fits_and_serves_no_other_text(lm):
    doc, line, col = DEADLINE_DOCS[0]
    opts = DecodeOptions(max_new_tokens=24, draft_max=0, first_answer_s=1e9)
    c = Completer(lm)
    c.warm(doc, line, col, cache_key="a")
    c.warm(doc, line, col, cache_key="b")
    assert c.ahead(doc, line, col, options=opts, cache_key="a", hold=threading.Event())
    assert not c.ahead(doc, line, col, options=opts, cache_key="a", hold=threading.Event())  # one is there
    assert not c.ahead(doc, line, col, options=replace(opts, first_answer_s=None), cache_key="b",
                       hold=threading.Event())  # no deadline: a request answers only when the whole is done
    assert not c.ahead(doc, line, col, options=replace(opts, temperature=0.8), cache_key="b",
                       hold=threading.Event())  # sampled: a request must draw its own
    other = doc.replace("def pop(self):", "def peek(self):")
    sug = c.complete(other, line, col, options=opts, cache_key="a")
    assert not sug.ahead
    assert sug.text == Completer(lm).complete(other, line, col, options=opts, cache_key="a").text


@pytest.mark.parametrize("doc,line,col", DEADLINE_DOCS)
def test_check_place_compares_the_paused_generation_with_the_uninterrupted_one(lm, doc, line, col):
    """The replay's check (`ditto/debug/checkPlace`): it finishes the paused generation, generates
    the prompt again without a deadline, and says whether the tokens agree; a place whose
    tokens were altered (as a broken resume would) is reported as not identical."""
    opts = DecodeOptions(max_new_tokens=24, draft_max=4, adaptive=False, first_answer_s=0.0)
    c = Completer(lm)
    first = c.complete(doc, line, col, options=opts, drafter="ngram", cache_key="a")
    if not first.continuing:
        assert c.check_place("a") is None  # it never paused: nothing to check
        return
    got = c.check_place("a")
    assert got is not None and got["identical"] and got["pauses"] >= 1 and got["tokens"] == got["uninterrupted_tokens"]
    assert c.check_place("a") is None  # once
    c.complete(doc, line, col, options=opts, drafter="ngram", cache_key="b")
    place = c.place("b")
    while c.pending("b"):
        c.continue_place("b")
    place.completion.tokens[-1] = (place.completion.tokens[-1] + 1) % lm.vocab_size
    assert c.check_place("b")["identical"] is False


def test_the_open_buffers_are_indexed_only_while_a_draft_could_pay(lm):
    """No index work where the drafter would not be consulted (issue 24, "no cost where no draft
    can pay"): on pass costs T(n) = n T(1), as llama.cpp's one-row verification on a CPU, the
    default drafter does what drafting off does. Costs where drafts pay bring the index back."""
    from lsp_server.decoding.speculation import Speculation

    doc = "def area(width, height):\n    return width * height\n" * 40
    c = Completer(lm)
    lookups = []
    propose = c.ngram.propose
    c.ngram.propose = lambda seq, k: lookups.append(k) or propose(seq, k)  # counts the drafter's lookups
    c.engine.speculation = Speculation({n: 10.0 * n for n in range(1, 10)})  # every row costs one pass
    c.set_buffer("other.py", doc)
    index = c.buffers
    assert index.stats()["indexings"] == 0 and index.pending() == 0 and not index.step()
    assert index.stats()["wanted"] is False and "other.py" not in c.ngram.source_names()
    sug = c.complete(doc, 1, 4, options=DecodeOptions(max_new_tokens=6), cache_key="doc")
    assert sug.completion.stats.drafted == 0 and lookups == []  # not consulted
    assert index.stats()["indexings"] == 0

    c.engine.speculation.set_costs({1: 10.0, 9: 12.0})  # a pass over 9 rows costs little more than one
    assert index.pending() == 1 and index.step() and index.stats()["indexings"] == 1
    assert index.stats()["wanted"] is True and "other.py" in c.ngram.source_names()
    sug = c.complete(doc, 1, 4, options=DecodeOptions(max_new_tokens=6), cache_key="doc2")
    assert len(lookups) >= sug.completion.stats.target_passes - 1 > 0  # on these costs it is (not at the last token)

    # Drafting off (the last request's drafter): nothing to index for.
    c.complete(doc, 1, 4, options=DecodeOptions(max_new_tokens=6), drafter="none", cache_key="doc")
    c.set_buffer("other.py", doc + "x = 1\n")
    assert index.pending() == 0 and not index.step() and index.stats()["indexings"] == 1

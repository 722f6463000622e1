"""Windows that survive editing (lsp_server/completion/context.py): the prompt's leading tokens stay the same.

On a real ~2,000-line source file installed with the venv (torch's nn/modules/conv.py,
found through the package, never downloaded): after Enter at the end of a line, after
typing a new line, after deleting the line above the cursor, and after moving the cursor
up by 1 to 20 lines (and down by one), at least 90% of the new prompt's tokens are a
common prefix with the previous prompt, at 10 positions spread over the file. Checked with
the default model's real tokenizer (marked `model`, skipped when it is not installed) and
with the tiny-random tokenizer (always).
"""

from __future__ import annotations

import random
import threading

import pytest

from lsp_server.completion.context import ContextBudget, Window, build_prompt
from lsp_server.backends.tiny import tiny_random


def real_file() -> str:
    import torch.nn.modules.conv as conv

    with open(conv.__file__, encoding="utf-8") as f:
        return f.read()


TEXT = real_file()
LINES = TEXT.split("\n")
N = len(LINES)
NEW_LINE = "        out = self._conv_forward(input, self.weight, self.bias)"


def positions(first: int = 250, count: int = 10) -> list[int]:
    """Ten cursor lines spread over the file, each with a full window of lines above."""
    return [first + (N - 60 - first) * i // (count - 1) for i in range(count)]


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def edits(line: int) -> list[tuple[str, str, int, int]]:
    """(name, text, line, col) after an edit made with the cursor at the end of `line`."""
    ls = LINES
    out = [
        ("enter", "\n".join(ls[: line + 1] + [""] + ls[line + 1 :]), line + 1, 0),
        ("new line typed", "\n".join(ls[: line + 1] + [NEW_LINE] + ls[line + 1 :]), line + 1, len(NEW_LINE)),
        ("line above deleted", "\n".join(ls[: line - 1] + ls[line:]), line - 1, len(ls[line])),
        ("down 1", TEXT, line + 1, min(len(ls[line]), len(ls[line + 1]))),
    ]
    for d in (1, 2, 5, 10, 15, 20):
        out.append((f"up {d}", TEXT, line - d, min(len(ls[line]), len(ls[line - d]))))
    return out


def check_reuse(lm, budget: ContextBudget, path: str = "torch/nn/modules/conv.py", others=None) -> dict[str, float]:
    worst: dict[str, float] = {}
    for line in positions():
        for name, text, l2, c2 in edits(line):
            w = Window()
            before = build_prompt(lm, TEXT, line, len(LINES[line]), others=others, path=path, budget=budget, window=w)
            after = build_prompt(lm, text, l2, c2, others=others, path=path, budget=budget, window=w)
            assert len(after.ids) <= budget.total
            share = common(before.ids, after.ids) / len(after.ids)
            worst[name] = min(worst.get(name, 1.0), share)
            assert share >= 0.9, (name, line, share, before.start_line, after.start_line)
    return worst


@pytest.fixture(scope="module")
def tiny():
    return tiny_random()


class RealTokenizer:
    """The default model's tokenizer alone (no weights): what the server's prompts are made of."""

    def __init__(self, directory):
        from transformers import AutoTokenizer

        from lsp_server.backends.base import find_fim_tokens

        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.fim = find_fim_tokens(self.tokenizer.get_vocab())

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def real():
    from lsp_server.backends.base import ModelError
    from lsp_server.backends.packaged import DEFAULT_SPEC, PACKAGED
    from lsp_server.backends.torch.loading import converted_packaged

    # On a fresh machine (CI) the README set-up installed the packages but nothing converted them
    # yet: convert here, as loading the model on torch would, rather than skip.
    try:
        directory = converted_packaged(PACKAGED[DEFAULT_SPEC], lambda message, fraction=None: None)
    except ModelError as err:
        pytest.skip(f"the default model is not installed (README set-up): {err}")
    return RealTokenizer(directory)


def test_the_real_file_is_long():
    assert N >= 1500, f"{N} lines: pick another file for this test"


@pytest.mark.model
def test_prompt_prefix_survives_edits_real_tokenizer(real):
    """The server's default budget and the default model's tokenizer."""
    check_reuse(real, ContextBudget())
    # With another open buffer its snippet comes first and is reused too.
    import torch.nn.modules.linear as linear

    with open(linear.__file__, encoding="utf-8") as f:
        check_reuse(real, ContextBudget(), others=[("torch/nn/modules/linear.py", f.read())])


def test_prompt_prefix_survives_edits_tiny_tokenizer(tiny):
    """The tiny tokenizer spends ~2.8x the tokens of the real one on a line of this file: the
    same proportions of the default budget, scaled to hold about as many lines."""
    d = ContextBudget()
    scaled = ContextBudget(total=3 * d.total, above=3 * d.above, below=3 * d.below, snippets=3 * d.snippets)
    check_reuse(tiny, scaled)


def test_window_start_moves_in_coarse_steps_while_typing_down_the_file(tiny):
    """Sixty lines typed one after another: the start moves rarely, at multiples of chunk_lines,
    and between moves every new prompt keeps >= 90% of the previous one; the lines typed stay in
    the middle (after the suffix: a new line costs its own tokens only) until they pass MIDDLE
    tokens, and then the place moves on without moving the start."""
    from lsp_server.completion.context import MIDDLE

    budget = ContextBudget(total=6144, above=4608, below=192, snippets=1056)
    w = Window()
    lines = LINES[:]
    line = positions()[3]
    prev = build_prompt(tiny, "\n".join(lines), line, len(lines[line]), budget=budget, window=w)
    starts = [prev.start_line]
    moved = places = 0
    new_line = len(tiny.encode(NEW_LINE + "\n"))
    for i in range(60):
        lines.insert(line + 1, NEW_LINE)
        line += 1
        middle = w.middle
        p = build_prompt(tiny, "\n".join(lines), line, len(lines[line]), budget=budget, window=w)
        if p.start_line != starts[-1]:
            moved += 1
            assert p.start_line > starts[-1] and p.start_line % budget.chunk_lines == 0
        elif w.middle != middle:  # the place moved on: the prompt is the same up to the old place's suffix
            places += 1
            assert common(prev.ids, p.ids) >= prev.ids.index(tiny.fim.suffix) - MIDDLE
        else:  # Enter at the place: the new line is the only new part
            assert common(prev.ids, p.ids) >= len(prev.ids) - new_line and len(p.ids) == len(prev.ids) + new_line
        starts.append(p.start_line)
        prev = p
    assert 1 <= places <= 60 * new_line // MIDDLE + 1
    typed = 60 * len(tiny.encode(NEW_LINE + "\n"))
    assert 1 <= moved <= typed // budget.room_for_slack() + 1, (moved, typed)
    assert w.anchored == moved + 1


def test_window_follows_the_cursor_far_away_and_back(tiny):
    budget = ContextBudget()
    w = Window()
    a = build_prompt(tiny, TEXT, 1500, 0, budget=budget, window=w)
    assert a.start_line % budget.chunk_lines == 0 and a.start_line < 1500
    b = build_prompt(tiny, TEXT, 400, 0, budget=budget, window=w)  # far above the window: re-anchored
    assert b.start_line < 400 and w.anchored == 2
    c = build_prompt(tiny, TEXT, 1800, 0, budget=budget, window=w)  # far below: re-anchored
    assert 400 < c.start_line < 1800 and w.anchored == 3
    # Near the top of the file the window starts at line 0 and stays there.
    top = Window()
    assert build_prompt(tiny, TEXT, 5, 0, budget=budget, window=top).start_line == 0
    assert build_prompt(tiny, TEXT, 20, 0, budget=budget, window=top).start_line == 0
    assert top.anchored == 1


def test_window_state_never_changes_the_prompt_of_a_given_start(tiny):
    """A Window only chooses where the lines above start and the middle starts; its token cache changes nothing."""
    budget = ContextBudget()
    w = Window()
    for line in (700, 705, 690, 702):
        p = build_prompt(tiny, TEXT, line, 3, budget=budget, window=w)
        fresh = Window(start=p.start_line, middle=w.middle)
        assert build_prompt(tiny, TEXT, line, 3, budget=budget, window=fresh).ids == p.ids


def test_snippets_keep_their_cut_while_this_document_changes(tiny):
    others = [("a.py", "import os\n" + "A = 1\n" * 400), ("b.py", "def b():\n    return 2\n" * 50)]
    budget = ContextBudget()
    w = Window()
    heads = []
    for text, line, col in [(TEXT, 800, 4), (TEXT, 803, 0), ("\n".join(LINES[:800] + [""] + LINES[800:]), 801, 0),
                            (TEXT, 300, 0), ("x = 1\n", 0, 5)]:
        p = build_prompt(tiny, text, line, col, others=others, path="conv.py", budget=budget, window=w)
        heads.append(p.ids[: p.ids.index(tiny.fim.prefix)])
        assert len(p.ids) <= budget.total
    assert all(h == heads[0] for h in heads)
    assert len(heads[0]) <= budget.snippets + 16
    # Another buffer's text changed: the head changes from that snippet on, not before it.
    changed = [others[0], ("b.py", "def b():\n    return 3\n" * 50)]
    p = build_prompt(tiny, TEXT, 800, 4, others=changed, path="conv.py", budget=budget, window=w)
    first = len([1, *tiny.encode(f"a.py\n{others[0][1]}")][: budget.snippets])
    assert p.ids[:first] == heads[0][:first]


@pytest.mark.parametrize("seed", range(4))
def test_the_total_budget_is_never_exceeded(tiny, seed):
    rng = random.Random(seed)
    long_line = "x = [" + ", ".join(str(i) for i in range(3000)) + "]"
    text = "\n".join(LINES[:300] + [long_line] + LINES[300:600])
    lines = text.split("\n")
    for _ in range(30):
        total = rng.choice([64, 128, 300, 1000, 2048])
        b = ContextBudget(total=total, above=rng.randint(0, 2 * total), below=rng.randint(0, total),
                          snippets=rng.randint(0, total), slack=rng.choice([None, 0, 50]), chunk_lines=rng.choice([1, 8, 32]))
        line = rng.randrange(len(lines))
        col = rng.randint(0, len(lines[line]))
        w = Window(start=rng.choice([None, 0, rng.randrange(len(lines))]))
        p = build_prompt(tiny, text, line, col, others=[("o.py", TEXT[:5000])], path="p.py", budget=b, window=w)
        assert len(p.ids) <= total, (total, b)
        assert -1 not in p.ids
        assert lines[line][:col].endswith(tiny.decode(p.ids[p.ids.index(tiny.fim.middle) + 1 :]))


def test_window_follows_its_lines_when_lines_are_added_above_it(tiny):
    """An import added at the top of the file while the cursor is far below: same window text."""
    budget = ContextBudget()
    w = Window()
    before = build_prompt(tiny, TEXT, 1200, 0, budget=budget, window=w)
    assert before.start_line > 0
    grown = "import sys\nimport os\n" + TEXT
    after = build_prompt(tiny, grown, 1202, 0, budget=budget, window=w)
    assert after.start_line == before.start_line + 2 and after.ids == before.ids and w.anchored == 1
    shrunk = "\n".join(LINES[3:])
    again = build_prompt(tiny, shrunk, 1197, 0, budget=budget, window=w)
    assert again.start_line == before.start_line - 3 and again.ids == before.ids


def test_lines_typed_at_a_place_stay_in_its_middle(tiny):
    """Issue 24: after Enter at a place the prefix and the suffix are those of the place's first
    request, the typed lines follow <fim_middle>; moving above the place starts a new one there."""
    budget = ContextBudget()
    w = Window()
    lines = LINES[:]
    at = positions()[2]
    lines.insert(at, "        ")
    build_prompt(tiny, "\n".join(lines), at - 40, 0, path="conv.py", budget=budget, window=w)  # (an earlier place)
    first = build_prompt(tiny, "\n".join(lines), at, 8, path="conv.py", budget=budget, window=w)
    assert w.middle == at  # a jump down is a new place, however few tokens lie between
    middle = first.ids.index(tiny.fim.middle)
    typed = ["        total = 0", "        for x in range(3):", "            total += x"]
    for k, text in enumerate(typed):
        lines[at + k] = text
        lines.insert(at + k + 1, text[:12])
        p = build_prompt(tiny, "\n".join(lines), at + k + 1, 12, path="conv.py", budget=budget, window=w)
        assert p.ids[: middle + 1] == first.ids[: middle + 1]  # prefix, suffix: as at the place's first request
        assert tiny.decode(p.ids[middle + 1 :]) == "\n".join(typed[: k + 1]) + "\n" + text[:12]
        assert w.middle == at
    up = build_prompt(tiny, "\n".join(lines), at - 3, 4, path="conv.py", budget=budget, window=w)
    assert w.middle == at - 3 and tiny.decode(up.ids[up.ids.index(tiny.fim.middle) + 1 :]) == lines[at - 3][:4]
    one_shot = build_prompt(tiny, "\n".join(lines), at + 3, 12, path="conv.py", budget=budget)
    assert tiny.decode(one_shot.ids[one_shot.ids.index(tiny.fim.middle) + 1 :]) == lines[at + 3][:12]


def test_a_line_too_long_to_tokenize_never_enters_the_middle(tiny):
    budget = ContextBudget.default()  # a small budget: such a line stands for fewer tokens than MIDDLE
    w = Window()
    lines = LINES[:]
    at = positions()[2]
    lines.insert(at, "        x = 1")
    build_prompt(tiny, "\n".join(lines), at, 13, budget=budget, window=w)
    lines[at] = "        x = [" + ", ".join(str(i) for i in range(2000)) + "]"  # a paste: one huge line
    lines.insert(at + 1, "        y")
    p = build_prompt(tiny, "\n".join(lines), at + 1, 9, budget=budget, window=w)
    assert -1 not in p.ids and w.middle == at + 1


def test_every_place_below_the_file_head_starts_with_it_and_a_place_above_it_holds_it_once(tiny):
    b = ContextBudget.scaled(256)
    assert b.file_head == 64 and b.above == 192 - 64  # the head is taken from the lines above
    prompts = [build_prompt(tiny, TEXT, line, 0, path="conv.py", budget=b, window=Window(), heal="token")
               for line in (300, 900, 1500)]
    stable = prompts[0].stable
    head = tiny.decode(stable[stable.index(tiny.fim.prefix) + 1:])
    assert head.startswith("import math\n") and "mypy" not in head  # its first lines after the leading comment
    assert len(tiny.encode(head)) <= b.file_head
    for p in prompts:
        assert p.stable == stable and p.ids[: len(stable)] == stable and p.stable_end == head.count("\n") + 1
        assert p.start_line > p.stable_end  # the window starts far below: the head is not in it
    for line in range(1, 16):  # near the top the window holds some of the head's lines: never twice
        near = build_prompt(tiny, TEXT, line, 0, path="conv.py", budget=b, window=Window(), heal="token")
        shown = tiny.decode(near.ids)
        assert shown.count("import math\n") == 1 and shown.count("from typing import Literal\n") <= 1, line
        assert near.stable == stable  # (the head every place below it starts with: what idle prefill warms up here)


def test_idle_prefill_at_the_top_warms_the_file_head_that_a_new_place_reuses(tiny):
    from lsp_server.completion.completer import Completer, CompleterSettings
    from lsp_server.decoding.types import DecodeOptions

    c = Completer(tiny, settings=CompleterSettings(drafter="none"))
    st = c.warm(TEXT, 0, 0, name="conv.py", cache_key="conv.py")  # didOpen aims at the top
    top = c.prompt_for(TEXT, 0, 0, name="conv.py", cache_key="conv.py")
    assert st.prefill_tokens == len(top.stable) > len(top.ids)  # the head, not the short prompt at the top
    # Idle work does not go on to generate at line 1 (Completer.ahead): its prompt would evict the head.
    hold = threading.Event()
    assert not c.ahead(TEXT, 0, 0, name="conv.py", options=DecodeOptions(first_answer_s=1.0), cache_key="conv.py",
                       hold=hold)
    assert c.engine.cached_ids("conv.py") == top.stable
    s = c.complete(TEXT, 1200, 8, name="conv.py", cache_key="conv.py", options=DecodeOptions(max_new_tokens=2))
    assert s.prompt.ids[: len(top.stable)] == top.stable
    assert s.completion.stats.reused_tokens == len(top.stable)  # a new place pays its own lines only
    # A place asked up in the head keeps its cache: idle prefill aimed there warms its prompt, not the head.
    near = c.complete(TEXT, 3, 0, name="conv.py", cache_key="conv.py", options=DecodeOptions(max_new_tokens=2))
    assert c.warm(TEXT, 3, 0, name="conv.py", cache_key="conv.py").prefill_tokens == 0
    assert c.engine.cached_ids("conv.py")[: len(near.prompt.ids) - 1] == near.prompt.ids[:-1]

"""The prompt's definitions and recent edits (lsp_server/completion/extras.py, context.py's layout):
after the file's head, before `[repeat]` and the lines above, within their shares, in place of tokens
at the window's top, and chosen when a place is new and kept while it stays, so the prompt's ids before
the middle do not change while the user types at a place."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lsp_server.backends.tiny import tiny_random
from lsp_server.completion.context import ContextBudget, Window, build_prompt
from lsp_server.completion.extras import PromptExtras, section_lines

HEAD = "import os\nfrom store import open_store\n\n\n"
BODY = "".join(f"value_{i} = compute_value({i}, factor={i % 7})\n" for i in range(120))
DOC = HEAD + BODY + "def main():\n    store = open_store('x')\n    items = store.get_items('k')\n    \n"
LINE = DOC.count("\n") - 1  # the last line, "    "
DEFS = ("# store.py: def open_store(path: str) -> Store: ...\n"
        "# store.py: class Store: def get_items(self, key: str) -> list[Item]: ...\n"
        '#     """Items stored under key."""\n')
EDITS = "# edit in store.py:\n# - def get(self, key):\n# + def get_items(self, key: str) -> list[Item]:\n"
EXTRAS = PromptExtras(DEFS, EDITS)
BUDGET = ContextBudget(total=1024, above=640, below=32, snippets=0, file_head=48, definitions=160, edits=96)


@pytest.fixture(scope="module")
def lm():
    return tiny_random()


def prefix_text(lm, ids: list[int]) -> str:
    """What the prompt holds between <fim_prefix> and <fim_suffix>."""
    return lm.decode(ids[ids.index(lm.fim.prefix) + 1 : ids.index(lm.fim.suffix)])


def test_the_sections_sit_after_the_head_and_before_the_lines_above(lm):
    p = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=Window(), extras=EXTRAS)
    text = prefix_text(lm, p.ids)
    head = "import os\nfrom store import open_store\n"
    assert text.startswith(head)
    rest = text[len(head):]
    defs_at, edits_at = rest.index("# store.py: def open_store"), rest.index("# edit in store.py:")
    assert not rest[:defs_at].strip() and edits_at > defs_at  # the head, the definitions, the edits ...
    assert rest.index("value_") > edits_at  # ... then the window above
    assert p.sections["definitions"] == len(lm.encode(DEFS)) and p.sections["edits"] > 0
    assert p.sections["file_head"] > 0 and p.start_line > 4


def test_the_prompt_knows_the_section_lines_it_wrote_and_only_those(lm):
    p = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=Window(), extras=EXTRAS)
    assert p.written == {line.strip() for line in (DEFS + EDITS).splitlines()}
    small = replace(BUDGET, definitions=len(lm.encode(DEFS.split("\n")[0] + "\n")) + 3, edits=8)
    q = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=small, window=Window(), extras=EXTRAS)
    assert q.written == {DEFS.split("\n")[0]}  # the first definition only; no edit fits
    none = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=Window())
    assert none.written == frozenset()


def test_each_section_takes_whole_lines_within_its_share(lm):
    small = replace(BUDGET, definitions=len(lm.encode(DEFS.split("\n")[0] + "\n")) + 3, edits=8)
    p = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=small, window=Window(), extras=EXTRAS)
    text = prefix_text(lm, p.ids)
    assert "def open_store" in text and "get_items(self" not in text  # the first line only
    assert "# edit in" not in text and p.sections["edits"] == 0  # not even one whole line fits 8 tokens
    header = len(lm.encode(EDITS.split("\n")[0] + "\n"))
    q = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=replace(small, edits=header + 5), window=Window(),
                     extras=EXTRAS)
    assert q.sections["edits"] == 0  # the header fits, its lines do not: a hunk is whole or not there
    assert p.sections["definitions"] <= small.definitions
    lines = section_lines(lm.encode, DEFS, 10_000)
    assert [t for ids in lines for t in ids] == [t for line in DEFS.splitlines(keepends=True) for t in lm.encode(line)]


def test_the_sections_take_the_place_of_lines_at_the_window_top(lm):
    plain = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=Window())
    p = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=Window(), extras=EXTRAS)
    assert len(p.ids) <= len(plain.ids) <= BUDGET.total  # a new place costs no more than it did
    assert p.start_line > plain.start_line  # the lines at the top made room
    assert p.ids[p.ids.index(lm.fim.suffix):] == plain.ids[plain.ids.index(lm.fim.suffix):]  # the rest is the same
    assert sum(p.sections.values()) + 3 == len(p.ids)  # (<fim_prefix>, <fim_suffix>, <fim_middle>)


def test_no_share_or_nothing_offered_is_the_prompt_without_them(lm):
    plain = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=Window())
    none = replace(BUDGET, definitions=0, edits=0)
    assert build_prompt(lm, DOC, LINE, 4, path="app.py", budget=none, window=Window(), extras=EXTRAS).ids == \
        build_prompt(lm, DOC, LINE, 4, path="app.py", budget=none, window=Window()).ids
    assert build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=Window(),
                        extras=PromptExtras()).ids == plain.ids


def test_typing_at_a_place_never_changes_the_ids_before_the_middle(lm):
    w = Window()
    p = build_prompt(lm, DOC, LINE, 4, path="app.py", budget=BUDGET, window=w, extras=EXTRAS)
    cut = p.ids.index(lm.fim.middle)
    newer = PromptExtras("# other.py: def unrelated() -> None: ...\n", "# edit in other.py:\n# + x = 1\n")
    typed = DOC[:-1] + "for item in it\n"
    q = build_prompt(lm, typed, LINE, 18, path="app.py", budget=BUDGET, window=w, extras=newer)
    assert q.ids[:cut] == p.ids[:cut]  # typed on the line: newer sections wait for a new place
    entered = DOC[:-1] + "for item in items:\n        \n"
    r = build_prompt(lm, entered, LINE + 1, 8, path="app.py", budget=BUDGET, window=w, extras=newer)
    assert r.ids[:cut] == p.ids[:cut]  # Enter: the line goes to the middle, the place stays
    assert "unrelated" not in lm.decode(r.ids)
    # A new place (the cursor moved up, the text after it is another) takes the newer ones.
    s = build_prompt(lm, DOC, LINE - 2, 4, path="app.py", budget=BUDGET, window=w, extras=newer)
    assert "def unrelated" in prefix_text(lm, s.ids) and "open_store(path" not in prefix_text(lm, s.ids)


def test_a_short_window_keeps_half_its_tokens_and_cuts_the_edits_first(lm):
    doc = HEAD + "def main():\n" + "".join(f"    store_{i} = open_store('x{i}')\n" for i in range(7)) + "    \n"
    line = doc.count("\n") - 1
    budget = replace(BUDGET, file_head=0)
    plain = build_prompt(lm, doc, line, 4, path="app.py", budget=budget, window=Window())
    p = build_prompt(lm, doc, line, 4, path="app.py", budget=budget, window=Window(), extras=EXTRAS)
    assert plain.start_line == 0 < p.start_line and p.sections["definitions"] > 0
    assert p.sections["above"] * 2 >= plain.sections["above"]  # the window keeps at least half its tokens
    assert p.sections["edits"] == 0 and p.sections["definitions"] < len(lm.encode(DEFS))  # the edits went first
    # The lines that made room hold what the sections took and no more than one line beyond it.
    taken = plain.sections["above"] - p.sections["above"]
    assert p.sections["definitions"] <= taken < p.sections["definitions"] + 24
    assert len(p.ids) <= len(plain.ids)


def test_the_shares_scale_with_the_budget():
    b = ContextBudget.scaled(384, definitions=0.2, edits=0.1)
    assert (b.definitions, b.edits) == (76, 38)
    assert (ContextBudget.scaled(384).definitions, ContextBudget.scaled(384).edits) == (0, 0)

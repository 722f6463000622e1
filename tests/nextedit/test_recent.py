"""The recent edits as the prompt's comment lines (lsp_server/nextedit/recent.py): whole changed lines
before and after, most recent first, only those that share a name with the lines around the cursor,
none from the cursor's own window, none that changed whitespace alone or were too large to keep, capped."""

from __future__ import annotations

import itertools

from lsp_server.nextedit.history import EditHistory
from lsp_server.nextedit.recent import Limits, hunk, recent_edits


class Doc:
    """A text and its history, changed as an editor sends changes, at increasing clock times."""

    clock = itertools.count(1)

    def __init__(self, name: str, text: str):
        self.name, self.text = name, text
        self.h = EditHistory(clock=lambda: float(next(Doc.clock)))

    def replace(self, old: str, new: str) -> None:
        start = self.text.index(old)
        self.text = self.text[:start] + new + self.text[start + len(old):]
        self.h.record(start, start + len(old), new, old)

    def entry(self, skip=None):
        return (self.name, self.text, self.h.groups(), skip)


STORE = ("class Store:\n    def get(self, key):\n        return self.items[key]\n\n"
         "    def size(self):\n        return 0\n")
NEAR = "    store = open_store(path)\n    items = store.get_items(key)\n"


def test_a_renamed_method_is_one_hunk_of_whole_lines():
    d = Doc("store.py", STORE)
    d.replace("def get(self, key)", "def get_items(self, key: str)")
    assert recent_edits([d.entry()], NEAR) == ("# edit in store.py:\n# - def get(self, key):\n"
                                               "# + def get_items(self, key: str):\n")


def test_only_edits_that_share_a_name_with_the_lines_around_the_cursor():
    d = Doc("store.py", STORE)
    d.replace("def size(self)", "def count(self)")  # nothing around the cursor names size or count
    assert recent_edits([d.entry()], NEAR) == ""
    assert recent_edits([d.entry()], "    n = store.count()\n").startswith("# edit in store.py:\n# - def size(self):")
    assert recent_edits([d.entry()], "    if self:\n        return\n") == ""  # keywords and self say nothing


def test_most_recent_first_and_capped():
    a, b = Doc("a.py", "x_items = 1\ny_items = 2\nz_items = 3\n"), Doc("b.py", "w_items = 0\n")
    a.replace("x_items = 1", "x_items = 10")
    b.replace("w_items = 0", "w_items = 5")
    a.replace("z_items = 3", "z_items = 30")
    near = "print(x_items, w_items, z_items)\n"
    text = recent_edits([a.entry(), b.entry()], near)
    assert [line for line in text.splitlines() if line.startswith("# +")] == \
        ["# + z_items = 30", "# + w_items = 5", "# + x_items = 10"]
    text = recent_edits([a.entry(), b.entry()], near, Limits(hunks=2))
    assert text.count("# edit in") == 2 and "x_items = 10" not in text


def test_the_cursors_window_whitespace_and_large_edits_are_left_out():
    d = Doc("app.py", "def main():\n    items = store.get_items(key)\n    return items\n")
    d.replace("return items", "return list(items)")
    start = d.text.index("    return")
    assert recent_edits([d.entry(skip=(start, start + 10))], NEAR) == ""  # in the cursor's own window
    assert "list(items)" in recent_edits([d.entry()], NEAR)
    w = Doc("w.py", "items = store.get_items(key)\n")
    w.replace("items = store", "items  =  store")
    assert recent_edits([w.entry()], NEAR) == ""  # whitespace alone
    big = Doc("big.py", "items = 1\n")
    big.replace("items = 1", "items = [" + "1, " * 3000 + "]")
    assert big.h.groups()[0].large and recent_edits([big.entry()], NEAR) == ""


def test_lines_per_side_and_characters_per_line_are_capped():
    d = Doc("s.py", "".join(f"item_{i} = {i}\n" for i in range(10)))
    d.replace("".join(f"item_{i} = {i}\n" for i in range(10)), "".join(f"item_{i} = {i * 2}\n" for i in range(10)))
    text = recent_edits([d.entry()], "print(item_1)\n", Limits(lines=2, line_chars=10))
    lines = text.splitlines()
    assert sum(line.startswith("# -") for line in lines) == 2 and sum(line.startswith("# +") for line in lines) == 2
    assert all(len(line) <= 10 + 4 for line in lines[1:])


def test_a_deletion_and_an_insertion_have_one_side():
    d = Doc("s.py", "first_item = 1\nsecond_item = 2\n")
    d.replace("second_item = 2\n", "")
    g = d.h.groups()[0]
    h = hunk("s.py", d.text, g)
    assert h.old == ("second_item = 2",) and h.new == () or (h.old, h.new) == (("second_item = 2", ""), ("",))
    text = recent_edits([d.entry()], "print(second_item)\n")
    assert "# - second_item = 2" in text and "# +" not in text
    i = Doc("i.py", "first_item = 1\n")
    i.replace("first_item = 1\n", "first_item = 1\nthird_item = 3\n")
    assert recent_edits([i.entry()], "third_item\n").endswith("# + third_item = 3\n")

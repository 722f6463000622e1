"""Edit propagation: the user's change learnt from their typing and proposed where it still applies, and
nothing where it does not."""

from __future__ import annotations

from lsp_server.nextedit.history import EditHistory
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.types import position

from tests.nextedit.test_history import Doc


def edit_once(text: str, old: str, new: str, occurrence: int = 0) -> Doc:
    """`text` with the `occurrence`-th `old` turned into `new` as typed: selected, deleted, typed."""
    d = Doc(text)
    i = -1
    for _ in range(occurrence + 1):
        i = d.text.index(old, i + 1)
    d.change(i, i + len(old), "")
    d.type(i, new)
    return d


def propose(d: Doc, others=()):
    cursor = d.h.last().end
    return Propagator().propose(d.h.groups(), "a.py", d.text, cursor, list(others))


def applied(d: Doc, e) -> str:
    assert e.uri == "a.py"
    return e.apply(d.text)


SRC = '''import os


class KeepOpenFile:
    pass


def open_stream(path):
    stream = KeepOpenFile(path)
    return stream


def other(path):
    handle = KeepOpenFile(path)
    return KeepOpenFile(handle)
'''


def test_a_rename_goes_to_the_next_place_and_its_whole_line():
    d = edit_once(SRC, "KeepOpenFile", "_KeepOpenFile")  # the class statement
    e = propose(d)
    assert e.source == "propagate" and "KeepOpenFile" in e.why
    assert position(d.text, e.start)[0] == 8  # the nearest below: `stream = KeepOpenFile(path)`
    after = applied(d, e)
    assert "stream = _KeepOpenFile(path)" in after
    d.change(e.start, e.end, e.new_text)  # accepted: the next one is in `other`, both on one line at its second
    e = propose(d)
    assert position(d.text, e.start)[0] == 13
    d.change(e.start, e.end, e.new_text)
    e = propose(d)
    assert position(d.text, e.start)[0] == 14 and "return _KeepOpenFile(handle)" in applied(d, e)
    d.change(e.start, e.end, e.new_text)
    assert propose(d) is None  # done: no old name is left


def test_moving_up_proposes_above_first():
    d = Doc("a = fetch_items(1)\nb = fetch_items(2)\nc = fetch_items(3)\nd = fetch_items(4)\n")
    for line in (3, 2):  # the user renamed on line 4, then on line 3: they are going up
        i = d.text.split("\n")[line].index("fetch_items") + sum(len(x) + 1 for x in d.text.split("\n")[:line])
        d.change(i, i + len("fetch_items"), "load_items")
    e = propose(d)
    assert position(d.text, e.start)[0] == 1


def test_a_changed_argument_with_its_context():
    text = "x = call(value, 1)\ny = other(3)\nz = call(value, 1)\n"
    d = edit_once(text, "value, 1", "value, timeout=1")
    e = propose(d)
    assert applied(d, e).splitlines()[2] == "z = call(value, timeout=1)"


def test_an_annotation_added_on_a_sibling_line():
    text = "class A(Error):\n    exit_code = 1\n\n\nclass B(Error):\n    exit_code = 2\n"
    d = Doc(text)
    d.type(d.text.index(" = 1"), ": t.ClassVar[int]")
    e = propose(d)
    assert applied(d, e).splitlines()[5] == "    exit_code: t.ClassVar[int] = 2"


def test_a_changed_call_shape_on_a_sibling_line():
    text = ("def t(response):\n    parts = [part for part in response.iter_bytes()]\n"
            "    x = 1\n    chunks = [part for part in response.iter_bytes()]\n")
    d = Doc(text)
    old = "[part for part in response.iter_bytes()]"
    i = d.text.index(old)
    d.change(i, i + len(old), "")
    d.type(i, "list(response.iter_bytes())")
    e = propose(d)
    assert applied(d, e).splitlines()[3] == "    chunks = list(response.iter_bytes())"


def test_deleted_lines_are_deleted_where_they_stand_again():
    text = ("def a():\n    # TODO remove the fallback\n    return 1\n\n\n"
            "def b():\n    # TODO remove the fallback\n    return 2\n")
    d = Doc(text)
    i = d.text.index("    # TODO")
    d.change(i, i + len("    # TODO remove the fallback\n"), "")
    e = propose(d)
    assert applied(d, e) == "def a():\n    return 1\n\n\ndef b():\n    return 2\n"


CALLS = """def make(a, b):
    return Config(
        name=a,
        path=b,
    )


class Factory:
    def make(self, a, b):
        return Config(
            name=a,
            path=b,
        )
"""


def test_inserted_lines_go_where_their_neighbours_stand_together_again():
    d = Doc(CALLS)
    d.type(d.text.index("        path=b"), "        strict=True,\n")  # typed at the start of the line below
    e = propose(d)
    assert e.why.startswith("insert lines")
    # At the end of the line above, as new lines after it (how editors draw new lines below a line).
    assert e.start == e.end and d.text[e.start] == "\n" and e.new_text == "\n            strict=True,"
    assert applied(d, e) == CALLS.replace("name=a,\n", "name=a,\n        strict=True,\n", 1).replace(
        "            path=b,", "            strict=True,\n            path=b,")  # indented as the line below there


def test_inserted_lines_whose_neighbours_stand_together_often_go_nowhere():
    block = "    return Config(\n        name=a,\n        path=b,\n    )\n"
    d = Doc("".join(f"def make{i}(a, b):\n{block}\n\n" for i in range(5)))  # the user's place and four more
    d.type(d.text.index("        path=b"), "        strict=True,\n")
    assert propose(d) is None


def test_new_code_and_a_one_off_fix_propose_nothing():
    text = "import os\n\n\ndef f(x):\n    return x\n\n\ndef g(y):\n    return y\n"
    d = Doc(text)
    d.type(d.text.index("\n\n\ndef g") + 1, "LIMIT = 3\n")  # a new line
    assert propose(d) is None
    d = edit_once("total = compte(a)\nprint(total)\n", "compte", "compute")  # a typo fixed where it was
    assert propose(d) is None


def test_plain_words_need_context_and_values_are_data():
    text = "a = text\nb = 2\nprint(text)\n"
    assert propose(edit_once(text, "text", "label")) is None  # `text` is a plain word: no context agrees
    text = "check(flag=True, mode=1)\ncheck(flag=True, mode=2)\n"
    assert propose(edit_once(text, "True", "False")) is None  # one value for another: data


def test_an_attribute_is_not_the_name_and_a_string_not_the_code():
    text = ("a = self.value + offset\nb = value + offset\nc = 'self.value + offset'\n"
            "d = self.value + offset\n")
    d = edit_once(text, "self.value + offset", "self.amount + offset")
    e = propose(d)
    assert position(d.text, e.start)[0] == 3  # not the plain name on line 2, not the string on line 3
    assert applied(d, e).splitlines()[3] == "d = self.amount + offset"


def test_an_insertion_is_not_made_where_it_already_stands():
    text = '__all__ = ["Auth", "BasicAuth", "DigestAuth", "NetRCAuth"]\n'
    d = edit_once(text, '"DigestAuth", ', '"DigestAuth", "FunctionAuth", ')
    assert propose(d) is None


def test_a_line_holding_only_part_of_the_edit_is_not_proposed():
    text = "x = load(a, b)\ny = load(c, b)\nz = load(a, d)\n"
    d = Doc(text)
    i = d.text.index("load(a, b)")
    d.change(i, i + len("load(a, b)"), "")
    d.type(i, "fetch(a, b=b)")  # two changes in one edit: load -> fetch and b -> b=b
    e = propose(d)
    assert e is None or applied(d, e).splitlines()[1] == "y = fetch(c, b=b)"


def test_a_distinctive_rename_goes_on_in_the_other_open_files():
    d = edit_once("def get_binary_stream(name):\n    pass\n", "get_binary_stream", "_get_binary_stream")
    others = [("b.py", "x = 1\n"), ("c.py", "s = get_binary_stream('x')\nget_binary_stream\n")]
    e = propose(d, others)
    assert e.uri == "c.py" and e.apply(others[1][1]).startswith("s = _get_binary_stream('x')")
    # A rename where it is used (an import, a call) carries over only where a neighbour agrees.
    d = edit_once("from .utils import get_binary_stream\n", "get_binary_stream", "_get_binary_stream")
    assert propose(d, others) is None
    assert propose(d, [("c.py", "from .utils import get_binary_stream as s\n")]).uri == "c.py"
    d = edit_once("count = 1\n", "count = 1", "total = 1")  # a plain word: not in other files
    assert propose(d, [("c.py", "x = count = 2\n")]) is None


def test_a_history_the_text_does_not_agree_with_teaches_nothing():
    h = EditHistory()
    h.record(0, 3, "bar", "foo")
    assert Propagator().propose(h.groups(), "a.py", "xyz = foo\n", 3) is None


def test_an_older_edit_a_few_lines_up_is_another_edit():
    """An argument added, then a rename a few lines below (within a few hundred characters): the rename
    is learnt alone, so its next place on its own line is proposed (as one edit with the argument, a
    line would need both changes)."""
    text = ("def first(path):\n    value = read_config(path)\n    return value\n\n\n"
            "def second(path):\n    return OpenMode(path) or OpenMode(None)\n")
    d = Doc(text)
    d.type(text.index("path)\n    return value") + len("path"), ", timeout")
    i = d.text.index("OpenMode")
    d.change(i, i + len("OpenMode"), "")
    d.type(i, "ClosedMode")
    e = propose(d)
    assert e is not None and "ClosedMode" in e.why
    assert applied(d, e).endswith("    return ClosedMode(path) or ClosedMode(None)\n")


LOOSE = "def kind(ty):\n    if ty is str or ty is None:\n        return 1\n    if ty is int:\n        return 2\n"


def test_looser_rules_find_what_the_strict_ones_refuse():
    """A plain name (`ty`) needs three agreeing tokens around it; `if ty is int` has two. The loose rules
    (one token, for a proposer that judges each place: judge.py) propose it; the strict ones do not."""
    d = edit_once(LOOSE, "if ty is str or ty is None", "if guessed is str or guessed is None")
    assert propose(d) is None
    e = Propagator(loose=True).propose(d.h.groups(), "a.py", d.text, d.h.last().end)
    assert e is not None and applied(d, e) == LOOSE.replace("if ty is", "if guessed is").replace(
        "or ty is", "or guessed is")
    assert "def kind(ty)" in applied(d, e)  # no neighbour agrees there: not even the loose rules take it

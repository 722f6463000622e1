"""The resolver of the prompt's definitions (lsp_server/completion/definitions.py), in this process on a
temporary workspace: a package with a class and functions, and a call site. What it writes, what it
leaves out, its caps, and bad input: no error and no stall (the loop's process and timeout are
tests/lsp/test_definitions_jobs.py's)."""

from __future__ import annotations

import os
import textwrap

import pytest

from lsp_server.completion import definitions
from lsp_server.completion.definitions import Request, cap_text, resolve


@pytest.fixture(autouse=True)
def time_enough(monkeypatch):
    """What a look-up writes, not how far it gets in 3 s: beside a CPU-heavy job, SOFT_LIMIT_S once cut a
    test's answer short of the item it checked. The cut itself is tested below, set to 0."""
    monkeypatch.setattr(definitions, "SOFT_LIMIT_S", 600.0)


STORE = textwrap.dedent('''\
    """Storage of items."""
    from dataclasses import dataclass

    DEFAULT_LIMIT = 100  # items kept per key: the comment is not written


    @dataclass
    class Item:
        """One stored item."""
        key: str
        value: int


    class Store:
        """A store of items by key.

        Kept in memory.
        """

        kind = "memory"

        def __init__(self, path: str, limit: int = DEFAULT_LIMIT):
            self.path = path
            self.items: dict[str, list[Item]] = {}

        def get_items(self, key: str) -> list[Item]:
            """Items stored under key."""
            return self.items.get(key, [])

        async def put(self, key: str,  # the key: a name
                      item: Item) -> None:
            self.items.setdefault(key, []).append(item)

        def _private(self):
            pass


    def open_store(path: str) -> Store:
        """Open the store at path."""
        return Store(path)
    ''')

APP = textwrap.dedent('''\
    import os
    from pkg.store import open_store, Item, Store, DEFAULT_LIMIT


    def helper(x):
        return x * 2


    def main():
        store = open_store("x")
        items = store.get_items("k")
        print(len(items), DEFAULT_LIMIT, helper(3))
        store.put("k", Item("k", 1))
        os.path.join("a", "b")
        local = Store("y")
        ''')


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "store.py").write_text(STORE)
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


def at_end(root, text=APP, path="app.py", **kw) -> definitions.Resolved:
    line = text.count("\n") - 1 if text.endswith("\n") else text.count("\n")
    return resolve(Request(str(root / path), text, line, str(root), **kw))


def test_functions_classes_and_constants_used_around_the_cursor_are_written_compactly(workspace):
    r = at_end(workspace)
    assert r.error is None and r.items > 0
    lines = r.text.splitlines()
    assert "# pkg/store.py: def open_store(path: str) -> Store: ..." in lines
    assert "# pkg/store.py: class Store: def get_items(self, key: str) -> list[Item]: ..." in lines
    assert '#     """Items stored under key."""' in lines  # the docstring's first line, after its function
    assert lines[lines.index("# pkg/store.py: class Store: def get_items(self, key: str) -> list[Item]: ...") + 1] \
        == '#     """Items stored under key."""'
    assert "# pkg/store.py: class Store: async def put(self, key: str, item: Item) -> None: ..." in lines  # joined
    item = next(line for line in lines if line.startswith("# pkg/store.py: class Item"))
    assert "__init__(key: str, value: int)" in item and "key" in item
    store = next(line for line in lines if line.startswith("# pkg/store.py: class Store:") and "get_items," in line)
    assert "__init__(path: str" in store and "put" in store and "kind" in store and "_private" not in store
    assert "# pkg/store.py: DEFAULT_LIMIT = 100" in lines
    assert all(line.startswith("#") for line in lines) and r.text.endswith("\n")


def test_builtins_the_standard_library_modules_and_the_window_itself_are_left_out(workspace):
    text = at_end(workspace).text
    assert "def len(" not in text and "def print(" not in text  # builtins
    assert "join(" not in text  # os.path: the standard library
    assert "helper" not in text  # defined in the lines around the cursor
    assert "store = open_store" not in text and "local =" not in text  # nor the window's own assignments
    # A definition of this file outside the window is written, named by the file.
    far = APP.replace("def main():", "".join(f"v{i} = {i}\n" for i in range(40)) + "def main():")
    assert "# app.py: def helper(x): ..." in at_end(workspace, far).text.splitlines()


def test_the_nearest_use_comes_first_and_the_caps_hold(workspace, monkeypatch):
    lines = at_end(workspace).text.splitlines()
    assert "class Store(" in lines[0] or lines[0].startswith("# pkg/store.py: class Store:")  # `Store("y")`: last line
    monkeypatch.setattr(definitions, "MAX_ITEMS", 2)
    assert at_end(workspace).items == 2
    monkeypatch.setattr(definitions, "MAX_ITEMS", 8)
    monkeypatch.setattr(definitions, "MAX_CHARS", 100)
    r = at_end(workspace)
    assert 0 < len(r.text) <= 100
    monkeypatch.setattr(definitions, "MAX_CHARS", 1600)
    monkeypatch.setattr(definitions, "SOFT_LIMIT_S", 0.0)  # past its time: the items found so far, at least one
    r = at_end(workspace)
    assert r.partial and r.items == 1
    monkeypatch.setattr(definitions, "SOFT_LIMIT_S", 600.0)
    assert not at_end(workspace).partial
    monkeypatch.setattr(definitions, "MAX_LINE", 40)
    assert all(len(line) <= 40 for line in at_end(workspace).text.splitlines())


def test_a_file_that_does_not_parse_gives_what_can_be_read_and_no_error(workspace):
    broken = APP + "    if (store.get_items(\n        def ((( :\n"
    r = at_end(workspace, broken)
    assert r.error is None or isinstance(r.error, str)
    assert "get_items" in r.text  # jedi reads past the broken lines


def test_binary_text_gives_nothing(workspace):
    r = at_end(workspace, "\x00\x01\x02ELF\x00" * 100)
    assert r.text == "" and r.error == "binary"


def test_a_workspace_root_that_does_not_exist_and_no_root(workspace, tmp_path):
    missing = tmp_path / "gone"
    r = resolve(Request(str(workspace / "app.py"), APP, APP.count("\n") - 1, str(missing)))
    assert r.error is None and "def open_store" in r.text  # the file's own folder serves
    r = resolve(Request(str(missing / "x.py"), APP, APP.count("\n") - 1, None))
    assert r.error is None  # nothing to find, nothing raised


def test_a_symlink_loop_in_the_workspace_does_not_stall(workspace):
    os.symlink(workspace, workspace / "pkg" / "loop")
    os.symlink(workspace / "pkg", workspace / "pkg" / "again")
    r = at_end(workspace)
    assert r.error is None and "def open_store" in r.text


def test_jedi_raising_anything_is_an_empty_answer(workspace, monkeypatch):
    import jedi

    class Broken:
        def __init__(self, *args, **kwargs):
            raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(jedi, "Script", Broken)
    r = at_end(workspace)
    assert r.text == "" and r.error.startswith("RecursionError")


def test_one_name_jedi_cannot_follow_leaves_the_others(workspace, monkeypatch):
    from jedi.api.classes import Name

    real = Name.goto

    def goto(self, **kwargs):
        if self.name == "open_store":
            raise ValueError("cannot follow")
        return real(self, **kwargs)

    monkeypatch.setattr(Name, "goto", goto)
    r = at_end(workspace)
    assert "get_items" in r.text and "def open_store" not in r.text and "ValueError" in r.error


def test_a_huge_document_is_cut_to_its_head_and_the_lines_around_the_cursor(workspace):
    body = "".join(f"value_{i} = {i}  # filler line number {i}\n" for i in range(20_000))
    long_line = "data = [" + "1, " * 100_000 + "]\n"
    text = APP.split("def main")[0] + long_line + body + "def main" + APP.split("def main")[1]
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    line = text.count("\n") - 1
    sent, at = cap_text(text, starts, line)
    assert len(sent) <= 200 * 400 + 101 * 400 and sent.split("\n")[at] == text.split("\n")[line]
    assert sent.startswith("import os\nfrom pkg.store import") and "1, 1, 1" not in sent  # the long line sent empty
    assert cap_text(APP, [0], 3) == (APP, 3)  # a small one goes whole
    r = resolve(Request(str(workspace / "app.py"), sent, at, str(workspace)))
    assert "def open_store" in r.text


def test_the_debug_delay_sleeps_first(workspace, monkeypatch):
    slept = []
    monkeypatch.setattr(definitions.time, "sleep", slept.append)
    at_end(workspace, delay_s=0.5)
    assert slept == [0.5]


def test_a_truncated_parse_cache_is_a_miss_and_written_again_whole(workspace, monkeypatch):
    """parso pickles what it parses; a pickle cut short (a job killed mid-write, two servers writing one
    module) made every later job raise EOFError, for this server and the next (definitions.py
    `parso_cache`). Every pickle in the cache cut in half: the answer is the same, and what was read again is whole again."""
    import glob
    import pickle

    import jedi.settings
    import parso.cache

    monkeypatch.setattr(definitions, "SOFT_LIMIT_S", 600.0)  # (parsing again is slower: never a partial answer)
    first = at_end(workspace)
    assert first.error is None and first.items > 0
    assert jedi.settings.cache_directory.endswith(os.path.join("ditto", "jedi"))  # Ditto's own, not jedi's shared one
    pickles = glob.glob(os.path.join(jedi.settings.cache_directory, "**", "*.pkl"), recursive=True)
    assert pickles
    for path in pickles:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    parso.cache.parser_cache.clear()  # read from disk again, as a new process would
    again = at_end(workspace)
    assert (again.error, again.text) == (None, first.text)
    whole = 0
    for path in glob.glob(os.path.join(jedi.settings.cache_directory, "**", "*.pkl"), recursive=True):
        try:
            with open(path, "rb") as f:
                pickle.load(f)
            whole += 1
        except (EOFError, pickle.UnpicklingError):
            pass  # (a module this job did not read again stays as it was, a miss when read)
    assert whole > 0  # those read again were removed and written again whole
    assert not glob.glob(os.path.join(jedi.settings.cache_directory, "**", "*.tmp"), recursive=True)

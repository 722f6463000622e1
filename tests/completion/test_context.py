"""Prompt layout and ghost-text stop rules (text level; the tiny model only tokenizes)."""

import pytest

from lsp_server.completion.completer import Completer
from lsp_server.completion.context import Prompt, build_prompt, split_at
from lsp_server.completion.stops import finish, ghost_cut
from lsp_server.decoding.types import DecodeOptions
from lsp_server.backends.tiny import tiny_random

DOC = "def f(x):\n    y = x + 1\n    return y\n\nprint(f(2))\n"


@pytest.fixture(scope="module")
def lm():
    return tiny_random()


def test_split_at_positions_and_errors():
    above, typed, after, below = split_at(DOC, 1, 8)
    assert above == "def f(x):\n"
    assert typed == "    y = "
    assert after == "x + 1"
    assert below.startswith("\n    return y")
    assert split_at("", 0, 0) == ("", "", "", "")
    with pytest.raises(ValueError, match="line 9"):
        split_at(DOC, 8, 0)
    with pytest.raises(ValueError, match="column 40"):
        split_at(DOC, 1, 39)


def test_fim_layout_puts_the_typed_text_last(lm):
    from lsp_server.completion.context import ContextBudget

    p = build_prompt(lm, DOC, 1, 8, budget=ContextBudget.scaled(320))  # room for all the lines below
    fim = lm.fim
    ids = p.ids
    assert ids.index(fim.prefix) < ids.index(fim.suffix) < ids.index(fim.middle)
    middle_at = ids.index(fim.middle)
    assert lm.decode(ids[middle_at + 1 :]) == "    y = "
    assert lm.decode(ids[ids.index(fim.prefix) + 1 : ids.index(fim.suffix)]) == "def f(x):\n"
    assert lm.decode(ids[ids.index(fim.suffix) + 1 : middle_at]) == "x + 1\n    return y\n\nprint(f(2))\n"


def test_typing_on_the_cursor_line_changes_only_the_tail(lm):
    """Typing keeps the tokens before <fim_suffix> unchanged (what KV reuse relies on)."""
    doc = "import os\n\ndef g():\n    retu\n"
    before = build_prompt(lm, doc, 3, 8).ids
    doc2 = "import os\n\ndef g():\n    return\n"
    after = build_prompt(lm, doc2, 3, 10).ids
    cut = before.index(lm.fim.suffix)
    assert before[: cut + 1] == after[: cut + 1]


def test_other_buffers_come_first_and_respect_the_budget(lm):
    from lsp_server.completion.context import ContextBudget

    others = [("a.py", "A = 1\n" * 50), ("b.py", "B = 2\n")]
    p = build_prompt(lm, DOC, 1, 8, others=others, path="main.py",
                     budget=ContextBudget(total=400, above=200, below=60, snippets=60))
    assert p.ids[0] == lm.fim.file_sep
    assert p.ids.index(lm.fim.prefix) > 0
    head = p.ids[: p.ids.index(lm.fim.prefix)]
    assert len(head) <= 60 + 10  # snippets plus this file's header
    assert "a.py" in lm.decode(head)


def mk(typed="    ", after="", below=""):
    return Prompt([], "", typed, after, below)


def test_block_end_stops_at_a_dedent():
    gen = "x = 1\n    y = 2\nz = 3\n"
    assert ghost_cut(gen, mk("    ")) == len("x = 1\n    y = 2")
    assert finish(gen, mk("    ")) == "x = 1\n    y = 2"
    # Nested block opened by the completion itself is kept.
    gen2 = "if a:\n        b()\n    c()\nd()"
    assert finish(gen2, mk("    ")) == "if a:\n        b()\n    c()"


def test_stops_before_repeating_the_next_line_below():
    p = mk("    ", below="\n    return y\n")
    gen = "y = x\n    return y\n    more"
    assert finish(gen, p) == "y = x"


def test_rest_of_line_is_not_typed_twice():
    p = mk("print(", after=")")
    assert finish("x)", p) == "x"
    assert finish(")", p) == ""  # only re-types what follows the cursor
    assert finish("", p) == ""
    assert finish("\n\n", mk()) == ""


def test_single_line_mode():
    assert finish("a = 1\nb = 2", mk(""), multiline=False) == "a = 1"


def test_completer_heals_trailing_blanks(lm):
    """Bare indentation: the prompt keeps its blanks but the last (which the tokenizer writes with
    the first word, " self"); the suggestion starts at the real cursor."""
    c = Completer(lm)
    doc = "class A:\n    def f(self):\n        \n"
    sug = c.complete(doc, 2, 8, options=DecodeOptions(max_new_tokens=8, draft_max=0))
    # Ends with 7 of the 8 blanks after <fim_middle>; the 8th is healed: the model writes it.
    assert sug.prompt.ids == build_prompt(lm, "class A:\n    def f(self):\n       \n", 2, 7).ids
    assert sug.prompt.ids[-1] != lm.fim.middle and lm.fim.middle in sug.prompt.ids
    assert sug.prompt.typed == "        "
    raw = sug.raw
    expected = raw[8:] if raw.startswith(" " * 8) else raw.lstrip(" \t")
    assert sug.text == finish(expected, sug.prompt)
    # Typed code followed by a blank: the prompt ends at the code, the blank is healed too.
    doc2 = "x = \n"
    sug2 = c.complete(doc2, 0, 4, options=DecodeOptions(max_new_tokens=4, draft_max=0))
    assert sug2.prompt.ids == build_prompt(lm, "x =\n", 0, 3).ids


def test_never_writes_a_line_of_the_prompts_own_sections():
    """The definitions' and edits' comment lines are Ditto's, not the user's: a held-out replay had the
    model copy `# edit in F:` after a typed `#`. A line equal to one of them ends the suggestion."""
    written = frozenset({"# edit in store.py:", "# - def get(self, key):", "# + def get_items(self, key):"})
    p = Prompt([], "", "    #", "", "", written=written)
    assert finish(" edit in store.py:\n", p) == "" and ghost_cut(" edit in store.py:", p, final=True) == 0
    assert ghost_cut(" edit in store.py:", p) is None  # still being written: not judged yet
    assert finish(" edit in store.py: why", p) == " edit in store.py: why"  # another comment
    q = Prompt([], "", "    ", "", "", written=written)
    assert finish("x = 1\n    # - def get(self, key):\n    y = 2", q) == "x = 1"
    assert finish("x = 1\n    # - def get(self, key):\n    y = 2", mk("    ")) == "x = 1\n    # - def get(self, key):\n    y = 2"
    assert finish(" edit in store.py:", Prompt([], "", "#", "", "", written=written), multiline=False) == ""


def test_stops_before_a_line_the_suggestion_already_wrote():
    p = mk("")
    looping = "import os\nimport sys\nimport os\nimport os"
    assert finish(looping, p) == "import os\nimport sys"
    assert ghost_cut(looping + "\n", p) == len("import os\nimport sys")
    # Still being written: the repeat is not judged before its line is complete.
    assert ghost_cut("import os\nimport sys\nimport os", p) is None
    # Similar lines that differ, and lines that name nothing, repeat legitimately.
    args = ('parser.add_argument("--model")\nparser.add_argument("--device")\n'
            'parser.add_argument("--dtype")')
    assert finish(args, p) == args
    block = ("with lock:\n    f(\n        x,\n        None,\n    )\n\nwith lock:\n    f(\n        y,\n        None,\n    )\n"
             "    if c:\n        return None\n    else:\n        return None")
    assert finish(block, p) == block
    # The same line at another depth is another statement.
    nested = "x = load()\n    if not x:\n        x = load()"
    assert finish(nested, mk("    ")) == nested


def test_ghost_text_ends_before_a_character_no_editor_can_insert():
    """Byte tokens of a small model (NUL, form feed, undecodable bytes) never reach an editor:
    Emacs refuses JSON with \\u0000 and Neovim's complete() fails on it (CI saw both)."""
    p = mk("    ")
    assert finish("name = 1\x00 garbage", p) == "name = 1"
    assert ghost_cut("x = f(\x0c)", p) == len("x = f(")
    assert finish("a\x7fb", p) == "a" and finish("a\x85b", p) == "a"
    assert finish("\x00abc", p) == ""
    # Tabs, newlines and carriage returns are text.
    assert finish("a\tb\r\n    c", p) == "a\tb\r\n    c"
    # U+FFFD followed by more text is a byte sequence that is not UTF-8: cut there.
    assert ghost_cut("s = '\ufffd'x", p) == len("s = '")
    # At the end while generating it may be a character's first bytes: go on; cut once final.
    assert ghost_cut("s = '\ufffd", p) is None and ghost_cut("s = '\ufffd\ufffd", p) is None
    assert finish("s = '\ufffd", p) == "s = '"
    # The other stop rules still apply to what comes before the cut.
    assert finish("x = 1\ny = 2\x00", mk("    ")) == "x = 1"


# -- well-formed suggestions (issue 25) ------------------------------------------------------------

@pytest.mark.parametrize("text,typed,after,below,want", [
    ("x = foo(a,\n    b)\ny = 1", "    ", "", "", "x = foo(a,\n    b)\ny = 1"),  # closed: kept whole
    ("x = foo(a,\n    b,\n    c", "", "", "", "x = foo(a,"),  # never closed: back to the first line
    ("a,\n    b", "foo(", "", "", "a,"),  # the user's bracket, left open by the suggestion
    ("a,\n    b", "foo(", ")", "", "a,\n    b"),  # ... closed by the text after the cursor
    ("a,\n    b", "foo(", "", "\n    c)\n", "a,\n    b"),  # ... or by the lines below
    ("s = '''doc\nmore", "", "", "", "s = '''doc"),  # an unterminated string
    ("d = {\n  'a': 1,\n}\nprint(d)", "", "", "", "d = {\n  'a': 1,\n}\nprint(d)"),
    ("x = 1  # (comment\ny = 2", "", "", "", "x = 1  # (comment\ny = 2"),  # brackets in comments
    ("\n    'c': 3,\n}\nx = 1", "    'b': 2,", "", "", "\n    'c': 3,\n}\nx = 1"),  # closes one from above
    ("f(x", "", "", "", "f(x"),  # one line: kept (the user is mid-expression)
])
def test_a_multiline_suggestion_never_ends_inside_what_it_left_open(text, typed, after, below, want):
    from lsp_server.completion.stops import well_formed

    assert well_formed(text, Prompt([], "", typed, after, below)) == want


# -- snippets by similarity (issue 25) -------------------------------------------------------------

def test_similar_snippets_pick_the_chunk_like_the_code_at_the_cursor_and_stay_put_while_typing():
    from lsp_server.backends.tiny import tiny_random
    from lsp_server.completion.context import ContextBudget, Window
    from lsp_server.completion.retrieval import CHUNK_LINES, ranked_chunks

    filler = "\n".join(f"noise_{i} = {i}" for i in range(CHUNK_LINES))
    helper = "def parse_header(raw_header):\n    fields = raw_header.split(';')\n    return fields\n"
    others = [("util.py", filler + "\n" + helper + "\n" + filler)]
    doc = "import util\n\n\ndef read(raw_header):\n    fields = \n"
    assert ranked_chunks(others, doc)[0] == ("util.py", CHUNK_LINES)  # the chunk holding parse_header
    lm = tiny_random()
    budget = ContextBudget(total=512, above=256, below=32, snippets=160, snippet_source="similar")
    window = Window()
    p = build_prompt(lm, doc, 4, 13, others=others, path="main.py", budget=budget, window=window)
    assert "util.py\ndef parse_header" in lm.decode(p.ids)  # that chunk, not the buffer's head (noise_0 ...)
    typed = doc.replace("fields = \n", "fields = r\n")
    q = build_prompt(lm, typed, 4, 14, others=others, path="main.py", budget=budget, window=window)
    head = p.ids[: p.ids.index(lm.fim.prefix)]
    assert q.ids[: len(head)] == head  # the snippets (the prompt's start) did not move


def test_the_snippets_setting_shares_the_budget_with_the_lines_above():
    from lsp_server.completion.context import ContextBudget
    from lsp_server.settings import Settings, SettingsError

    small = {s: ContextBudget.scaled(320, s) for s in ContextBudget.SOURCES}
    assert small["heads"].snippets == small["none"].snippets == 0  # heads only from SNIPPETS_FROM on
    assert small["similar"].snippets > 0 and small["similar"].snippet_source == "similar"
    assert small["similar"].above + small["similar"].snippets == small["heads"].above  # same total, fewer lines above
    big = {s: ContextBudget.scaled(2048, s) for s in ContextBudget.SOURCES}
    assert big["heads"] == ContextBudget(total=2048, above=1536 - ContextBudget.FILE_HEAD_MAX, below=64, snippets=352,
                                         repeat=ContextBudget.REPEAT_MAX, file_head=ContextBudget.FILE_HEAD_MAX)
    assert big["similar"].above == big["heads"].above and big["none"].snippets == 0
    with pytest.raises(ValueError, match="snippets must be one of"):
        ContextBudget.scaled(320, "nearby")
    both = {"definitions": True, "recentEdits": True}
    assert Settings().merged({"snippets": "similar", "contextTokens": 512, **both}).completer_settings().budget == \
        ContextBudget.scaled(512, "similar", Settings.definitions_share, Settings.edits_share)
    fitted = Settings().merged({"snippets": "similar"}).completer_settings()  # context_tokens 0: fitted at load
    assert fitted.budget is None and fitted.snippets == "similar"
    with pytest.raises(SettingsError, match="'snippets' must be heads, similar or none"):
        Settings().merged({"snippets": "nearby"})


def test_similar_snippets_search_this_document_above_its_window():
    """A sync twin far above the window (as in httpx's _client.py) is found with no other buffer open."""
    from lsp_server.backends.tiny import tiny_random
    from lsp_server.completion.context import ContextBudget, Window

    twin = ("def send_request(client, request, timeout):\n    response = client.transport.handle_request(request)\n"
            "    response.raise_for_status()\n    return response\n")
    filler = "".join(f"value_{i} = {i}\n" for i in range(120))
    doc = twin + filler + "async def send_request_async(client, request, timeout):\n    response = \n"
    line = doc.count("\n") - 1
    lm = tiny_random()
    budget = ContextBudget(total=256, above=128, below=16, snippets=96, snippet_source="similar")
    w = Window()
    p = build_prompt(lm, doc, line, 15, path="client.py", budget=budget, window=w)
    assert p.start_line > 4 and p.snippets == ["client.py"]
    assert "client.py\ndef send_request(client" in lm.decode(p.ids[: p.ids.index(lm.fim.prefix)])
    heads = build_prompt(lm, doc, line, 15, path="client.py", budget=ContextBudget(total=256, above=128, below=16,
                                                                                     snippets=96), window=Window())
    assert heads.snippets == []  # heads: other buffers only


def test_repeated_at_finds_what_followed_the_same_lines_elsewhere_in_the_file():
    from lsp_server.completion.retrieval import repeated_at

    lines = ["class Sync:", "    def send(self, request):", "        self.check(request)",
             "        return self.transport.handle(request)", "", *[f"x_{i} = {i}" for i in range(40)],
             "class Async:", "    async def send(self, request):", "        self.check(request)", "        "]
    cur = len(lines) - 1
    # The lines above the cursor stand at 1-2; what followed them there (line 3) is where the cursor is.
    assert repeated_at(lines, cur, "        r", [(0, 40)]) == (1, 3) or repeated_at(lines, cur, "        r", [(0, 40)]) == (2, 3)
    assert repeated_at(lines, cur, "        r", [(0, 40)])[1] == 3
    assert repeated_at(lines, cur, "        x", [(0, 40)]) is None  # what followed does not start with what is typed
    assert repeated_at(lines, cur, "", [(10, 40)]) is None  # only the regions given are searched
    short = ["    )", "a = 1", *["y = 0"] * 30, "    )", ""]
    assert repeated_at(short, len(short) - 1, "", [(0, 20)]) is None  # `)` alone matches everywhere


def test_repeated_at_breaks_ties_by_the_identifiers_around_the_cursor():
    from lsp_server.completion.retrieval import repeated_at

    def klass(name, field):
        return [f"class {name}:", f"    def __init__(self):", f"        self.{field} = None", "",
                "    def flush(self) -> bytes:", f"        return self.{field}", ""]

    lines = [*klass("A", "seen_data"), *klass("B", "buffer"), *klass("C", "other"),
             *[f"z_{i} = {i}" for i in range(20)],
             "class D:", "    def __init__(self):", "        self.seen_data = None", "",
             "    def flush(self) -> bytes:", "        "]
    found = repeated_at(lines, len(lines) - 1, "        r", [(0, 41)])
    assert found is not None and lines[found[1]] == "        return self.seen_data"  # class A's, not the nearer B's or C's


def test_the_prompt_opens_with_what_followed_the_lines_above_the_cursor_further_up():
    from dataclasses import replace

    from lsp_server.completion.context import ContextBudget, Window

    twin = ("def send_request(client, request, timeout):\n    response = client.transport.handle_request(request)\n"
            "    response.raise_for_status_and_log_the_failure()\n    return response\n")
    filler = "".join(f"value_{i} = {i}\n" for i in range(120))
    doc = twin + filler + "def send_request_again(client, request, timeout):\n" \
        "    response = client.transport.handle_request(request)\n    r\n"
    line = doc.count("\n") - 1
    lm = tiny_random()
    assert ContextBudget.scaled(256).repeat > 0
    budget = ContextBudget(total=768, above=384, below=32, snippets=0, repeat=128)  # the tiny tokenizer's tokens are short
    w = Window()
    p = build_prompt(lm, doc, line, 5, path="client.py", budget=budget, window=w)
    text = lm.decode(p.ids)
    prefix = text[text.index("<|fim_prefix|>") + len("<|fim_prefix|>"):]
    assert p.start_line > 4 and prefix.startswith(
        "    response = client.transport.handle_request(request)\n    response.raise_for_status_and_log_the_failure()\n")
    assert len(p.ids) <= budget.total
    # Typing on at the place keeps everything before the typed text.
    q = build_prompt(lm, doc.replace("\n    r\n", "\n    resp\n"), line, 8, path="client.py", budget=budget, window=w)
    cut = p.ids.index(lm.fim.middle)
    assert q.ids[:cut] == p.ids[:cut]
    # Without a repeat budget the prompt is today's.
    plain = build_prompt(lm, doc, line, 5, path="client.py", budget=replace(budget, repeat=0), window=Window())
    assert "raise_for_status_and_log" not in lm.decode(plain.ids)
    assert len(p.ids) <= len(plain.ids)  # it took the place of lines at the window's top: no dearer


def test_a_place_where_nothing_repeats_keeps_the_last_choice():
    from lsp_server.completion.context import ContextBudget, Window

    twin = "def load(path):\n    with open(path) as handle_of_the_file:\n        return handle_of_the_file.read()\n"
    filler = "".join(f"value_{i} = {i}\n" for i in range(120))
    doc = twin + filler + "def load_again(path):\n    with open(path) as handle_of_the_file:\n        r\n" \
        + "".join(f"other_{i} = {i}\n" for i in range(30)) + "print(unique_line_here)\n\n"
    lm = tiny_random()
    w = Window()
    first = doc.count("\n", 0, doc.index("        r\n"))
    budget = ContextBudget(total=768, above=384, below=32, snippets=0, repeat=128)
    p = build_prompt(lm, doc, first, 9, path="f.py", budget=budget, window=w)
    assert "return handle_of_the_file.read()" in lm.decode(p.ids[: p.ids.index(lm.fim.suffix)])
    assert p.start_line > 3
    last = doc.count("\n") - 1
    q = build_prompt(lm, doc, last, 0, path="f.py", budget=budget, window=w)
    assert "return handle_of_the_file.read()" in lm.decode(q.ids[: q.ids.index(lm.fim.suffix)])

"""`ditto/nextEdit` through the real server (`ditto-lsp serve` over stdio): the document session records
the typed edits, the request answers the next place the change applies, in the client's units, and
`null` where there is nothing to propose."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from ditto_bench.client import RawClient  # noqa: E402

TIMEOUT = 60
URI = "file:///tmp/next_edit.py"
SRC = '''import os


class KeepOpenFile:
    pass


def open_stream(path):
    s\U0001F600 = KeepOpenFile(path)
    return s\U0001F600


def other(path):
    handle = KeepOpenFile(path)
    return KeepOpenFile(handle)
'''


@pytest.fixture(scope="module")
def server():
    c = RawClient(["--model", "tiny-random", "--max-tokens", "4"], env={"OMP_NUM_THREADS": "1"})
    try:
        c.initialize({"maxTokens": 4})
        yield c
        assert c.shutdown_and_exit() == 0
    finally:
        c.kill()


def units(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


def offset(text: str, pos: dict) -> int:
    """The code-point offset of an LSP position (UTF-16 columns) in `text`."""
    lines = text.split("\n")
    start = sum(len(line) + 1 for line in lines[: pos["line"]])
    line, seen, i = lines[pos["line"]], 0, 0
    while i < len(line) and seen < pos["character"]:
        seen += units(line[i])
        i += 1
    return start + i


def lsp_range(text: str, a: int, b: int) -> dict:
    def pos(o):
        before = text[:o]
        line = before.count("\n")
        return {"line": line, "character": units(before[before.rfind("\n") + 1 :])}
    return {"start": pos(a), "end": pos(b)}


def next_edit(c: RawClient, uri: str, line: int, character: int) -> dict:
    return c.call("ditto/nextEdit", {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}},
                  TIMEOUT)


def test_a_typed_rename_is_proposed_at_the_next_place_in_client_units(server):
    c, text, version = server, SRC, 1
    c.open(URI, text)
    assert next_edit(c, URI, 3, 6)["result"] is None  # no edit yet: nothing to propose
    i = text.index("KeepOpenFile")
    # As typed: the name selected and deleted, then the new one typed a character at a time.
    for a, b, new in [(i, i + len("KeepOpenFile"), "")] + [(i + k, i + k, ch) for k, ch in enumerate("_KeepOpenFile")]:
        version += 1
        c.change(URI, version, [{"range": lsp_range(text, a, b), "text": new}])
        text = text[:a] + new + text[b:]
    answer = next_edit(c, URI, 3, 6 + len("_KeepOpenFile"))
    e = answer["result"]
    assert e is not None and e["uri"] == URI and e["version"] == version and e["source"] == "propagate"
    a, b = offset(text, e["range"]["start"]), offset(text, e["range"]["end"])
    assert text[a:b] == e["oldText"]
    after = text[:a] + e["newText"] + text[b:]
    assert "s\U0001F600 = _KeepOpenFile(path)" in after  # the nearest place below, past the emoji (2 UTF-16 units)
    assert e["range"]["start"]["line"] == 8
    cursor = offset(after, e["cursor"])
    assert a <= cursor <= a + len(e["newText"])
    stats = c.stats()["next_edit"]
    assert stats["requests"] == 2 and stats["proposed"] == 1
    c.close_doc(URI)


def test_unknown_documents_get_null_and_bad_params_an_error(server):
    c = server
    assert next_edit(c, "file:///tmp/never-opened.py", 0, 0)["result"] is None
    bad = c.call("ditto/nextEdit", {"textDocument": {"uri": URI}}, TIMEOUT)
    assert bad["error"]["code"] == -32602  # InvalidParams
    assert "result" in c.call("ditto/stats", {}, TIMEOUT)  # still serving


LINE_SRC = '''class KeepOpenFile:
    pass


def other(path):
    handle = KeepOpenFile(path) or KeepOpenFile(None)
    return handle
'''


def type_rename(c: RawClient, uri: str, text: str, version: int, old: str, new: str) -> tuple[str, int, int]:
    """Select the first `old` and type `new` over it a character at a time: (text, version, cursor offset)."""
    i = text.index(old, text.index("handle"))
    for a, b, piece in [(i, i + len(old), "")] + [(i + k, i + k, ch) for k, ch in enumerate(new)]:
        version += 1
        c.change(uri, version, [{"range": lsp_range(text, a, b), "text": piece}])
        text = text[:a] + piece + text[b:]
    return text, version, i + len(new)


def inline_items(c: RawClient, uri: str, text: str, cursor: int) -> list[dict]:
    pos = lsp_range(text, cursor, cursor)["start"]
    r = c.wait(c.inline(uri, pos["line"], pos["character"]), TIMEOUT)
    assert "error" not in r, r
    result = r["result"]
    return [] if result is None else result["items"] if isinstance(result, dict) else result


def test_the_next_edit_on_the_cursors_line_is_an_inline_item_that_replaces_text(server):
    c, uri = server, "file:///tmp/next_edit_line.py"
    c.open(uri, LINE_SRC)
    text, version, cursor = type_rename(c, uri, LINE_SRC, 1, "KeepOpenFile", "KeepClosedFile")
    before = c.stats()["next_edit"]["inline"]
    (item,) = inline_items(c, uri, text, cursor)
    r = item["range"]
    assert r["start"] == lsp_range(text, cursor, cursor)["start"] and r["end"]["line"] == r["start"]["line"]
    a, b = offset(text, r["start"]), offset(text, r["end"])
    assert text[a:b] == "(path) or KeepOpenFile(None)"  # from the cursor to the line's end: text is replaced
    after = text[:a] + item["insertText"] + text[b:]
    assert after == LINE_SRC.replace("KeepOpenFile(", "KeepClosedFile(")  # the class keeps its name
    assert c.stats()["next_edit"]["inline"] == before + 1
    # On another line (the cursor moved up to the class), the edit is no inline item there.
    line2 = text.index("    pass")
    assert all("Closed" not in i["insertText"] for i in inline_items(c, uri, text, line2))
    c.close_doc(uri)


def test_with_next_edit_off_neither_the_request_nor_the_inline_item_proposes():
    c = RawClient(["--model", "tiny-random", "--max-tokens", "4", "--no-next-edit"], env={"OMP_NUM_THREADS": "1"})
    try:
        c.initialize({"maxTokens": 4})
        uri = "file:///tmp/next_edit_off.py"
        c.open(uri, LINE_SRC)
        text, version, cursor = type_rename(c, uri, LINE_SRC, 1, "KeepOpenFile", "KeepClosedFile")
        pos = lsp_range(text, cursor, cursor)["start"]
        assert next_edit(c, uri, pos["line"], pos["character"])["result"] is None
        assert all("Closed" not in i["insertText"] for i in inline_items(c, uri, text, cursor))
        stats = c.stats()["next_edit"]
        assert stats["requests"] == 0 and stats["inline"] == 0
        c.notify("workspace/didChangeConfiguration", {"settings": {"ditto": {"nextEdit": True}}})
        e = next_edit(c, uri, pos["line"], pos["character"])["result"]
        assert (e["newText"], e["oldText"]) == ("Closed", "Open")
        assert c.stats()["next_edit"]["inline"] == 0
        (item,) = inline_items(c, uri, text, cursor)
        assert item["insertText"] == "(path) or KeepClosedFile(None)"
        assert c.shutdown_and_exit() == 0
    finally:
        c.kill()


@pytest.mark.parametrize("proposer", ["both", "rewrite", "judged"])
def test_the_model_proposers_run_the_loaded_model_on_its_worker(proposer):
    """`next_edit_proposer` both / rewrite / judged: the request runs the loaded model (lsp_server/nextedit/rewrite.py,
    judge.py) on the server's model worker. The tiny random model writes noise: `both` shows nothing where
    propagation alone would (the check refuses it), `rewrite` shows only its own rewrite, if any, `judged`
    propagation's proposal or nothing, as the random model's likelihoods fall."""
    c = RawClient(["--model", "tiny-random", "--max-tokens", "4", "--next-edit-proposer", proposer],
                  env={"OMP_NUM_THREADS": "1"})
    try:
        c.initialize({"maxTokens": 4})
        c.wait_ready()
        uri = "file:///tmp/next_edit_model.py"
        c.open(uri, LINE_SRC)
        text, version, cursor = type_rename(c, uri, LINE_SRC, 1, "KeepOpenFile", "KeepClosedFile")
        pos = lsp_range(text, cursor, cursor)["start"]
        e = next_edit(c, uri, pos["line"], pos["character"])["result"]
        stats = c.stats()["next_edit"]
        assert stats["model"] == 1 and stats["without_model"] == 0
        if proposer == "both":
            assert e is None  # propagation proposes `KeepClosedFile(None)`; the random model's rewrite is not that
        elif proposer == "judged":
            assert e is None or (e["newText"], e["source"]) == ("Closed", "propagate")
        else:
            assert e is None or e["source"] == "rewrite"
        # the inline item stays propagation's, at once
        (item,) = inline_items(c, uri, text, cursor)
        assert item["insertText"] == "(path) or KeepClosedFile(None)"
        # back to propagation by a settings change: the proposal is there, and the model not asked
        c.notify("workspace/didChangeConfiguration", {"settings": {"ditto": {"nextEditProposer": "propagate"}}})
        e = next_edit(c, uri, pos["line"], pos["character"])["result"]
        assert (e["newText"], e["source"]) == ("Closed", "propagate") and c.stats()["next_edit"]["model"] == 1
        assert c.shutdown_and_exit() == 0
    finally:
        c.kill()

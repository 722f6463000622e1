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

"""A snapshot of a long document hands the completer a window of it (lsp_server/lsp/documents.py,
issue 26), and the prompts are still those of the whole text: the same token ids and the same
lines-above window, through moves down the file, jumps and edits, including where the window's
first line moves (the completer's prompt window is moved with it)."""

from __future__ import annotations

import asyncio
import random

import pytest
from lsprotocol import types
from pygls.workspace import Workspace

from lsp_server.completion.completer import Completer
from lsp_server.lsp.documents import WINDOW_GRID, WindowText, buffer_name
from lsp_server.lsp.server import DittoServer
from lsp_server.lsp.worker.state import Sinks, Worker
from lsp_server.settings import Settings

URI = "file:///tmp/ditto-window/long.py"


@pytest.fixture(scope="module")
def lm():
    from lsp_server.backends.tiny import tiny_random

    return tiny_random()


def server_with(text: str) -> DittoServer:
    server = DittoServer()
    server.protocol._workspace = Workspace(None)
    server.workspace.put_text_document(types.TextDocumentItem(uri=URI, language_id="python", version=1, text=text))
    return server


def long_doc(lines: int) -> str:
    return "".join(f"def handler_{i}(value):\n    return value * {i} + offset_{i % 7}\n" for i in range(lines // 2))


async def test_prompts_through_a_window_are_the_whole_texts(lm):
    text = long_doc(6000)
    server = server_with(text)
    windowed, whole = Completer(lm), Completer(lm)
    ignore = lambda *args: None  # noqa: E731  (what the worker reports to the loop: not looked at here)
    worker = Worker(ignore, Sinks(ignore, ignore, ignore, ignore), Settings)  # the worker's state, run on a thread
    worker.completer = windowed
    server.documents.connect(worker.inbox.put)
    server.documents.changed(URI, text, 1)  # (didOpen's message)
    name = buffer_name(URI)

    def on_worker(snap):  # moves the prompt window with the snapshot's, then builds the prompt
        worker.sync(Settings())
        return windowed.prompt_for(snap.text, snap.line, snap.col, name=name, cache_key=URI, file=worker.file(snap))

    rng = random.Random(0)
    line = 100
    firsts = set()
    for step in range(160):
        if step % 40 == 39:
            line = rng.randrange(6000)  # a jump
        else:
            line = min(5990, line + rng.choice([1, 3, 17, 60]))  # moving down, across grid lines
        col = rng.randrange(8)
        snap = server.documents.snapshot(URI, types.Position(line=line, character=col))
        assert isinstance(snap.text, WindowText) and snap.line + snap.text.first_line == line
        firsts.add(snap.text.first_line)
        a = await asyncio.to_thread(on_worker, snap)
        b = whole.prompt_for(text, line, snap.col, name=name, cache_key=URI)
        assert a.ids == b.ids, (step, line)
        assert a.start_line + snap.text.first_line == b.start_line
    assert len(firsts) >= 3 and all(f % WINDOW_GRID == 0 for f in firsts)


async def test_a_short_document_is_its_own_window():
    text = long_doc(400)
    server = server_with(text)
    snap = server.documents.snapshot(URI, types.Position(line=200, character=3))
    assert snap.text == text and snap.text.first_line == 0 and snap.line == 200


async def test_to_client_counts_lines_of_the_document():
    text = long_doc(6000)
    server = server_with(text)
    snap = server.documents.snapshot(URI, types.Position(line=5000, character=4))
    pos = server.documents.to_client(snap.text, snap.line, snap.col)
    assert (pos.line, pos.character) == (5000, 4)
    assert server.documents.to_client("a\nbc", 1, 1) == types.Position(line=1, character=1)


def test_the_prompt_is_offered_the_definitions_resolved_nearest_its_place():
    """lsp_server/lsp/worker/state.py `extras`: of the definitions resolved at a document's lines (where
    the user was, and places ahead), the nearest within NEAR_LINES; none farther; a newer at the same
    line replaces the older; a closed document's go."""
    from lsp_server.lsp.worker.messages import BufferText, Closed, Definitions, Snapshot

    ignore = lambda *args: None  # noqa: E731
    worker = Worker(ignore, Sinks(ignore, ignore, ignore, ignore), Settings)
    worker.inbox.put(BufferText(URI, "a.py", "x = 1\n" * 400, True, 1))
    worker.sync(Settings())
    for line, text in ((10, "# at 10\n"), (100, "# at 100\n"), (300, "# at 300\n"), (100, "# at 100, newer\n")):
        worker.inbox.put(Definitions(URI, 1, line, text))
    worker.sync(Settings())

    def offered(line: int) -> str:
        return worker.extras(Snapshot(URI, 1, "", 0, 0, (line, 0), "a.py", "# - edit\n")).definitions

    assert offered(12) == "# at 10\n" and offered(60) == "# at 100, newer\n" and offered(54) == "# at 10\n"
    assert offered(200) == "" and offered(364) == "# at 300\n" and offered(365) == ""
    assert worker.extras(Snapshot(URI, 1, "", 0, 0, (12, 0), "a.py", "# - edit\n")).edits == "# - edit\n"
    worker.inbox.put(Closed(URI, "a.py"))
    worker.sync(Settings())
    assert offered(12) == ""

"""The prompt's definitions and recent edits through the server (`ditto-lsp serve`, tiny random model):
a request is answered while the resolver (lsp_server/lsp/definitions.py, a process of its own) is made
slow on purpose (`debug_resolve_delay_s`, only with `--debug-hooks`) and its prompt has no definitions;
once resolved, a later request at a new place has them (`ditto/trace`'s `prompt_sections`); an edit of
another open document that shares a name with the lines around the cursor is in the prompt too; and
`ditto/stats` counts the jobs and the prompts with each section. No timed assertion: the resolver's
delay only makes sure nothing can arrive before the first answer."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient
from support.workspaces import STORE, write_store
from test_server import plain

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, "-m", "lsp_server.cli", "serve", "--model", "tiny-random", "--max-tokens", "4",
          "--debug-hooks"]
DELAY_S = 4.0  # the resolver sleeps this long before each job
OPTIONS = {"maxTokens": 4, "timeBudgetS": 10, "debugResolveDelayS": DELAY_S}
WAIT_S = 120
FILLER = "".join(f"SETTING_{i} = {i}\n" for i in range(48))  # a window above with room for both sections
APP = ("from store import open_store\n\n" + FILLER + "\n\ndef main():\n    store = open_store('x')\n"
       "    items = store.get_items('k')\n    \n\n\ndef other():\n    pass\n")
END = APP.split("\n").index("    items = store.get_items('k')") + 1  # the blank line after it: (END, 4)
ROOT = Path(__import__("tempfile").mkdtemp(prefix="ditto-definitions-"))


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER), scope="module")
async def client(lsp_client: LanguageClient):
    write_store(ROOT)
    (ROOT / "app.py").write_text(APP)
    caps = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    lsp_client.init_result = await lsp_client.initialize_session(types.InitializeParams(
        capabilities=caps, initialization_options=OPTIONS, root_uri=ROOT.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=ROOT.as_uri(), name="ws")]))
    yield
    await lsp_client.shutdown_session()


async def request(client: LanguageClient, method: str, params: dict):
    return plain(await client.protocol.send_request_async(method, params))


async def inline(client: LanguageClient, uri: str, line: int, character: int):
    return await asyncio.wait_for(client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))), WAIT_S)


async def until(client: LanguageClient, check) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        s = await request(client, "ditto/stats", {})
        if check(s):
            return s
        assert time.monotonic() < deadline, s
        await asyncio.sleep(0.1)


def open_doc(client: LanguageClient, uri: str, text: str) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


async def test_a_request_does_not_wait_for_the_resolver_and_a_later_one_has_its_definitions(client):
    await until(client, lambda s: s["model_state"] == "ready")
    uri = (ROOT / "app.py").as_uri()
    open_doc(client, uri, APP)
    await inline(client, uri, END, 4)  # answered (a suggestion or none) while the resolver sleeps
    first = await request(client, "ditto/trace", {"uri": uri})
    s = await request(client, "ditto/stats", {})
    assert s["definitions"]["jobs"] == 0 and first["prompt_sections"]["definitions"] == 0
    assert first["prompt_sections"]["above"] > 0
    assert sum(first["prompt_sections"].values()) + 3 == first["prompt_tokens"]  # (+ the three FIM tokens)
    s = await until(client, lambda s: s["definitions"]["jobs"] >= 1)  # resolved once the resolver woke
    d = s["definitions"]
    assert d["enabled"] and d["abandoned"] == 0 and d["failed"] == 0 and d["processes_started"] == 1 and d["found"] == 1
    assert d["resolve_ms"]["total"] >= DELAY_S * 1000 and d["resolve_ms"]["count"] == 1
    # A later request at a new place nearby: its prompt has them (chosen when a place is new).
    await inline(client, uri, END - 1, 4)
    later = await request(client, "ditto/trace", {"uri": uri})
    assert later["prompt_sections"]["definitions"] > 0
    s = await request(client, "ditto/stats", {})
    assert s["definitions"]["prompts"] == 2 and s["definitions"]["prompts_with"] == 1
    assert s["definitions"]["share"] == 0.5


async def test_an_edit_elsewhere_that_shares_a_name_with_the_cursors_lines_is_in_the_prompt(client):
    store_uri, uri = (ROOT / "store.py").as_uri(), (ROOT / "app.py").as_uri()
    open_doc(client, store_uri, STORE)
    line = STORE.split("\n").index("    def get_items(self, key: str) -> list:")
    col = STORE.split("\n")[line].index("-> list") + 3
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=store_uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=line, character=col),
                              end=types.Position(line=line, character=col + 4)), text="list[str]")]))
    before = (await request(client, "ditto/stats", {}))["recent_edits"]["prompts_with"]
    await inline(client, uri, END + 1, 0)  # a new place in app.py, below `store.get_items(...)`
    t = await request(client, "ditto/trace", {"uri": uri})
    assert t["prompt_sections"]["edits"] > 0, {k: t[k] for k in ("prompt_sections", "prompt_tokens", "source") if k in t}
    s = await request(client, "ditto/stats", {})
    assert s["recent_edits"]["enabled"] and s["recent_edits"]["prompts_with"] == before + 1

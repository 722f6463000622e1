"""Requests made while the model loads (pytest-lsp over stdio, tiny random model).

The load is made slow on purpose with the test-only `debugLoadDelayS` setting (a sleep on
the worker before the model loads) of 600 s, and each test ends it by setting it to 0 once
it has seen, in `ditto/stats`, that its requests are waiting. Nothing here depends on how
long anything takes: the server is still loading whenever a request is sent.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient

from test_server import CODE, END, FAST, TIMEOUT, completer, inline, items_of, stats, suggesting_variant  # noqa: F401 (fixture)

SLOW = {**FAST, "debugLoadDelayS": 600}
# --debug-hooks: the debug* settings are refused without it.
TINY = [sys.executable, "-m", "lsp_server.cli", "serve", "--model", "tiny-random", "--max-tokens", "12", "--debug-hooks"]
BROKEN = [sys.executable, "-m", "lsp_server.cli", "serve", "--model", "no-such-model", "--max-tokens", "12",
          "--debug-hooks"]


async def start(client: LanguageClient) -> None:
    caps = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    await client.initialize_session(types.InitializeParams(capabilities=caps, initialization_options=SLOW))


@pytest_lsp.fixture(config=ClientServerConfig(server_command=TINY))
async def tiny(lsp_client: LanguageClient):
    await start(lsp_client)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=ClientServerConfig(server_command=BROKEN))
async def broken(lsp_client: LanguageClient):
    await start(lsp_client)
    yield
    await lsp_client.shutdown_session()


def open_doc(client: LanguageClient, uri: str, text: str = CODE) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


def end_load_delay(client: LanguageClient) -> None:
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={**FAST, "debugLoadDelayS": 0}))


async def until_waiting(client: LanguageClient, n: int) -> dict:
    """Poll `ditto/stats` until `n` requests wait for the model (which must still be loading)."""
    async def poll():
        while True:
            s = await stats(client)
            assert s["model_state"] == "loading", s
            if s["waiting"] == n:
                return s
            await asyncio.sleep(0.05)
    return await asyncio.wait_for(poll(), TIMEOUT)


async def test_requests_made_while_loading_are_answered_when_the_model_is_ready(tiny, completer):
    client = tiny
    a, b, c, d = (f"file:///tmp/ditto-loading/{name}.py" for name in "abcd")
    # A text tiny-random completes with visible ghost text in documents a and c, so "answered with
    # a suggestion" is shown, not a null (which variant does depends on the backend and the budget).
    code, _ = suggesting_variant(completer, lambda v: (v, *END, a), lambda v: (v, *END, c))
    for uri in (a, b, c, d):
        open_doc(client, uri, code)
    first = inline(client, a, *END)
    await until_waiting(client, 1)
    # A newer request for the same document: the older one gets null at once, while still loading.
    second = inline(client, a, *END)
    assert await asyncio.wait_for(first, TIMEOUT) is None
    # Cancelled while waiting: RequestCancelled, also while still loading.
    cancelled = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=b), position=types.Position(*END),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)),
        msg_id="cancel-while-loading"))
    await until_waiting(client, 2)
    client.cancel_request(types.CancelParams(id="cancel-while-loading"))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(cancelled, TIMEOUT)
    assert err.value.code == types.LSPErrorCodes.RequestCancelled
    # Another document waits too; a third one changes while its request waits (stale: dropped).
    other = inline(client, c, *END)
    stale = inline(client, d, *END)
    s = await until_waiting(client, 3)
    assert s["superseded"] == 1 and s["cancelled"] == 1 and s["completed"] == 0 and s["not_ready"] == 0
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=d, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="# note\n")]))
    ready = asyncio.ensure_future(client.wait_for_notification("ditto/modelReady"))
    end_load_delay(client)
    assert (await asyncio.wait_for(ready, TIMEOUT)).model == "tiny-random"
    held = items_of(await asyncio.wait_for(second, TIMEOUT))
    held_other = items_of(await asyncio.wait_for(other, TIMEOUT))
    assert await asyncio.wait_for(stale, TIMEOUT) is None
    # The answers are the model's suggestions: the same as the same requests made now that it is ready.
    assert held and held[0].insert_text and held[0].range.start == types.Position(*END)
    assert held[0].insert_text == items_of(await asyncio.wait_for(inline(client, a, *END), TIMEOUT))[0].insert_text
    assert held_other[0].insert_text == items_of(await asyncio.wait_for(inline(client, c, *END), TIMEOUT))[0].insert_text
    s = await stats(client)
    assert s["model_state"] == "ready" and s["waiting"] == 0 and s["waited"] == 5
    assert s["superseded"] == 1 and s["cancelled"] == 1 and s["dropped_stale"] == 1 and s["not_ready"] == 0
    assert s["completed"] == 4  # the two held requests and the two asked again
    assert client.messages == []


async def test_the_wait_is_bounded_by_load_wait_s(tiny):
    client = tiny
    uri = "file:///tmp/ditto-loading/bounded.py"
    open_doc(client, uri)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={**SLOW, "loadWaitS": 0.2}))
    assert await asyncio.wait_for(inline(client, uri, *END), TIMEOUT) is None
    s = await stats(client)
    assert s["model_state"] == "loading" and s["not_ready"] == 1 and s["waited"] == 1 and s["waiting"] == 0
    # 0: answered at once, without waiting.
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={**SLOW, "loadWaitS": 0}))
    assert await asyncio.wait_for(inline(client, uri, *END), TIMEOUT) is None
    s = await stats(client)
    assert s["model_state"] == "loading" and s["not_ready"] == 2 and s["waited"] == 1


async def test_a_failing_load_answers_every_waiting_request_null_and_shows_one_message(broken):
    client = broken
    uris = [f"file:///tmp/ditto-loading/fail-{i}.py" for i in range(3)]
    for uri in uris:
        open_doc(client, uri)
    pending = [inline(client, uri, *END) for uri in uris]
    await until_waiting(client, len(uris))
    end_load_delay(client)
    for fut in pending:
        assert await asyncio.wait_for(fut, TIMEOUT) is None
    s = await stats(client)
    assert s["model_state"] == "failed" and s["not_ready"] == len(uris) and s["waiting"] == 0
    assert len(client.messages) == 1
    shown = client.messages[0]
    assert shown.type == types.MessageType.Error and "no-such-model" in shown.message

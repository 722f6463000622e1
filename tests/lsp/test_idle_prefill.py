"""Idle prefill end to end: the server prefills the likely next prompt while the client pauses.

`ditto-lsp serve` over stdio (pytest-lsp) with the tiny random model. What is checked is what
a user would feel, by counts and events, never by timing:
- after didOpen and a cursor notification (or an edit) and a pause, the first request at
  that place finds at least 90% of its prompt in the cache (its trace says so);
- a request that arrives while idle prefill runs waits for at most one more idle pass
  (the step notifications of `--debug-hooks` show the order of passes), and the chunks
  prefilled before it stay cached for it.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from test_server import TIMEOUT, inline, plain, stats, trace, wait_progress_end

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, "-m", "lsp_server.cli", "serve", "--model", "tiny-random", "--max-tokens", "4",
          "--context-tokens", "2048",  # a long prompt (a GPU-sized budget): many idle passes
          "--debug-hooks"]
# (firstAnswerS named so that a test's `finally` that sends FAST puts it back: a configuration change keeps
# what it does not name, and a deadline of 0 left by one test made the next one's answers depend on drafts.)
FAST = {"maxTokens": 4, "debugStepDelayMs": 0, "debugNotifySteps": False, "timeBudgetS": 10, "firstAnswerS": 1.0}
# A long document: its prompt takes many idle passes of 32 tokens.
LINES = [f"def handler_{i}(request, value_{i}):\n    return request.process(value_{i}) + {i}\n" for i in range(150)]
DOC = "".join(LINES) + "\n"


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER), scope="module")
async def client(lsp_client: LanguageClient):
    caps = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    await lsp_client.initialize_session(types.InitializeParams(capabilities=caps, initialization_options=FAST))
    await wait_progress_end(lsp_client)
    yield
    await lsp_client.shutdown_session()


def open_doc(client: LanguageClient, uri: str, text: str):
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


def move_cursor(client: LanguageClient, uri: str, line: int, character: int):
    client.protocol.notify("ditto/didMoveCursor", {"textDocument": {"uri": uri},
                                                   "position": {"line": line, "character": character}})


async def idle_done(client: LanguageClient, before: dict, tokens: int):
    """Wait (bounded) until idle prefill has prefilled `tokens` more tokens and the worker is idle."""
    for _ in range(int(TIMEOUT / 0.05)):
        s = await stats(client)
        if s["idle_prefill"]["tokens"] - before["tokens"] >= tokens and not s["worker_busy"]:
            return s
        await asyncio.sleep(0.05)
    raise AssertionError(f"idle prefill did not prefill {tokens} tokens within {TIMEOUT} s: {s}")


async def test_after_open_and_a_pause_the_first_request_finds_its_prompt_prefilled(client: LanguageClient):
    uri = "file:///tmp/ditto-idle/open.py"
    before = (await stats(client))["idle_prefill"]
    open_doc(client, uri, DOC)
    line = 200
    move_cursor(client, uri, line, 4)  # Ditto's plugins say where the cursor is
    await idle_done(client, before, 500)  # most of the prompt at that line
    await asyncio.wait_for(inline(client, uri, line, 4), TIMEOUT)
    t = await trace(client, uri)
    s = t["stats"]
    prompt_tokens = s["prefill_tokens"] + s["reused_tokens"] + 1
    assert s["reused_tokens"] >= 0.9 * prompt_tokens, s
    assert (await stats(client))["idle_prefill"]["hits"] == before["hits"] + 1


async def test_an_edit_aims_idle_prefill_at_its_end(client: LanguageClient):
    uri = "file:///tmp/ditto-idle/edit.py"
    open_doc(client, uri, DOC)
    before = (await stats(client))["idle_prefill"]
    # Type "x = " at the start of line 120: the cursor is then at (120, 4).
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=120, character=0), end=types.Position(line=120, character=0)),
            text="x = ")]))
    await idle_done(client, before, 500)
    await asyncio.wait_for(inline(client, uri, 120, 4), TIMEOUT)
    s = (await trace(client, uri))["stats"]
    assert s["reused_tokens"] >= 0.9 * (s["prefill_tokens"] + s["reused_tokens"] + 1), s


async def test_a_request_during_idle_prefill_waits_for_at_most_one_idle_pass(client: LanguageClient):
    uri = "file:///tmp/ditto-idle/busy.py"
    steps: list[dict] = []
    got_idle = asyncio.Event()

    def on_step(params):
        p = plain(params) if not isinstance(params, dict) else params
        steps.append(p)
        if p.get("idle") and p.get("uri", "").endswith("busy.py"):
            got_idle.set()

    client.feature("ditto/debug/step")(on_step)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={**FAST, "debugStepDelayMs": 150, "debugNotifySteps": True}))
    try:
        open_doc(client, uri, DOC)
        move_cursor(client, uri, 250, 0)
        await asyncio.wait_for(got_idle.wait(), TIMEOUT)  # idle prefill is running (slowly: 150 ms a pass)
        sent_at = len(steps)
        result = await asyncio.wait_for(inline(client, uri, 250, 0), TIMEOUT)
        assert result is None or result.items is not None
        after = steps[sent_at:]
        first_request_pass = next(i for i, p in enumerate(after) if not p.get("idle"))
        # The pass running when the request came may finish; no idle pass starts after it.
        assert first_request_pass <= 1, after[:5]
        s = (await trace(client, uri))["stats"]
        assert s["reused_tokens"] > 0  # what idle prefill did before the request was kept
        assert (await stats(client))["idle_prefill"]["stopped"] >= 1
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=FAST))


async def test_a_paused_suggestion_typed_past_does_not_stop_idle_prefill(client: LanguageClient):
    """A suggestion answered at its deadline pauses its generation, to be finished while idle.
    When the user has typed something else, that generation can serve nothing there: idle
    prefill must warm the new prompt instead of keeping the pause (it did nothing, and the next
    request prefilled the typed line itself). The edit is sent while the request still runs
    (slow passes), so no idle work can finish the generation before the edit is known."""
    uri = "file:///tmp/ditto-idle/typed-past.py"
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={**FAST, "maxTokens": 64, "firstAnswerS": 0.0, "debugStepDelayMs": 200}))
    try:
        open_doc(client, uri, DOC)
        line = len(LINES) * 2  # the empty line at the end: nothing after the cursor to stop at
        first = inline(client, uri, line, 0)
        await asyncio.sleep(0.05)  # sent (inline sends on the next turn of the loop), then the edit
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=line, character=0),
                                  end=types.Position(line=line, character=0)),
                text="ZZZ = compute(1)\nQ")]))  # a whole line and the start of the next
        idle_before = (await stats(client))["idle_prefill"]
        await asyncio.wait_for(first, TIMEOUT)  # (stale, dropped, when the edit came first: either way paused)
        t = await trace(client, uri)
        assert t["stop_reason"] == "paused" and not t["text"].startswith("ZZZ"), t  # what the test needs
        await idle_done(client, idle_before, 1)
        await asyncio.wait_for(inline(client, uri, line + 1, 1), TIMEOUT)
        s = (await trace(client, uri))["stats"]
        assert s["prefill_tokens"] == 0 and s["reused_tokens"] > 0, s  # the typed line was warmed while idle
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=FAST))


def shown(result) -> str | None:
    items = getattr(result, "items", result) or []
    return items[0].insert_text if items else None


async def test_while_idle_the_suggestion_where_the_user_is_is_generated_and_answers_the_request(
        client: LanguageClient):
    """Once the prompt at the cursor is prefilled, idle work generates its suggestion there
    (`Completer.ahead`); the request made there is answered from it (its trace says `ahead`,
    `ditto/stats` counts it), and the same request again, generated anew, shows the same text."""
    uri = "file:///tmp/ditto-idle/ahead.py"
    before = (await stats(client))["idle_prefill"]
    open_doc(client, uri, DOC)
    line = 100
    move_cursor(client, uri, line, 4)
    for _ in range(int(TIMEOUT / 0.05)):
        s = await stats(client)
        if s["idle_prefill"]["ahead"] > before["ahead"] and not s["worker_busy"]:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"no suggestion was generated while idle within {TIMEOUT} s: {s}")
    first = shown(await asyncio.wait_for(inline(client, uri, line, 4), TIMEOUT))
    assert (await trace(client, uri))["ahead"] is True
    assert (await stats(client))["idle_prefill"]["served_ahead"] == before["served_ahead"] + 1
    again = shown(await asyncio.wait_for(inline(client, uri, line, 4), TIMEOUT))
    assert (await trace(client, uri))["ahead"] is False  # shown once: asked again, it is generated anew
    assert first == again and first


async def test_while_idle_the_file_is_filled_and_a_request_gets_the_whole_file_above(client: LanguageClient):
    """Issue 40: idle work fills the document's prefix KV from its top (lsp_server/completion/wholefile.py);
    a request then holds every line above its place and prefills only what is new."""
    uri = "file:///tmp/ditto-idle/whole.py"
    text = "".join(LINES[:40]) + "\n"
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={**FAST, "wholeFile": True}))
    try:
        await _whole_file_above(client, uri, text)
    finally:  # (a configuration change keeps what it does not name)
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={**FAST, "wholeFile": False}))


async def _whole_file_above(client: LanguageClient, uri: str, text: str) -> None:
    before = (await stats(client))["whole_file"]["fill_tokens"]
    open_doc(client, uri, text)
    line = 60
    move_cursor(client, uri, line, 4)
    for _ in range(int(TIMEOUT / 0.05)):
        s = await stats(client)
        if s["whole_file"]["fill_tokens"] - before >= 600 and not s["worker_busy"] and not s["worker_idle_work"]:
            break
        await asyncio.sleep(0.05)
    assert s["whole_file"]["fill_tokens"] - before >= 600 and s["kv_cache"]["file_prefix"]["tokens"] >= 600, s
    # A character typed there: idle work aimed at the new place (its suggestion made ahead, if any, from this prompt).
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=line, character=4), end=types.Position(line=line, character=4)),
            text="r")]))
    await asyncio.wait_for(inline(client, uri, line, 5), TIMEOUT)
    t = await trace(client, uri)
    assert t["whole_file"] is True, t
    assert t["stats"]["prefill_tokens"] < t["prompt_tokens"] // 2, t
    assert (await stats(client))["whole_file"]["requests"] >= 1


async def test_with_whole_file_off_the_default_idle_work_fills_no_file_prefix(client: LanguageClient):
    """`whole_file` is off by default (lsp_server/settings.py): idle work warms the place and generates
    ahead as before, and no file's prefix KV is filled behind it (requests never wait for such a chunk)."""
    uri = "file:///tmp/ditto-idle/nofill.py"
    before, fills = (await stats(client))["idle_prefill"], (await stats(client))["whole_file"]["fill_tokens"]
    open_doc(client, uri, "".join(LINES[:40]) + "\n")
    move_cursor(client, uri, 60, 4)
    for _ in range(int(TIMEOUT / 0.05)):
        s = await stats(client)
        if s["idle_prefill"]["ahead"] > before["ahead"] and not s["worker_busy"] and not s["worker_idle_work"]:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"idle work did not generate ahead within {TIMEOUT} s: {s}")
    assert s["idle_prefill"]["tokens"] > before["tokens"]  # the place was warmed ...
    assert s["whole_file"]["fill_tokens"] == fills, s  # ... and no file prefix filled

"""Tier 3 of the server tests: `ditto-lsp serve` end to end over stdio (pytest-lsp), tiny random model.

One server for the module (starting one costs seconds); every test uses its own
document URIs and checks counters as differences. A tiny random model's suggestions are
noise, so tests assert on structure, ranges, ids and statistics, and compare the text
with what `Completer.complete` returns in-process for the same snapshot.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, "-m", "lsp_server.cli", "serve", "--model", "tiny-random", "--max-tokens", "12",
          "--debug-hooks"]  # the debug* settings below are refused without it
FAST = {"maxTokens": 12, "debugStepDelayMs": 0, "debugNotifySteps": False, "timeBudgetS": 10}
TIMEOUT = 60


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER), scope="module")
async def client(lsp_client: LanguageClient):
    caps = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    lsp_client.init_result = await lsp_client.initialize_session(
        types.InitializeParams(capabilities=caps, initialization_options=FAST))
    await wait_progress_end(lsp_client)
    yield
    await lsp_client.shutdown_session()


@pytest.fixture(scope="module")
def completer():
    """The same model in-process: what the server should answer for a snapshot, with the prompt budget
    fitted to the machine as the server's default fits it (tiny-random's passes are cheap: 2048)."""
    from support.completers import like_the_server

    return like_the_server()


def expected(completer, text: str, line: int, col: int, uri: str, others: dict[str, str] | None = None) -> str:
    """The suggestion for this snapshot, with `others` (uri -> text) the other open documents in opening order."""
    from lsp_server.decoding.types import DecodeOptions
    from lsp_server.lsp.documents import buffer_name

    snippets = [(buffer_name(u), t) for u, t in (others or {}).items()]
    return completer.complete(text, line, col, name=buffer_name(uri),
                              options=DecodeOptions(max_new_tokens=12), others=snippets).text


def suggesting_variant(completer, *requests, others=lambda code: None) -> tuple[str, str]:
    """CODE, or CODE with its second function renamed, whichever the model first completes with
    visible text at every request: (code, the first request's suggestion). tiny-random writes
    random bytes, and the ghost text ends before a character no editor can insert, so at a given
    place its suggestion may be empty on one backend and not on the other.
    Each of `requests`: code -> (text, line, col, uri)."""
    for name in ("mul", "sub", "div", "pow", "neg", "mod", "inc", "dec", "top", "avg"):
        code = CODE.replace("def mul(", f"def {name}(")
        wants = [expected(completer, *request(code), others=others(code)) for request in requests]
        if all(w.strip() for w in wants):
            return code, wants[0]
    raise AssertionError("tiny-random suggests nothing visible in any variant of CODE")


async def wait_progress_end(client: LanguageClient):
    while True:
        for reports in client.progress_reports.values():
            if any(isinstance(r, types.WorkDoneProgressEnd) for r in reports):
                return
        await asyncio.wait_for(client.wait_for_notification(types.PROGRESS), TIMEOUT)


async def wait_step(client: LanguageClient, uri: str):
    while True:
        params = await asyncio.wait_for(client.wait_for_notification("ditto/debug/step"), TIMEOUT)
        if params.uri == uri and not getattr(params, "idle", False):  # a request's pass, not idle prefill
            return


@pytest.fixture
def open_doc(client: LanguageClient):
    """Open documents for one test and close them after it, so that other tests' buffers
    never show up as snippets in a prompt compared with an in-process completion."""
    opened = []

    def do_open(client: LanguageClient, uri: str, text: str, version: int = 1):
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))
        opened.append(uri)

    yield do_open
    for uri in opened:
        client.text_document_did_close(types.DidCloseTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))


def configure(client: LanguageClient, **options):
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={**FAST, **options}))


def inline(client: LanguageClient, uri: str, line: int, character: int, invoked: bool = False):
    kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
    # Sent now (ensure_future), not when first awaited: tests send requests before awaiting older ones.
    return asyncio.ensure_future(client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=kind))))


def plain(x):
    """The pygls client turns JSON objects of custom results into namedtuples: back to dicts."""
    if hasattr(x, "_asdict"):
        return {k: plain(v) for k, v in x._asdict().items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


async def stats(client: LanguageClient) -> dict:
    return plain(await client.protocol.send_request_async("ditto/stats", {}))


async def trace(client: LanguageClient, uri: str):
    return plain(await client.protocol.send_request_async("ditto/trace", {"uri": uri}))


def items_of(result):
    return result.items if isinstance(result, types.InlineCompletionList) else result


CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    "
END = (5, 4)


# -- capabilities and loading ---------------------------------------------------------------

async def test_capabilities_advertise_inline_completion_and_incremental_sync(client: LanguageClient):
    caps = client.init_result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    sync = caps.text_document_sync
    assert getattr(sync, "change", sync) == types.TextDocumentSyncKind.Incremental
    assert caps.position_encoding in (None, types.PositionEncodingKind.Utf16)


async def test_model_load_reported_with_progress_and_stats_name_the_model(client: LanguageClient):
    reports = next(r for r in client.progress_reports.values() if r and isinstance(r[0], types.WorkDoneProgressBegin))
    assert isinstance(reports[-1], types.WorkDoneProgressEnd) and reports[-1].message == "ready"
    s = await stats(client)
    assert s["model_state"] == "ready" and s["model"] == "tiny-random" and s["device"] == "cpu"
    # tiny-random runs on torch unless the run chose a backend (tests/backends/test_backend_e2e.py: llama.cpp)
    assert s["backend"] == (os.environ.get("DITTO_BACKEND") or "torch")


# -- completion ---------------------------------------------------------------------------------

async def test_open_then_inline_completion_returns_an_item_at_the_cursor(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/open.py"
    open_doc(client, uri, CODE)
    result = await asyncio.wait_for(inline(client, uri, *END), TIMEOUT)
    want = expected(completer, CODE, *END, uri)
    assert want, "tiny-random's suggestion here should be non-empty; pick another snapshot"
    (item,) = items_of(result)
    assert item.insert_text == want
    assert item.range == types.Range(start=types.Position(*END), end=types.Position(*END))
    t = await trace(client, uri)
    assert t["text"] == want and t["rounds"] and t["stop_reason"] in ("length", "eos", "stop-rule", "time")
    rnd = t["rounds"][0]
    assert set(rnd) >= {"proposed", "accepted", "appended", "kind"} and isinstance(rnd["proposed"], list)
    assert sum(r["accepted"] + 1 for r in t["rounds"]) == t["stats"]["generated"]
    # The same data as `ditto-lsp trace --json`, round for round.
    assert t["trace"]["text"] == want and len(t["trace"]["rounds"]) == len(t["rounds"])
    # Where the time went besides the Completer: waiting for the worker, and the whole job.
    assert t["waited_ms"] >= 0 and t["job_ms"] >= t["latency_ms"] > 0
    assert [r["gained"] for r in t["trace"]["rounds"]] == [r["accepted"] + 1 for r in t["rounds"]]


async def test_incremental_edits_are_reflected(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/edit.py"
    open_doc(client, uri, CODE)
    # Insert a line above, then replace "mul" by "power" (two incremental changes).
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[
            types.TextDocumentContentChangePartial(range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)),
                                                   text="import math\n"),
            types.TextDocumentContentChangePartial(range=types.Range(start=types.Position(5, 4), end=types.Position(5, 7)),
                                                   text="power"),
        ]))
    edited = "import math\n" + CODE.replace("def mul", "def power")
    result = await asyncio.wait_for(inline(client, uri, 6, 4), TIMEOUT)
    want = expected(completer, edited, 6, 4, uri)
    assert want != expected(completer, CODE, *END, uri)
    (item,) = items_of(result)
    assert item.insert_text == want and item.range.start == types.Position(6, 4)


async def test_utf16_positions_after_emoji_and_cjk(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/unicode.py"
    text = 's = "😀 你好"\nname = "世界🌍"; va'
    open_doc(client, uri, text)
    line = text.split("\n")[1]
    utf16 = len(line.encode("utf-16-le")) // 2
    assert utf16 == len(line) + 1  # the emoji takes two UTF-16 code units
    result = await asyncio.wait_for(inline(client, uri, 1, utf16), TIMEOUT)
    (item,) = items_of(result)
    assert item.range.start == item.range.end == types.Position(1, utf16)
    assert item.insert_text == expected(completer, text, 1, len(line), uri)
    # Just after the CJK characters, before the emoji: code point 9 is UTF-16 unit 9.
    cut = line.index("🌍")
    result = await asyncio.wait_for(inline(client, uri, 1, cut), TIMEOUT)
    got = items_of(result)
    want = expected(completer, text, 1, cut, uri)
    assert (got[0].insert_text if got else "") == want


async def test_invoked_multiline_suggestion_also_offers_its_first_line(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/invoked.py"
    open_doc(client, uri, CODE)
    items = items_of(await asyncio.wait_for(inline(client, uri, *END, invoked=True), TIMEOUT))
    full = expected(completer, CODE, *END, uri)
    assert items[0].insert_text == full
    if "\n" in full and full.split("\n")[0].strip():
        assert items[1].insert_text == full.split("\n")[0]
    else:
        assert len(items) == 1


async def test_completion_fallback_is_the_same_suggestion_as_one_item(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/fallback.py"
    text = CODE + "re"
    open_doc(client, uri, text)
    result = await asyncio.wait_for(client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(5, 6))), TIMEOUT)
    want = expected(completer, text, 5, 6, uri)
    assert want
    (item,) = result.items
    assert item.label == want.split("\n")[0]
    assert item.text_edit.new_text == "re" + want
    assert item.text_edit.range == types.Range(start=types.Position(5, 4), end=types.Position(5, 6))


async def test_selected_completion_info_is_extended_and_its_range_used(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/selected.py"
    code, want = suggesting_variant(completer, lambda c: (c + "return", 5, 10, uri))
    text = code + "re"
    open_doc(client, uri, text)
    sel_range = types.Range(start=types.Position(5, 4), end=types.Position(5, 6))
    result = await asyncio.wait_for(client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(5, 6),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Invoked,
            selected_completion_info=types.SelectedCompletionInfo(range=sel_range, text="return")))), TIMEOUT)
    items = items_of(result)
    assert items[0].insert_text == "return" + want and items[0].range == sel_range


# -- bad input ---------------------------------------------------------------------------------------

async def test_unknown_documents_and_positions_past_the_end_get_none(client, tmp_path, open_doc):
    on_disk = tmp_path / "never_opened.py"
    on_disk.write_text(CODE)
    before = await stats(client)
    assert await asyncio.wait_for(inline(client, on_disk.as_uri(), 5, 4), TIMEOUT) is None
    assert await asyncio.wait_for(inline(client, "file:///no/such/file.py", 0, 0), TIMEOUT) is None
    uri = "file:///tmp/ditto-test/short.py"
    open_doc(client, uri, "x = 1\n")
    assert await asyncio.wait_for(inline(client, uri, 99, 0), TIMEOUT) is None
    # A character past the end of a line means the end of the line (LSP).
    result = await asyncio.wait_for(inline(client, uri, 0, 99), TIMEOUT)
    for item in items_of(result) or []:
        assert item.range.start == types.Position(0, 5)
    after = await stats(client)
    assert after["invalid"] - before["invalid"] == 3
    assert await trace(client, on_disk.as_uri()) is None


@pytest.mark.parametrize("params", [
    {"textDocument": {"uri": "file:///x.py"}, "position": {"line": -1, "character": 0}, "context": {"triggerKind": 1}},
    {"textDocument": {"uri": "file:///x.py"}, "position": {"line": 0, "character": 0}, "context": {"triggerKind": 9}},
    {"textDocument": {"uri": "file:///x.py"}, "position": {"line": "zero", "character": 0}, "context": {"triggerKind": 1}},
    {"position": {"line": 0, "character": 0}},
])
async def test_malformed_params_get_invalid_params_and_the_server_goes_on(client, params):
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(send_raw(client, types.TEXT_DOCUMENT_INLINE_COMPLETION, params), TIMEOUT)
    assert err.value.code == -32602
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(client.protocol.send_request_async("ditto/trace", {"uri": 7}), TIMEOUT)
    assert err.value.code == -32602
    assert (await stats(client))["model_state"] == "ready"


def send_raw(client: LanguageClient, method: str, params: dict):
    """Send params as given (the client would refuse to serialise malformed ones)."""
    from concurrent.futures import Future

    from pygls.protocol import JsonRPCRequestMessage

    msg_id = str(uuid.uuid4())
    future: Future = Future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data(JsonRPCRequestMessage(id=msg_id, method=method, params=params, jsonrpc="2.0"))
    return asyncio.wrap_future(future)


# -- scheduling ----------------------------------------------------------------------------------------

async def test_cancel_request_stops_the_engine_and_frees_the_worker(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/cancel.py"
    other = "file:///tmp/ditto-test/after-cancel.py"
    open_doc(client, uri, CODE)
    open_doc(client, other, CODE)
    before = await stats(client)
    # Slow enough that without a working stop flag it would hold the worker for minutes.
    configure(client, maxTokens=5000, debugStepDelayMs=50, debugNotifySteps=True, timeBudgetS=None)
    msg_id = "cancel-me"
    fut = asyncio.ensure_future(client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(*END),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)),
        msg_id=msg_id))
    await wait_step(client, uri)
    client.cancel_request(types.CancelParams(id=msg_id))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(fut, TIMEOUT)
    assert err.value.code == types.LSPErrorCodes.RequestCancelled
    configure(client)
    # One worker, first in first out: this answer means the cancelled generation ended.
    result = await asyncio.wait_for(inline(client, other, *END), 30)
    assert items_of(result)[0].insert_text == expected(completer, CODE, *END, other, others={uri: CODE})
    t = await trace(client, uri)
    assert t["stop_reason"] == "cancelled" and t["stats"]["generated"] < 200
    after = await stats(client)
    assert after["cancelled"] - before["cancelled"] == 1
    assert not after["worker_busy"] and after["worker_pending"] == 0


async def test_newer_request_for_a_document_supersedes_the_older(client, completer, open_doc):
    uri = "file:///tmp/ditto-test/supersede.py"
    open_doc(client, uri, CODE)
    before = await stats(client)
    configure(client, maxTokens=5000, debugStepDelayMs=50, debugNotifySteps=True, timeBudgetS=None)
    old = inline(client, uri, *END)
    await wait_step(client, uri)
    configure(client)
    new = await asyncio.wait_for(inline(client, uri, *END), 30)
    assert await asyncio.wait_for(old, TIMEOUT) is None
    assert items_of(new)[0].insert_text == expected(completer, CODE, *END, uri)
    after = await stats(client)
    assert after["superseded"] - before["superseded"] == 1
    assert not after["worker_busy"]


async def test_result_for_a_stale_document_version_is_dropped(client, open_doc):
    uri = "file:///tmp/ditto-test/stale.py"
    open_doc(client, uri, CODE)
    before = await stats(client)
    configure(client, maxTokens=6, debugStepDelayMs=100, debugNotifySteps=True, timeBudgetS=None)
    pending = inline(client, uri, *END)
    await wait_step(client, uri)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(5, 4), end=types.Position(5, 4)), text="x")]))
    assert await asyncio.wait_for(pending, TIMEOUT) is None
    configure(client)
    after = await stats(client)
    assert after["dropped_stale"] - before["dropped_stale"] == 1
    t = await trace(client, uri)
    assert t["version"] == 1 and t["stop_reason"] != "cancelled"


async def test_stats_report_latency_acceptance_and_tokens_per_pass(client):
    s = await stats(client)
    assert s["completed"] >= 1 and s["latency_ms"]["count"] == s["completed"]
    assert 0 < s["latency_ms"]["p50"] <= s["latency_ms"]["p95"]
    assert s["tokens_per_target_pass"] >= 1
    assert s["acceptance_rate"] is None or 0 <= s["acceptance_rate"] <= 1
    assert s["requests"] >= s["completed"] + s["cancelled"] + s["superseded"] + s["dropped_stale"]
    # The speculation policy's live estimates: pass costs learned from the passes run so far.
    sp = s["speculation"]
    assert sp["learning_costs"] and sum(sp["passes_timed"].values()) >= 1
    assert len(sp["costs_ms"]) >= 2 and all(v > 0 for v in sp["costs_ms"].values())  # T(n) at every measured n

"""Server tests: a model that fails to load, and recovery through didChangeConfiguration."""

from __future__ import annotations

import asyncio
import sys

import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from test_server import END, CODE, TIMEOUT, items_of, plain

SERVER = [sys.executable, "-m", "lsp_server.cli", "serve", "--model", "no-such-model", "--max-tokens", "8"]


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities(
        window=types.WindowClientCapabilities(work_done_progress=True))))
    yield
    await lsp_client.shutdown_session()


async def test_load_failure_shows_one_message_answers_none_and_a_good_model_recovers(client: LanguageClient):
    shown = await asyncio.wait_for(client.wait_for_notification(types.WINDOW_SHOW_MESSAGE), TIMEOUT)
    assert shown.type == types.MessageType.Error and "no-such-model" in shown.message
    uri = "file:///tmp/ditto-test/load.py"
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=CODE + "r")))
    # After "r": tiny-random's suggestion there is not empty (at the bare indentation it is cut to nothing)
    at = types.Position(END[0], END[1] + 1)
    req = types.InlineCompletionParams(text_document=types.TextDocumentIdentifier(uri=uri),
                                       position=at,
                                       context=types.InlineCompletionContext(
                                           trigger_kind=types.InlineCompletionTriggerKind.Automatic))
    assert await asyncio.wait_for(client.text_document_inline_completion_async(req), TIMEOUT) is None
    s = plain(await client.protocol.send_request_async("ditto/stats", {}))
    assert s["model_state"] == "failed" and "no-such-model" in s["model_error"] and s["not_ready"] == 1
    # Recover: a settings change to a loadable model; its load ends with a "ready" progress report.
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"ditto": {"model": "tiny-random"}}))
    while not any(isinstance(r, types.WorkDoneProgressEnd) and r.message == "ready"
                  for reports in client.progress_reports.values() for r in reports):
        await asyncio.wait_for(client.wait_for_notification(types.PROGRESS), TIMEOUT)
    result = await asyncio.wait_for(client.text_document_inline_completion_async(req), TIMEOUT)
    (item,) = items_of(result)
    assert item.insert_text and item.range.start == at
    s = plain(await client.protocol.send_request_async("ditto/stats", {}))
    assert s["model_state"] == "ready" and s["model"] == "tiny-random" and s["completed"] == 1
    # contextTokens unset: the prompt budget was fitted to what this model's passes cost here (completion/build.py)
    from lsp_server.completion.build import fitting_budget

    fitted = s["context_fitted_to"]
    assert fitted["prefill_ms_per_token"] > 0 and fitted["decode_ms"] > 0
    assert s["context_tokens"] == fitting_budget(fitted["prefill_ms_per_token"], fitted["decode_ms"])
    assert len(client.messages) == 1  # the failure was shown once, nothing else

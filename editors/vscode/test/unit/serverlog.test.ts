import { test } from "node:test";
import assert from "node:assert/strict";

import { classify } from "../../src/serverlog";

test("Python logging lines get their level, without the timestamp", () => {
  assert.deepEqual(classify("2026-11-30 17:30:10,825 INFO lsp_server.server: model tiny-random ready on cpu in 5.3 s", "info"), {
    level: "info",
    text: "lsp_server.server: model tiny-random ready on cpu in 5.3 s",
  });
  assert.equal(classify("2026-11-30 17:30:11,783 WARNING pygls.protocol.json_rpc: Cancel notification for unknown message id", "info").level, "warn");
  assert.equal(classify("2026-11-30 17:30:11,783 ERROR lsp_server.server: boom", "info").level, "error");
  assert.equal(classify("2026-11-30 17:30:11,783 DEBUG x: y", "error").level, "debug");
});

test("continuation lines keep the previous level; a traceback is an error", () => {
  assert.deepEqual(classify("Traceback (most recent call last):", "info"), { level: "error", text: "Traceback (most recent call last):" });
  assert.deepEqual(classify('  File "x.py", line 1, in <module>', "error"), { level: "error", text: '  File "x.py", line 1, in <module>' });
  assert.deepEqual(classify("loading: 50%", "info"), { level: "info", text: "loading: 50%" });
});

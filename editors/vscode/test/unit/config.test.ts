import { test } from "node:test";
import assert from "node:assert/strict";

import {
  changeKind,
  configurationParams,
  DEFAULTS,
  describeLaunch,
  initializationOptions,
  readSettings,
  serverLaunch,
} from "../../src/config";

const from = (o: Record<string, unknown>) => readSettings((k) => o[k]);

test("nothing set gives the defaults", () => {
  assert.deepEqual(from({}), DEFAULTS);
});

test("settings become flat camelCase initializationOptions, client-only keys left out", () => {
  const s = from({ model: "tiny-random", drafter: "none", maxTokens: 32, timeBudget: null, enable: false, serverCommand: "/x/ditto-lsp" });
  assert.deepEqual(initializationOptions(s), {
    model: "tiny-random",
    drafter: "none",
    device: "auto",
    dtype: "auto",
    maxTokens: 32,
    draftMax: 8,
    temperature: 0,
    timeBudget: null,
    multiline: true,
  });
});

test("didChangeConfiguration sends the same options under a ditto key", () => {
  const s = from({ model: "qwen2.5-coder-0.5b" });
  assert.deepEqual(configurationParams(s), { settings: { ditto: initializationOptions(s) } });
});

test("wrong types and out-of-range numbers fall back to defaults", () => {
  const s = from({ model: "  ", maxTokens: 0, draftMax: -1, temperature: "hot", drafter: "llm", timeBudget: -3, serverArgs: ["-v", 3] });
  assert.equal(s.model, "default");
  assert.equal(s.maxTokens, 64);
  assert.equal(s.draftMax, 8);
  assert.equal(s.temperature, 0);
  assert.equal(s.drafter, "ngram");
  assert.equal(s.timeBudget, 5);
  assert.deepEqual(s.serverArgs, ["-v"]);
  assert.equal(from({ maxTokens: 12.7 }).maxTokens, 12);
  assert.equal(from({ draftMax: 0 }).draftMax, 0);
});

test("serverCommand launch: <cmd> serve --model M [args]", () => {
  const l = serverLaunch(from({ serverCommand: "/opt/venv/bin/ditto-lsp", model: "tiny-random", serverArgs: ["--verbose"] }));
  assert.deepEqual(l, { command: "/opt/venv/bin/ditto-lsp", args: ["serve", "--model", "tiny-random", "--verbose"] });
});

test("pythonPath wins over serverCommand: <python> -m lsp_server.cli serve", () => {
  const l = serverLaunch(from({ serverCommand: "ignored", pythonPath: " /v/bin/python ", model: "default" }));
  assert.deepEqual(l, { command: "/v/bin/python", args: ["-m", "lsp_server.cli", "serve", "--model", "default"] });
});

test("describeLaunch quotes what a shell would need quoted", () => {
  assert.equal(describeLaunch({ command: "/a b/ditto-lsp", args: ["serve", "--model", "it's"] }), `'/a b/ditto-lsp' serve --model 'it'\\''s'`);
});

test("changeKind: launch settings restart, server settings notify, enable does neither", () => {
  const a = from({});
  assert.equal(changeKind(a, from({ serverCommand: "/other" })), "restart");
  assert.equal(changeKind(a, from({ pythonPath: "/usr/bin/python3" })), "restart");
  assert.equal(changeKind(a, from({ serverArgs: ["-v"] })), "restart");
  assert.equal(changeKind(a, from({ model: "tiny-random" })), "notify");
  assert.equal(changeKind(a, from({ drafter: "none" })), "notify");
  assert.equal(changeKind(a, from({ enable: false })), "none");
  assert.equal(changeKind(a, from({})), "none");
});

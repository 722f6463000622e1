import { test } from "node:test";
import assert from "node:assert/strict";

import manifest from "../../package.json";
import {
  changeKind,
  configurationParams,
  DEFAULTS,
  describeLaunch,
  DittoSettings,
  DRAFTERS,
  initializationOptions,
  RESTART_KEYS,
  readSettings,
  SERVER_KEYS,
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
    draftModel: "qwen2.5-coder-0.5b",
    adaptive: true,
    idlePrefill: true,
    wholeFile: false,
    show: "sure",
    learnShow: true,
    nextEdit: true,
    nextEditProposer: "propagate",
    device: "auto",
    dtype: "auto",
    backend: "auto",
    trustRemoteCode: false,
    remote: {},
    maxTokens: 32,
    contextTokens: 0,
    snippets: "heads",
    draftMax: 8,
    temperature: 0,
    topP: 1,
    topK: 0,
    seed: null,
    timeBudget: null,
    multiline: true,
    firstAnswerS: 1,
    loadWaitS: 120,
    indexMemoryMb: 64,
    definitions: true,
    recentEdits: true,
    definitionsShare: 0.2,
    editsShare: 0.1,
  });
});

test("every drafter, the draft model and adaptive reach the server's options", () => {
  assert.deepEqual([...DRAFTERS], ["none", "ngram", "model", "hybrid"]);
  for (const drafter of DRAFTERS) assert.equal(initializationOptions(from({ drafter })).drafter, drafter);
  const s = from({ drafter: "hybrid", draftModel: " qwen2.5-coder-1.5b ", adaptive: false, topP: 0.9, topK: 40, seed: 7 });
  const o = initializationOptions(s);
  assert.equal(o.drafter, "hybrid");
  assert.equal(o.draftModel, "qwen2.5-coder-1.5b");
  assert.equal(o.adaptive, false);
  assert.deepEqual([o.topP, o.topK, o.seed], [0.9, 40, 7]);
  assert.equal(initializationOptions(from({ drafter: "model" })).drafter, "model");
  assert.deepEqual(configurationParams(s).settings.ditto, o);
  assert.equal(changeKind(from({}), s), "notify");
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
  const t = from({ draftModel: "", adaptive: "no", topP: 0, topK: -1, seed: 1.5, trustRemoteCode: "yes", drafter: 3 });
  assert.deepEqual([t.draftModel, t.adaptive, t.topP, t.topK, t.seed, t.trustRemoteCode, t.drafter],
    [DEFAULTS.draftModel, true, 1, 0, null, false, "ngram"]);
  assert.equal(from({ maxTokens: 12.7 }).maxTokens, 12);
  // contextTokens: 0 (the default) leaves the budget to the server's fit; under 64 otherwise falls back to it
  assert.deepEqual([0, 512, 32].map((contextTokens) => from({ contextTokens }).contextTokens), [0, 512, 0]);
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
  assert.equal(changeKind(a, from({ nextEdit: false })), "notify");
  assert.equal(changeKind(a, from({})), "none");
});

// package.json is what VS Code shows and validates; these keep config.ts in step with it (and
// tests/lsp/test_settings_paths.py keeps package.json in step with the server's Settings).
const properties = manifest.contributes.configuration.properties as Record<string, { default?: unknown }>;
const CLIENT_ONLY = ["enable", ...RESTART_KEYS];

test("every ditto.* setting is read here with package.json's default, and nothing else is", () => {
  const declared = Object.keys(properties).map((k) => k.replace(/^ditto\./, "")).filter((k) => k !== "trace.server");
  assert.deepEqual([...declared].sort(), Object.keys(DEFAULTS).sort());
  for (const k of declared) assert.deepEqual(properties[`ditto.${k}`].default, DEFAULTS[k as keyof DittoSettings], k);
});

test("the server keys are exactly the settings that are not the client's own", () => {
  const server = Object.keys(DEFAULTS).filter((k) => !CLIENT_ONLY.includes(k));
  assert.deepEqual([...SERVER_KEYS].sort(), server.sort());
});

import { test } from "node:test";
import assert from "node:assert/strict";

import { percent, pick, progressView, shortModel, stateView, statsView, summarize } from "../../src/stats";

test("pick finds snake_case, camelCase and one-level nested keys", () => {
  assert.equal(pick({ acceptance_rate: 0.5 }, "acceptanceRate"), 0.5);
  assert.equal(pick({ acceptanceRate: 0.25 }, "acceptance_rate"), 0.25);
  assert.equal(pick({ latency_ms: { p50: 12 } }, "latency_ms_p50"), 12);
  assert.equal(pick({ a: null }, "a"), undefined);
  assert.equal(pick(null, "a"), undefined);
});

test("status text: model, acceptance rate and tokens per pass", () => {
  const v = statsView({ model: "tiny-random", device: "cpu", acceptance_rate: 0.6234, tokens_per_pass: 2.5, requests: 7 }, true, "x");
  assert.equal(v.text, "$(sparkle) Ditto tiny-random · acc 62% · 2.50 tok/pass");
  assert.match(v.tooltip, /\| requests \| 7 \|/);
  assert.match(v.tooltip, /\| device \| cpu \|/);
});

test("status text before any completion shows the model only; off says so", () => {
  assert.equal(statsView({ model: "m" }, true, "x").text, "$(sparkle) Ditto m");
  assert.equal(statsView({ model: "m", acceptance_rate: 0.5 }, false, "x").text, "$(circle-slash) Ditto m (off)");
  assert.equal(statsView({}, true, "/models/qwen/").text, "$(sparkle) Ditto qwen");
});

test("summarize reads latency percentiles in the shapes a server may use", () => {
  assert.deepEqual([summarize({ latency_ms: { p50: 10, p95: 90 } }).p50, summarize({ latency_ms: { p50: 10, p95: 90 } }).p95], [10, 90]);
  assert.equal(summarize({ latency_p95_ms: 41 }).p95, 41);
  assert.equal(summarize({ latency: { p50_ms: 3 } }).p50, 3);
  assert.equal(summarize({ tokens_per_target_pass: 1.75 }).tokensPerPass, 1.75);
});

test("tooltip escapes markdown from the server", () => {
  const v = statsView({ model: "a|b*c" }, true, "x");
  assert.match(v.tooltip, /a\\\|b\\\*c/);
});

test("percent and shortModel", () => {
  assert.equal(percent(undefined), "–");
  assert.equal(percent(0), "0%");
  assert.equal(percent(87.4), "87%");
  assert.equal(shortModel("C:\\models\\coder.gguf"), "coder.gguf");
  assert.equal(shortModel("x".repeat(40)).length, 32);
});

test("progress and state views", () => {
  assert.equal(progressView("Loading tiny-random", { kind: "report", percentage: 41.6 }).text, "$(loading~spin) Ditto: Loading tiny-random 42%");
  assert.equal(progressView("", { kind: "begin" }).text, "$(loading~spin) Ditto: loading");
  assert.match(stateView("failed", "no ditto-lsp").tooltip, /no ditto-lsp/);
});

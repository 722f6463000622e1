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
  assert.match(v.tooltip, /\| device \/ dtype \| cpu \/ – \|/);
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

test("progress: the latest message, else the title", () => {
  assert.equal(progressView("Ditto", "loading model tiny-random", { kind: "report", percentage: 41.6 }).text, "$(loading~spin) Ditto: loading model tiny-random 42%");
  assert.equal(progressView("Ditto", undefined, { kind: "begin" }).text, "$(loading~spin) Ditto: loading");
  assert.equal(progressView("Reading weights", undefined, { kind: "begin", percentage: 0 }).text, "$(loading~spin) Ditto: Reading weights 0%");
  assert.match(stateView("failed", "no ditto-lsp").tooltip, /no ditto-lsp/);
});

// The reply of the server as it is (lsp_server/lsp/server.py DittoServer.stats).
const SERVER_STATS = {
  requests: 5, completed: 4, empty: 1, cancelled: 1, superseded: 2, dropped_stale: 0, not_ready: 0, invalid: 0, errors: 0,
  latency_ms: { p50: 180.2, p95: 1450, count: 4 },
  acceptance_rate: 0.4167, tokens_per_target_pass: 1.3125, drafted: 12, accepted: 5,
  model: "tiny-random", device: "cpu", dtype: "float32", model_state: "ready", model_error: null,
  worker_busy: false, worker_pending: 0, open_documents: 1,
};

test("the server's ditto/stats reply", () => {
  const v = statsView(SERVER_STATS, true, "x");
  assert.equal(v.text, "$(sparkle) Ditto tiny-random · acc 42% · 1.31 tok/pass");
  assert.match(v.tooltip, /\| latency p50 \/ p95 \| 180 ms \/ 1\.45 s \|/);
  assert.match(v.tooltip, /\| cancelled \/ superseded \/ stale \| 1 \/ 2 \/ 0 \|/);
  assert.match(v.tooltip, /\| device \/ dtype \| cpu \/ float32 \|/);
});

test("before the first completion (rates null), while loading, after a failed load", () => {
  const fresh = { ...SERVER_STATS, acceptance_rate: null, tokens_per_target_pass: null };
  assert.equal(statsView(fresh, true, "x").text, "$(sparkle) Ditto tiny-random");
  assert.equal(statsView({ ...fresh, model_state: "loading", device: null }, true, "x").text, "$(loading~spin) Ditto: loading tiny-random");
  const failed = statsView({ ...fresh, model: "nope", model_state: "failed", model_error: "no such model" }, true, "x");
  assert.equal(failed.text, "$(warning) Ditto: nope failed to load");
  assert.match(failed.tooltip, /no such model/);
});

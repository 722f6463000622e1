import { test } from "node:test";
import assert from "node:assert/strict";

import { escapeHtml, readRounds, renderTraceHtml, showToken } from "../../src/trace";

const TRACE = {
  uri: "file:///w/a.py",
  model: "tiny-random",
  drafter: "ngram",
  text: "return a + b\n",
  rounds: [
    { proposed_text: ["return", " a"], accepted: 2, token_text: " +", kind: "bonus", source: "prompt", match_len: 3, ms: 12.5 },
    { proposed_text: [" b", "<x>"], accepted: 1, token_text: "\n", kind: "correction", source: "buffer", match_len: 2, ms: 9 },
    { proposed_text: [], accepted: 0, token_text: " ", kind: "plain", ms: 4 },
  ],
};

// The reply of the server as it is (lsp_server/lsp/server.py DittoServer._record).
const SERVER_TRACE = {
  uri: "file:///w/a.py", version: 3, position: { line: 22, character: 15 },
  text: "self.side", raw: "self.side\n", drafter: "ngram", stop_reason: "block_end",
  stats: { tokens: 3, generated: 4, target_passes: 2, drafted: 3, accepted: 2, stop_reason: "block_end", acceptance_rate: 0.6667, tokens_per_pass: 2 },
  latency_ms: 85.3,
  rounds: [
    { proposed: ["self", ".", "width"], proposed_text: "self.width", accepted: 2, appended: "side", kind: "correction", source: "buffer:/w/a.py", match_len: 4, ms: 30.1 },
    { proposed: [], proposed_text: "", accepted: 0, appended: "\n", kind: "plain", source: "", match_len: 0, ms: 20 },
  ],
};

test("the server's ditto/trace reply: token lists, appended token, stop reason", () => {
  const html = renderTraceHtml(SERVER_TRACE);
  assert.match(html, /<span class="tok acc">self<\/span><span class="tok acc">\.<\/span><span class="tok rej">width<\/span><span class="tok own" title="correction">side<\/span>/);
  assert.match(html, /<span class="tok own" title="plain">⏎<\/span>/);
  assert.match(html, /<b>2<\/b> target passes/);
  assert.match(html, /acceptance <b>67%<\/b> \(2\/3 drafted\)/);
  assert.match(html, /stopped by <b>block_end<\/b>/);
  assert.match(html, /latency <b>85\.3 ms<\/b>/);
  assert.match(html, /buffer:\/w\/a\.py \(match 4\)/);
});

test("readRounds normalises rounds and clamps accepted", () => {
  const r = readRounds({ rounds: [{ proposed: [1, 2], accepted: 5, token: 9 }] })!;
  assert.equal(r[0].accepted, 2);
  assert.equal(r[0].kind, "correction");
  assert.equal(r[0].token, 9);
  assert.equal(readRounds({ nothing: 1 }), undefined);
});

test("the page marks accepted, rejected and the target's own tokens", () => {
  const html = renderTraceHtml(TRACE, { uri: TRACE.uri, cspSource: "vscode-webview:" });
  assert.match(html, /<span class="tok acc">return<\/span><span class="tok acc">·a<\/span><span class="tok own" title="bonus">·\+<\/span>/);
  assert.match(html, /<span class="tok acc">·b<\/span><span class="tok rej">&lt;x&gt;<\/span><span class="tok own" title="correction">⏎<\/span>/);
  assert.match(html, /<b>3<\/b> target passes/);
  assert.match(html, /<b>6<\/b> tokens/); // (2+1) + (1+1) + (0+1)
  assert.match(html, /acceptance <b>75%<\/b> \(3\/4 drafted\)/);
  assert.match(html, /<b>2\.00<\/b> tokens\/pass/);
  assert.match(html, /match 3/);
  assert.match(html, /12\.5 ms/);
});

test("no scripts, and a Content-Security-Policy that allows none", () => {
  const html = renderTraceHtml({ ...TRACE, text: "<script>alert(1)</script>" });
  assert.doesNotMatch(html, /<script/i);
  assert.match(html, /&lt;script&gt;/);
  assert.match(html, /default-src 'none'/);
});

test("no completion yet, and an unknown shape shown as JSON", () => {
  assert.match(renderTraceHtml(null), /No completion yet/);
  assert.match(renderTraceHtml({ rounds: [] }), /No completion yet/);
  const html = renderTraceHtml({ something: "<else>" });
  assert.match(html, /shape this view does not know/);
  assert.match(html, /&quot;something&quot;: &quot;&lt;else&gt;&quot;/);
});

test("token display makes whitespace visible and escapes", () => {
  assert.equal(showToken(" \t\n"), "·⇥⏎");
  assert.equal(showToken(""), "∅");
  assert.equal(showToken(42), "#42");
  assert.equal(escapeHtml(`<a href="x">'&'</a>`), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
});

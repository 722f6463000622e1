import { test } from "node:test";
import assert from "node:assert/strict";

import { ghostDrawable, NextEditAnswer, offScreenHint, onScreen, parseAnswer, shownNewText, staleness, tabAction } from "../../src/nexteditLogic";

// The shape lsp_server/lsp/nextedit.py answers (tests/lsp/test_next_edit.py checks the server side).
const ANSWER: NextEditAnswer = {
  uri: "file:///w/a.py",
  range: { start: { line: 8, character: 13 }, end: { line: 8, character: 21 } },
  newText: "Lazy",
  oldText: "KeepOpen",
  cursor: { line: 8, character: 17 },
  version: 12,
  source: "propagate",
  why: "KeepOpenFile -> LazyFile",
};

test("parseAnswer takes the server's answer and refuses null and malformed ones", () => {
  assert.deepEqual(parseAnswer(JSON.parse(JSON.stringify(ANSWER))), ANSWER);
  assert.equal(parseAnswer(null), undefined);
  assert.equal(parseAnswer({ ...ANSWER, newText: 3 }), undefined);
  assert.equal(parseAnswer({ ...ANSWER, cursor: { line: -1, character: 0 } }), undefined);
  assert.equal(parseAnswer({ ...ANSWER, range: { start: ANSWER.range.end, end: ANSWER.range.start } }), undefined);
  assert.equal(parseAnswer({ ...ANSWER, version: undefined }), undefined);
  assert.deepEqual(parseAnswer({ ...ANSWER, version: null }), { ...ANSWER, version: null }); // another document
});

test("staleness: the newest request, the current version, the text still there", () => {
  const req = { seq: 3, version: 12 };
  assert.equal(staleness(ANSWER, req, { seq: 3, version: 12 }, "KeepOpen"), undefined);
  assert.equal(staleness(ANSWER, req, { seq: 4, version: 12 }, "KeepOpen"), "a newer request was made");
  assert.equal(staleness(ANSWER, req, { seq: 3, version: 13 }, "KeepOpen"), "the document changed");
  assert.equal(staleness(ANSWER, req, { seq: 3, version: undefined }, "KeepOpen"), "the document changed");
  assert.equal(staleness({ ...ANSWER, version: 11 }, req, { seq: 3, version: 12 }, "KeepOpen"), "the document changed");
  assert.equal(staleness(ANSWER, req, { seq: 3, version: 12 }, undefined), "its document is not open");
  // an edit in another document: no version in the answer; the asking document's still counts
  assert.equal(staleness({ ...ANSWER, version: null }, req, { seq: 3, version: 12 }, "KeepOpen"), undefined);
  assert.equal(staleness({ ...ANSWER, version: null }, req, { seq: 3, version: 13 }, "KeepOpen"), "the document changed");
  assert.equal(staleness(ANSWER, req, { seq: 3, version: 12 }, "KeepOpem"), "the text there changed");
});

test("the first Tab jumps, the second (at the edit's start) applies", () => {
  assert.equal(tabAction(ANSWER, true, { line: 0, character: 10 }), "jump");
  assert.equal(tabAction(ANSWER, false, { line: 8, character: 13 }), "jump"); // another document
  assert.equal(tabAction(ANSWER, true, undefined), "jump"); // a selection
  assert.equal(tabAction(ANSWER, true, { line: 8, character: 13 }), "apply");
});

test("the texts shown: the new text on one line, the off-screen hint, what is on screen", () => {
  assert.equal(shownNewText("Lazy"), "Lazy");
  assert.equal(shownNewText("a\nb\r\nc"), "a ⏎ b ⏎ c");
  assert.equal(shownNewText("x".repeat(200), 10), "x".repeat(9) + "…");
  assert.equal(offScreenHint(ANSWER), "  » next edit at line 9 (Tab)");
  assert.equal(offScreenHint(ANSWER, "b.py"), "  » next edit at b.py:9 (Tab)");
  assert.equal(onScreen(8, [{ start: 0, end: 7 }]), false);
  assert.equal(onScreen(8, [{ start: 0, end: 3 }, { start: 8, end: 20 }]), true);
});

test("an item is ghost text only where it inserts around the text it replaces", () => {
  assert.equal(ghostDrawable("", "anything"), true); // a plain insertion
  assert.equal(ghostDrawable(")", "x, y)"), true); // an argument typed before a closing bracket
  assert.equal(ghostDrawable("(path) or KeepOpenFile(None)", "(path) or _KeepOpenFile(None)"), true);
  assert.equal(ghostDrawable("(path) or OpenMode(None)", "(path) or ClosedMode(None)"), false); // "O" replaced
  assert.equal(ghostDrawable("abc", "ab"), false); // a deletion
});

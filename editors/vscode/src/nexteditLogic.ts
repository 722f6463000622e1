/**
 * The pure part of next-edit suggestions (no `vscode` import, unit-tested in
 * test/unit/nextedit.test.ts): checking the server's `ditto/nextEdit` answer
 * (lsp_server/lsp/nextedit.py in the repository), deciding whether it is stale, what the
 * first Tab does, and the texts shown. nextedit.ts is the glue that draws and applies it.
 */

export interface Pos {
  line: number;
  character: number;
}

export interface NextEditAnswer {
  uri: string;
  range: { start: Pos; end: Pos };
  newText: string;
  oldText: string;
  cursor: Pos;
  version: number | null; // the asking document's version; null for an edit in another document
  source?: string;
  why?: string;
}

function isPos(p: unknown): p is Pos {
  const q = p as Pos;
  return typeof p === "object" && p !== null && Number.isInteger(q.line) && Number.isInteger(q.character) && q.line >= 0 && q.character >= 0;
}

/** The answer if it is a well-formed proposal, else undefined (`null`: nothing to propose). */
export function parseAnswer(a: unknown): NextEditAnswer | undefined {
  if (typeof a !== "object" || a === null) return undefined;
  const e = a as NextEditAnswer;
  if (typeof e.uri !== "string" || typeof e.newText !== "string" || typeof e.oldText !== "string") return undefined;
  if (typeof e.range !== "object" || e.range === null || !isPos(e.range.start) || !isPos(e.range.end)) return undefined;
  if (!isPos(e.cursor) || (typeof e.version !== "number" && e.version !== null)) return undefined;
  const { start, end } = e.range;
  if (end.line < start.line || (end.line === start.line && end.character < start.character)) return undefined;
  return e;
}

/**
 * Why an answer is not shown, or undefined when it is: it must answer the newest request
 * (`seq`), for the document version still current (the server's `version` is null for an edit
 * in another document), and replace exactly the text that is there (`textAtRange`: the target
 * document's text over `range` now, undefined when that document is not open).
 */
export function staleness(
  e: NextEditAnswer,
  request: { seq: number; version: number },
  now: { seq: number; version: number | undefined },
  textAtRange: string | undefined,
): string | undefined {
  if (request.seq !== now.seq) return "a newer request was made";
  if (now.version !== request.version || (e.version !== null && e.version !== request.version)) return "the document changed";
  if (textAtRange === undefined) return "its document is not open";
  if (textAtRange !== e.oldText) return "the text there changed";
  return undefined;
}

/** What Tab does while an edit is shown: go to its start first, apply it when there already
 * (`inTarget`: the active editor shows the edit's document; `cursor`: undefined with a selection). */
export function tabAction(e: NextEditAnswer, inTarget: boolean, cursor: Pos | undefined): "jump" | "apply" {
  const s = e.range.start;
  if (!inTarget || !cursor || cursor.line !== s.line || cursor.character !== s.character) return "jump";
  return "apply";
}

/** The new text as shown after the struck-through old text (one line: line breaks as ⏎). */
export function shownNewText(newText: string, max = 120): string {
  const one = newText.replace(/\r?\n/g, " ⏎ ");
  return one.length > max ? one.slice(0, max - 1) + "…" : one;
}

/** The hint at the cursor when the edit is off screen (or in another file, `fileName`). */
export function offScreenHint(e: NextEditAnswer, fileName?: string): string {
  const where = fileName ? `${fileName}:${e.range.start.line + 1}` : `line ${e.range.start.line + 1}`;
  return `  » next edit at ${where} (Tab)`;
}

/** Whether `line` lies in one of the visible line ranges (inclusive). */
export function onScreen(line: number, visible: { start: number; end: number }[]): boolean {
  return visible.some((r) => line >= r.start && line <= r.end);
}

/**
 * Whether VS Code can draw an inline completion item that replaces `replaced` (the text from the
 * cursor to the item's range end) with `text` (its text after the cursor) as ghost text: only
 * insertions around the replaced text, which stays in it in order. The server's item that makes the
 * next edit on the cursor's line (lsp_server/lsp/nextedit.py `inline_item`) replaces text; where VS
 * Code cannot draw it, the extension drops it and the next edit shows it instead (extension.ts).
 */
export function ghostDrawable(replaced: string, text: string): boolean {
  let i = 0;
  for (const ch of text) if (i < replaced.length && ch === replaced[i]) i++;
  return i === replaced.length;
}

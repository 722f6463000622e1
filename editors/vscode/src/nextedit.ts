/**
 * Next-edit suggestions in VS Code: after an edit, once the user pauses (DEBOUNCE_MS after the
 * last change), ask the server (`ditto/nextEdit`, lsp_server/lsp/nextedit.py in the repository)
 * for the edit that follows, often somewhere else, and show it where it goes: the replaced text
 * struck through, the new text after it, a mark in the gutter and on the scrollbar, and a hint
 * at the cursor when its place is off screen. Tab (package.json's keybindings, only while one is
 * shown and no ghost text is) goes there, a second Tab applies it as one workspace edit and puts
 * the cursor where the server says; Escape dismisses it.
 *
 * Nothing is applied without that key. A proposal answering a document version that is no
 * longer current, or a request that a newer one replaced, is dropped; any edit of its document
 * clears the one shown. No request is made while ghost text is shown (as far as an extension can
 * tell: the last inline answer for this version and cursor had items; cleared when the cursor
 * moves or Escape hides it). The checks are nexteditLogic.ts (unit-tested); this file is glue.
 */

import * as vscode from "vscode";
import { LanguageClient } from "vscode-languageclient/node";

import { NextEditAnswer, offScreenHint, onScreen, parseAnswer, shownNewText, staleness, tabAction } from "./nexteditLogic";

export const DEBOUNCE_MS = 300;
const CONTEXT_KEY = "ditto.nextEditShown";
const GUTTER_ICON = vscode.Uri.parse(
  "data:image/svg+xml;utf8," +
    encodeURIComponent(
      '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">' +
        '<path d="M3 3l5 5-5 5M8 3l5 5-5 5" fill="none" stroke="#3794ff" stroke-width="2"/></svg>',
    ),
);

interface Shown {
  answer: NextEditAnswer;
  from: string; // the document asked from (uri string)
  target: vscode.Uri; // the document it edits
  targetVersion: number;
  range: vscode.Range;
}

export class NextEdits implements vscode.Disposable {
  private shown: Shown | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private seq = 0;
  private readonly asked = new Map<string, number>(); // uri -> the version last asked about
  private ghost: { uri: string; version: number; position: vscode.Position } | undefined;
  private pending = false; // skipped for ghost text: ask once it goes
  readonly counts = { asked: 0, shown: 0, none: 0, stale: 0, jumped: 0, applied: 0, dismissed: 0, cleared: 0 };
  private readonly oldText = vscode.window.createTextEditorDecorationType({
    textDecoration: "line-through",
    backgroundColor: new vscode.ThemeColor("diffEditor.removedTextBackground"),
  });
  private readonly newText = vscode.window.createTextEditorDecorationType({
    after: {
      color: new vscode.ThemeColor("editor.foreground"),
      backgroundColor: new vscode.ThemeColor("diffEditor.insertedTextBackground"),
    },
  });
  private readonly mark = vscode.window.createTextEditorDecorationType({
    gutterIconPath: GUTTER_ICON,
    gutterIconSize: "contain",
    overviewRulerColor: new vscode.ThemeColor("editorInfo.foreground"),
    overviewRulerLane: vscode.OverviewRulerLane.Right,
  });
  private readonly hint = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor("editorCodeLens.foreground"), fontStyle: "italic" },
  });
  private readonly subs: vscode.Disposable[] = [];

  constructor(
    private readonly client: () => LanguageClient | undefined,
    private readonly enabled: () => boolean,
    private readonly log: vscode.LogOutputChannel,
  ) {
    this.subs.push(
      vscode.workspace.onDidChangeTextDocument((e) => this.changed(e)),
      vscode.window.onDidChangeTextEditorSelection((e) => this.moved(e)),
      vscode.window.onDidChangeTextEditorVisibleRanges(() => this.render()),
      vscode.window.onDidChangeActiveTextEditor(() => this.render()),
      vscode.workspace.onDidCloseTextDocument((d) => {
        this.asked.delete(d.uri.toString());
        if (this.shown && (this.shown.from === d.uri.toString() || this.shown.target.toString() === d.uri.toString())) this.clear("cleared");
      }),
    );
  }

  /** The middleware saw an inline completion answer: ghost text is (probably) shown there. */
  sawInline(document: vscode.TextDocument, position: vscode.Position, items: number): void {
    this.ghost = items > 0 ? { uri: document.uri.toString(), version: document.version, position } : undefined;
  }

  /** Escape while ghost text is shown: hide it, and ask for a next edit if one was held back. */
  async hideGhostText(): Promise<void> {
    await vscode.commands.executeCommand("editor.action.inlineSuggest.hide");
    this.ghost = undefined;
    if (this.pending) this.schedule(0);
  }

  private ghostShown(editor: vscode.TextEditor): boolean {
    const g = this.ghost;
    return (
      g !== undefined &&
      g.uri === editor.document.uri.toString() &&
      g.version === editor.document.version &&
      editor.selection.active.isEqual(g.position)
    );
  }

  private changed(e: vscode.TextDocumentChangeEvent): void {
    if (e.contentChanges.length === 0) return;
    const uri = e.document.uri.toString();
    const s = this.shown;
    if (s && (s.from === uri || s.target.toString() === uri)) this.clear("cleared"); // any edit clears it
    if (vscode.window.activeTextEditor?.document === e.document) this.schedule();
  }

  private moved(e: vscode.TextEditorSelectionChangeEvent): void {
    if (this.ghost && !this.ghostShown(e.textEditor)) {
      this.ghost = undefined; // the cursor left it: VS Code hides the ghost text
      if (this.pending) this.schedule();
    }
    if (this.shown) this.render();
  }

  private schedule(delay = DEBOUNCE_MS): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.ask(), delay);
  }

  /** Ask for the active editor's document, unless asked at this version already, or an edit or
   * ghost text is shown. */
  async ask(): Promise<void> {
    const client = this.client();
    const editor = vscode.window.activeTextEditor;
    if (!client?.isRunning() || !this.enabled() || !editor || this.shown) return;
    const doc = editor.document;
    if (!["file", "untitled"].includes(doc.uri.scheme)) return;
    if (this.ghostShown(editor)) {
      this.pending = true;
      return;
    }
    this.pending = false;
    const key = doc.uri.toString();
    if (this.asked.get(key) === doc.version) return;
    this.asked.set(key, doc.version);
    const request = { seq: ++this.seq, version: doc.version };
    const pos = editor.selection.active;
    this.counts.asked++;
    let result: unknown;
    try {
      result = await client.sendRequest("ditto/nextEdit", {
        textDocument: { uri: client.code2ProtocolConverter.asUri(doc.uri) },
        position: { line: pos.line, character: pos.character },
      });
    } catch (err) {
      this.log.warn(`ditto/nextEdit: ${err instanceof Error ? err.message : String(err)}`);
      return;
    }
    const e = parseAnswer(result);
    if (!e) {
      this.counts.none++;
      return;
    }
    const target = client.protocol2CodeConverter.asUri(e.uri);
    const tdoc = vscode.workspace.textDocuments.find((d) => d.uri.toString() === target.toString());
    const range = new vscode.Range(e.range.start.line, e.range.start.character, e.range.end.line, e.range.end.character);
    const there = tdoc && tdoc.validateRange(range).isEqual(range) ? tdoc.getText(range) : undefined;
    const why = staleness(e, request, { seq: this.seq, version: doc.isClosed ? undefined : doc.version }, there);
    if (why || !tdoc) {
      this.counts.stale++;
      this.log.debug(`next edit dropped: ${why}`);
      return;
    }
    const now = vscode.window.activeTextEditor;
    if (this.shown || (now && this.ghostShown(now))) return; // ghost text came meanwhile: it keeps Tab
    this.shown = { answer: e, from: key, target, targetVersion: tdoc.version, range };
    this.counts.shown++;
    this.log.info(`next edit shown: ${JSON.stringify(e)}`); // (test/e2e-next-edit.mjs reads it back)
    void vscode.commands.executeCommand("setContext", CONTEXT_KEY, true);
    this.render();
  }

  private render(): void {
    const s = this.shown;
    const active = vscode.window.activeTextEditor;
    for (const ed of vscode.window.visibleTextEditors) {
      const inTarget = s !== undefined && ed.document.uri.toString() === s.target.toString();
      ed.setDecorations(this.oldText, inTarget && !s.range.isEmpty ? [s.range] : []);
      ed.setDecorations(
        this.newText,
        inTarget && s.answer.newText !== ""
          ? [{ range: new vscode.Range(s.range.end, s.range.end), renderOptions: { after: { contentText: shownNewText(s.answer.newText) } } }]
          : [],
      );
      ed.setDecorations(this.mark, inTarget ? [new vscode.Range(s.range.start, s.range.start)] : []);
      let hint: vscode.DecorationOptions[] = [];
      if (s && ed === active) {
        const visible = ed.visibleRanges.map((r) => ({ start: r.start.line, end: r.end.line }));
        if (!inTarget || !onScreen(s.range.start.line, visible)) {
          const line = ed.document.lineAt(ed.selection.active.line).range.end;
          const name = inTarget ? undefined : s.target.path.split("/").pop();
          hint = [{ range: new vscode.Range(line, line), renderOptions: { after: { contentText: offScreenHint(s.answer, name) } } }];
        }
      }
      ed.setDecorations(this.hint, hint);
    }
  }

  clear(why?: keyof NextEdits["counts"]): void {
    if (!this.shown) return;
    this.shown = undefined;
    if (why) this.counts[why]++;
    void vscode.commands.executeCommand("setContext", CONTEXT_KEY, false);
    this.render();
  }

  dismiss(): void {
    if (this.shown) this.log.info("next edit dismissed");
    this.clear("dismissed");
  }

  /** Tab: go to the shown edit, or apply it when the cursor is at its start. */
  async tab(): Promise<void> {
    const s = this.shown;
    if (!s) return;
    const tdoc = vscode.workspace.textDocuments.find((d) => d.uri.toString() === s.target.toString());
    if (!tdoc || tdoc.version !== s.targetVersion) {
      this.clear("cleared");
      return;
    }
    let editor = vscode.window.activeTextEditor;
    const inTarget = editor?.document === tdoc;
    const at = editor?.selection.isEmpty ? editor.selection.active : undefined;
    if (tabAction(s.answer, inTarget, at) === "jump") {
      if (!inTarget || !editor) editor = await vscode.window.showTextDocument(tdoc, { preview: false });
      editor.selection = new vscode.Selection(s.range.start, s.range.start);
      editor.revealRange(s.range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      this.counts.jumped++;
      this.render();
      return;
    }
    if (tdoc.getText(s.range) !== s.answer.oldText) {
      this.clear("cleared");
      return;
    }
    this.clear(); // before the edit: the change it makes is not the user's
    const edit = new vscode.WorkspaceEdit();
    edit.replace(tdoc.uri, s.range, s.answer.newText);
    if (!(await vscode.workspace.applyEdit(edit))) {
      this.log.warn("next edit: the workspace edit was not applied");
      return;
    }
    this.counts.applied++;
    this.log.info(`next edit applied: ${JSON.stringify(s.answer)}`);
    const c = s.answer.cursor;
    const cursor = tdoc.validatePosition(new vscode.Position(c.line, c.character));
    if (editor && editor.document === tdoc) {
      editor.selection = new vscode.Selection(cursor, cursor);
      editor.revealRange(new vscode.Range(cursor, cursor));
    }
  }

  dispose(): void {
    if (this.timer) clearTimeout(this.timer);
    this.shown = undefined;
    for (const d of [this.oldText, this.newText, this.mark, this.hint, ...this.subs]) d.dispose();
  }
}

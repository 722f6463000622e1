// Playwright driver for test/e2e.sh's next-edit scenario (DITTO_E2E_SCENARIO=next-edit): in
// code-server, a class is renamed by typing at its definition; Ditto's next edit must then show
// at the next use (the old text struck through, the new text after it), Tab must move the cursor
// there and a second Tab apply it; the edit that follows is then dismissed with Escape, after
// which nothing changes and Tab is Tab again (it indents). Then a name is renamed at the first of
// two uses on one line and inline suggestions are asked for (the command palette's Trigger Inline
// Suggestion; they are off here): the server's
// inline item that makes the same change at the second use replaces text VS Code cannot draw as ghost
// text, so the extension leaves it to the next edit, which shows it on that line; Tab goes there and
// Tab makes it. Last, a line is inserted into one of two like calls: the next edit inserts it into the
// other (off screen: a hint at the cursor; after Tab, drawn after the line above its place), and
// the second Tab inserts it. Writes what it saw to
// SHOTS/next-edit.json (tests/editors/test_editor_vscode.py checks it against the server's
// answers, which the extension logs), and screenshots. Exits 0 when every step happened, else 1.
//
//   node e2e-next-edit.mjs --url URL --file WORKSPACE_FILE --shots DIR --chromium /usr/bin/chromium \
//     --logs USER_DATA_DIR/logs   (where the extension's log says "model ready")
//
// playwright-core is resolved from $PW_DIR (test/e2e.sh installs it outside the repository).
import { createRequire } from "node:module";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
};
const URL_ = arg("url");
const FILE = arg("file");
const SHOTS = arg("shots", "/tmp/ditto-vscode-e2e");
const CHROMIUM = arg("chromium", "/usr/bin/chromium");
const LOGS = arg("logs");
const OLD = "KeepOpenFile";
const NEW = "LazyFile";
const require = createRequire(path.join(process.env.PW_DIR ?? process.cwd(), "/"));
const { chromium } = require("playwright-core");

const t0 = Date.now();
const log = (msg) => console.log(`[next-edit ${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${msg}`);
const visible = (s) => JSON.stringify(s.length > 160 ? s.slice(0, 160) + "…" : s);
const report = {};

let page;
async function shot(name) {
  try {
    await page.screenshot({ path: path.join(SHOTS, name) });
  } catch (e) {
    log(`screenshot ${name} failed: ${e.message}`);
  }
}

async function statusText() {
  const item = page.locator(".statusbar-item", { hasText: "Ditto" }).first();
  return (await item.count()) ? (await item.innerText()).replace(/\s+/g, " ").trim() : "";
}

/** The cursor as the status bar shows it: [line, column], 1-based. */
async function cursor() {
  const t = await page.locator("#status\\.editor\\.selection").first().innerText().catch(() => "");
  const m = /Ln (\d+), Col (\d+)/.exec(t);
  return m ? [Number(m[1]), Number(m[2])] : null;
}

async function ghostText() {
  return page.evaluate(() => {
    const els = [...document.querySelectorAll(".monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text")];
    return els.map((e) => e.textContent ?? "").join("\n");
  });
}

/** What the editor draws for a next edit: struck-through text, and text drawn after it by a
 * decoration (the ::after content VS Code generates for it; the cursor line's hint included). */
async function decorations() {
  return page.evaluate(() => {
    const struck = [];
    const after = [];
    for (const el of document.querySelectorAll(".editor-instance .view-lines span")) {
      const st = getComputedStyle(el);
      if (st.textDecorationLine.includes("line-through") && el.children.length === 0) struck.push(el.textContent ?? "");
      for (const pseudo of ["::after", "::before"]) {
        const c = getComputedStyle(el, pseudo).content;
        if (c && c !== "none" && c !== "normal" && c !== '""') after.push(JSON.parse(c));
      }
    }
    return { struck: struck.join("").replace(/\u00a0/g, " "), after: after.map((s) => s.replace(/\u00a0/g, " ")) };
  });
}

/** Whether the extension's log says the model is ready: after that the extension asks for ghost
 * text once (ditto/modelReady), so typing waits for it (ghost text shown keeps the next edit away). */
function modelReady() {
  const walk = (dir) =>
    readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
      e.isDirectory() ? walk(path.join(dir, e.name)) : [path.join(dir, e.name)],
    );
  try {
    return walk(LOGS).some((f) => f.includes("ditto-lsp.ditto-vscode") && f.endsWith(".log") && readFileSync(f, "utf8").includes("] model ready"));
  } catch {
    return false;
  }
}

async function waitFor(what, ms, cond) {
  const until = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > until) {
      await shot(`fail-${what.replace(/\W+/g, "-")}.png`);
      throw new Error(`timed out waiting for ${what}`);
    }
    await page.waitForTimeout(100);
  }
}

/** Save, and the file once saved (it differs from `previous`; empty is the file truncated by a save not
 * yet written: the fixture never is). */
async function save(previous) {
  await page.keyboard.press("Control+S");
  return waitFor("the saved file to change", 60000, async () => {
    const text = readFileSync(FILE, "utf8");
    return text !== previous && text !== "" ? text : null;
  });
}

async function main() {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage"],
  });
  const context = await browser.newContext({ viewport: { width: 1400, height: 850 } });
  page = await context.newPage();
  page.on("pageerror", (e) => log(`page error: ${e.message}`));
  try {
    await page.goto(URL_, { waitUntil: "domcontentloaded", timeout: 60000 });
    await page.locator(".monaco-workbench").waitFor({ timeout: 120000 });
    const base = path.basename(FILE);
    // Open the file from the Explorer once it lists it: on a busy machine the workspace is read (and
    // Quick Open's file search ready) well after the workbench shows.
    const listed = page.locator(".part.sidebar .monaco-list-row", { hasText: base }).first();
    await listed.waitFor({ timeout: 180000 });
    await listed.click();
    const editor = page.locator(".editor-instance .monaco-editor").first();
    await editor.locator(".view-lines", { hasText: `class ${OLD}` }).waitFor({ timeout: 120000 });
    log(`${base} open`);
    await waitFor("the model", 600000, async () => modelReady());
    log(`model ready; status bar: ${visible(await statusText())}`);

    // The rename, typed: the name at `class KeepOpenFile:` selected word-wise and typed anew.
    const original = readFileSync(FILE, "utf8");
    const row = original.split("\n").findIndex((l) => l.startsWith(`class ${OLD}`));
    await editor.locator(".view-lines").click();
    await page.keyboard.press("Control+Home");
    for (let i = 0; i < row; i++) await page.keyboard.press("ArrowDown");
    await page.keyboard.press("Home");
    for (let i = 0; i < "class ".length; i++) await page.keyboard.press("ArrowRight");
    await page.keyboard.press("Control+Shift+ArrowRight");
    await page.keyboard.type(NEW, { delay: 60 });
    report.before = await save(original); // the file as the next edit finds it
    if (!report.before.includes(`class ${NEW}:`)) throw new Error(`the rename was not typed: ${visible(report.before)}`);
    report.cursor_before = await cursor();
    log(`typed the rename; cursor ${report.cursor_before}`);

    // The next edit shows: the old text struck through, the new text after it. Ghost text (the
    // extension asks for it once when the model is ready, even with inline suggestions off) keeps
    // it away while shown: Escape hides it, and the next edit is asked for then.
    const shown = await waitFor("the next edit to show", 30000, async () => {
      const d = await decorations();
      if (d.struck) return d;
      if ((await ghostText()).trim()) {
        log(`ghost text shown: ${visible(await ghostText())}; Escape`);
        report.ghost_hidden = (report.ghost_hidden ?? 0) + 1;
        await page.keyboard.press("Escape");
      }
      return null;
    });
    report.shown = shown;
    log(`shown: struck ${visible(shown.struck)}, after ${visible(JSON.stringify(shown.after))}`);
    await shot("ne-1-shown.png");

    // Tab: the cursor goes there; nothing changes yet.
    await page.keyboard.press("Tab");
    report.cursor_jumped = await waitFor("the cursor to jump", 10000, async () => {
      const c = await cursor();
      return c && c[0] !== report.cursor_before[0] ? c : null;
    });
    report.shown_after_jump = await decorations();
    report.dirty_after_jump = readFileSync(FILE, "utf8") !== report.before;
    log(`Tab: cursor ${report.cursor_jumped}`);
    await shot("ne-2-jumped.png");

    // Tab again: applied.
    await page.keyboard.press("Tab");
    report.cursor_applied = await waitFor("the edit to apply (the cursor moves)", 10000, async () => {
      const c = await cursor();
      return c && (c[0] !== report.cursor_jumped[0] || c[1] !== report.cursor_jumped[1]) ? c : null;
    });
    report.applied = await save(report.before);
    log(`Tab: applied; cursor ${report.cursor_applied}`);
    await shot("ne-3-applied.png");

    // The edit that follows (the rename's next use) shows; Escape dismisses it.
    report.next = await waitFor("the following next edit", 30000, async () => {
      const d = await decorations();
      return d.struck ? d : null;
    });
    await page.keyboard.press("Escape");
    await waitFor("the dismissed edit to go", 10000, async () => !(await decorations()).struck || null);
    report.cursor_dismissed = await cursor();
    report.after_dismiss = readFileSync(FILE, "utf8");
    log(`Escape: dismissed; cursor ${report.cursor_dismissed}`);
    await shot("ne-4-dismissed.png");
    // Nothing shown: Tab is Tab (it indents at the cursor), no jump, no edit elsewhere.
    await page.keyboard.press("Tab");
    report.after_tab = await save(report.after_dismiss);
    report.cursor_after_tab = await cursor();
    await shot("ne-5-tab.png");

    // The cursor's own line: `OpenMode` renamed at the first of its two uses on a line, inline suggestions
    // asked for; the server's item replacing the rest of the line is left to the next edit (extension.ts).
    const lines = report.after_tab.split("\n");
    const pairRow = lines.findIndex((l) => l.includes("OpenMode(path) or OpenMode(None)"));
    if (pairRow < 0) throw new Error("the fixture's pair() line is missing");
    await page.keyboard.press("Escape");
    await page.keyboard.press("Control+Home");
    for (let i = 0; i < pairRow; i++) await page.keyboard.press("ArrowDown");
    await page.keyboard.press("Home"); // the first non-blank character: `return`
    await page.keyboard.press("Control+ArrowRight"); // after `return`
    await page.keyboard.press("ArrowRight");
    await page.keyboard.press("Control+Shift+ArrowRight"); // `OpenMode` selected
    await page.keyboard.type("ClosedMode", { delay: 60 });
    report.line_typed = await save(report.after_tab);
    await page.waitForTimeout(200);
    await page.keyboard.press("F1"); // editor.action.inlineSuggest.trigger, from the command palette
    const palette = page.locator(".quick-input-widget input");
    await palette.waitFor({ state: "visible", timeout: 10000 });
    await palette.fill(">Trigger Inline Suggestion");
    await page.locator(".quick-input-list .monaco-list-row", { hasText: "Trigger Inline Suggestion" }).first().waitFor({ timeout: 10000 });
    await page.keyboard.press("Enter");
    report.line_shown = await waitFor("the next edit on the typed line", 30000, async () => {
      const d = await decorations();
      return d.struck ? { ...d, ghost: await ghostText(), cursor: await cursor() } : null;
    });
    log(`line: shown ${visible(JSON.stringify(report.line_shown))}`);
    await shot("ne-6-line-shown.png");
    await page.keyboard.press("Tab");
    report.line_jumped = await waitFor("the cursor to go to the second use", 10000, async () => {
      const c = await cursor();
      return c && c[1] !== report.line_shown.cursor[1] ? c : null;
    });
    await page.keyboard.press("Tab");
    await waitFor("the edit on the line to apply (the cursor moves)", 10000, async () => {
      const c = await cursor();
      return c && c[1] !== report.line_jumped[1] ? c : null;
    });
    report.line_after = await save(report.line_typed);
    log(`Tab, Tab: ${visible(report.line_after.split("\n")[pairRow])}`);
    await shot("ne-7-line-applied.png");

    // Lines inserted: `strict=True,` typed on a new line after the first call's `name=a,`; the next
    // edit inserts it where the same two lines stand together again (the second call), drawn after
    // that line's end (nothing struck: nothing is replaced); Tab goes there, Tab inserts it.
    const calls = report.line_after.split("\n");
    const nameRow = calls.findIndex((l) => l === "        name=a,");
    if (nameRow < 0) throw new Error("the fixture's make() is missing");
    await page.keyboard.press("Escape");
    await page.keyboard.press("Control+Home");
    for (let i = 0; i < nameRow; i++) await page.keyboard.press("ArrowDown");
    await page.keyboard.press("End");
    await page.keyboard.press("Enter"); // the new line, indented as `name=a,` is
    await page.keyboard.type("strict=True,", { delay: 60 });
    report.insert_typed = await save(report.line_after);
    report.cursor_insert_typed = await cursor();
    // The second call is below the screen's last line: a hint at the cursor says where.
    report.insert_hint = await waitFor("the inserted line's next edit", 30000, async () => {
      const d = await decorations();
      return d.after.some((a) => a.includes("strict=True,") || a.includes("next edit at line")) ? d : null;
    });
    log(`insert: hint ${visible(JSON.stringify(report.insert_hint))}`);
    await shot("ne-8-insert-hint.png");
    await page.keyboard.press("Tab");
    report.insert_jumped = await waitFor("the cursor to go to the second call", 10000, async () => {
      const c = await cursor();
      return c && c[0] !== report.cursor_insert_typed[0] ? c : null;
    });
    report.insert_shown = await waitFor("the inserted line drawn at its place", 10000, async () => {
      const d = await decorations();
      return d.after.some((a) => a.includes("strict=True,")) ? d : null;
    });
    log(`Tab: cursor ${report.insert_jumped}; shown ${visible(JSON.stringify(report.insert_shown))}`);
    await shot("ne-9-insert-shown.png");
    await page.keyboard.press("Tab");
    report.insert_applied_cursor = await waitFor("the lines to be inserted (the cursor moves)", 10000, async () => {
      const c = await cursor();
      return c && (c[0] !== report.insert_jumped[0] || c[1] !== report.insert_jumped[1]) ? c : null;
    });
    report.insert_after = await save(report.insert_typed);
    log(`Tab, Tab: cursor ${report.insert_applied_cursor}`);
    await shot("ne-10-insert-applied.png");
    writeFileSync(path.join(SHOTS, "next-edit.json"), JSON.stringify(report, null, 2));
    await browser.close();
    return 0;
  } catch (e) {
    log(`FAIL: ${e.message}`);
    writeFileSync(path.join(SHOTS, "next-edit.json"), JSON.stringify({ ...report, error: e.message }, null, 2));
    await shot("fail.png");
    await browser.close();
    return 1;
  }
}

process.exit(await main());

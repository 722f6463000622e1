// Playwright driver for test/e2e.sh's partial-accept scenario (DITTO_E2E_SCENARIO=accept): in
// code-server, text is typed where tiny-random suggests a line of several words; once Ditto's ghost
// text shows, Ctrl+Right (VS Code's editor.action.inlineSuggest.acceptNextWord) accepts its next word,
// then, once the rest shows, Ctrl+Down (editor.action.inlineSuggest.acceptNextLine, bound by the
// extension) accepts its next line. The file is saved after each key and read back. Then
// "Ditto: Show Statistics" writes ditto/stats to the extension's log (type-through: the rest answered
// without the model). Writes what it saw to SHOTS/accept.json (tests/editors/test_editor_vscode.py
// checks it), and screenshots. Exits 0 when every step happened, else 1.
//
//   node e2e-accept.mjs --url URL --file WORKSPACE_FILE --shots DIR --chromium /usr/bin/chromium \
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
// Typed on the empty last line, inside `def area` of class Square: tiny-random's suggestion there has
// a first line of several words (tests/editors/test_editor_vscode.py checks it in-process).
const TYPED = "        return ";
const require = createRequire(path.join(process.env.PW_DIR ?? process.cwd(), "/"));
const { chromium } = require("playwright-core");

const t0 = Date.now();
const log = (msg) => console.log(`[accept ${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${msg}`);
const visible = (s) => JSON.stringify(s.length > 160 ? s.slice(0, 160) + "…" : s);
const report = { typed: TYPED };

let page;
async function shot(name) {
  try {
    await page.screenshot({ path: path.join(SHOTS, name) });
  } catch (e) {
    log(`screenshot ${name} failed: ${e.message}`);
  }
}

/** The ghost text drawn: its first line after the cursor (inline spans, one per token colour), then the
 * lines below it (a view zone), joined by "\n". */
async function ghostText() {
  return page.evaluate(() => {
    const text = (e) => (e.textContent ?? "").replace(/\u00a0/g, " ");
    const first = [...document.querySelectorAll(".editor-instance .monaco-editor .ghost-text-decoration")].map(text).join("");
    const below = [...document.querySelectorAll(".editor-instance .monaco-editor .ghost-text")].flatMap((zone) => {
      const lines = [...zone.querySelectorAll(".view-line")];
      return lines.length ? lines.map(text) : [text(zone)];
    });
    return [first, ...below].join("\n").replace(/^\n+$/, "");
  });
}

/** Whether the extension's log holds `needle`. */
function logHas(needle) {
  const walk = (dir) =>
    readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
      e.isDirectory() ? walk(path.join(dir, e.name)) : [path.join(dir, e.name)],
    );
  try {
    return walk(LOGS).some((f) => f.includes("ditto-lsp.ditto-vscode") && f.endsWith(".log") && readFileSync(f, "utf8").includes(needle));
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

async function runCommand(title) {
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: 10000 });
  await input.fill(">" + title);
  await page.locator(".quick-input-list .monaco-list-row", { hasText: title }).first().waitFor({ timeout: 10000 });
  await page.keyboard.press("Enter");
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
    await editor.locator(".view-lines", { hasText: "class Square" }).waitFor({ timeout: 120000 });
    log(`${base} open`);
    await waitFor("the model", 600000, async () => logHas("] model ready"));
    log("model ready");

    report.before = readFileSync(FILE, "utf8");
    await editor.locator(".view-lines").click();
    await page.keyboard.press("Control+End");
    await page.keyboard.type(TYPED, { delay: 60 });
    // While typing, VS Code may keep showing an earlier answer whose start the user typed, until the
    // answer for the last keystroke replaces it: hide what is shown and ask here, so that the ghost text
    // the keys act on is the answer for this place.
    await page.keyboard.press("Escape");
    await waitFor("no ghost text", 10000, async () => !(await ghostText()));
    await runCommand("Trigger Inline Suggestion");

    // Each key once ghost text is shown: what was shown, then the file the key left.
    let text = report.before;
    report.steps = [];
    for (const key of ["Control+ArrowRight", "Control+ArrowDown"]) {
      const ghost = await waitFor(`ghost text before ${key}`, 120000, async () => (await ghostText()) || null);
      log(`ghost text ${visible(ghost)}; ${key}`);
      await shot(`accept-${report.steps.length + 1}-ghost.png`);
      await page.keyboard.press(key);
      text = await save(text);
      report.steps.push({ key, ghost, after: text });
      log(`${key}: the line is now ${visible(text.split("\n").at(-1))}`);
    }
    await shot("accept-3-done.png");
    // ditto/stats into the extension's log (its typethrough count)
    await page.keyboard.press("Escape");
    await runCommand("Ditto: Show Statistics");
    await waitFor("ditto/stats in the extension's log", 30000, async () => logHas('"typethrough"'));
    writeFileSync(path.join(SHOTS, "accept.json"), JSON.stringify(report, null, 2));
    await browser.close();
    return 0;
  } catch (e) {
    log(`FAIL: ${e.message}`);
    writeFileSync(path.join(SHOTS, "accept.json"), JSON.stringify({ ...report, error: e.message }, null, 2));
    await shot("fail.png");
    await browser.close();
    return 1;
  }
}

process.exit(await main());

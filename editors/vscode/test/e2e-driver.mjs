// Playwright driver for test/e2e.sh: code-server in Debian's chromium, a Python file, Ditto's
// ghost text, Tab to accept it, screenshots. Exits 0 on success, 1 with a reason otherwise.
// The text is typed while the status bar still says the model is loading (e2e.sh starts the
// server with a load that waits for this driver's signal, --load-trigger); the ghost text must then
// come without another keystroke.
//
//   node e2e-driver.mjs --url URL --file WORKSPACE_FILE --shots DIR --chromium /usr/bin/chromium \
//     [--load-trigger FILE]   (created once the text is typed: test/lsp-inject.py then lets the model load)
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
const LOAD_TRIGGER = arg("load-trigger");
const LOGS = arg("logs");
// Typed on the empty last line, inside `def area` of class Square. tiny-random's suggestion
// there is not empty (tests/editors/test_editor_vscode.py checks it in-process).
const TYPED = "        return ";
const require = createRequire(path.join(process.env.PW_DIR ?? process.cwd(), "/"));
const { chromium } = require("playwright-core");

const t0 = Date.now();
const log = (msg) => console.log(`[driver ${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${msg}`);
const visible = (s) => JSON.stringify(s.length > 120 ? s.slice(0, 120) + "…" : s);
const alnum = (s) => s.replace(/[^A-Za-z0-9]/g, "");

let page;
async function shot(name) {
  const p = path.join(SHOTS, name);
  try {
    await page.screenshot({ path: p });
    log(`screenshot ${p}`);
  } catch (e) {
    log(`screenshot ${name} failed: ${e.message}`);
  }
}

/** Whether the extension's log (under --logs) holds `needle`. */
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

async function statusText() {
  const item = page.locator(".statusbar-item", { hasText: "Ditto" }).first();
  return (await item.count()) ? (await item.innerText()).replace(/\s+/g, " ").trim() : "";
}

async function ghostText() {
  return page.evaluate(() => {
    const els = [...document.querySelectorAll(".monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text")];
    return els.map((e) => e.textContent ?? "").join("\n").replace(/\u00a0/g, " ");
  });
}

async function runCommand(title) {
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: 10000 });
  await input.fill(">" + title);
  await page.waitForTimeout(500);
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
    log(`open ${URL_}`);
    await page.goto(URL_, { waitUntil: "domcontentloaded", timeout: 60000 });
    await page.locator(".monaco-workbench").waitFor({ timeout: 120000 });
    log("workbench loaded");

    const base = path.basename(FILE);
    // Open the file from the Explorer once it lists it: on a busy machine the workspace is read (and
    // Quick Open's file search ready) well after the workbench shows.
    const listed = page.locator(".part.sidebar .monaco-list-row", { hasText: base }).first();
    await listed.waitFor({ timeout: 180000 });
    await listed.click();
    const editor = page.locator(".editor-instance .monaco-editor").first();
    await editor.locator(".view-lines", { hasText: "class Square" }).waitFor({ timeout: 120000 });
    log(`${base} open`);

    // The server: starting -> loading (from $/progress) -> "Ditto tiny-random" (from ditto/stats).
    // Type while it is loading: the server is up, its model not yet.
    // (any model: DITTO_E2E_MODEL; "Ditto: loading model tiny-random" while loading)
    const READY = /Ditto (?!suggestions)[^:\s]/; // the model's name after "Ditto " (not "Ditto: loading ...")
    let st = "";
    const deadline = Date.now() + 600000;
    while (Date.now() < deadline) {
      st = await statusText();
      if (/loading/i.test(st) || READY.test(st) || /Ditto: stopped|failed/.test(st)) break;
      await page.waitForTimeout(100);
    }
    log(`status bar: ${visible(st)}`);
    if (!/loading/i.test(st)) {
      await shot("fail-status.png");
      throw new Error(READY.test(st)
        ? "the model was loaded before anything was typed (was the server started through test/lsp-inject.py?)"
        : `the status bar never showed the model loading (last: ${visible(st)})`);
    }
    await shot("1-loading.png");

    // Type at the end of the file (an empty line inside a method body).
    await editor.locator(".view-lines").click();
    await page.keyboard.press("Control+End");
    const before = readFileSync(FILE, "utf8");
    await page.keyboard.type(TYPED, { delay: 60 });
    const typed = TYPED;
    st = await statusText();
    log(`typed ${visible(typed)}; status bar: ${visible(st)}`);
    if (!/loading/i.test(st)) {
      await shot("fail-typed-too-late.png");
      throw new Error(`the model was loaded before the typing ended (was the server started through test/lsp-inject.py?): ${visible(st)}`);
    }
    await shot("2-typed-while-loading.png");
    // Typed while it loads: now let the server load the model.
    if (LOAD_TRIGGER) writeFileSync(LOAD_TRIGGER, "");

    // Now only wait: the request the last keystroke made is answered once the model is ready
    // (and the extension asks again on ditto/modelReady). Poll until the ghost text has shown
    // the same text twice in a row, so that Tab is not pressed while it is being replaced.
    let ghost = "";
    let seenReady = false;
    const until = Date.now() + 600000;
    for (let last = ""; Date.now() < until; last = ghost) {
      if (!seenReady && READY.test((st = await statusText()))) {
        seenReady = true;
        log(`status bar: ${visible(st)} (model ready)`);
      }
      ghost = await ghostText();
      if (ghost.trim() && ghost === last) break;
      await page.waitForTimeout(250);
    }
    if (!ghost.trim()) {
      await shot("fail-no-ghost-text.png");
      await runCommand("Ditto: Show Statistics").catch(() => {}); // ditto/stats into the Ditto log
      await page.waitForTimeout(1500);
      throw new Error(`no ghost text appeared (status bar: ${visible(await statusText())})`);
    }
    log(`ghost text: ${visible(ghost)}`);
    await shot("3-ghost-text.png");
    if (process.env.DITTO_E2E_PICTURE) {
      // The README's picture: the editor alone, the ghost text on it.
      await editor.screenshot({ path: process.env.DITTO_E2E_PICTURE }).catch((e) => log(`picture failed: ${e.message}`));
      log(`picture ${process.env.DITTO_E2E_PICTURE}`);
    }

    // Tab accepts: the ghost text becomes buffer text; save and read the file back.
    await page.keyboard.press("Tab");
    await page.waitForTimeout(500);
    const leftover = await ghostText();
    await page.keyboard.press("Control+S");
    // The file once saved (empty: truncated by the save, not yet written; the fixture never is).
    let after = before;
    for (const until = Date.now() + 60000; (after === before || after === "") && Date.now() < until; ) {
      await page.waitForTimeout(200);
      after = readFileSync(FILE, "utf8");
    }
    await shot("4-accepted.png");
    const expectedStart = before + typed;
    if (!after.startsWith(expectedStart)) {
      throw new Error(`saved file does not continue the typed text: ${visible(after.slice(-200))}`);
    }
    const accepted = after.slice(expectedStart.length);
    log(`accepted into the buffer: ${visible(accepted)}`);
    if (accepted.length === 0) throw new Error("Tab inserted nothing");
    const g = alnum(ghost.split("\n")[0]).slice(0, 12);
    if (g && !alnum(accepted).startsWith(g)) {
      throw new Error(`inserted text ${visible(accepted)} is not the ghost text ${visible(ghost)}`);
    }
    if (leftover.trim() && leftover === ghost) throw new Error("ghost text still shown after Tab");
    writeFileSync(path.join(SHOTS, "accepted.txt"), JSON.stringify({ ghost, accepted, status: st }, null, 2));
    // ditto/stats into the Ditto log: e2e.sh checks there that the request waited for the model.
    await page.keyboard.press("Escape");
    await runCommand("Ditto: Show Statistics");
    for (const until = Date.now() + 60000; !logHas('"waited"') && Date.now() < until; ) await page.waitForTimeout(200);
    // The verdict is in: what follows does not change it, and e2e.sh keeps it if its time limit cuts
    // what follows short (a busy machine loads the model again slowly after the restart below).
    writeFileSync(path.join(SHOTS, "verdict.txt"), "PASS\n");

    // Not part of PASS/FAIL: the status bar after a completion, and the trace webview.
    log(`status bar after the completion: ${visible(await statusText())}`);
    try {
      await runCommand("Ditto: Show Last Completion's Propose/Verify Trace");
      await page.locator(".webview, iframe.webview").first().waitFor({ timeout: 15000 });
      await page.waitForTimeout(2000);
      await shot("5-trace.png");
    } catch (e) {
      log(`trace view not shown: ${e.message}`);
    }
    // Also not part of PASS/FAIL: the toggle and restart commands, seen in the status bar.
    const waitStatus = async (re, ms) => {
      const until = Date.now() + ms;
      let t = "";
      while (Date.now() < until) {
        t = await statusText();
        if (re.test(t)) return t;
        await page.waitForTimeout(250);
      }
      throw new Error(`status bar ${visible(t)} never matched ${re}`);
    };
    for (const [title, re, label] of [
      ["Ditto: Toggle Suggestions", /\(off\)/, "toggle off"],
      ["Ditto: Toggle Suggestions", /^(?!.*\(off\)).*Ditto [^:\s]/, "toggle on"], // any model's name
      ["Ditto: Restart Server", /^Ditto [^:\s·]+$/, "restart"], // a new server: no rates yet
    ]) {
      try {
        await page.keyboard.press("Escape");
        await runCommand(title);
        if (label === "restart") await page.waitForTimeout(1000);
        log(`extra check ${label}: ok, status bar ${visible(await waitStatus(re, 120000))}`);
      } catch (e) {
        log(`extra check ${label}: FAILED (${e.message})`);
      }
    }
    await shot("6-after-restart.png");
    await browser.close();
    return 0;
  } catch (e) {
    log(`FAIL: ${e.message}`);
    await shot("fail.png");
    await browser.close();
    return 1;
  }
}

process.exit(await main());

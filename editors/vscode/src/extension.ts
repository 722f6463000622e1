/**
 * The VS Code side of Ditto: starts `ditto-lsp serve`, lets vscode-languageclient (>= 10,
 * which turns on LSP 3.18 inline completion by default) show its ghost text, shows next-edit
 * suggestions (nextedit.ts), and adds a status bar item, a few commands, a trace webview and a
 * log channel.
 *
 * The logic worth testing lives in config.ts, stats.ts, trace.ts and nexteditLogic.ts (no
 * `vscode` import); this file is glue.
 */

import * as vscode from "vscode";
import {
  LanguageClient,
  LanguageClientOptions,
  RevealOutputChannelOn,
  ServerOptions,
  State,
  StaticFeature,
  TransportKind,
  DidChangeConfigurationNotification,
  WorkDoneProgress,
  WorkDoneProgressCreateRequest,
  FeatureState,
} from "vscode-languageclient/node";

import { changeKind, configurationParams, describeLaunch, DittoSettings, initializationOptions, readSettings, serverLaunch } from "./config";
import { ProgressValue, progressView, stateView, statsView, StatusView } from "./stats";
import { classify, Level } from "./serverlog";
import { renderTraceHtml } from "./trace";
import { NextEdits } from "./nextedit";
import { ghostDrawable } from "./nexteditLogic";
import * as readline from "node:readline";

const STATS_POLL_MS = 5000;

function currentSettings(): DittoSettings {
  const cfg = vscode.workspace.getConfiguration("ditto");
  return readSettings((k) => cfg.get(k));
}

/** Shows the server's `$/progress` (model loading) in the status bar instead of a notification. */
class ProgressToStatusBar implements StaticFeature {
  constructor(
    private readonly client: LanguageClient,
    private readonly onValue: (title: string, message: string | undefined, v: ProgressValue) => void,
  ) {}
  fillClientCapabilities(capabilities: { window?: { workDoneProgress?: boolean } }): void {
    capabilities.window = capabilities.window ?? {};
    capabilities.window.workDoneProgress = true;
  }
  getState(): FeatureState {
    return { kind: "static" };
  }
  initialize(): void {
    // Runs after languageclient's own ProgressFeature, so this handler replaces its notification popup.
    this.client.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => {
      let title = "";
      let message: string | undefined;
      const sub = this.client.onProgress(WorkDoneProgress.type, token, (v) => {
        if (v.kind === "begin") title = v.title;
        if (v.message) message = v.message;
        this.onValue(title, message, v as ProgressValue);
        if (v.kind === "end") sub.dispose();
      });
    });
  }
  clear(): void {}
}

class Ditto implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private settings = currentSettings();
  private readonly log = vscode.window.createOutputChannel("Ditto", { log: true });
  private readonly status = vscode.window.createStatusBarItem("ditto.status", vscode.StatusBarAlignment.Right, 100);
  private tracePanel: vscode.WebviewPanel | undefined;
  private loading: StatusView | undefined;
  private lastStats: unknown;
  private failure: string | undefined;
  private pollTimer: ReturnType<typeof setInterval> | undefined;
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private lastCompletedUri: vscode.Uri | undefined;
  private starting: Promise<void> | undefined;
  readonly nextEdits = new NextEdits(
    () => this.client,
    () => this.settings.enable && this.settings.nextEdit,
    this.log,
  );

  constructor() {
    this.status.name = "Ditto";
    this.status.command = "ditto.menu";
    this.render();
    this.status.show();
  }

  // -- lifecycle --------------------------------------------------------------------------
  async start(): Promise<void> {
    this.settings = currentSettings();
    this.failure = undefined;
    this.lastStats = undefined;
    this.loading = undefined;
    const launch = serverLaunch(this.settings);
    const serverOptions: ServerOptions = {
      command: launch.command,
      args: launch.args,
      transport: TransportKind.stdio,
      options: { cwd: vscode.workspace.workspaceFolders?.[0]?.uri.fsPath },
    };
    const clientOptions: LanguageClientOptions = {
      documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
      initializationOptions: initializationOptions(this.settings),
      outputChannel: this.log,
      stdioOptions: {
        stdout: (input, channel) => {
          // Only reached if the transport is not stdio; stdout carries the protocol otherwise.
          readline.createInterface({ input, crlfDelay: Infinity }).on("line", (line) => channel.info(line));
        },
        stderr: (input, channel) => {
          let level: Level = "info";
          readline.createInterface({ input, crlfDelay: Infinity }).on("line", (line) => {
            const c = classify(line, level);
            level = c.level;
            channel[c.level](`[server] ${c.text}`);
          });
        },
      },
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      middleware: {
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          if (!this.settings.enable) return null;
          let result = await next(document, position, context, token);
          result = this.drawable(document, position, result);
          const items = Array.isArray(result) ? result.length : (result?.items.length ?? 0);
          if (!token.isCancellationRequested) this.nextEdits.sawInline(document, position, items);
          this.lastCompletedUri = document.uri;
          this.refreshStatsSoon();
          return result;
        },
        // VS Code shows Ditto's suggestion as ghost text; the server's completion fallback
        // (for editors without inline completion) would only repeat it in the suggest widget.
        provideCompletionItem: () => null,
      },
    };
    this.log.info(`starting: ${describeLaunch(launch)}`);
    this.log.info(`initializationOptions: ${JSON.stringify(clientOptions.initializationOptions)}`);
    const client = new LanguageClient("ditto", "Ditto", serverOptions, clientOptions);
    client.registerFeature(
      new ProgressToStatusBar(client, (title, message, v) => {
        this.loading = v.kind === "end" ? undefined : progressView(title, message, v);
        if (v.kind !== "report") this.log.info(`progress ${v.kind}: ${message ?? title}`);
        if (v.kind === "end") this.refreshStatsSoon(0);
        this.render();
      }),
    );
    // The server's model finished loading. The server answers the requests made while it loaded,
    // but VS Code may have dropped that answer (the editor moved on): ask once more.
    client.onNotification("ditto/modelReady", () => {
      this.log.info("model ready");
      if (this.settings.enable && vscode.window.activeTextEditor) {
        void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
      }
    });
    client.onDidChangeState(({ newState }) => {
      if (newState === State.Running) this.startPolling();
      else this.stopPolling();
      this.render();
    });
    this.client = client;
    this.followCursor(client);
    this.render();
    try {
      await client.start();
      this.log.info("server started");
      this.refreshStatsSoon(0);
    } catch (err) {
      this.failure = `could not start \`${describeLaunch(launch)}\``;
      this.log.error(`${this.failure}: ${err instanceof Error ? err.message : String(err)}`);
      this.render();
      void vscode.window
        .showErrorMessage(
          `Ditto: could not start ${launch.command}. Set ditto.serverCommand or ditto.pythonPath to where ditto-lsp is installed.`,
          "Open Settings",
          "Show Log",
        )
        .then((pick) => {
          if (pick === "Open Settings") void vscode.commands.executeCommand("workbench.action.openSettings", "ditto.");
          if (pick === "Show Log") this.log.show(true);
        });
    }
  }

  async stop(): Promise<void> {
    this.stopPolling();
    const client = this.client;
    this.client = undefined;
    if (client) {
      try {
        await client.stop(3000);
      } catch (err) {
        this.log.warn(`stopping the server: ${err instanceof Error ? err.message : String(err)}`);
      }
      await client.dispose().catch(() => undefined);
    }
    this.render();
  }

  async restart(): Promise<void> {
    if (this.starting) await this.starting;
    this.starting = (async () => {
      await this.stop();
      await this.start();
    })();
    try {
      await this.starting;
    } finally {
      this.starting = undefined;
    }
  }

  async onConfigurationChanged(e: vscode.ConfigurationChangeEvent): Promise<void> {
    if (!e.affectsConfiguration("ditto")) return;
    const before = this.settings;
    const after = currentSettings();
    this.settings = after;
    if (before.enable !== after.enable && !after.enable) {
      void vscode.commands.executeCommand("editor.action.inlineSuggest.hide");
    }
    if (!after.enable || !after.nextEdit) this.nextEdits.clear();
    const kind = changeKind(before, after);
    if (kind === "restart") {
      this.log.info("server command changed: restarting");
      await this.restart();
    } else if (kind === "notify" && this.client?.isRunning()) {
      const params = configurationParams(after);
      this.log.info(`didChangeConfiguration: ${JSON.stringify(params.settings)}`);
      await this.client.sendNotification(DidChangeConfigurationNotification.type, params);
      this.refreshStatsSoon(1000);
    }
    this.render();
  }

  // -- status bar -------------------------------------------------------------------------
  private cursorTimer: ReturnType<typeof setTimeout> | undefined;
  private cursorSub: vscode.Disposable | undefined;

  /** Tell the server where the cursor rests (`ditto/didMoveCursor`) 150 ms after it stops, so it
   * prefills the prompt of the next suggestion while you pause (docs/design.md in the repository). */
  private followCursor(client: LanguageClient): void {
    this.cursorSub?.dispose();
    this.cursorSub = vscode.window.onDidChangeTextEditorSelection((e) => {
      if (this.cursorTimer) clearTimeout(this.cursorTimer);
      this.cursorTimer = setTimeout(() => {
        const doc = e.textEditor.document;
        if (!client.isRunning() || !this.settings.enable || !["file", "untitled"].includes(doc.uri.scheme)) return;
        const pos = e.selections[0]?.active;
        if (!pos) return;
        void client.sendNotification("ditto/didMoveCursor", {
          textDocument: { uri: client.code2ProtocolConverter.asUri(doc.uri) },
          position: { line: pos.line, character: pos.character },
        });
      }, 150);
    });
  }

  private render(): void {
    let view: StatusView;
    if (this.failure) view = stateView("failed", this.failure);
    else if (!this.client || this.client.state === State.Stopped) view = stateView("stopped");
    else if (this.loading) view = this.loading;
    else if (this.client.state === State.Starting || this.lastStats === undefined) view = stateView("starting");
    else view = statsView(this.lastStats, this.settings.enable, this.settings.model);
    this.status.text = view.text;
    const md = new vscode.MarkdownString(view.tooltip);
    md.isTrusted = false;
    this.status.tooltip = md;
  }

  private startPolling(): void {
    this.stopPolling();
    this.pollTimer = setInterval(() => {
      if (vscode.window.state.focused) void this.refreshStats();
    }, STATS_POLL_MS);
  }

  private stopPolling(): void {
    if (this.pollTimer) clearInterval(this.pollTimer);
    this.pollTimer = undefined;
  }

  /**
   * The inline answer less the items VS Code cannot draw as ghost text: the server's item that makes the
   * next edit on the cursor's line replaces text after the cursor (lsp_server/lsp/nextedit.py
   * `inline_item`); where that is no insertion, it is dropped here, so that no ghost text is taken to be
   * shown and the next edit (nextedit.ts) shows the same edit its own way.
   */
  private drawable(
    document: vscode.TextDocument,
    position: vscode.Position,
    result: vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined,
  ): vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined {
    const items = Array.isArray(result) ? result : result?.items;
    if (!items) return result;
    const kept = items.filter((it) => {
      const r = it.range;
      if (!r || r.end.line !== position.line || !r.end.isAfter(position) || r.start.isAfter(position)) return true;
      const text = typeof it.insertText === "string" ? it.insertText : it.insertText.value;
      const typed = document.getText(new vscode.Range(r.start, position));
      const after = text.startsWith(typed) ? text.slice(typed.length) : text;
      return ghostDrawable(document.getText(new vscode.Range(position, r.end)), after);
    });
    if (kept.length === items.length) return result;
    this.log.info(`inline item replacing text after the cursor, not drawable as ghost text: left to the next edit`);
    return Array.isArray(result) ? kept : new vscode.InlineCompletionList(kept);
  }

  private refreshStatsSoon(delayMs = 300): void {
    if (this.refreshTimer) clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => void this.refreshStats(), delayMs);
  }

  async refreshStats(): Promise<unknown> {
    const client = this.client;
    if (!client?.isRunning()) return undefined;
    try {
      this.lastStats = (await client.sendRequest("ditto/stats", {})) ?? {};
    } catch (err) {
      this.log.debug(`ditto/stats: ${err instanceof Error ? err.message : String(err)}`);
      this.lastStats = this.lastStats ?? {};
    }
    this.render();
    return this.lastStats;
  }

  // -- commands ---------------------------------------------------------------------------
  async toggle(): Promise<void> {
    const cfg = vscode.workspace.getConfiguration("ditto");
    const inspect = cfg.inspect<boolean>("enable");
    const target =
      inspect?.workspaceFolderValue !== undefined
        ? vscode.ConfigurationTarget.WorkspaceFolder
        : inspect?.workspaceValue !== undefined
          ? vscode.ConfigurationTarget.Workspace
          : vscode.ConfigurationTarget.Global;
    await cfg.update("enable", !this.settings.enable, target);
    vscode.window.setStatusBarMessage(`Ditto suggestions ${!this.settings.enable ? "off" : "on"}`, 2000);
  }

  async showTrace(): Promise<void> {
    const client = this.client;
    const uri = vscode.window.activeTextEditor?.document.uri ?? this.lastCompletedUri;
    if (!client?.isRunning()) {
      void vscode.window.showWarningMessage("Ditto: the server is not running.");
      return;
    }
    if (!uri) {
      void vscode.window.showInformationMessage("Ditto: open a file and get a suggestion first.");
      return;
    }
    const protoUri = client.code2ProtocolConverter.asUri(uri);
    let trace: unknown;
    try {
      trace = await client.sendRequest("ditto/trace", { uri: protoUri });
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      this.log.error(`ditto/trace: ${msg}`);
      void vscode.window.showErrorMessage(`Ditto: ditto/trace failed: ${msg}`);
      return;
    }
    if (!this.tracePanel) {
      this.tracePanel = vscode.window.createWebviewPanel("ditto.trace", "Ditto trace", vscode.ViewColumn.Beside, {
        enableScripts: false,
        retainContextWhenHidden: false,
      });
      this.tracePanel.onDidDispose(() => (this.tracePanel = undefined));
    } else {
      this.tracePanel.reveal(vscode.ViewColumn.Beside, true);
    }
    this.tracePanel.title = `Ditto trace: ${uri.path.split("/").pop() ?? ""}`;
    this.tracePanel.webview.html = renderTraceHtml(trace, { uri: protoUri, cspSource: this.tracePanel.webview.cspSource });
  }

  async showStats(): Promise<void> {
    const stats = await this.refreshStats();
    this.log.info(`ditto/stats: ${JSON.stringify(stats ?? null, null, 2)}`);
    this.log.show(true);
  }

  async menu(): Promise<void> {
    const items: (vscode.QuickPickItem & { command: string })[] = [
      { label: this.settings.enable ? "$(circle-slash) Turn suggestions off" : "$(sparkle) Turn suggestions on", command: "ditto.toggle" },
      { label: "$(debug-restart) Restart server", command: "ditto.restart" },
      { label: "$(list-tree) Show last completion's trace", command: "ditto.showTrace" },
      { label: "$(graph) Show statistics", command: "ditto.showStats" },
      { label: "$(output) Show log", command: "ditto.showLog" },
      { label: "$(gear) Settings", command: "ditto.openSettings" },
    ];
    const pick = await vscode.window.showQuickPick(items, { title: "Ditto" });
    if (!pick) return;
    if (pick.command === "ditto.openSettings") void vscode.commands.executeCommand("workbench.action.openSettings", "ditto.");
    else void vscode.commands.executeCommand(pick.command);
  }

  showLog(): void {
    this.log.show(true);
  }

  dispose(): void {
    this.stopPolling();
    if (this.refreshTimer) clearTimeout(this.refreshTimer);
    if (this.cursorTimer) clearTimeout(this.cursorTimer);
    this.cursorSub?.dispose();
    this.tracePanel?.dispose();
    this.nextEdits.dispose();
    this.status.dispose();
    this.log.dispose();
  }
}

let ditto: Ditto | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const d = new Ditto();
  ditto = d;
  context.subscriptions.push(
    d,
    vscode.commands.registerCommand("ditto.toggle", () => d.toggle()),
    vscode.commands.registerCommand("ditto.restart", () => d.restart()),
    vscode.commands.registerCommand("ditto.showTrace", () => d.showTrace()),
    vscode.commands.registerCommand("ditto.showStats", () => d.showStats()),
    vscode.commands.registerCommand("ditto.showLog", () => d.showLog()),
    vscode.commands.registerCommand("ditto.menu", () => d.menu()),
    vscode.commands.registerCommand("ditto.nextEdit.tab", () => d.nextEdits.tab()),
    vscode.commands.registerCommand("ditto.nextEdit.dismiss", () => d.nextEdits.dismiss()),
    vscode.commands.registerCommand("ditto.nextEdit.hideGhostText", () => d.nextEdits.hideGhostText()),
    vscode.workspace.onDidChangeConfiguration((e) => d.onConfigurationChanged(e)),
  );
  await d.start();
}

export async function deactivate(): Promise<void> {
  await ditto?.stop();
  ditto = undefined;
}

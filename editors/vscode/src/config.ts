/**
 * Settings -> how to start the server and what to tell it.
 *
 * Pure logic (no `vscode` import) so that it is unit-tested without an editor:
 * the extension hands in a getter over `workspace.getConfiguration("ditto")`.
 *
 * Two kinds of settings live under `ditto.*`:
 *  - client-only: enable (handled here by not asking), serverCommand, pythonPath, serverArgs
 *    (changing them restarts the server), trace.server (languageclient's own);
 *  - server settings: sent as `initializationOptions` and, on change, as
 *    `workspace/didChangeConfiguration` `{settings: {ditto: {...}}}`. The server accepts
 *    camelCase names and reloads the model when `model`/`device`/`dtype`/`backend` change.
 *    nextEdit is both: nextedit.ts asks for next edits only with it on, and the server makes
 *    the next edit on the cursor's line an inline item only with it on.
 *
 * The server settings are the server's Settings fields (lsp_server/settings.py), camelCase.
 * tests/lsp/test_settings_paths.py checks package.json's `ditto.*` properties against those
 * fields and SERVER_KEYS below against package.json; test/unit/config.test.ts checks
 * DEFAULTS against package.json. The drafter names are package.json's enum, not a copy.
 */

import manifest from "../package.json";

export interface DittoSettings {
  enable: boolean;
  nextEdit: boolean;
  serverCommand: string;
  pythonPath: string;
  serverArgs: string[];
  model: string;
  drafter: string;
  draftModel: string;
  adaptive: boolean;
  idlePrefill: boolean;
  wholeFile: boolean;
  show: string;
  learnShow: boolean;
  nextEditProposer: string;
  device: string;
  dtype: string;
  backend: string;
  trustRemoteCode: boolean;
  remote: Record<string, unknown>;
  maxTokens: number;
  contextTokens: number;
  snippets: string;
  draftMax: number;
  temperature: number;
  topP: number;
  topK: number;
  seed: number | null;
  timeBudget: number | null;
  multiline: boolean;
  firstAnswerS: number | null;
  loadWaitS: number;
  indexMemoryMb: number;
  definitions: boolean;
  recentEdits: boolean;
  definitionsShare: number;
  editsShare: number;
}

/** The server's drafter names (none, ngram, model, hybrid): package.json's enum for `ditto.drafter`. */
export const DRAFTERS: readonly string[] = manifest.contributes.configuration.properties["ditto.drafter"].enum;
/** What of a suggestion is shown (all, sure, surest): package.json's enum for `ditto.show`. */
export const SHOWS: readonly string[] = manifest.contributes.configuration.properties["ditto.show"].enum;
/** The next-edit proposers (propagate, rewrite, both, judged): package.json's enum for `ditto.nextEditProposer`. */
export const PROPOSERS: readonly string[] =
  manifest.contributes.configuration.properties["ditto.nextEditProposer"].enum;

export const DEFAULTS: DittoSettings = {
  enable: true,
  nextEdit: true,
  serverCommand: "ditto-lsp",
  pythonPath: "",
  serverArgs: [],
  model: "default",
  drafter: "ngram",
  draftModel: "qwen2.5-coder-0.5b",
  adaptive: true,
  idlePrefill: true,
  wholeFile: false,
  show: "sure",
  learnShow: true,
  nextEditProposer: "propagate",
  device: "auto",
  dtype: "auto",
  backend: "auto",
  trustRemoteCode: false,
  remote: {},
  maxTokens: 64,
  contextTokens: 0, // fitted to the machine when the model loads (lsp_server/completion/build.py)
  snippets: "heads",
  draftMax: 8,
  temperature: 0,
  topP: 1,
  topK: 0,
  seed: null,
  timeBudget: 5,
  multiline: true,
  firstAnswerS: 1,
  loadWaitS: 120,
  indexMemoryMb: 64,
  definitions: true,
  recentEdits: true,
  definitionsShare: 0.2,
  editsShare: 0.1,
};

/** The keys the server understands (its Settings dataclass, camelCase). */
export const SERVER_KEYS = [
  "model",
  "drafter",
  "draftModel",
  "adaptive",
  "idlePrefill",
  "wholeFile",
  "show",
  "learnShow",
  "nextEdit",
  "nextEditProposer",
  "device",
  "dtype",
  "backend",
  "trustRemoteCode",
  "remote",
  "maxTokens",
  "contextTokens",
  "snippets",
  "draftMax",
  "temperature",
  "topP",
  "topK",
  "seed",
  "timeBudget",
  "multiline",
  "firstAnswerS",
  "loadWaitS",
  "indexMemoryMb",
  "definitions",
  "recentEdits",
  "definitionsShare",
  "editsShare",
] as const;

/** Changing one of these needs a new server process, not a configuration message. */
export const RESTART_KEYS = ["serverCommand", "pythonPath", "serverArgs"] as const;

export type Getter = (key: string) => unknown;

/** A share of the prompt budget: a number in [0, 0.5] (the server's range), else the default. */
function share(v: unknown, dflt: number): number {
  return typeof v === "number" && v >= 0 && v <= 0.5 ? v : dflt;
}

function str(v: unknown, dflt: string): string {
  return typeof v === "string" && v.trim() !== "" ? v.trim() : dflt;
}

function num(v: unknown, dflt: number, min: number, integer: boolean): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < min) return dflt;
  return integer ? Math.floor(v) : v;
}

function obj(v: unknown): Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v) ? { ...(v as Record<string, unknown>) } : {};
}

function bool(v: unknown, dflt: boolean): boolean {
  return typeof v === "boolean" ? v : dflt;
}

/** Read and sanitise `ditto.*`: a wrong type falls back to the default (the editor shows the schema error). */
export function readSettings(get: Getter): DittoSettings {
  const args = get("serverArgs");
  const tb = get("timeBudget");
  const fa = get("firstAnswerS");
  const drafter = get("drafter");
  const proposer = get("nextEditProposer");
  const show = get("show");
  const topP = get("topP");
  const seed = get("seed");
  return {
    enable: bool(get("enable"), DEFAULTS.enable),
    nextEdit: bool(get("nextEdit"), DEFAULTS.nextEdit),
    serverCommand: str(get("serverCommand"), DEFAULTS.serverCommand),
    pythonPath: typeof get("pythonPath") === "string" ? (get("pythonPath") as string).trim() : "",
    serverArgs: Array.isArray(args) ? args.filter((a): a is string => typeof a === "string") : [],
    model: str(get("model"), DEFAULTS.model),
    drafter: typeof drafter === "string" && DRAFTERS.includes(drafter) ? drafter : DEFAULTS.drafter,
    draftModel: str(get("draftModel"), DEFAULTS.draftModel),
    adaptive: bool(get("adaptive"), DEFAULTS.adaptive),
    idlePrefill: bool(get("idlePrefill"), DEFAULTS.idlePrefill),
    wholeFile: bool(get("wholeFile"), DEFAULTS.wholeFile),
    show: typeof show === "string" && SHOWS.includes(show) ? show : DEFAULTS.show,
    learnShow: bool(get("learnShow"), DEFAULTS.learnShow),
    nextEditProposer:
      typeof proposer === "string" && PROPOSERS.includes(proposer) ? proposer : DEFAULTS.nextEditProposer,
    device: str(get("device"), DEFAULTS.device),
    dtype: str(get("dtype"), DEFAULTS.dtype),
    backend: str(get("backend"), DEFAULTS.backend),
    trustRemoteCode: bool(get("trustRemoteCode"), DEFAULTS.trustRemoteCode),
    remote: obj(get("remote")),
    maxTokens: num(get("maxTokens"), DEFAULTS.maxTokens, 1, true),
    contextTokens: get("contextTokens") === 0 ? 0 : num(get("contextTokens"), DEFAULTS.contextTokens, 64, true),
    snippets: str(get("snippets"), DEFAULTS.snippets),
    draftMax: num(get("draftMax"), DEFAULTS.draftMax, 0, true),
    temperature: num(get("temperature"), DEFAULTS.temperature, 0, false),
    topP: typeof topP === "number" && topP > 0 && topP <= 1 ? topP : DEFAULTS.topP,
    topK: num(get("topK"), DEFAULTS.topK, 0, true),
    seed: typeof seed === "number" && Number.isInteger(seed) ? seed : DEFAULTS.seed,
    timeBudget: tb === null ? null : typeof tb === "number" && tb > 0 ? tb : DEFAULTS.timeBudget,
    multiline: bool(get("multiline"), DEFAULTS.multiline),
    firstAnswerS: fa === null ? null : typeof fa === "number" && fa >= 0 ? fa : DEFAULTS.firstAnswerS,
    loadWaitS: num(get("loadWaitS"), DEFAULTS.loadWaitS, 0, false),
    indexMemoryMb: num(get("indexMemoryMb"), DEFAULTS.indexMemoryMb, 1, true),
    definitions: bool(get("definitions"), DEFAULTS.definitions),
    recentEdits: bool(get("recentEdits"), DEFAULTS.recentEdits),
    definitionsShare: share(get("definitionsShare"), DEFAULTS.definitionsShare),
    editsShare: share(get("editsShare"), DEFAULTS.editsShare),
  };
}

export interface ServerLaunch {
  command: string;
  args: string[];
}

/**
 * `<serverCommand> serve --model M [serverArgs]`, or `<pythonPath> -m lsp_server.cli serve ...`.
 * The model is also on the command line so that the server never starts loading its
 * default model before `initialize` brings the configured one.
 */
export function serverLaunch(s: DittoSettings): ServerLaunch {
  const tail = ["serve", "--model", s.model, ...s.serverArgs];
  if (s.pythonPath !== "") {
    return { command: s.pythonPath, args: ["-m", "lsp_server.cli", ...tail] };
  }
  return { command: s.serverCommand, args: tail };
}

export type ServerOptions = Pick<DittoSettings, (typeof SERVER_KEYS)[number]>;

/** What the server gets as `initializationOptions` (flat, camelCase). */
export function initializationOptions(s: DittoSettings): ServerOptions {
  const out: Record<string, unknown> = {};
  for (const k of SERVER_KEYS) out[k] = s[k];
  return out as ServerOptions;
}

/** The `workspace/didChangeConfiguration` params for the current settings. */
export function configurationParams(s: DittoSettings): { settings: { ditto: ServerOptions } } {
  return { settings: { ditto: initializationOptions(s) } };
}

/** How a settings change must be applied. */
export function changeKind(before: DittoSettings, after: DittoSettings): "restart" | "notify" | "none" {
  const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
  if (RESTART_KEYS.some((k) => !same(before[k], after[k]))) return "restart";
  if (SERVER_KEYS.some((k) => !same(before[k], after[k]))) return "notify";
  return "none";
}

/** A shell-like one-liner for logs and the README ("what exactly was started"). */
export function describeLaunch(l: ServerLaunch): string {
  const q = (a: string) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`);
  return [l.command, ...l.args].map(q).join(" ");
}

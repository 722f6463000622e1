/**
 * What the status bar item says: loading progress, then model + acceptance rate + tokens
 * per target pass from `ditto/stats`.
 *
 * Pure logic (no `vscode` import). The server's reply is read leniently: snake_case or
 * camelCase keys, flat or one level nested (`latency: {p50, p95}`), so that a renamed or
 * missing field shows as "–" instead of breaking the status bar.
 */

export interface StatusView {
  text: string;
  tooltip: string; // markdown
}

type Json = Record<string, unknown>;

const norm = (k: string) => k.toLowerCase().replace(/[^a-z0-9]/g, "");

/** The first of `names` found in `obj` or in one of its object-valued fields. */
export function pick(obj: unknown, ...names: string[]): unknown {
  if (obj === null || typeof obj !== "object") return undefined;
  const wanted = names.map(norm);
  const entries = Object.entries(obj as Json);
  for (const w of wanted) {
    for (const [k, v] of entries) if (norm(k) === w && v !== null && v !== undefined) return v;
  }
  for (const w of wanted) {
    for (const [k, v] of entries) {
      if (v && typeof v === "object" && !Array.isArray(v)) {
        for (const [k2, v2] of Object.entries(v as Json)) {
          if ((norm(k + k2) === w || norm(k2) === w) && v2 !== null && v2 !== undefined) return v2;
        }
      }
    }
  }
  return undefined;
}

function pickNum(obj: unknown, ...names: string[]): number | undefined {
  const v = pick(obj, ...names);
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

function pickStr(obj: unknown, ...names: string[]): string | undefined {
  const v = pick(obj, ...names);
  return typeof v === "string" && v !== "" ? v : undefined;
}

/** 0.6234 -> "62%"; a value already in percent (> 1) is kept. */
export function percent(rate: number | undefined): string {
  if (rate === undefined) return "–";
  const p = rate > 1 ? rate : rate * 100;
  return `${Math.round(p)}%`;
}

export function fixed(x: number | undefined, digits = 2): string {
  return x === undefined ? "–" : x.toFixed(digits);
}

export function ms(x: number | undefined): string {
  if (x === undefined) return "–";
  return x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${Math.round(x)} ms`;
}

/** Last path segment of a model spec, so a long path fits in the status bar. */
export function shortModel(model: string): string {
  const parts = model.split(/[\\/]/).filter((p) => p !== "");
  const last = parts.length ? parts[parts.length - 1] : model;
  return last.length > 32 ? last.slice(0, 31) + "…" : last;
}

export interface StatsSummary {
  model?: string;
  device?: string;
  requests?: number;
  cancelled?: number;
  superseded?: number;
  stale?: number;
  acceptanceRate?: number;
  tokensPerPass?: number;
  p50?: number;
  p95?: number;
  dtype?: string;
  state?: string; // loading | ready | failed (the server's model_state)
  error?: string;
}

export function summarize(stats: unknown): StatsSummary {
  return {
    model: pickStr(stats, "model", "model_name", "modelName", "model_spec"),
    device: pickStr(stats, "device"),
    requests: pickNum(stats, "requests", "requests_total", "completed"),
    cancelled: pickNum(stats, "cancelled", "canceled", "cancellations"),
    superseded: pickNum(stats, "superseded"),
    stale: pickNum(stats, "dropped_stale", "stale", "dropped", "droppedStale"),
    acceptanceRate: pickNum(stats, "acceptance_rate", "acceptance", "accept_rate"),
    tokensPerPass: pickNum(stats, "tokens_per_pass", "tokens_per_target_pass", "tokensPerTargetPass"),
    p50: pickNum(stats, "latency_p50_ms", "latency_ms_p50", "latencyp50", "p50_ms", "p50"),
    p95: pickNum(stats, "latency_p95_ms", "latency_ms_p95", "latencyp95", "p95_ms", "p95"),
    dtype: pickStr(stats, "dtype"),
    state: pickStr(stats, "model_state", "state"),
    error: pickStr(stats, "model_error", "error", "load_error"),
  };
}

/** The status bar once the server answers `ditto/stats`. */
export function statsView(stats: unknown, enabled: boolean, fallbackModel: string): StatusView {
  const s = summarize(stats);
  const model = shortModel(s.model ?? fallbackModel);
  let text: string;
  if (s.state === "loading") text = `$(loading~spin) Ditto: loading ${model}`;
  else if (s.state === "failed" || s.error) text = `$(warning) Ditto: ${model} failed to load`;
  else if (!enabled) text = `$(circle-slash) Ditto ${model} (off)`;
  else {
    text = `$(sparkle) Ditto ${model}`;
    if (s.acceptanceRate !== undefined || s.tokensPerPass !== undefined)
      text += ` · acc ${percent(s.acceptanceRate)} · ${fixed(s.tokensPerPass)} tok/pass`;
  }
  const rows: [string, string][] = [
    ["model", s.model ?? fallbackModel],
    ["state", s.state ?? "–"],
    ["device / dtype", `${s.device ?? "–"} / ${s.dtype ?? "–"}`],
    ["suggestions", enabled ? "on" : "off"],
    ["requests", s.requests?.toString() ?? "–"],
    ["cancelled / superseded / stale", [s.cancelled, s.superseded, s.stale].map((x) => x?.toString() ?? "–").join(" / ")],
    ["latency p50 / p95", `${ms(s.p50)} / ${ms(s.p95)}`],
    ["draft acceptance rate", percent(s.acceptanceRate)],
    ["tokens per target pass", fixed(s.tokensPerPass)],
  ];
  if (s.error) rows.push(["error", s.error]);
  const esc = (x: string) => x.replace(/[|\\`*_<>[\]]/g, (c) => "\\" + c);
  const tooltip =
    "**Ditto** — click for commands\n\n| | |\n|---|---|\n" + rows.map(([k, v]) => `| ${esc(k)} | ${esc(v)} |`).join("\n");
  return { text, tooltip };
}

/** A `$/progress` value (begin/report/end) while the model loads. */
export interface ProgressValue {
  kind: "begin" | "report" | "end";
  title?: string;
  message?: string;
  percentage?: number;
}

/** `title` is the begin's title; `message` the latest message seen (a report may omit it). */
export function progressView(title: string, message: string | undefined, v: ProgressValue): StatusView {
  const pct = typeof v.percentage === "number" ? ` ${Math.round(v.percentage)}%` : "";
  const what = message || (title && title !== "Ditto" ? title : "loading");
  return {
    text: `$(loading~spin) Ditto: ${what}${pct}`,
    tooltip: `**Ditto** ${title && title !== "Ditto" ? title + ": " : ""}${what}${pct}`,
  };
}

export function stateView(state: "starting" | "stopped" | "failed", detail?: string): StatusView {
  switch (state) {
    case "starting":
      return { text: "$(loading~spin) Ditto: starting", tooltip: "**Ditto** starting the server" + (detail ? `: ${detail}` : "") };
    case "stopped":
      return { text: "$(debug-stop) Ditto: stopped", tooltip: "**Ditto** server stopped — click to restart" };
    case "failed":
      return { text: "$(error) Ditto", tooltip: "**Ditto** " + (detail ?? "server failed") + " — see the Ditto output channel" };
  }
}

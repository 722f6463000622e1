/**
 * The last completion's propose/verify rounds (`ditto/trace`) as a self-contained HTML page
 * for a webview: one row per target pass, the drafted tokens that survived in green, the
 * rejected ones struck through in red, and the target's own token (correction, bonus or
 * plain) in blue.
 *
 * Pure logic (no `vscode` import). No scripts; everything from the server is escaped. The
 * reply is read leniently (token texts or ids, snake_case or camelCase); a reply of an
 * unknown shape is shown as JSON rather than dropped.
 */

import { fixed, percent, pick } from "./stats";

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

/** A token as the reader should see it: whitespace made visible, then escaped. */
export function showToken(t: unknown): string {
  const s = typeof t === "string" ? t : typeof t === "number" ? `#${t}` : JSON.stringify(t ?? "");
  const visible = s.replace(/\r/g, "␍").replace(/\n/g, "⏎").replace(/\t/g, "⇥").replace(/ /g, "·");
  return escapeHtml(visible === "" ? "∅" : visible);
}

export interface TraceRound {
  proposed: unknown[];
  accepted: number;
  token: unknown;
  kind: string;
  source?: string;
  matchLen?: number;
  ms?: number;
}

function asArray(v: unknown): unknown[] | undefined {
  return Array.isArray(v) ? v : undefined;
}

/** The first of `names` whose value is an array (a server may send both token lists and joined strings). */
function pickArray(obj: unknown, ...names: string[]): unknown[] | undefined {
  for (const n of names) {
    const v = asArray(pick(obj, n));
    if (v) return v;
  }
  return undefined;
}

export function readRounds(trace: unknown): TraceRound[] | undefined {
  const raw = asArray(pick(trace, "rounds", "steps"));
  if (!raw) return undefined;
  return raw.map((r) => {
    const proposed = pickArray(r, "proposed", "proposed_tokens", "draft_tokens", "draft", "proposed_text") ?? [];
    const accepted = pick(r, "accepted", "n_accepted", "num_accepted");
    const ms = pick(r, "ms", "time_ms", "elapsed_ms");
    const ml = pick(r, "match_len", "matchLen");
    const src = pick(r, "source", "drafter");
    return {
      proposed,
      accepted: typeof accepted === "number" ? Math.max(0, Math.min(accepted, proposed.length)) : 0,
      token: pick(r, "appended", "token_text", "tokenText", "token"),
      kind: String(pick(r, "kind") ?? (proposed.length ? "correction" : "plain")),
      source: typeof src === "string" ? src : undefined,
      matchLen: typeof ml === "number" ? ml : undefined,
      ms: typeof ms === "number" ? ms : undefined,
    };
  });
}

const STYLE = `
body { font-family: var(--vscode-font-family, sans-serif); color: var(--vscode-foreground, #ddd);
       background: var(--vscode-editor-background, #1e1e1e); padding: 0 1em 2em; }
h1 { font-size: 1.2em; } .muted { opacity: .7; }
table { border-collapse: collapse; margin-top: .5em; }
th, td { text-align: left; padding: .2em .6em; border-bottom: 1px solid rgba(128,128,128,.25); vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.tok { font-family: var(--vscode-editor-font-family, monospace); white-space: pre; border-radius: 3px;
       padding: 0 2px; margin-right: 1px; }
.acc { background: rgba(60,180,90,.35); }
.rej { background: rgba(220,70,70,.30); text-decoration: line-through; }
.own { background: rgba(70,140,230,.40); }
pre.text { font-family: var(--vscode-editor-font-family, monospace); background: rgba(128,128,128,.12);
           padding: .5em; white-space: pre-wrap; }
.legend span { margin-right: 1em; }
`;

/** The page. `cspSource` is the webview's `cspSource` (only inline styles are used). */
export function renderTraceHtml(trace: unknown, opts: { uri?: string; cspSource?: string } = {}): string {
  const csp = `default-src 'none'; style-src 'unsafe-inline'${opts.cspSource ? " " + opts.cspSource : ""};`;
  const head = `<!DOCTYPE html><html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="${csp.replace(/[&"<>]/g, "")}"><title>Ditto trace</title><style>${STYLE}</style></head><body>`;
  const where = opts.uri ? `<p class="muted">${escapeHtml(opts.uri)}</p>` : "";
  const rounds = trace === null || trace === undefined ? undefined : readRounds(trace);
  if (trace === null || trace === undefined || (rounds !== undefined && rounds.length === 0 && pick(trace, "text") === undefined)) {
    return `${head}<h1>Ditto — propose/verify trace</h1>${where}<p>No completion yet for this document. Type in it until a suggestion appears, then run <b>Ditto: Show Last Completion's Propose/Verify Trace</b> again.</p></body></html>`;
  }
  if (rounds === undefined) {
    return `${head}<h1>Ditto — propose/verify trace</h1>${where}<p>The server answered in a shape this view does not know; here it is as it came:</p><pre class="text">${escapeHtml(JSON.stringify(trace, null, 2))}</pre></body></html>`;
  }
  const text = pick(trace, "text", "suggestion", "completion");
  const drafted = rounds.reduce((a, r) => a + r.proposed.length, 0);
  const accepted = rounds.reduce((a, r) => a + r.accepted, 0);
  const gained = rounds.reduce((a, r) => a + r.accepted + 1, 0);
  const rate = drafted ? accepted / drafted : undefined;
  const perPass = rounds.length ? gained / rounds.length : undefined;
  const model = pick(trace, "model");
  const drafter = pick(trace, "drafter");
  const facts = [
    typeof model === "string" ? `model <b>${escapeHtml(model)}</b>` : "",
    typeof drafter === "string" ? `drafter <b>${escapeHtml(drafter)}</b>` : "",
    `<b>${rounds.length}</b> target passes`,
    `<b>${gained}</b> tokens`,
    `<b>${fixed(perPass)}</b> tokens/pass`,
    `acceptance <b>${percent(rate)}</b> (${accepted}/${drafted} drafted)`,
    typeof pick(trace, "latency_ms") === "number" ? `latency <b>${escapeHtml(String(pick(trace, "latency_ms")))} ms</b>` : "",
    typeof pick(trace, "stop_reason") === "string" ? `stopped by <b>${escapeHtml(String(pick(trace, "stop_reason")))}</b>` : "",
  ].filter((x) => x !== "");
  const rows = rounds
    .map((r, i) => {
      const toks = r.proposed
        .map((t, j) => `<span class="tok ${j < r.accepted ? "acc" : "rej"}">${showToken(t)}</span>`)
        .join("");
      const own = `<span class="tok own" title="${escapeHtml(r.kind)}">${showToken(r.token)}</span>`;
      return `<tr><td class="n">${i + 1}</td><td>${toks}${own}</td><td class="n">${r.accepted}/${r.proposed.length}</td><td>${escapeHtml(r.kind)}</td><td>${escapeHtml(r.source ?? "")}${r.source && r.matchLen ? ` (match ${r.matchLen})` : ""}</td><td class="n">${r.ms !== undefined ? r.ms.toFixed(1) + " ms" : ""}</td></tr>`;
    })
    .join("\n");
  return `${head}<h1>Ditto — propose/verify trace</h1>${where}
<p>${facts.join(" · ")}</p>
${typeof text === "string" ? `<pre class="text">${escapeHtml(text)}</pre>` : ""}
<p class="legend muted"><span class="tok acc">accepted draft</span><span class="tok rej">rejected draft</span><span class="tok own">target's own token</span></p>
<table><thead><tr><th>pass</th><th>tokens</th><th>accepted</th><th>kind</th><th>draft source</th><th>time</th></tr></thead>
<tbody>
${rows}
</tbody></table></body></html>`;
}

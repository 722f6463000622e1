"""The propose/verify rounds of one completion as data, and the two views of them.

`trace_data(completion, token_text)` is the JSON-able structure behind every view: the
server's `ditto/trace` returns it, `ditto-lsp trace` (lsp_server/commands/trace.py) prints it.
`render_terminal` shows it with colours (accepted drafts green, rejected red and struck
through, the target's own token marked), `render_html` as a self-contained page.
No torch, no LSP, no command line here.
"""

from __future__ import annotations

import html
import json
from typing import Callable

TRACE_VERSION = 1


def trace_data(completion, token_text: Callable[[int], str], text: str | None = None, model: str | None = None,
               drafter: str | None = None) -> dict:
    """A Completion's rounds and stats as plain JSON types.

    token_text maps a token id to its text (LoadedModel.token_text). Shape:
    {"version", "model", "drafter", "text", "stats": {...},
     "rounds": [{"index", "kind", "source", "match_len", "healed", "ms", "gained",
                 "proposed": [{"id", "text", "accepted"}], "token": {"id", "text"}}]}
    kind is "bonus" (all drafts accepted), "correction" (a draft rejected: `token` replaces
    it) or "plain" (no draft); gained = accepted drafts + 1 = tokens bought by the pass.
    """
    rounds = []
    for i, r in enumerate(completion.rounds):
        rounds.append({
            "index": i,
            "kind": r.kind,
            "source": r.source,
            "match_len": r.match_len,
            "healed": getattr(r, "healed", 0),
            "ms": round(r.ms, 3),
            "accepted": r.accepted,
            "gained": r.accepted + 1,
            "proposed": [{"id": t, "text": token_text(t), "accepted": j < r.accepted} for j, t in enumerate(r.proposed)],
            "token": {"id": r.token, "text": token_text(r.token)},
        })
    s = completion.stats
    stats = {
        "tokens": s.tokens, "generated": s.generated, "target_passes": s.target_passes, "drafted": s.drafted,
        "accepted": s.accepted, "acceptance_rate": round(s.acceptance_rate, 4), "tokens_per_pass": round(s.tokens_per_pass, 4),
        "prefill_tokens": s.prefill_tokens, "reused_tokens": s.reused_tokens, "prefill_ms": round(s.prefill_ms, 1),
        "decode_ms": round(s.decode_ms, 1), "wall_ms": round(s.wall_ms, 1), "stop_reason": s.stop_reason,
    }
    return {"version": TRACE_VERSION, "model": model, "drafter": drafter, "text": text, "stats": stats, "rounds": rounds}


def _visible(s: str) -> str:
    return s.replace("\n", "⏎").replace("\t", "⇥") or "∅"


# -- terminal -----------------------------------------------------------------------------


def render_terminal(data: dict, console=None) -> None:
    """Print the rounds with rich colours (green accepted, red rejected, yellow correction, cyan bonus)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    table = Table(title=f"propose/verify rounds — {data.get('model') or ''} drafter {data.get('drafter') or ''}",
                  show_lines=False, expand=False)
    table.add_column("#", justify="right")
    table.add_column("source")
    table.add_column("proposed → verified")
    table.add_column("+tok", justify="right")
    table.add_column("ms", justify="right")
    for r in data["rounds"]:
        t = Text()
        for p in r["proposed"]:
            t.append(_visible(p["text"]), style="bold green" if p["accepted"] else "red strike")
            t.append("·", style="dim")
        style = {"bonus": "bold cyan", "correction": "bold yellow", "plain": "white"}[r["kind"]]
        t.append(f"[{_visible(r['token']['text'])}]", style=style)
        src = f"{r['source']}/{r['match_len']}{'~' * r.get('healed', 0)}" if r["proposed"] else "–"
        table.add_row(str(r["index"]), src, t, str(r["gained"]), f"{r['ms']:.0f}")
    console.print(table)
    s = data["stats"]
    console.print(Text.assemble(("legend: ", "dim"), ("accepted", "bold green"), " ", ("rejected", "red strike"), " ",
                                ("[correction]", "bold yellow"), " ", ("[bonus]", "bold cyan"), " ", ("[plain step]", "white")))
    console.print(f"{s['generated']} tokens in {s['target_passes']} target passes "
                  f"({s['tokens_per_pass']:.2f} tokens/pass), {s['accepted']}/{s['drafted']} drafts accepted; "
                  f"prefill {s['prefill_tokens']} tokens ({s['reused_tokens']} reused) {s['prefill_ms']:.0f} ms, "
                  f"decode {s['decode_ms']:.0f} ms, stop: {s['stop_reason']}")
    if data.get("text") is not None:
        console.print("[bold]suggestion:[/bold]")
        console.print(Text(data["text"]))


# -- HTML -------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.5 system-ui,sans-serif;margin:2em;color:#222;background:#fafafa}
h1{font-size:1.3em} table{border-collapse:collapse} td,th{padding:3px 8px;border-bottom:1px solid #ddd;vertical-align:top}
th{text-align:left;background:#eee} .tok{font-family:ui-monospace,monospace;white-space:pre;border-radius:3px;padding:0 2px;margin-right:2px}
.acc{background:#c8f0c8} .rej{background:#f6caca;text-decoration:line-through;color:#933}
.correction{background:#ffe08a;font-weight:bold} .bonus{background:#a8e6f0;font-weight:bold} .plain{background:#e4e4e4}
.num{text-align:right;font-variant-numeric:tabular-nums} pre{background:#fff;border:1px solid #ddd;padding:8px}
.legend span{margin-right:1em}
"""


def _tok(text: str, cls: str, tid: int) -> str:
    return f'<span class="tok {cls}" title="id {tid}">{html.escape(_visible(text))}</span>'


def render_html(data: dict, title: str = "Ditto trace") -> str:
    """A self-contained HTML page (inline CSS, no scripts or external resources)."""
    rows = []
    for r in data["rounds"]:
        toks = "".join(_tok(p["text"], "acc" if p["accepted"] else "rej", p["id"]) for p in r["proposed"])
        toks += _tok(r["token"]["text"], r["kind"], r["token"]["id"])
        src = html.escape(f"{r['source']}/{r['match_len']}{'~' * r.get('healed', 0)}") if r["proposed"] else "–"
        rows.append(f"<tr><td class=num>{r['index']}</td><td>{src}</td><td>{r['kind']}</td><td>{toks}</td>"
                    f"<td class=num>{r['gained']}</td><td class=num>{r['ms']:.0f}</td></tr>")
    s = data["stats"]
    summary = (f"{s['generated']} tokens in {s['target_passes']} target passes ({s['tokens_per_pass']:.2f} tokens/pass); "
               f"{s['accepted']}/{s['drafted']} drafts accepted; prefill {s['prefill_tokens']} tokens "
               f"({s['reused_tokens']} reused) {s['prefill_ms']:.0f} ms; decode {s['decode_ms']:.0f} ms; "
               f"stop: {s['stop_reason']}")
    text = "" if data.get("text") is None else f"<h2>Suggestion</h2><pre>{html.escape(data['text'])}</pre>"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_CSS}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>model {html.escape(str(data.get('model')))}, drafter {html.escape(str(data.get('drafter')))}</p>
<p class=legend><span class="tok acc">accepted draft</span><span class="tok rej">rejected draft</span>
<span class="tok correction">correction</span><span class="tok bonus">bonus</span><span class="tok plain">plain step</span></p>
<p>{html.escape(summary)}</p>
<table><tr><th>#</th><th>source/match</th><th>kind</th><th>proposed → verified</th><th>+tokens</th><th>ms</th></tr>
{''.join(rows)}
</table>
{text}
<script type="application/json" id="trace-data">{html.escape(json.dumps(data, ensure_ascii=False), quote=False)}</script>
</body></html>
"""


# -- command --------------------------------------------------------------------------------

"""What the user keeps, in the report (issue 58): the headline table, the cells beside each mode's
quality columns, and the plot of wrong a request against characters kept a request.

Reads only a summary (metrics.keep_summary's fields, wherever a mode puts them). Left out on
purpose: the definitions (quality.py) and the sums (metrics.py); the rest of the report (report.py).
"""

from __future__ import annotations

import re
from pathlib import Path

KEEP_HEAD = "shown | kept | wrong | chars kept a request | wrong a request"


def _num(x, nd: int) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def keep_cells(v: dict | None, n: int) -> str:
    """The cells under KEEP_HEAD from metrics.keep_summary's figures over n requests (– where a
    results.json predates them)."""
    if not v or v.get("shown") is None:
        return " | ".join(["–"] * 5)
    return (f"{v['shown']}/{n} | {v['kept']} | {v['wrong']} | {_num(v['kept_chars_per_request'], 2)} | "
            f"{_num(v['wrong_per_request'], 3)}")


def keep_rows(summary: dict) -> list[tuple[str, str, int, dict]]:
    """(system, kind, requests, figures) of what the user keeps, from any mode's summary: the editor
    replay's cold, warm and all; keystroke and session mode's `quality`; completion mode's own."""
    rows = []
    for s, v in summary.items():
        if "cold" in v:
            rows += [(s, kind, v[kind]["n"], v[kind]) for kind in ("cold", "warm", "all")]
        elif "quality" in v:
            rows.append((s, "all", v["requests"], v["quality"] or {}))
        else:
            rows.append((s, "all", v.get("tasks") or 0, v))
    return rows


def keep_table(summary: dict) -> str:
    """The headline: wrong a request beside characters kept a request, per system and kind."""
    head = "| system | kind | requests | wrong a request | chars kept a request | shown | kept | wrong |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, kind, n, v in keep_rows(summary):
        if v.get("shown") is None:
            continue
        rows.append(f"| {s} | {kind} | {n} | {_num(v['wrong_per_request'], 3)} | {_num(v['kept_chars_per_request'], 2)} | "
                    f"{v['shown']} | {v['kept']} | {v['wrong']} |")
    return "\n".join(rows) if len(rows) > 2 else ""


KEEP_NOTE = ("Wrong a request: requests whose suggestion was shown and whose first line is not a prefix of the rest "
             "of the true line (trailing blanks aside), over all requests. Chars kept a request: the common prefix of "
             "the suggestion and what the user types next (the rest of the block), cut back to a word boundary, "
             "averaged over all requests (nothing shown counts 0). Kept: the whole suggestion is a prefix of what the "
             "user types next. Definitions: ditto_bench/quality.py, docs/benchmark.md.")


def keep_plot(summary: dict, out: Path) -> bool:
    """kept_vs_wrong.png: wrong a request against characters kept a request, one point per system (its
    settings apart: `ditto#show=sure` beside `ditto`), a colour per base system; False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(s, v) for s, kind, _, v in keep_rows(summary) if kind == "all" and v.get("shown") is not None]
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    colours: dict[str, str] = {}
    at: dict[tuple, list[str]] = {}  # systems on one point are named together
    for s, v in pts:
        base = re.split(r"[#@~+]", s, maxsplit=1)[0].removesuffix("-noreuse")
        first = base not in colours
        colour = colours.setdefault(base, f"C{len(colours) % 10}")
        xy = (v["kept_chars_per_request"], v["wrong_per_request"])
        ax.scatter([xy[0]], [xy[1]], color=colour, s=40, label=base if first else None)
        at.setdefault(xy, []).append(s)
    for xy, names in at.items():
        ax.annotate(", ".join(names), xy, textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("characters kept a request (word by word; nothing shown counts 0)")
    ax.set_ylabel("wrong a request (shown, first line not the true line's rest)")
    ax.set_title("What the user keeps against what misleads them (up-left is worse, down-right better)")
    ax.set_xlim(0, max(max(x for x, _ in at) * 1.3, 1.0))  # room for the names
    ax.set_ylim(0, max(max(y for _, y in at) * 1.2, 0.05))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "kept_vs_wrong.png", dpi=110)
    plt.close(fig)
    return True

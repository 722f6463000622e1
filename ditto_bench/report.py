"""results.json -> report.md (tables) and PNG plots (matplotlib, Agg backend).

Reads only the dict written to results.json, so a report can be rebuilt from a saved run:
`python -m ditto_bench.report DIR`. What the user keeps (the headline table, its cells beside each
mode's quality columns, kept_vs_wrong.png) is report_keep.py's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ditto_bench.report_keep import KEEP_HEAD, KEEP_NOTE, keep_cells, keep_plot, keep_table


def _f(x, nd=2, suffix=""):
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}{suffix}"
    return f"{x}{suffix}"


def _pct(x):
    return "–" if x is None else f"{100 * x:.1f}%"


QUALITY_HEAD = "typed + 1st line = truth | edit sim | empty | whole-word misfires | " + KEEP_HEAD


def _quality_cells(q: dict | None, n: int) -> str:
    """The cells under QUALITY_HEAD from metrics.quality_summary's figures over n requests."""
    if not q:
        return " | ".join(["–"] * 9)
    return (f"{q['first_line_exact']}/{n} ({_pct(q['first_line_exact_rate'])}) | {_f(q['edit_similarity_mean'], 3)} | "
            f"{_pct(q['empty_share'])} | {q['misfires']}/{q['misfire_eligible']} ({_pct(q['misfire_share'])}) | "
            + keep_cells(q, n))


def completion_table(summary: dict) -> str:
    head = ("| system | tasks | latency p50 ms | latency p95 ms | decode p50 ms | tokens/s | passes/token | "
            "acceptance | identical | exact block | exact 1st line | edit sim | empty | speedup median | speedup geomean | "
            f"decode speedup geomean | {KEEP_HEAD} |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in summary.items():
        rows.append(f"| {s} | {v['tasks']} | {_f(v['latency_ms_p50'], 0)} | {_f(v['latency_ms_p95'], 0)} | "
                    f"{_f(v['decode_ms_p50'], 0)} | {_f(v['tokens_per_s'])} | {_f(v['passes_per_token'], 3)} | "
                    f"{_pct(v['acceptance_rate'])} | {_pct(v['identical_rate'])} | {_pct(v['exact_match'])} | "
                    f"{_pct(v['first_line_exact'])} | {_f(v['edit_similarity'], 3)} | {_pct(v.get('empty_share'))} | "
                    f"{_f(v['speedup_median'], 3)} | "
                    f"{_f(v['speedup_geomean'], 3)} | {_f(v['decode_speedup_geomean'], 3)} | {keep_cells(v, v['tasks'])} |")
    return "\n".join(rows)


def bucket_table(summary: dict, field: str = "buckets") -> str:
    systems = [s for s in summary if s != "off"]
    if not systems:
        return ""
    names = list(next(iter(summary.values()))[field])
    head = "| copyable fraction | tasks | " + " | ".join(f"{s} speedup (decode)" for s in systems) + " |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for b in names:
        n = summary["off"][field][b]["tasks"] if "off" in summary else summary[systems[0]][field][b]["tasks"]
        cells = []
        for s in systems:
            v = summary[s][field][b]
            acc = f", acc {_pct(v['acceptance_rate'])}" if v["acceptance_rate"] is not None else ""
            cells.append(f"{_f(v['speedup_geomean'], 3)} ({_f(v['decode_speedup_geomean'], 3)}){acc}")
        rows.append(f"| {b} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def steps_table(summary: dict) -> str:
    """Target passes by what drafted them (shows where the hybrid ran its draft model)."""
    head = "| system | target passes | n-gram draft | model draft | no draft | tasks with a model draft |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in summary.items():
        st = v.get("steps")
        if not st or s in ("off", "oracle"):
            continue
        total = sum(st.values()) or 1
        rows.append(f"| {s} | {total} | {_pct(st.get('ngram', 0) / total)} | {_pct(st.get('model', 0) / total)} | "
                    f"{_pct(st.get('plain', 0) / total)} | {v.get('tasks_with_model_draft', '–')} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def drafting_table(summary: dict) -> str:
    """What the drafts bought (metrics.drafting): tokens per pass and where no draft was."""
    head = ("| system | target passes | tokens per pass | passes with no draft | tree passes | rows per pass | "
            "drafting ms per pass | same suggestion as off |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in summary.items():
        if v.get("tokens_per_pass") is None:
            continue
        same = v.get("same_suggestion_as_off_rate", v.get("identical_rate"))
        n = v.get("same_suggestion_as_off_compared", v.get("tasks"))
        cell = f"{_pct(same)} ({n})" if s != "off" and same is not None else "–"
        rows.append(f"| {s} | {v['passes']} | {_f(v['tokens_per_pass'], 3)} | {v['no_draft_passes']} | "
                    f"{v['tree_passes']} | {_f(v['rows_per_pass'], 2)} | {_f(v.get('draft_ms_per_pass'), 3)} | {cell} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def _drafting_lines(results: dict, summary: dict) -> list[str]:
    meta = results["meta"]
    table = drafting_table(summary)
    if not table:
        return []
    out = ["## Drafting: tokens per target pass", "", table, ""]
    priced = meta.get("priced_with")
    if priced:
        out += [f"Passes were priced with the pass costs of {priced.get('device') or priced.get('source')} "
                f"({priced.get('source')}" + (f", its fixed shape of {priced['rows']} rows" if priced.get("rows") else "")
                + "): the adaptive policy chose draft and tree sizes as it would there; this machine's own "
                "pass costs were not used.", ""]
        from ditto_bench.projection import gpu_costs, project

        try:
            p = project(results["tasks"], gpu_costs(Path(priced["source"])))
        except (OSError, ValueError, KeyError):
            p = None
        if p is not None:
            from ditto_bench.projection import markdown as projection_md

            out += ["## Projected tokens/s on that device", "", projection_md(p), ""]
    return out


def keystroke_table(summary: dict) -> str:
    head = ("| system | requests | tasks | tts p50 ms | tts p95 ms | tts p50 ms (model answered) | prefill tokens mean | reused tokens mean | "
            f"prompt tokens mean | typethrough hits | p50 gain vs noreuse | p50 gain (model answered) | prefill gain vs noreuse | "
            f"{QUALITY_HEAD} |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in summary.items():
        rows.append(f"| {s} | {v['requests']} | {v['tasks']} | {_f(v['tts_ms_p50'], 0)} | {_f(v['tts_ms_p95'], 0)} | "
                    f"{_f(v.get('tts_ms_p50_model'), 0)} | {_f(v['prefill_tokens_mean'], 1)} | {_f(v['reused_tokens_mean'], 1)} | "
                    f"{_f(v['prompt_tokens_mean'], 1)} | {v['typethrough_hits']} | "
                    f"{_f(v.get('tts_p50_gain_vs_noreuse'), 2, '×')} | {_f(v.get('tts_p50_model_gain_vs_noreuse'), 2, '×')} | "
                    f"{_f(v.get('prefill_tokens_gain_vs_noreuse'), 1, '×')} | {_quality_cells(v.get('quality'), v['requests'])} |")
    return "\n".join(rows)


def session_table(summary: dict) -> str:
    head = ("| system | sessions | tasks | requests | tts p50 ms | tts p95 ms | tts p50 ms (model) | tts p95 ms (model) | "
            "prefill tokens p50 (model) | prefill tokens p95 (model) | prompt tokens mean | reused after Enter | "
            "reused after a move | window moves | typethrough hits | idle-prefill hits | prefill p95 gain vs noreuse | "
            f"tts p95 gain (model) vs noreuse | same tokens as off / as reuse | {QUALITY_HEAD} |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in summary.items():
        rows.append(f"| {s} | {v['sessions']} | {v['tasks']} | {v['requests']} | {_f(v['tts_ms_p50'], 0)} | "
                    f"{_f(v['tts_ms_p95'], 0)} | {_f(v['tts_ms_p50_model'], 0)} | {_f(v['tts_ms_p95_model'], 0)} | "
                    f"{_f(v['prefill_tokens_p50_model'], 0)} | {_f(v['prefill_tokens_p95_model'], 0)} | "
                    f"{_f(v['prompt_tokens_mean_model'], 0)} | {_pct(v['reused_share_enter_mean'])} ({v['enter_requests']}) | "
                    f"{_pct(v['reused_share_move_mean'])} ({v['move_requests']}) | {v['window_moves']} | "
                    f"{v['typethrough_hits']} | {v['idle_prefill_hits']} | "
                    f"{_f(v.get('prefill_tokens_p95_gain_vs_noreuse'), 1, '×')} | {_f(v.get('tts_p95_model_gain_vs_noreuse'), 2, '×')} | "
                    f"{_same(v)} | {_quality_cells(v.get('quality'), v['requests'])} |")
    return "\n".join(rows)


def replay_table(summary: dict) -> str:
    """The editor replay (replay.py): one row per system and kind of request (cold, warm, all)."""
    head = (f"| system | kind | n | tts p50 ms | tts p95 ms | {QUALITY_HEAD} | prompt tokens processed p50 | "
            "prompt tokens seen p50 | whole file above | shown without the model | idle before p50 ms | timeouts | deadline + continuation = one generation |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in summary.items():
        for kind in ("cold", "warm", "all"):
            g = v[kind]
            rows.append(f"| {s} | {kind} | {g['n']} | {_f(g['tts_ms_p50'], 0)} | {_f(g['tts_ms_p95'], 0)} | "
                        f"{_quality_cells(g, g['n'])} | {_f(g['prompt_tokens_p50'], 0)} | "
                        f"{_f(g.get('prompt_tokens_seen_p50'), 0)} | {_whole(g)} | {g['typethrough']} | "
                        f"{_f(g['idle_ms_p50'], 0)} | {g['timeouts']} | {_checked(g)} |")
    return "\n".join(rows)


def _whole(g: dict) -> str:
    """Requests with the whole file above / requests that say (– where none does: the peer, an older Ditto)."""
    n = g.get("whole_file_known") or 0
    return f"{g['whole_file']}/{n}" if n else "–"


def _checked(g: dict) -> str:
    """The continuation check (`--check-continuations`): identical / checked, or – when not run; runs cut
    short before their first token compared nothing and are shown apart."""
    n, empty = g.get("continuations_checked") or 0, g.get("continuations_empty") or 0
    cell = f"{g['continuations_identical']}/{n}" if n else "–"
    return f"{cell} (+{empty} cut short empty)" if empty else cell


def replay_ratio_table(summary: dict) -> str:
    """The peer's time to suggestion over each Ditto system's (above 1: Ditto is faster)."""
    have = {s: v["vs_peer"] for s, v in summary.items() if v.get("vs_peer")}
    if not have:
        return ""
    head = "| system | peer / system cold p50 | cold p95 | warm p50 | warm p95 |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, r in have.items():
        rows.append(f"| {s} | {_f(r['cold_p50'], 2, '×')} | {_f(r['cold_p95'], 2, '×')} | {_f(r['warm_p50'], 2, '×')} | "
                    f"{_f(r['warm_p95'], 2, '×')} |")
    return "\n".join(rows)


def _replay_lines(meta: dict, summary: dict) -> list[str]:
    rp = meta.get("replay") or {}
    out = ["## Editor replay: real servers, the same edits and requests", "", replay_table(summary), ""]
    ratios = replay_ratio_table(summary)
    if ratios:
        out += [ratios, ""]
    drafted = {s: v["drafted"] for s, v in summary.items() if v.get("drafted") is not None}
    if drafted:
        out += ["Draft tokens verified over the run (ditto/trace; the drafter's index work is each system's "
                "`index` below): " + ", ".join(f"{s} {n}" for s, n in drafted.items()), ""]
    pauses = rp.get("pauses_s") or {}
    out.append("cold: the request made as the cursor arrives at a block not visited yet; warm: after a line's first "
               "character, at a place visited. Time to suggestion: request sent -> answer received (client wall "
               "clock); a timeout counts at the timeout. Typed + 1st line = truth: the text before the cursor plus the "
               "suggestion's first line equals the true line. Whole-word misfires: of the requests where a letter was "
               "typed and the true line continues the word, those whose suggestion starts with a non-word character. "
               "Prompt tokens processed: Ditto's prefill tokens (ditto/trace), llama-server's timings.prompt_n. Shown "
               "without the model: Ditto's type-through, llama.vim's cache. Idle before: wall time from the previous "
               "answer to the request. Deadline + continuation = one generation (`--check-continuations`): of Ditto's "
               "answers given at a deadline, those whose finished generation has the tokens of the same generation "
               "run again without a deadline (ditto/debug/checkPlace; – when not checked).")
    if rp:
        out += ["", f"Pauses (s, × pause scale {rp.get('pause_scale')}): rest after arriving {pauses.get('rest')}, "
                    f"before a line's request {pauses.get('line')}, ditto/didMoveCursor {pauses.get('cursor_notice')} "
                    f"into each; cores {rp.get('cores')}, one thread each; llama.vim follow-up "
                    f"{'on' if rp.get('followup') else 'off'}; answer timeout {rp.get('answer_timeout_s')} s; "
                    f"load average at start / end {rp.get('loadavg_start')} / {rp.get('loadavg_end')}."]
        for name, info in (rp.get("systems") or {}).items():
            out.append(f"- {name}: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in info.items() if k != "system"))
    out.append("")
    return out


def _same(v: dict) -> str:
    """Session mode's identical-output column: "100% (n)" against off or against the reusing twin."""
    for key in ("identical_to_off", "identical_to_reuse"):
        if v.get(f"{key}_rate") is not None:
            return f"{_pct(v[f'{key}_rate'])} ({v[f'{key}_compared']})"
    return "–"


def markdown(results: dict) -> str:
    meta = results["meta"]
    out = [f"# Ditto benchmark ({meta.get('mode', 'completion')} mode)", ""]
    out.append(f"- repository: `{meta.get('repo')}` ({meta.get('tasks_run')} tasks run of {meta.get('tasks_harvested')} "
               f"harvested; {meta.get('candidates')} candidates before sampling; skipped commits: {meta.get('commits_skipped')})")
    out.append(f"- model: {meta.get('model')} on {meta.get('device')} ({meta.get('dtype')}); "
               f"machine: {meta.get('machine', {}).get('summary')}")
    if meta.get("max_tokens") is None and meta.get("replay"):  # only the editor replay: each server's own settings
        budget = "budget: each server's defaults and what its system name says (below)"
    else:
        budget = (f"budget: {meta.get('max_tokens')} new tokens, draft_max {meta.get('draft_max')}, "
                  f"adaptive draft length {meta.get('adaptive', '–')}, context {meta.get('context_tokens')} tokens")
    out.append(f"- {budget}; wall time {_f(meta.get('wall_s'), 0)} s"
               + ("; **partial run** (" + meta.get("stopped", "") + ")" if meta.get("partial") else ""))
    if meta.get("repo_commit"):
        out.append(f"- repository commit: {meta['repo_commit']}")
    out.append(f"- command: `{meta.get('command')}`")
    if meta.get("pass_costs_ms"):
        costs = ", ".join(f"T({n}) {ms:.0f}" for n, ms in meta["pass_costs_ms"].items())
        out.append(f"- target pass costs measured at the start of the run (ms): {costs}")
    if meta.get("hybrid"):
        hy = meta["hybrid"]
        out.append(f"- hybrid at the end of the run: draft model pass {_f(hy.get('draft_ms'), 1)} ms + "
                   f"{_f(hy.get('draft_token_ms'), 2)} ms per extra token (measured), drafting-cost correction "
                   f"{_f(hy.get('draft_scale'), 2)}×, model acceptance estimate {_f(hy.get('model_acceptance'), 2)}; "
                   f"steps: {hy.get('steps')}")
    if meta.get("note"):
        out.append(f"- note: {meta['note']}")
    out.append("")
    summary = results["summary"]
    headline = keep_table(summary)
    if headline:
        out += ["## What the user keeps", "", headline, "", KEEP_NOTE, ""]
    replayed = {s: v for s, v in summary.items() if "cold" in v}  # the editor replay's systems (replay.py)
    summary = {s: v for s, v in summary.items() if s not in replayed}
    if replayed:
        out += _replay_lines(meta, replayed)
    if meta.get("mode") == "session":
        if summary:  # the in-process session systems (runner.Bench.session)
            out += ["## Session replay: time to suggestion and prefill per request", "", session_table(summary), ""]
            out.append("\"model\" columns leave out type-through answers. Reused after Enter / a move: mean share of the "
                       "prompt's tokens taken from the KV cache on those requests (count in brackets). Window moves: requests "
                       "whose lines-above window started at another line than the previous one. Idle-prefill hits: "
                       "requests at a new place whose prompt was prefilled while the user paused there (server.py idle "
                       "prefill; not counted in their time to suggestion; off with --no-idle-prefill). Systems with -noreuse pass no "
                       "cache key: no KV reuse and no type-through.")
            if meta.get("budget"):
                out.append("")
                out.append(f"Context budget: {meta['budget']}")
            out += [""] + _drafting_lines(results, summary)
    elif meta.get("mode") == "keystroke":
        out += ["## Time to suggestion per keystroke", "", keystroke_table(summary), ""]
        out.append("Systems with -noreuse pass no cache key: no KV reuse and no type-through.")
    else:
        out += ["## Summary", "", completion_table(summary), "",
                "Latency of a Ditto system = the task's prefill (done once, by `off`) + its own decode; the "
                "transformers systems are timed end to end with the same token budget. Speedups are per-task ratios "
                "against `off`.", "",
                "## Speedup by copyable fraction (document + open buffers)", "", bucket_table(summary, "buckets"), "",
                "## Target passes by draft source", "", steps_table(summary), "",
                *_drafting_lines(results, summary),
                "## Speedup by copyable fraction (open buffers only)", "", bucket_table(summary, "buckets_buffers"), ""]
        mm = results.get("mismatches") or []
        out += ["## Outputs that differ from `off`", ""]
        if not mm:
            out.append("None: every system produced `off`'s tokens on every task.")
        for m in mm[:20]:
            out.append(f"- `{m['task']}` {m['system']}: {json.dumps(m['text'])} vs off {json.dumps(m['reference'])}")
        out.append("")
    plots = results.get("plots") or []
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(out)


def replay_plot(records: list[dict], systems: list[str], path: Path, title: str, dpi: int = 110) -> None:
    """The editor replay's chart: time to suggestion of each system, cold and warm apart, on a log scale
    (a warm answer may take milliseconds, a cold one seconds). One run's (replay.png) or several runs'
    pooled (pages.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels, data = [], []
    for s in systems:
        for kind in ("cold", "warm"):
            labels.append(f"{s}\n{kind}")
            data.append([max(r["tts_ms"], 1.0) / 1000 for r in records
                         if r["system"] == s and r.get("kind") == kind and r.get("tts_ms") is not None])
    boxes = ax.boxplot(data, whis=(5, 95), showfliers=True, patch_artist=True, medianprops={"color": "black"})
    colours = [f"C{i}" for i in range(len(systems)) for _ in ("cold", "warm")]  # one colour a system
    for box, colour in zip(boxes["boxes"], colours):
        box.set(facecolor=colour, alpha=0.35)
    ax.set_xticks(range(1, len(labels) + 1), labels)
    ax.set_yscale("log")
    ax.set_ylabel("seconds to suggestion (log)")
    ax.set_title(title + "; whiskers: p5 and p95")
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plots(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    tasks = results["tasks"]
    systems = list(results["summary"])
    if not systems:
        return made
    key = "tts_ms" if results["meta"].get("mode") in ("keystroke", "session") else "latency_ms"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    data = [[r[key] / 1000 for r in tasks if r["system"] == s and r.get(key) is not None] for s in systems]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(systems) + 1), systems)
    ax.set_ylabel("seconds" + (" to suggestion" if key == "tts_ms" else " per completion"))
    ax.set_title("Latency distribution per system")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
    made.append("latency.png")
    replayed = [s for s, v in results["summary"].items() if "cold" in v]
    if replayed:  # the editor replay: cold and warm apart
        replay_plot(tasks, replayed, out / "replay.png", "Editor replay: time to suggestion, cold and warm")
        made.append("replay.png")
    if keep_plot(results["summary"], out):
        made.append("kept_vs_wrong.png")
    if key == "tts_ms":
        return made
    ref = {r["task"]: r["latency_ms"] for r in tasks if r["system"] == "off"}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s in systems:
        if s == "off":
            continue
        pts = [(r["copyable"], ref[r["task"]] / r["latency_ms"]) for r in tasks
               if r["system"] == s and r["task"] in ref and r.get("latency_ms")]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=s, alpha=0.7, s=18)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("copyable fraction of the ground truth (document + open buffers)")
    ax.set_ylabel("speedup over off (latency ratio, log)")
    ax.set_title("Speedup against copyable fraction")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "speedup_vs_copyable.png", dpi=110)
    plt.close(fig)
    made.append("speedup_vs_copyable.png")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s, v in results["summary"].items():
        pos = [p for p in v.get("acceptance_by_position") or [] if p["rate"] is not None]
        if pos:
            ax.plot([p["position"] for p in pos], [p["rate"] for p in pos], marker="o", label=s)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance by draft position")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_position.png", dpi=110)
    plt.close(fig)
    made.append("acceptance_by_position.png")
    return made


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results["plots"] = plots(results, out) if results["tasks"] else []
    (out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(results), encoding="utf-8")


if __name__ == "__main__":
    d = Path(sys.argv[1])
    write(json.loads((d / "results.json").read_text(encoding="utf-8")), d)

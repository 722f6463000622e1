"""The current performance record: one page per benchmark kind under docs/perf, generated from runs.

    python -m ditto_bench.pages RUN... --kind replay|nextedit|gpu [--out docs/perf] [--readme README.md]

- `replay`: editor replays (`ditto-lsp bench --mode session` with `llama-server` and Ditto systems), one
  run a repository. Writes replay.md (every system pooled, then per repository: time to suggestion cold
  and warm, first lines right, wrong a request, characters kept a request; the machine and each run's
  command), replay.png (report.py `replay_plot`, the chart `ditto-lsp bench` draws for one run, over
  all runs), and with `--readme` the README's table between its `perf:replay` markers.
- `nextedit`: next-edit runs (`--mode next-edit`): nextedit.md and nextedit.png, per proposer.
- `gpu`: a GPU check's gpucheck.json, then compact passes of CPU runs to price on its costs
  (projection.py): gpu.md and gpu.png (T(n) by path).

RUN is a run's results.json, or the page's own data file (data/replay.json, data/nextedit.json), which
this writes beside the page: what the page is built from, machine paths taken out, so that the page can
be regenerated from the tree alone. A `replay` run's records written before what the user keeps was
recorded get it from their text (quality.request_quality's fields, the same definitions).

Left out on purpose: running benchmarks (cli.py) and one run's full report (report.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from ditto_bench.runinfo import read_json, write_json

# The dated record these pages replace (every earlier run's report, plots and results) is in git at
# this commit: docs/perf/README.md and its folders there.
OLDER_REPORTS_AT = "9fb2ee1"
NAMES = {"ditto": "Ditto", "llama-server": "llama-server (llama.vim's client)", "ditto-base": "Ditto, previous version"}
# The README's table and the chart: Ditto at its defaults, the peer, and Ditto's previous version (a run's
# ditto#KEY=VALUE variants are on the page only).
SHOWN = tuple(NAMES)
# What a replay page reads of each request (the data file holds them as rows under these columns).
COLUMNS = ("system", "kind", "tts_ms", "timeout", "first_line_exact", "shown", "kept", "wrong", "kept_chars")
MARK = "<!-- perf:{kind}:{end} (python -m ditto_bench.pages; do not edit by hand) -->"


def repo_label(path: str) -> str:
    """owner/name for a clone at .../owner+name/... (how mirrors name them), else the folder's name."""
    parts = [p for p in Path(str(path)).parts if p not in ("/", "repo", ".git")]
    named = [p for p in parts if "+" in p]
    return named[-1].replace("+", "/", 1) if named else (parts[-1].removesuffix(".git") if parts else str(path))


def clone_label(path: str) -> str:
    """owner/name of the clone a run replayed: from its origin (a mirror's folder or a URL) where the clone is
    still here, else from its own path (repo_label)."""
    import subprocess

    try:
        url = subprocess.run(["git", "-C", str(path), "remote", "get-url", "origin"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        url = ""
    if "+" in url:
        return repo_label(url)
    m = re.search(r"[:/]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$", url)
    return f"{m.group(1)}/{m.group(2)}" if m and ("://" in url or "@" in url) else repo_label(path)


def portable_command(command: str, label: str) -> str:
    """The run's command with this machine's paths replaced: --repo a clone, --out a folder of runs."""
    short = label.rsplit("/", 1)[-1]
    words, out = shlex.split(command), []
    for i, w in enumerate(words):
        prev = words[i - 1] if i else ""
        if prev == "--repo":
            w = f"path/to/{short}"
        elif prev == "--out":
            w = f"runs/{short}"
        elif prev == "--baseline":
            w = "path/to/previous-checkout"
        elif w.startswith("/"):
            w = f"path/to/{Path(w).name}"
        out.append(w)
    return shlex.join(out)


def _run_meta(meta: dict) -> dict:
    label = clone_label(meta.get("repo", "?"))
    replay = meta.get("replay") or {}
    return {"repo": label, "repo_commit": (meta.get("repo_commit") or "")[:10],
            "command": portable_command(meta.get("command") or "", label),
            "machine": (meta.get("machine") or {}).get("summary"), "model": meta.get("model"),
            "backend": meta.get("backend"), "dtype": meta.get("dtype"),
            "versions": {k: v for k, v in (meta.get("versions") or {}).items() if k in ("ditto-lsp", "ditto_commit", "xllamacpp")},
            "open_rest_s": (replay.get("pauses_s") or {}).get("open_rest"), "pause_scale": replay.get("pause_scale"),
            "threads": sorted({v["threads"] for v in (replay.get("systems") or {}).values() if v.get("threads")}),
            "context_tokens": {s: v.get("context_tokens") for s, v in (replay.get("systems") or {}).items()
                               if v.get("context_tokens") is not None},
            "wall_s": meta.get("wall_s")}


def _row(r: dict) -> list:
    """A replay record as a data file's row (COLUMNS), what the user keeps taken from its text where the run
    predates those fields."""
    if "shown" not in r and r.get("true_rest") is not None:
        from ditto_bench.quality import keep_quality

        r = {**r, **keep_quality(r.get("text") or "", r["true_rest"])}
    return [r.get(k) for k in COLUMNS]


def records(run: dict) -> list[dict]:
    """A replay run's requests as records metrics.summarise_replay reads."""
    return [{"session": "", "task": "", **{k: v for k, v in zip(run["columns"], row) if v is not None}}
            for row in run["rows"]]


def load(paths: list[Path], kind: str) -> dict:
    """The page's data: {"kind", "runs": [...]}, from results.json files or the page's own data file."""
    runs = []
    for path in paths:
        data = read_json(path)
        if data.get("kind") == kind:  # the page's own data file
            runs += data["runs"]
            continue
        meta = data.get("meta") or {}
        if kind == "replay":
            if meta.get("mode") != "session" or not any("cold" in v for v in (data.get("summary") or {}).values()):
                raise ValueError(f"{path}: not an editor replay (ditto-lsp bench --mode session with replay systems)")
            rows = [_row(r) for r in data["tasks"] if r.get("kind") in ("cold", "warm")]
            runs.append({**_run_meta(meta), "columns": list(COLUMNS), "rows": rows})
        elif kind == "nextedit":
            if meta.get("mode") != "next-edit":
                raise ValueError(f"{path}: not a next-edit run (ditto-lsp bench --mode next-edit)")
            summary = {s: v for s, v in data["summary"].items() if isinstance(v, dict)}
            runs.append({**_run_meta(meta), "summary": summary, "default": data["summary"].get("default")})
        else:
            raise ValueError(f"unknown kind {kind}")
    runs.sort(key=lambda r: r["repo"].lower())
    return {"kind": kind, "runs": runs}


def _ms(x) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _pair(g: dict) -> str:
    return f"{_ms(g['tts_ms_p50'])} / {_ms(g['tts_ms_p95'])}"


def _num(x, nd: int) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _t(ms) -> str:
    """A time in ms: to a tenth below 100 ms, else whole."""
    return "–" if ms is None else f"{ms:,.1f}" if ms < 100 else f"{ms:,.0f}"


def _order(systems) -> list[str]:
    """SHOWN's systems first, in its order, then the rest as they came."""
    systems = list(dict.fromkeys(systems))
    return [s for s in SHOWN if s in systems] + [s for s in systems if s not in SHOWN]


def replay_rows(records: list[dict], only: tuple[str, ...] | None = None) -> list[str]:
    from ditto_bench.metrics import summarise_replay

    rows = []
    summary = summarise_replay(records)
    for s in _order(summary):
        if only is not None and s not in only:
            continue
        v = summary[s]
        a = v["all"]
        rows.append(f"| {NAMES.get(s, s)} | {a['n']} | {_pair(v['cold'])} | {_pair(v['warm'])} | "
                    f"{a['first_line_exact']}/{a['n']} | {_num(a['wrong_per_request'], 2)} | "
                    f"{_num(a['kept_chars_per_request'], 1)} |")
    return rows


REPLAY_HEAD = ("| | requests | cold p50 / p95 ms | warm p50 / p95 ms | first lines right | wrong a request | "
               "characters kept a request |\n|---|---|---|---|---|---|---|")


def _machine(runs: list[dict]) -> str:
    m = sorted({r["machine"] for r in runs if r.get("machine")})
    model = sorted({f"{r.get('model')} ({r.get('dtype')}, {r.get('backend')})" for r in runs})
    threads = sorted({t for r in runs for t in r.get("threads") or ()})
    each = [f"one core and {' or '.join(map(str, threads))} thread{'s' if threads != [1] else ''} a server"] if threads else []
    return "; ".join([*m, *model, *each])


def readme_block(data: dict, rel: str = "docs/perf") -> str:
    """The README's table: every system over all runs, the chart, a link to the page (`rel`: the pages'
    folder from the README's)."""
    runs = data["runs"]
    recs = [r for run in runs for r in records(run)]
    return "\n".join([
        f"Held-out repositories ({', '.join(r['repo'] for r in runs)}), {len(recs) // max(len({r['system'] for r in recs}), 1)} "
        f"requests a system, {_machine(runs)}:", "", REPLAY_HEAD, *replay_rows(recs, SHOWN), "",
        f"![Time to suggestion, cold and warm, of each system]({rel}/replay.png)", "",
        "Cold: the cursor arrives at a place not visited yet; warm: a line typed there. How it was run, "
        f"per repository: [{rel}/replay.md]({rel}/replay.md)."])


def shown_path(path: Path) -> str:
    """`path` as the page writes it: relative to the working directory (the repository's root), never this
    machine's absolute path."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return Path(path).name


def _footer(kind: str, out: Path, readme: bool) -> list[str]:
    where, also = shown_path(out), " --readme README.md" if readme else ""
    return ["## Regenerate", "", "From the runs' results.json (the first time) or from the data file beside this page:", "",
            "```sh", f"python -m ditto_bench.pages runs/*/results.json --kind {kind} --out {where}{also}",
            f"python -m ditto_bench.pages {where}/data/{kind}.json --kind {kind} --out {where}{also}", "```", "",
            f"Older reports (the dated record, every earlier run) left the tree; git has them: "
            f"`git show {OLDER_REPORTS_AT}:docs/perf/README.md`, `git ls-tree -r {OLDER_REPORTS_AT} docs/perf`.", ""]


def _commands(runs: list[dict]) -> list[str]:
    return ["```sh", *(r["command"] for r in runs), "```"]


def replay_page(data: dict, out: Path) -> str:
    from ditto_bench.report import replay_plot

    runs = data["runs"]
    recs = [r for run in runs for r in records(run)]
    replay_plot(recs, [s for s in _order(r["system"] for r in recs) if s in SHOWN], out / "replay.png",
                "Editor replay: time to suggestion, cold and warm", dpi=80)
    lines = ["# Editor replay: Ditto against llama-server", "",
             "What you get here: how long a suggestion takes in an editor and how much of it you keep, for Ditto and "
             "for llama.cpp's own server driven as the llama.vim plugin drives it, on the same edits, pauses and "
             "requests, on repositories no tuning looked at. The method: [../benchmark.md](../benchmark.md), "
             '"Editor replay".', "",
             f"Machine: {_machine(runs)}. Ditto: ditto-lsp "
             f"{', '.join(sorted({str(r['versions'].get('ditto-lsp')) + (' at ' + r['versions']['ditto_commit'] if r['versions'].get('ditto_commit') else '') for r in runs}))}"
             f"; open rest {', '.join(sorted({str(r.get('open_rest_s') or 0) for r in runs}))} s.", "",
             "## All repositories", "", REPLAY_HEAD, *replay_rows(recs), "", "![replay.png](replay.png)", "",
             "## Per repository", "",
             "| repository @ commit | system | requests | cold p50 / p95 ms | warm p50 / p95 ms | first lines right | "
             "wrong a request | characters kept a request | prompt budget |", "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for row in replay_rows(records(run)):
            name = row.split(" | ", 1)[0].removeprefix("| ")
            system = next((s for s, n in NAMES.items() if n == name), name)
            lines.append(f"| {run['repo']} @ {run['repo_commit']} | {row.removeprefix('| ')} "
                         f"{run['context_tokens'].get(system, '–')} |")
    lines += ["", "Cold: the cursor arrives at a place not visited yet; warm: a line typed there (its first character, "
              "then a pause). First lines right: the typed text and the suggestion's first line make the true line. "
              "Wrong a request: shown, and its first line is not how the true line goes on. Characters kept a "
              "request: what a word-by-word accept keeps, nothing shown counting 0 (ditto_bench/quality.py).", "",
              "## The runs", "", *_commands(runs), ""]
    return "\n".join(lines + _footer("replay", out, True))


def nextedit_page(data: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["runs"]
    proposers = list(dict.fromkeys(p for r in runs for p in r["summary"]))
    total = {p: {k: {f: sum(r["summary"][p][k][f] for r in runs if p in r["summary"]) for f in ("n", "exact", "shown_wrong")}
                 for k in ("repeated", "all")} for p in proposers}
    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = range(len(proposers))
    ax.bar([x - 0.2 for x in xs], [total[p]["repeated"]["exact"] / max(total[p]["repeated"]["n"], 1) for p in proposers],
           0.4, label="repeated changes: exact a case")
    ax.bar([x + 0.2 for x in xs], [total[p]["all"]["shown_wrong"] / max(total[p]["all"]["n"], 1) for p in proposers],
           0.4, label="all cases: shown and wrong a case")
    ax.set_xticks(list(xs), proposers)
    ax.set_title("Next-edit suggestions, all repositories")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "nextedit.png", dpi=80)
    plt.close(fig)
    lines = ["# Next-edit suggestions", "",
             "What you get here: how often the edit that follows your change is proposed exactly, and how often a "
             "wrong one is shown, per proposer, on repositories no tuning looked at. The method and the proposers: "
             "[../nextedit.md](../nextedit.md).", "", f"Machine: {_machine(runs)}.", "",
             "| proposer | repeated changes: exact | all cases: shown and wrong | wrong per right |", "|---|---|---|---|"]
    for p in proposers:
        t = total[p]
        lines.append(f"| {p}{' (default)' if all(r.get('default') == p for r in runs) else ''} | "
                     f"{t['repeated']['exact']}/{t['repeated']['n']} | {t['all']['shown_wrong']}/{t['all']['n']} | "
                     f"{_num(t['all']['shown_wrong'] / t['all']['exact'] if t['all']['exact'] else None, 2)} |")
    lines += ["", "Repeated changes: cases where the commit made the user's change again elsewhere; exact: the file "
              "with the proposal applied is the commit's. Wrong per right: shown and wrong over exact, all cases.", "",
              "![nextedit.png](nextedit.png)", "", "## Per repository", "",
              "| repository @ commit | proposer | repeated: exact | all: shown wrong | time p50 / p95 ms |", "|---|---|---|---|---|"]
    for r in runs:
        for p, v in r["summary"].items():
            lines.append(f"| {r['repo']} @ {r['repo_commit']} | {p} | {v['repeated']['exact']}/{v['repeated']['n']} | "
                         f"{v['all']['shown_wrong']}/{v['all']['n']} | {_t(v['all']['tts_ms_p50'])} / {_t(v['all']['tts_ms_p95'])} |")
    lines += ["", "## The runs", "", *_commands(runs), ""]
    return "\n".join(lines + _footer("nextedit", out, False))


def gpu_page(paths: list[Path], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ditto_bench.gpucheck_report import markdown as check_markdown
    from ditto_bench.projection import gpu_costs, markdown as projection_markdown, project

    res = read_json(paths[0])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for k, costs in res.get("pass_costs", {}).items():
        ns = sorted(int(n) for n in costs)
        ax.plot(ns, [costs[str(n)]["best_ms"] for n in ns], marker="o", ms=3, label=k)
    ax.set_yscale("log")
    ax.set_xlabel("new tokens in one pass (n)")
    ax.set_ylabel("ms per pass, T(n)")
    ax.set_title(f"Pass cost on {res['environment']['device_name']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gpu.png", dpi=80)
    plt.close(fig)
    check = check_markdown(res).split("\n", 1)[1].replace("\n## ", "\n### ")
    lines = ["# The GPU check", "",
             "What you get here: what a pass costs on a GPU by how many tokens it verifies, whether verify rows equal "
             "plain decoding, and tokens per second, measured by `python -m ditto_bench.gpucheck` with random weights of "
             "the default model's architecture (what the design rests on: [../gpu.md](../gpu.md)).", "",
             "![gpu.png](gpu.png)", "", check.strip(), ""]
    rel = [shown_path(p) for p in paths]
    if len(paths) > 1:
        p = project([t for path in paths[1:] for t in read_json(path)["tasks"]], gpu_costs(paths[0]))
        lines += ["## The default drafter's passes priced at these costs", "",
                  projection_markdown(p).replace(str(paths[0]), Path(paths[0]).name), "",
                  f"`python -m ditto_bench.projection {' '.join(rel[1:])} --gpu {rel[0]}`", ""]
    lines += ["## Regenerate", "", "```sh", f"python -m ditto_bench.pages {' '.join(rel)} --kind gpu --out {shown_path(out)}",
              "```", "", f"Older reports left the tree; git has them: `git ls-tree -r {OLDER_REPORTS_AT} docs/perf`.", ""]
    return "\n".join(lines)


def update_readme(readme: Path, kind: str, block: str) -> None:
    """Replace what stands between the README's markers for `kind`."""
    text = readme.read_text(encoding="utf-8")
    start, end = MARK.format(kind=kind, end="start"), MARK.format(kind=kind, end="end")
    pat = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pat.search(text):
        raise ValueError(f"{readme}: no {start} ... {end}")
    readme.write_text(pat.sub(lambda _: f"{start}\n{block}\n{end}", text), encoding="utf-8")


def generate(paths: list[Path], kind: str, out: Path, readme: Path | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    if kind == "gpu":
        (out / "gpu.md").write_text(gpu_page(paths, out), encoding="utf-8")
        return [out / "gpu.md", out / "gpu.png"]
    data = load(paths, kind)
    if not data["runs"]:
        raise ValueError("no runs")
    (out / "data").mkdir(exist_ok=True)
    write_json(out / "data" / f"{kind}.json", data)
    page = replay_page(data, out) if kind == "replay" else nextedit_page(data, out)
    (out / f"{kind}.md").write_text(page, encoding="utf-8")
    written = [out / f"{kind}.md", out / f"{kind}.png", out / "data" / f"{kind}.json"]
    if readme is not None and kind == "replay":
        rel = Path(os.path.relpath(out.resolve(), readme.resolve().parent)).as_posix()
        update_readme(readme, kind, readme_block(data, rel))
        written.append(readme)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ditto_bench.pages", description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="results.json of runs, or the page's data file (gpu: gpucheck.json, "
                                                      "then compact passes)")
    ap.add_argument("--kind", required=True, choices=["replay", "nextedit", "gpu"])
    ap.add_argument("--out", type=Path, default=Path("docs/perf"), help="the pages' folder (default docs/perf)")
    ap.add_argument("--readme", type=Path, default=None, help="replay: also rewrite this README's table between its markers")
    args = ap.parse_args(argv)
    try:
        for path in generate(args.runs, args.kind, args.out, args.readme):
            print(f"wrote {path}", file=sys.stderr)
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"pages: {err}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())

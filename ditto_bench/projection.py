"""Tokens/s on a GPU's measured pass costs, projected from a CPU benchmark's passes (a projection).

Greedy verification is exact, so the tokens a pass buys are a property of the drafts and the
model's greedy output: the same on a CPU as on a GPU. What a GPU changes is the price of a pass.
The GPU check (ditto_bench/gpucheck.py; docs/gpu.md) measured T(n) on an H200 for the default
model's architecture: through the fixed shape of R rows, with CUDA graphs, every pass costs
T(R) whatever its draft. This module prices a `ditto-lsp bench` run's passes that way:

- a drafting system runs the fixed shape of R = 9 rows (today's GPU default) when none of its
  passes verified more than 8 draft tokens, else of 16 rows (trees of up to 15 nodes); each of
  its passes costs T(R) plus its drafter's time per pass, as measured in the run on the CPU
  it ran on (`draft_ms`; a CPU slower than the GPU machine's host overstates it) plus
  TREE_MS for each tree pass's bookkeeping (the layout copied to the GPU, the kept path's KV
  moved: a few small kernels);
- drafting off is one token per pass: through the fixed shape of 9 rows (`off`, the GPU
  check's drafting off) and, the fastest plain decoding there, a one-row CUDA graph
  (`off-1row`), which is not exact for speculation in bf16 but is what a user without
  drafting could run.

T(n) is the GPU check's `graphed_static` curve (best of 10, n = 1..16; equal to its fixed
shape at 9 rows within 0.5%). The result is labelled a projection everywhere it is written.

Command: `python -m ditto_bench.projection RESULTS.json [MORE.json ...] [--gpu docs/perf/data/gpucheck.json]`
(several runs are priced as one: their passes pooled per system). Next-edit runs (`--mode next-edit`, with
the model's proposers) are priced by `project_rewrites`: the model rewrites' passes, the region the draft.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_GPU = Path(__file__).resolve().parents[1] / "docs" / "perf" / "data" / "gpucheck.json"
TREE_MS = 0.05  # per tree pass, beyond the pass (docs/gpu.md, "Trees": layout and compaction)
ROWS = (9, 16)


def gpu_costs(path: Path) -> dict:
    """{"device", "source", "costs_ms": {n: ms}} from a gpucheck.json (graphed static cache), or
    from a plain JSON {n: ms}."""
    data = json.loads(Path(path).read_text())
    if "pass_costs" in data:
        costs = data["pass_costs"].get("graphed_static") or data["pass_costs"].get("fixed_shape")
        if not costs:
            raise ValueError(f"{path}: no graphed_static or fixed_shape pass costs")
        env = data.get("environment", {})
        return {"device": env.get("device_name"), "source": str(path), "curve": "graphed_static",
                "costs_ms": {int(n): float(v["best_ms"]) for n, v in costs.items()}}
    costs = {int(n): float(v) for n, v in data.items()}
    if 1 not in costs:
        raise ValueError(f"{path}: pass costs need T(1)")
    return {"device": None, "source": str(path), "curve": "given", "costs_ms": costs}


def cost(costs: dict[int, float], n: int) -> float:
    """T(n): the measured point, or the next larger one measured."""
    if n in costs:
        return costs[n]
    larger = [m for m in costs if m > n]
    return costs[min(larger)] if larger else costs[max(costs)]


def fixed_costs(gpu: dict, rows: int) -> dict[int, float]:
    """Pass costs of the fixed shape of `rows` rows: every pass over 1..rows tokens costs T(rows)."""
    t = cost(gpu["costs_ms"], rows)
    return {1: t, rows: t}


def project(records: list[dict], gpu: dict) -> dict:
    """Per Ditto system of a bench run (records with rounds): its passes and tokens priced at the
    GPU's costs, and tokens/s against drafting off (module docstring)."""
    costs = gpu["costs_ms"]
    out: dict = {"projection": True, "device": gpu.get("device"), "source": gpu.get("source"),
                 "off_ms_per_token": {"off": cost(costs, 9), "off-1row": cost(costs, 1)}, "systems": {}}
    systems = list(dict.fromkeys(r["system"] for r in records if r.get("rounds") is not None))
    for s in systems:
        rs = [r for r in records if r["system"] == s and r.get("rounds") is not None and not r.get("error")]
        rounds = [x for r in rs for x in r["rounds"]]
        passes = len(rounds)
        tokens = sum(r["generated"] for r in rs)
        if not passes:
            continue
        widest = max(1 + (x[5] if len(x) > 5 and x[5] else x[2]) for x in rounds)
        rows = next((R for R in ROWS if widest <= R), widest)
        trees = sum(1 for x in rounds if len(x) > 5 and x[5])
        draft_ms = sum(r.get("draft_ms") or 0.0 for r in rs)
        ms = passes * cost(costs, rows) + draft_ms + trees * TREE_MS if s != "off" else tokens * cost(costs, 9)
        tps = tokens / (ms / 1000)
        out["systems"][s] = {"tokens": tokens, "passes": passes, "tokens_per_pass": round(tokens / passes, 3),
                             "no_draft_passes": sum(1 for x in rounds if not x[2]),
                             "rows": rows, "tree_passes": trees, "draft_ms_per_pass": round(draft_ms / passes, 3),
                             "ms_per_pass": round(ms / passes, 3), "tokens_per_s": round(tps, 1),
                             "vs_off": round(tps * cost(costs, 9) / 1000, 2),
                             "vs_off_1row": round(tps * cost(costs, 1) / 1000, 2)}
    return out


def project_rewrites(records: list[dict], gpu: dict) -> dict:
    """Per next-edit proposer that ran the model (`ditto-lsp bench --mode next-edit` records with `model`
    statistics): its rewrites' decoding priced at the GPU's costs. A rewrite drafts at most 8 tokens of the
    region a pass (lsp_server/nextedit/rewrite.py), so every pass runs the fixed shape of 9 rows and costs
    T(9); plain decoding is a token a pass, at T(9) through the same shape or T(1) as a one-row graph. The
    prompt's prefill is left out (one pass over the prompt, the same with or without the draft)."""
    costs = gpu["costs_ms"]
    t9, t1 = cost(costs, 9), cost(costs, 1)
    out: dict = {"projection": True, "device": gpu.get("device"), "source": gpu.get("source"),
                 "off_ms_per_token": {"off": t9, "off-1row": t1}, "proposers": {}}
    for s in dict.fromkeys(r["system"] for r in records if r.get("model")):
        ms = [r["model"] for r in records if r["system"] == s and r.get("model")]
        tokens, passes = sum(m["generated"] for m in ms), sum(m["passes"] for m in ms)
        if not passes:
            continue
        rewrites = sum(m.get("rewrites", 1) for m in ms)
        out["proposers"][s] = {"requests": len(ms), "rewrites": rewrites, "tokens": tokens, "passes": passes,
                               "tokens_per_pass": round(tokens / passes, 3), "rows": 9,
                               "ms_per_rewrite": round(passes * t9 / rewrites, 2),
                               "ms_per_rewrite_off": round(tokens * t9 / rewrites, 2),
                               "ms_per_rewrite_off_1row": round(tokens * t1 / rewrites, 2),
                               "vs_off": round(tokens / passes, 2), "vs_off_1row": round(tokens * t1 / (passes * t9), 2)}
    return out


def rewrites_markdown(p: dict) -> str:
    head = ("| proposer | requests | rewrites | tokens / pass | decoding ms / rewrite | drafting off (9 rows) | "
            "drafting off (1-row graph) | × off | × off 1-row |")
    rows = [f"**A projection, not a measurement**: the rewrites' passes priced at the pass costs measured on "
            f"{p.get('device') or 'a GPU'} ({p.get('source')}; ditto_bench/projection.py `project_rewrites`), "
            "prefill left out.", "", head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in p["proposers"].items():
        rows.append(f"| {s} | {v['requests']} | {v['rewrites']} | {v['tokens_per_pass']} | {v['ms_per_rewrite']} | "
                    f"{v['ms_per_rewrite_off']} | {v['ms_per_rewrite_off_1row']} | {v['vs_off']} | {v['vs_off_1row']} |")
    return "\n".join(rows)


def table(p: dict) -> str:
    head = ("| system | tokens / pass | fixed shape rows | tree passes | drafting ms / pass (CPU) | ms / pass | "
            "tokens/s | × drafting off (9 rows) | × drafting off (1-row graph) |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for s, v in p["systems"].items():
        rows.append(f"| {s} | {v['tokens_per_pass']} | {v['rows']} | {v['tree_passes']} | {v['draft_ms_per_pass']} | "
                    f"{v['ms_per_pass']} | {v['tokens_per_s']} | {v['vs_off']} | {v['vs_off_1row']} |")
    return "\n".join(rows)


def markdown(p: dict) -> str:
    off = p["off_ms_per_token"]
    return "\n".join([
        f"**A projection, not a measurement**: this run's passes priced at the pass costs measured on "
        f"{p.get('device') or 'a GPU'} ({p.get('source')}; ditto_bench/projection.py). Drafting off costs "
        f"{off['off']} ms a token through the fixed shape of 9 rows, {off['off-1row']} ms as a one-row graph.", "",
        table(p)])


def compact(results: dict, without: tuple[str, ...] = ()) -> dict:
    """What `project` needs from a results.json: meta and the Ditto systems' passes and rounds
    (`without`: systems left out, e.g. `off`, whose passes are one token each, to keep a copy small)."""
    keep = ("task", "system", "generated", "target_passes", "rounds", "draft_ms", "identical")
    meta = {k: v for k, v in (results.get("meta") or {}).items() if not isinstance(v, (list, dict))}
    if without:
        meta["left_out"] = ",".join(without)
    tasks = [{k: r.get(k) for k in keep} for r in results.get("tasks", [])
             if r.get("rounds") is not None and r.get("system") not in without]
    for t in tasks:  # a pass's CPU time to the whole ms (`project` prices passes at the GPU's costs, not these)
        t["rounds"] = [[*x[:4], round(x[4]), *x[5:]] if len(x) > 4 and x[4] is not None else x for x in t["rounds"]]
    return {"about": "passes recorded by a CPU run of `ditto-lsp bench` (ditto_bench/projection.py prices them)",
            "meta": meta, "tasks": tasks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ditto_bench.projection", description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+",
                    help="results.json of a `ditto-lsp bench` run (or its compact copy); several are priced as one")
    ap.add_argument("--gpu", type=Path, default=DEFAULT_GPU, help=f"gpucheck.json (default {DEFAULT_GPU.name} of docs/perf/data)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--save-compact", type=Path, default=None, metavar="PATH",
                    help="write the compact copy of RESULTS (what the GPU check's tree projection reads) and stop")
    ap.add_argument("--without", default="", metavar="SYSTEMS",
                    help="with --save-compact: comma-separated systems to leave out (e.g. off)")
    args = ap.parse_args(argv)
    try:
        runs = [json.loads(path.read_text()) for path in args.results]
        if args.save_compact:
            if len(runs) != 1:
                raise ValueError("--save-compact takes one RESULTS file")
            without = tuple(s for s in args.without.split(",") if s)
            args.save_compact.write_text(json.dumps(compact(runs[0], without), separators=(",", ":")) + "\n")
            return 0
        if all("records" in run for run in runs):  # next-edit runs: the model rewrites' passes
            p = project_rewrites([r for run in runs for r in run["records"]], gpu_costs(args.gpu))
            print(json.dumps(p, indent=1) if args.json else rewrites_markdown(p))
            return 0
        p = project([r for run in runs for r in run["tasks"]], gpu_costs(args.gpu))
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"projection: {err}") from None
    print(json.dumps(p, indent=1) if args.json else markdown(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())

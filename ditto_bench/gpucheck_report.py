"""What the GPU check makes of its numbers (gpucheck.py measures them, gpucheck_phases.py).

The replay of a CPU benchmark's recorded n-gram rounds priced at this device's pass cost
(`replay_record`, `project`, `compact`: a projection, labelled so), the goals (`goals`), the rule
that makes the fixed shape the CUDA default (`decision`, docs/gpu.md), and gpucheck.json and
gpucheck.md (`markdown`, `write`, rewritten after every phase).

Left out on purpose: measuring (gpucheck_phases.py) and the command (gpucheck.py).
"""

from __future__ import annotations

import json
from pathlib import Path


def replay_record(data: dict, rows: int) -> dict:
    """The rounds of the recorded n-gram system from a benchmark's results.json (or its compact
    copy): per system, passes, tokens and the histogram of verified draft lengths, rebuilt from
    target_passes and drafted_at (drafted_at[i] = rounds that verified more than i drafts)."""
    records = data.get("tasks")
    if not isinstance(records, list):
        raise ValueError("no 'tasks' list: is this a results.json of `ditto-lsp bench` (completion mode)?")
    names = {r.get("system") for r in records if isinstance(r, dict)}
    fixed = sorted((int(s[7:]) for s in names if isinstance(s, str) and s.startswith("ngram-k") and s[7:].isdigit()),
                   reverse=True)
    fitting = [k for k in fixed if k <= rows - 1]
    system = f"ngram-k{fitting[0]}" if fitting else ("ngram" if "ngram" in names else None)
    if system is None:
        raise ValueError(f"no n-gram system among {sorted(n for n in names if n)}")
    hist: dict[int, int] = {}
    total = {"tasks": 0, "passes": 0, "generated": 0, "drafted": 0, "accepted": 0}
    for r in records:
        if r.get("system") != system:
            continue
        passes = int(r["target_passes"])
        at = [int(x) for x in r.get("drafted_at") or []]
        counts = [passes - (at[0] if at else 0)] + [at[v - 1] - (at[v] if v < len(at) else 0) for v in range(1, len(at) + 1)]
        for v, c in enumerate(counts):
            if c:
                hist[v] = hist.get(v, 0) + c
        total["tasks"] += 1
        total["passes"] += passes
        total["generated"] += int(r["generated"])
        total["drafted"] += int(r.get("drafted") or 0)
        total["accepted"] += int(r.get("accepted") or 0)
    meta = data.get("meta") or {}
    return {"system": system, **total, "verified_hist": {str(v): c for v, c in sorted(hist.items())},
            "tokens_per_pass": round(total["generated"] / total["passes"], 4) if total["passes"] else None,
            "recorded_on": {k: meta.get(k) for k in ("model_spec", "device", "dtype", "command") if k in meta}}


def project(record: dict, pass_ms: float, rows: int) -> dict:
    """tokens/s of the recorded rounds if each cost `pass_ms` (the measured ms of one n-gram
    round through the fixed shape, drafting and acceptance included: with every pass padded to
    `rows`, a round costs the same whatever its draft length)."""
    longest = max((int(v) for v in record["verified_hist"]), default=0)
    ms = record["passes"] * pass_ms
    return {"projection": True, "tokens": record["generated"], "passes": record["passes"], "ms_per_pass": pass_ms,
            "tokens_per_s": round(record["generated"] / (ms / 1000), 2) if ms > 0 else None,
            "fits_fixed_shape": longest <= rows - 1}


def compact(data: dict) -> dict:
    """What the replay needs from a results.json: meta and the n-gram systems' per-task counts."""
    keep = ("task", "system", "generated", "target_passes", "drafted", "accepted", "drafted_at", "accepted_at",
            "steps", "identical")
    meta = {k: v for k, v in (data.get("meta") or {}).items() if not isinstance(v, (list, dict)) or k == "versions"}
    tasks = [{k: r.get(k) for k in keep} for r in data.get("tasks", [])
             if isinstance(r.get("system"), str) and (r["system"] == "off" or r["system"].startswith("ngram"))]
    return {"about": "n-gram rounds recorded by a CPU run of `ditto-lsp bench` (ditto_bench/gpucheck.py replays them)",
            "meta": meta, "tasks": tasks}


def goals(res: dict) -> dict:
    sysm = res.get("engine", {}).get("systems", {})
    tps = {k: v.get("tokens_per_s") for k, v in sysm.items()}
    out = {}
    if tps.get("off") and tps.get("hf-greedy"):
        r = tps["off"] / tps["hf-greedy"]
        out["off_vs_hf_greedy"] = {"value": round(r, 2), "target": 3.0, "met": r >= 3.0}
    if tps.get("oracle") and tps.get("off"):
        r = tps["oracle"] / tps["off"]
        out["oracle_vs_off"] = {"value": round(r, 2), "target": 4.0, "met": r >= 4.0}
    inv = res.get("invariance", {}).get("fixed")
    ex = res.get("engine", {}).get("exactness")
    if inv and ex:
        ok = ex["mismatches"] == 0 and inv["argmax_agree"] == inv["positions"] > 0
        out["speculative_equals_plain"] = {"value": f"{ex['positions'] - ex['mismatches']}/{ex['positions']} engine "
                                                    f"positions over {ex['runs']} runs; argmax {inv['argmax_agree']}/"
                                                    f"{inv['positions']} verify rows",
                                           "target": "all", "met": ok}
    return out


def decision(res: dict) -> dict:
    """The rule of docs/gpu.md: the fixed shape becomes the CUDA default when, in bf16 on CUDA,
    every verify row is bit-identical to plain decoding, the engine's speculative output equals
    plain on every position, and drafting off through the fixed shape is no slower than today."""
    env, inv = res.get("environment", {}), res.get("invariance", {}).get("fixed")
    ex = res.get("engine", {}).get("exactness")
    sysm = res.get("engine", {}).get("systems", {})
    reasons = []
    if not (env.get("device", "").startswith("cuda") and env.get("dtype") == "bfloat16"):
        reasons.append("not measured in bf16 on CUDA")
    if not inv or inv["bitwise_rows"] != inv["positions"] or not inv["positions"]:
        reasons.append("verify rows not all bit-identical to plain decoding")
    if not ex or ex["mismatches"]:
        reasons.append("speculative output differed from plain")
    off, eager = (sysm.get("off") or {}).get("tokens_per_s"), (sysm.get("off-eager") or {}).get("tokens_per_s")
    if not off or not eager or off < eager:
        reasons.append("fixed shape slower than today's path")
    return {"fixed_shape_default_on_cuda": not reasons, "because": reasons or ["every condition holds"]}


def markdown(res: dict) -> str:
    env = res["environment"]
    lines = [f"# Ditto GPU check ({env['device_name']}, {env['dtype']}, {env['model']})", "",
             f"- torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}; "
             f"fixed shape: {env['rows']} rows, static cache {env['static_tokens']} tokens, CUDA graphs "
             f"{env['cuda_graphs']}; wall {res.get('wall_s', '?')} s"]
    if res.get("notes"):
        lines += [f"- note: {n}" for n in res["notes"]]
    costs = res.get("pass_costs")
    if costs:
        kinds = [k for k in ("eager_dynamic", "eager_static", "graphed_static", "fixed_shape") if k in costs]
        lines += ["", "## Pass cost T(n), ms (best of reps; median in parentheses)", "",
                  "| n | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
        for n in sorted({int(n) for k in kinds for n in costs[k]}):
            cells = []
            for k in kinds:
                c = costs[k].get(str(n))
                cells.append(f"{c['best_ms']:.3f} ({c['median_ms']:.3f})" if c else "–")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    inv = res.get("invariance")
    if inv:
        lines += ["", "## Batch invariance: verify rows against plain decoding", "",
                  "| path | positions | max abs Δlogit | mean abs Δlogit | argmax agree | bit-identical rows | min top-2 margin |",
                  "|---|---|---|---|---|---|---|"]
        for k, v in inv.items():
            if not isinstance(v, dict) or "positions" not in v:
                continue
            extra = " (cut short)" if v.get("cut_short") else ""
            margin = v.get("min_top2_margin")
            lines.append(f"| {k}{extra} | {v['positions']} | {v['max_abs_diff']:.3g} | {v.get('mean_abs_diff', 0):.3g} | "
                         f"{v['argmax_agree']}/{v['positions']} | {v.get('bitwise_rows', '–')} | "
                         f"{'–' if margin is None else f'{margin:.3g}'} |")
    eng = res.get("engine")
    if eng:
        lines += ["", "## Tokens per second (batch 1, greedy)", "",
                  "| system | tokens | decode tokens/s | end-to-end tokens/s | ms per pass | tokens per pass |",
                  "|---|---|---|---|---|---|"]
        for s, v in eng["systems"].items():
            tpp = round(v["tokens"] / v["passes"], 2) if v["passes"] else "–"
            lines.append(f"| {s} | {v['tokens']} | {v['tokens_per_s']} | {v['end_to_end_tokens_per_s']} | "
                         f"{v['ms_per_pass']} | {tpp} |")
        rp = res.get("replay")
        if rp and rp.get("projection"):
            p = rp["projection"]
            lines.append(f"| ngram-replayed (**projection**) | {p['tokens']} | {p['tokens_per_s']} | – | "
                         f"{p['ms_per_pass']} | {rp['record']['tokens_per_pass']} |")
        ex = eng["exactness"]
        lines += ["", f"Speculative == plain: {ex['positions'] - ex['mismatches']}/{ex['positions']} positions, "
                      f"{ex['mismatches']} mismatching runs of {ex['runs']}"
                      + (f" (first: {ex['first_mismatch']})" if ex["first_mismatch"] else "") + "."]
        lines += ["", "off = drafting off through the fixed shape; off-eager = today's path (dynamic cache, "
                      "eager, unpadded); hf-greedy = transformers generate greedy; oracle = drafts of the "
                      "model's own continuation; ngram = the n-gram drafter on this random model's output "
                      "(its acceptance means nothing; its ms per pass prices the replay)."]
    rp = res.get("replay")
    if rp:
        lines += ["", "## Replayed n-gram acceptance (a projection)", ""]
        if rp.get("error"):
            lines.append(f"Not replayed: {rp['error']}")
        else:
            r = rp["record"]
            lines.append(f"Recorded by a CPU benchmark ({rp['source']}), system `{r['system']}`: {r['tasks']} tasks, "
                         f"{r['generated']} tokens in {r['passes']} passes ({r['tokens_per_pass']} tokens per pass), "
                         f"verified-draft-length histogram {r['verified_hist']}. Priced at this device's measured "
                         f"ms per n-gram round; every pass has the fixed shape, so its cost does not depend on the "
                         f"draft length. It is a projection: the acceptance is the CPU run's, on real code.")
    g = res.get("goals")
    if g:
        lines += ["", "## Goals", "", "| goal | value | target | met |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['value']} | {v['target']} | {'yes' if v['met'] else 'no'} |" for k, v in g.items()]
    d = res.get("decision")
    if d:
        lines += ["", f"Fixed shape as the CUDA default: **{'yes' if d['fixed_shape_default_on_cuda'] else 'no'}** "
                      f"({'; '.join(d['because'])})."]
    from ditto_bench.gputree import markdown as trees_markdown

    lines += trees_markdown(res)
    return "\n".join(lines) + "\n"


def write(res: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("gpucheck.json", json.dumps(res, indent=1)), ("gpucheck.md", markdown(res))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)

"""The GPU check: pass costs, exactness and tokens/s on the default architecture, in one command.

`python -m ditto_bench.gpucheck` (scripts/gpu-check.sh runs it on the device machine; docs/gpu.md)
builds Qwen2.5-Coder-0.5B's architecture with random weights (`--tiny`: a 2-layer model of the
same family, for CI) and measures:

- T(n), n = 1..16: eager on the dynamic cache (today's path), eager on the static cache, and
  replayed from CUDA graphs over the static cache (CUDA only);
- batch invariance: every row of a verify pass against the plain pass at the same position
  (max |Δlogit|, argmax agreement, bit-identical rows), through the fixed shape (padded rows,
  static cache, graphs on CUDA) and through today's unpadded dynamic path;
- the engine's tokens/s: drafting off (today's path and the fixed shape), oracle speculation,
  n-gram speculation, and transformers' `generate` greedy at batch 1; speculative output
  against plain output on every position (oracle, random and half-right drafts);
- replayed n-gram: the passes and tokens a CPU benchmark recorded (results.json, or the
  compact copy in docs/perf/acceptance-cpu.json) priced at this device's measured cost of an
  n-gram round: a projection, and labelled so.

Writes gpucheck.json and gpucheck.md to --out (default $OUT); both are rewritten after every
phase, so a run cut short still leaves what it measured. Imports torch, transformers (through
lsp_server/backends/torch/model.py), the engine and the drafters only: nothing the device machine
lacks (no pygls, lsprotocol or gguf).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch

from ditto_bench.hf import QWEN25_CODER_05B, FirstTokenClock, hf_generate, random_model
from drafters import NGramDrafter
from drafters.base import NoOwnSources, Proposal
from lsp_server.backends.torch.loading import choose_device, choose_dtype
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.types import DecodeOptions

TINY_ARCH = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=8192, rope_theta=10000.0, tie_word_embeddings=True,
                 use_sliding_window=False)
DEFAULT_REPLAY = Path(__file__).resolve().parents[1] / "docs" / "perf" / "acceptance-cpu.json"


@dataclass
class Plan:
    """How much to measure (the GPU plan fits the 8-minute budget; the CPU plan is for CI)."""

    context: int = 512  # prompt tokens
    sequences: int = 4  # invariance: sequences per path
    positions: int = 512  # invariance: positions per sequence
    prompts: int = 3  # tokens/s: prompts per system
    new_tokens: int = 128  # tokens/s: tokens per completion
    reps: int = 10  # T(n): timings per n (best and median kept)
    max_n: int = 16  # T(n) for n = 1..max_n
    rows: int = 9  # the fixed pass shape (k_max + 1)
    tree_rows: int = 16  # trees: the fixed shape they run through (15 nodes; gputree.py)
    trees: int = 8  # trees: random trees per sequence against plain decoding
    budget_s: float = 420.0  # phases past this are cut short (recorded as such)


GPU_PLAN = Plan()
CPU_PLAN = Plan(context=64, sequences=2, positions=64, prompts=2, new_tokens=32, reps=2, budget_s=240.0, trees=3)
TREES_REPLAY = Path(__file__).resolve().parents[1] / "docs" / "perf" / "acceptance-trees.json"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def random_ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


# ------------------------------------------------------------------------------------
# Phases
# ------------------------------------------------------------------------------------


def pass_costs(lm, context: Sequence[int], probe: Sequence[int], max_n: int, reps: int) -> dict:
    """T(n) in ms for n = 1..max_n over `context`: best and median of `reps`, interleaved."""
    dev = lm.device
    cache = lm.new_cache()
    ns = list(range(1, max_n + 1))
    samples: dict[int, list[float]] = {n: [] for n in ns}
    try:
        lm.forward(list(context), cache, last=1)
        for n in ns:  # warm-up (and graph capture) per shape
            lm.forward(probe[:n], cache, last=n)
            lm.crop(cache, len(context))
        for _ in range(reps):
            for n in ns:
                sync(dev)
                t = time.perf_counter()
                lm.forward(probe[:n], cache, last=n)
                sync(dev)
                samples[n].append((time.perf_counter() - t) * 1000)
                lm.crop(cache, len(context))
    finally:
        lm.release(cache)
    return {str(n): {"best_ms": round(min(v), 4), "median_ms": round(statistics.median(v), 4)} for n, v in samples.items()}


def invariance(lm, prompts: list[list[int]], positions: int, rows: int, deadline: float) -> dict:
    """Plain greedy decoding (one-token passes) against verify passes over the same tokens.

    For each prompt: decode `positions` tokens plainly, keeping each step's logits; then, from
    the same prefill, feed [last] + the next rows - 1 of those tokens per pass (a fully right
    draft) and compare every row with the plain logits of its position.
    """
    out = {"positions": 0, "passes": 0, "max_abs_diff": 0.0, "mean_abs_diff": 0.0, "argmax_agree": 0,
           "bitwise_rows": 0, "min_top2_margin": None, "sequences": 0, "cut_short": False}
    total_abs = 0.0
    for prompt in prompts:
        if time.monotonic() > deadline:
            out["cut_short"] = True
            break
        cache = lm.new_cache()
        lm.forward(prompt[:-1], cache, last=1)
        tok, toks, plain = prompt[-1], [], []
        for _ in range(positions):
            row = lm.forward([tok], cache, last=1)[0]
            plain.append(row)
            tok = int(row.argmax())
            toks.append(tok)
        lm.release(cache)
        ref = torch.stack(plain)
        top2 = ref.topk(2, dim=-1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
        out["min_top2_margin"] = margin if out["min_top2_margin"] is None else min(out["min_top2_margin"], margin)
        cache = lm.new_cache()
        lm.forward(prompt[:-1], cache, last=1)
        inputs = [prompt[-1], *toks]
        j = 0
        while j < positions:
            chunk = inputs[j : min(j + rows, positions)]
            got = lm.forward(chunk, cache, last=len(chunk))
            want = ref[j : j + len(chunk)]
            diff = (got - want).abs()
            out["max_abs_diff"] = max(out["max_abs_diff"], float(diff.max()))
            total_abs += float(diff.mean(dim=-1).sum())
            out["argmax_agree"] += int((got.argmax(-1) == want.argmax(-1)).sum())
            out["bitwise_rows"] += int((diff.amax(-1) == 0).sum())
            out["passes"] += 1
            j += len(chunk)
        lm.release(cache)
        out["positions"] += positions
        out["sequences"] += 1
    if out["positions"]:
        out["mean_abs_diff"] = total_abs / out["positions"]
        out["argmax_agreement"] = out["argmax_agree"] / out["positions"]
    return out


def graph_vs_eager(graphed, eager, prompt: list[int], positions: int) -> dict:
    """The same padded passes replayed from CUDA graphs and run eagerly: do the bits change?"""
    rows = []
    for lm in (graphed, eager):
        cache = lm.new_cache()
        lm.forward(prompt[:-1], cache, last=1)
        tok, logits = prompt[-1], []
        for i in range(positions):
            row = lm.forward([tok], cache, last=1)[0]
            logits.append(row)
            tok = int(rows[0][i].argmax()) if rows else int(row.argmax())  # both follow the graphed tokens
        lm.release(cache)
        rows.append(torch.stack(logits))
    diff = (rows[0] - rows[1]).abs()
    return {"positions": positions, "max_abs_diff": float(diff.max()),
            "bitwise_rows": int((diff.amax(-1) == 0).sum()),
            "argmax_agree": int((rows[0].argmax(-1) == rows[1].argmax(-1)).sum())}


class Oracle(NoOwnSources):
    """Proposes the reference continuation (the benchmark's oracle, ditto_bench/systems.py)."""

    name = "oracle"

    def __init__(self, prompt_len: int, target: list[int], corrupt=None):
        self.prompt_len, self.target, self.corrupt = prompt_len, target, corrupt

    def propose(self, context, k):
        done = list(context[self.prompt_len :])
        if k <= 0 or done != self.target[: len(done)]:
            return Proposal([], source=self.name, match_len=0)
        draft = self.target[len(done) : len(done) + k]
        if self.corrupt is not None:
            draft = self.corrupt(draft)
        return Proposal(draft, source=self.name, match_len=len(done), paid=True)


def engine_runs(base, fixed, prompts: list[list[int]], new_tokens: int, rows: int, seed: int) -> dict:
    """tokens/s per system (decode only, and end to end) and speculative == plain checks."""
    rng = random.Random(seed)
    eager, fast = Engine(base), Engine(fixed)
    vocab = base.vocab_size

    def opts(k: int) -> DecodeOptions:
        return DecodeOptions(max_new_tokens=new_tokens, draft_max=k, adaptive=False)

    # Warm-up: kernels, allocator and (on CUDA) the graphs of the fixed shape.
    warm = prompts[0]
    hf_generate(base, warm, 2)
    eager.generate(warm, options=replace(opts(0), max_new_tokens=2))
    fast.generate(warm, options=replace(opts(0), max_new_tokens=2))
    fast.generate(warm, drafter=NGramDrafter(), options=replace(opts(rows - 1), max_new_tokens=2))

    systems = ("hf-greedy", "off-eager", "off", "oracle", "ngram")
    acc = {s: {"tokens": 0, "decode_ms": 0.0, "wall_ms": 0.0, "passes": 0} for s in systems}
    exact = {"positions": 0, "mismatches": 0, "runs": 0, "first_mismatch": None}
    hf_same = 0

    def add(system, tokens, decode_ms, wall_ms, passes):
        a = acc[system]
        a["tokens"] += tokens
        a["decode_ms"] += decode_ms
        a["wall_ms"] += wall_ms
        a["passes"] += passes

    def check(name, got, ref, prompt_no):
        exact["runs"] += 1
        exact["positions"] += len(ref)
        bad = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
        if bad is None and len(got) != len(ref):
            bad = min(len(got), len(ref))
        if bad is not None:
            exact["mismatches"] += 1
            if exact["first_mismatch"] is None:
                exact["first_mismatch"] = {"system": name, "prompt": prompt_no, "position": bad}

    for i, prompt in enumerate(prompts):
        clock = FirstTokenClock()
        t0 = time.perf_counter()
        new, passes = hf_generate(base, prompt, new_tokens, streamer=clock)
        sync(base.device)
        end = time.perf_counter()
        first = clock.first or end
        add("hf-greedy", len(new) - 1, (end - first) * 1000, (end - t0) * 1000, passes - 1)

        off_e = eager.generate(prompt, options=opts(0))
        add("off-eager", len(off_e.tokens), off_e.stats.decode_ms, off_e.stats.wall_ms, off_e.stats.target_passes)
        hf_same += int(new == off_e.tokens)
        off = fast.generate(prompt, options=opts(0))
        add("off", len(off.tokens), off.stats.decode_ms, off.stats.wall_ms, off.stats.target_passes)

        oracle = fast.generate(prompt, drafter=Oracle(len(prompt), off.tokens), options=opts(rows - 1))
        add("oracle", len(oracle.tokens), oracle.stats.decode_ms, oracle.stats.wall_ms, oracle.stats.target_passes)
        check("oracle", oracle.tokens, off.tokens, i)
        ngram = fast.generate(prompt, drafter=NGramDrafter(), options=opts(rows - 1))
        add("ngram", len(ngram.tokens), ngram.stats.decode_ms, ngram.stats.wall_ms, ngram.stats.target_passes)
        check("ngram", ngram.tokens, off.tokens, i)

        def scramble(draft):
            return [rng.randrange(vocab) for _ in draft]

        def half_right(draft):
            cut = rng.randrange(len(draft) + 1)
            return draft[:cut] + [(t + 1) % vocab for t in draft[cut:]]

        for name, corrupt in (("random-drafts", scramble), ("half-right-drafts", half_right)):
            run = fast.generate(prompt, drafter=Oracle(len(prompt), off.tokens, corrupt), options=opts(rows - 1))
            check(name, run.tokens, off.tokens, i)

    out = {}
    for s, a in acc.items():
        out[s] = {**{k: round(v, 3) if isinstance(v, float) else v for k, v in a.items()},
                  "tokens_per_s": round(a["tokens"] / (a["decode_ms"] / 1000), 2) if a["decode_ms"] > 0 else None,
                  "end_to_end_tokens_per_s": round(a["tokens"] / (a["wall_ms"] / 1000), 2) if a["wall_ms"] > 0 else None,
                  "ms_per_pass": round(a["decode_ms"] / a["passes"], 4) if a["passes"] else None}
    return {"systems": out, "exactness": exact, "hf_greedy_equals_off_eager": f"{hf_same}/{len(prompts)} prompts"}


# ------------------------------------------------------------------------------------
# Replay of recorded n-gram acceptance
# ------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------


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


def trees_phase(res: dict, base, static_tokens: int, plan: Plan, prompts, run_prompts, args, deadline: float) -> None:
    """Tree passes through the fixed shape of plan.tree_rows rows (ditto_bench/gputree.py): their
    pass costs, their rows against plain decoding, the engine with tree drafts, the decision, and
    the projection of a CPU run of the default drafter (--trees-replay) on this device's costs."""
    from ditto_bench import gputree
    from ditto_bench.projection import project

    graphs = base.device.type == "cuda"
    lm = base.with_options(pad_to=plan.tree_rows, static_cache=static_tokens, cuda_graphs=graphs, trees=True)
    t: dict = {"rows": plan.tree_rows, "nodes": plan.tree_rows - 1}
    res["trees"] = t
    if time.monotonic() > deadline:
        res["notes"].append("trees skipped: the time budget was spent")
        return
    probe = random_ids(random.Random(args.seed + 1), base.vocab_size, plan.tree_rows)
    t["fixed_costs"] = pass_costs(lm, prompts[0][: plan.context], probe, plan.tree_rows, plan.reps)
    t["invariance"] = gputree.tree_invariance(lm, prompts, plan.trees, plan.tree_rows - 1, args.seed, deadline)
    if time.monotonic() < deadline:
        t["engine"] = gputree.tree_engine(lm, run_prompts, plan.new_tokens, plan.tree_rows, args.seed)
    t["decision"] = gputree.tree_decision(res)
    src = args.trees_replay or TREES_REPLAY
    curve = res["pass_costs"].get("graphed_static") or res["pass_costs"]["eager_static"]
    try:
        data = json.loads(Path(src).read_text())
        t["replay_source"] = str(src.name if src == TREES_REPLAY else src)
        t["replay"] = project(data["tasks"], {"device": res["environment"]["device_name"], "source": "this run",
                                              "costs_ms": {int(n): v["best_ms"] for n, v in curve.items()}})
    except (OSError, ValueError, KeyError, TypeError) as err:
        t["replay"] = {"error": f"{type(err).__name__}: {err}"}


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


# ------------------------------------------------------------------------------------
# Command
# ------------------------------------------------------------------------------------


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cuda, cuda:N or cpu")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, float32 on CPU), bfloat16, float32")
    p.add_argument("--tiny", action="store_true", help="a 2-layer model of the same family (CI), not the 0.5B architecture")
    p.add_argument("--out", type=Path, default=None, help="where gpucheck.json and gpucheck.md go (default $OUT, else ./gpucheck-out)")
    p.add_argument("--replay", type=Path, default=None,
                   help=f"results.json of a CPU `ditto-lsp bench` run, or its compact copy (default {DEFAULT_REPLAY.name})")
    p.add_argument("--trees-replay", type=Path, default=None,
                   help=f"compact copy of a CPU bench run of the default drafter (default {TREES_REPLAY.name}; "
                        "python -m ditto_bench.projection RESULTS --save-compact PATH writes one)")
    p.add_argument("--save-replay", type=Path, default=None, metavar="PATH",
                   help="write the compact copy of --replay to PATH and stop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-std", type=float, default=None, help="weights' std (default 0.02; 0.5 with --tiny)")
    for f in Plan.__dataclass_fields__:
        p.add_argument(f"--{f.replace('_', '-')}", type=float if f == "budget_s" else int, default=None,
                       help=f"plan: {f} (GPU default {getattr(GPU_PLAN, f)}, CPU default {getattr(CPU_PLAN, f)})")


def run(args) -> int:
    if args.save_replay:
        src = args.replay or DEFAULT_REPLAY
        try:
            data = json.loads(Path(src).read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"gpucheck: cannot read {src}: {err}") from None
        args.save_replay.write_text(json.dumps(compact(data), indent=None, separators=(",", ":")) + "\n")
        print(f"wrote {args.save_replay}", file=sys.stderr)
        return 0
    t_start = time.monotonic()
    from lsp_server.backends.base import ModelError

    try:
        dev = choose_device(args.device)
        dt = choose_dtype(args.dtype, dev)
    except ModelError as err:
        raise SystemExit(f"gpucheck: {err}") from None
    plan = replace(GPU_PLAN if dev.type == "cuda" else CPU_PLAN,
                   **{f: getattr(args, f) for f in Plan.__dataclass_fields__ if getattr(args, f) is not None})
    if plan.rows < 2 or plan.max_n < 1 or plan.positions < 1 or plan.new_tokens < 2 or plan.prompts < 1:
        raise SystemExit("gpucheck: rows must be >= 2, max-n, positions, prompts >= 1, new-tokens >= 2")
    deadline = t_start + plan.budget_s
    out = args.out or Path(os.environ.get("OUT") or "gpucheck-out")
    graphs = dev.type == "cuda"

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    import transformers

    arch = TINY_ARCH if args.tiny else QWEN25_CODER_05B
    init_std = args.init_std if args.init_std is not None else (0.5 if args.tiny else 0.02)
    static_tokens = -(-(plan.context + max(plan.positions, plan.new_tokens) + 4 * plan.rows + 64) // 256) * 256
    res: dict = {"environment": {
        "device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
        or platform.machine(), "dtype": str(dt).removeprefix("torch."), "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "model": ("tiny (2 layers)" if args.tiny else "Qwen2.5-Coder-0.5B architecture") + ", random weights",
        "architecture": arch, "init_std": init_std, "rows": plan.rows, "static_tokens": static_tokens,
        "cuda_graphs": graphs, "torch_threads": torch.get_num_threads()}, "plan": asdict(plan), "notes": []}
    say(f"building the model on {dev} ({res['environment']['dtype']})")
    t = time.monotonic()
    base = random_model(arch, dev, dt, seed=args.seed, init_std=init_std, name="gpucheck-random")
    fixed = base.with_options(pad_to=plan.rows, static_cache=static_tokens, cuda_graphs=graphs)
    res["environment"]["build_s"] = round(time.monotonic() - t, 2)
    write(res, out)

    rng = random.Random(args.seed)
    vocab = base.vocab_size
    context = random_ids(rng, vocab, plan.context)
    probe = random_ids(rng, vocab, max(plan.max_n, plan.rows))

    say("pass costs T(n)")
    costs = {"eager_dynamic": pass_costs(base, context, probe, plan.max_n, plan.reps),
             "eager_static": pass_costs(base.with_options(static_cache=static_tokens), context, probe, plan.max_n,
                                        plan.reps)}
    if graphs:
        costs["graphed_static"] = pass_costs(base.with_options(static_cache=static_tokens, cuda_graphs=True), context,
                                             probe, plan.max_n, plan.reps)
    costs["fixed_shape"] = pass_costs(fixed, context, probe, plan.rows, plan.reps)
    res["pass_costs"] = costs
    write(res, out)

    say("batch invariance")
    prompts = [random_ids(rng, vocab, plan.context) for _ in range(plan.sequences)]
    res["invariance"] = {"fixed": invariance(fixed, prompts, plan.positions, plan.rows, deadline)}
    write(res, out)
    res["invariance"]["unpadded_dynamic"] = invariance(base, prompts, plan.positions, plan.rows, deadline)
    if graphs:
        eager_fixed = base.with_options(pad_to=plan.rows, static_cache=static_tokens)
        res["invariance"]["graph_vs_eager"] = graph_vs_eager(fixed, eager_fixed, prompts[0], min(plan.positions, 128))
    write(res, out)

    say("tokens per second")
    run_prompts = [random_ids(rng, vocab, plan.context) for _ in range(plan.prompts)]
    if time.monotonic() > deadline:
        res["notes"].append("tokens/s skipped: the time budget was spent")
    else:
        res["engine"] = engine_runs(base, fixed, run_prompts, plan.new_tokens, plan.rows, args.seed)
    write(res, out)

    src = args.replay or DEFAULT_REPLAY
    try:
        record = replay_record(json.loads(Path(src).read_text()), plan.rows)
        res["replay"] = {"source": str(src.name if src == DEFAULT_REPLAY else src), "record": record}
        ngram = (res.get("engine") or {}).get("systems", {}).get("ngram")
        if ngram and ngram.get("ms_per_pass"):
            res["replay"]["projection"] = project(record, ngram["ms_per_pass"], plan.rows)
            off = res["engine"]["systems"]["off"]["tokens_per_s"]
            if off:
                res["replay"]["projection"]["vs_off"] = round(res["replay"]["projection"]["tokens_per_s"] / off, 2)
    except (OSError, ValueError, KeyError, TypeError) as err:
        res["replay"] = {"source": str(src), "error": f"{type(err).__name__}: {err}"}
    say("trees")
    trees_phase(res, base, static_tokens, plan, prompts, run_prompts, args, deadline)
    write(res, out)
    res["goals"] = goals(res)
    res["decision"] = decision(res)
    res["wall_s"] = round(time.monotonic() - t_start, 1)
    write(res, out)
    print(markdown(res))
    say(f"wrote {out / 'gpucheck.json'} and {out / 'gpucheck.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ditto_bench.gpucheck", description=__doc__.splitlines()[0])
    configure(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

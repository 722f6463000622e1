"""The GPU check's measurements (`python -m ditto_bench.gpucheck`, gpucheck.py runs them in order).

Pass costs T(n) (`pass_costs`), batch invariance of the verify rows against plain passes
(`invariance`), CUDA graphs against eager on the same rows (`graph_vs_eager`), the engine's tokens/s
and exactness for drafting off, oracle, n-gram and transformers' `generate` (`engine_runs`, with
`Oracle`, a drafter of known continuations), and the tree phase (`trees_phase`, gputree.py's
measurements on the fixed shape of trees).

Left out on purpose: the plan and the command (gpucheck.py) and what is made of the numbers: the
goals, the decision, the projection of a recorded run and the report (gpucheck_report.py).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from ditto_bench.hf import FirstTokenClock, hf_generate
from drafters import NGramDrafter
from drafters.base import NoOwnSources, Proposal
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.types import DecodeOptions

TREES_REPLAY = Path(__file__).resolve().parents[1] / "docs" / "perf" / "data" / "acceptance-trees.json"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def random_ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


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


def trees_phase(res: dict, base, static_tokens: int, plan, prompts, run_prompts, args, deadline: float) -> None:
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

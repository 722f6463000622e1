"""The GPU check's tree phases (ditto_bench/gpucheck.py runs them; docs/gpu.md, "Trees").

- `tree_invariance`: random trees of draft tokens through the fixed shape: every row of a tree
  pass (lsp_server/backends/torch/tree.py) against plain one-token decoding of that row's path
  from the same cache: max |Δlogit|, argmax agreement, bit-identical rows. A tree row whose
  ancestors are not at consecutive slots attends over the same keys at other slots, and a
  kernel that groups its sums by slot may round otherwise; on this CPU in bf16 the rows were
  bit-identical, in float32 not. Whether they are on CUDA is what this phase measures.
- `tree_engine`: the engine with tree drafts on the fixed shape (trees forced on) against plain
  decoding, token for token, with trees holding the right continuation among wrong siblings
  (oracle trees) and trees of random tokens; tokens/s of the oracle trees.
- `tree_decision`: trees become the default on CUDA's fixed shape only if every tree row was
  bit-identical and every engine run equal (until then DITTO_TREES=1 turns them on).
- `replay`: the projection of ditto_bench/projection.py for the compact copy of a CPU benchmark
  run of the default drafter (docs/perf/data/acceptance-trees.json) on this device's measured costs.

Imports torch, the engine and the drafters only (the device machine has no pygls).
"""

from __future__ import annotations

import random
import time

import torch

from drafters.base import NoOwnSources, Proposal
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.types import DecodeOptions


def random_tree(rng: random.Random, nodes: int, vocab: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a random tree of `nodes` nodes, each after its parent (-1: the root)."""
    parents = [rng.randrange(-1, i) for i in range(nodes)]
    return [rng.randrange(vocab) for _ in range(nodes)], parents


def _sync(lm) -> None:
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)


def tree_invariance(lm, prompts: list[list[int]], trees: int, nodes: int, seed: int, deadline: float) -> dict:
    """Tree rows against plain decoding of their paths (module docstring). `lm` has the fixed shape."""
    rng = random.Random(seed)
    out = {"trees": 0, "rows": 0, "max_abs_diff": 0.0, "argmax_agree": 0, "bitwise_rows": 0, "cut_short": False}
    for prompt in prompts:
        cache = lm.new_cache()
        lm.forward(prompt[:-1], cache, last=1)
        held = len(prompt) - 1
        for _ in range(trees):
            if time.monotonic() > deadline:
                out["cut_short"] = True
                break
            toks, parents = random_tree(rng, nodes, lm.vocab_size)
            rows = [-1, *[p + 1 for p in parents]]
            ids = [prompt[-1], *toks]
            lm.tree_next(cache, rows)
            got = lm.forward(ids, cache, last=len(ids))
            lm.crop(cache, held)
            for j in range(len(ids)):
                path, r = [], j
                while r >= 0:
                    path.append(r)
                    r = rows[r]
                plain = None
                for r in reversed(path):
                    plain = lm.forward([ids[r]], cache, last=1)[0]
                lm.crop(cache, held)
                diff = (got[j] - plain).abs()
                out["max_abs_diff"] = max(out["max_abs_diff"], float(diff.max()))
                out["argmax_agree"] += int(got[j].argmax() == plain.argmax())
                out["bitwise_rows"] += int(float(diff.max()) == 0.0)
                out["rows"] += 1
            out["trees"] += 1
        lm.release(cache)
    return out


class TreeOracle(NoOwnSources):
    """Trees around the plain continuation: its next tokens as one path, and wrong siblings at
    every level (or, with `right` False, random tokens only)."""

    name = "tree-oracle"

    def __init__(self, prompt_len: int, target: list[int], rng: random.Random, vocab: int, nodes: int,
                 right: bool = True):
        self.n, self.target, self.rng, self.vocab, self.nodes, self.right = prompt_len, target, rng, vocab, nodes, right

    def propose(self, context, k):
        done = len(context) - self.n
        if not self.right:
            toks, parents = random_tree(self.rng, self.nodes, self.vocab)
            return Proposal(toks, source="oracle", match_len=1, tree=parents, weights=[0.5] * len(toks))
        good = self.target[done : done + k]
        toks, parents, parent = [], [], -1
        for t in good:  # the right path, with a wrong sibling beside each of its nodes while room is left
            if len(toks) >= self.nodes:
                break
            toks.append(t)
            parents.append(parent)
            me = len(toks) - 1
            if len(toks) < self.nodes:
                toks.append((t + 1) % self.vocab)
                parents.append(parent)
            parent = me
        return Proposal(toks, source="oracle", match_len=len(good), tree=parents, weights=[0.5] * len(toks))


def tree_engine(lm, prompts: list[list[int]], new_tokens: int, rows: int, seed: int) -> dict:
    """Speculative == plain with tree drafts on `lm` (trees on), and tokens/s of the oracle trees."""
    rng = random.Random(seed)
    engine = Engine(lm)
    opts = DecodeOptions(max_new_tokens=new_tokens, draft_max=rows - 1, adaptive=False)
    plain_opts = DecodeOptions(max_new_tokens=new_tokens, draft_max=0, adaptive=False)
    engine.generate(prompts[0], options=DecodeOptions(max_new_tokens=2, draft_max=0))  # warm-up
    exact = {"positions": 0, "mismatches": 0, "runs": 0, "tree_passes": 0}
    speed = {"tokens": 0, "decode_ms": 0.0, "passes": 0}
    plain_speed = {"tokens": 0, "decode_ms": 0.0}
    for prompt in prompts:
        plain = engine.generate(prompt, options=plain_opts)
        plain_speed["tokens"] += len(plain.tokens)
        plain_speed["decode_ms"] += plain.stats.decode_ms
        for right in (True, False):
            drafter = TreeOracle(len(prompt), plain.tokens + [0] * rows, rng, lm.vocab_size, rows - 1, right)
            _sync(lm)
            run = engine.generate(prompt, drafter=drafter, options=opts)
            exact["runs"] += 1
            exact["positions"] += len(plain.tokens)
            exact["mismatches"] += int(run.tokens != plain.tokens)
            exact["tree_passes"] += sum(1 for r in run.rounds if r.nodes)
            if right:
                speed["tokens"] += len(run.tokens)
                speed["decode_ms"] += run.stats.decode_ms
                speed["passes"] += run.stats.target_passes
    return {"exactness": exact,
            "oracle_trees": {**speed, "tokens_per_s": round(speed["tokens"] / (speed["decode_ms"] / 1000), 2)
                             if speed["decode_ms"] > 0 else None},
            "off": {**plain_speed, "tokens_per_s": round(plain_speed["tokens"] / (plain_speed["decode_ms"] / 1000), 2)
                    if plain_speed["decode_ms"] > 0 else None}}


def tree_decision(res: dict) -> dict:
    """Trees on CUDA's fixed shape by default: only where every tree row had plain decoding's bits
    and every engine run with trees equalled plain decoding, in bf16 on CUDA."""
    env = res.get("environment", {})
    inv = (res.get("trees") or {}).get("invariance")
    eng = (res.get("trees") or {}).get("engine")
    reasons = []
    if not (env.get("device", "").startswith("cuda") and env.get("dtype") == "bfloat16"):
        reasons.append("not measured in bf16 on CUDA")
    if not inv or not inv["rows"] or inv["bitwise_rows"] != inv["rows"]:
        reasons.append("tree rows not all bit-identical to plain decoding")
    if not eng or eng["exactness"]["mismatches"] or not eng["exactness"]["tree_passes"]:
        reasons.append("speculative output with trees differed from plain (or no tree pass ran)")
    return {"trees_default_on_cuda": not reasons, "because": reasons or ["every condition holds"]}


def markdown(res: dict) -> list[str]:
    t = res.get("trees")
    if not t:
        return []
    lines = ["", "## Trees (docs/gpu.md, \"Trees\")", ""]
    inv = t.get("invariance")
    if inv:
        lines.append(f"Tree rows through the fixed shape of {t.get('rows')} rows against plain decoding of their paths: "
                     f"{inv['rows']} rows of {inv['trees']} random trees of {t.get('nodes')} nodes, "
                     f"{inv['bitwise_rows']} bit-identical, argmax {inv['argmax_agree']}/{inv['rows']}, "
                     f"max |Δlogit| {inv['max_abs_diff']:.3g}" + (" (cut short)" if inv.get("cut_short") else "") + ".")
    eng = t.get("engine")
    if eng:
        ex = eng["exactness"]
        lines.append(f"Engine with tree drafts (trees forced on): {ex['runs'] - ex['mismatches']}/{ex['runs']} runs equal "
                     f"to plain decoding ({ex['positions']} positions, {ex['tree_passes']} tree passes); oracle trees "
                     f"{eng['oracle_trees']['tokens_per_s']} tokens/s against {eng['off']['tokens_per_s']} drafting off.")
    costs = t.get("fixed_costs")
    if costs:
        lines.append("Fixed shape of " + str(t.get("rows")) + " rows, T(n) best ms: "
                     + ", ".join(f"T({n}) {v['best_ms']:.3f}" for n, v in costs.items()) + ".")
    rp = t.get("replay")
    if rp and rp.get("systems"):
        from ditto_bench.projection import table

        lines += ["", f"**A projection**: a CPU benchmark run of the default drafter ({t.get('replay_source')}) priced at "
                      "this device's costs (ditto_bench/projection.py):", "", table(rp)]
    elif rp and rp.get("error"):
        lines.append(f"Projection not made: {rp['error']}")
    d = t.get("decision")
    if d:
        lines += ["", f"Trees as the default on CUDA's fixed shape: **{'yes' if d['trees_default_on_cuda'] else 'no'}** "
                      f"({'; '.join(d['because'])})."]
    return lines

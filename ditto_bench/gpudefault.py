"""The GPU's default path, checked as the server uses it: `python -m ditto_bench.gpudefault`.

The GPU check (ditto_bench/gpucheck.py) measured the fixed shape with a static cache sized to its
own plan. This checks what a user gets with no variable set (docs/gpu.md, "The first run on a
GPU"): the pass options `pass_options` picks for this device and dtype (CUDA graphs, 9-row passes,
a 4096-token static cache on CUDA in bf16), on Qwen2.5-Coder-0.5B's architecture with random
weights (`--tiny`: 2 layers, for CI), driven from one worker thread as the server's scheduler does
(lsp_server/lsp/scheduler.py):

- T(1) and T(9) at the default capacity;
- a document's requests with KV reuse: each prompt extends the last one (a line typed), generated
  with drafting off on one engine and with the n-gram drafter on another; every request's tokens
  must be equal, and with a random model the n-gram drafter seldom drafts, so each request is also
  run with the plain tokens as its drafts (all right) and with those drafts corrupted from a
  random point on;
- tokens/s of both (decode only).

Writes gpudefault.json and gpudefault.md to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import torch

from ditto_bench.gpucheck_phases import Oracle, pass_costs, random_ids, sync
from ditto_bench.hf import QWEN25_CODER_05B, TINY_ARCH, random_model
from drafters import NGramDrafter
from lsp_server.backends.torch.loading import choose_device, choose_dtype
from lsp_server.backends.torch.options import pass_options
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.types import DecodeOptions


def requests(lm, rng: random.Random, context: int, edits: int, new_tokens: int) -> dict:
    """One document's requests, each prompt the last one plus a typed line, on engines that keep
    their KV between requests (cache_key): drafting off, n-gram, right drafts, corrupted drafts."""
    vocab = lm.vocab_size
    opts = DecodeOptions(max_new_tokens=new_tokens, draft_max=8, adaptive=False)
    engines = {name: Engine(lm) for name in ("off", "ngram", "right-drafts", "corrupted-drafts")}
    prompt = random_ids(rng, vocab, context)
    out = {"requests": 0, "positions": 0, "mismatches": [], "reused_tokens": 0,
           "decode_ms": {n: 0.0 for n in engines}, "tokens": {n: 0 for n in engines},
           "passes": {n: 0 for n in engines}}

    def corrupt(draft):
        cut = rng.randrange(len(draft) + 1)
        return draft[:cut] + [(t + 1) % vocab for t in draft[cut:]]

    for i in range(edits):
        off = engines["off"].generate(prompt, options=opts, cache_key="doc")
        runs = {"off": off,
                "ngram": engines["ngram"].generate(prompt, drafter=NGramDrafter(), options=opts, cache_key="doc"),
                "right-drafts": engines["right-drafts"].generate(
                    prompt, drafter=Oracle(len(prompt), off.tokens), options=opts, cache_key="doc"),
                "corrupted-drafts": engines["corrupted-drafts"].generate(
                    prompt, drafter=Oracle(len(prompt), off.tokens, corrupt), options=opts, cache_key="doc")}
        for name, run in runs.items():
            out["decode_ms"][name] += run.stats.decode_ms
            out["tokens"][name] += len(run.tokens)
            out["passes"][name] += run.stats.target_passes
            if run.tokens != off.tokens:
                bad = next((j for j, (a, b) in enumerate(zip(run.tokens, off.tokens)) if a != b),
                           min(len(run.tokens), len(off.tokens)))
                out["mismatches"].append({"request": i, "system": name, "position": bad})
        out["reused_tokens"] += off.stats.reused_tokens
        out["requests"] += 1
        out["positions"] += len(off.tokens)
        # the user accepts a few tokens of the suggestion and types a new line
        prompt = prompt + off.tokens[: rng.randrange(len(off.tokens) + 1)] + random_ids(rng, vocab, 12)
    out["tokens_per_s"] = {n: round(out["tokens"][n] / (ms / 1000), 1) if ms else None
                           for n, ms in out["decode_ms"].items()}
    out["ms_per_pass"] = {n: round(out["decode_ms"][n] / p, 3) if p else None for n, p in out["passes"].items()}
    return out


def markdown(res: dict) -> str:
    env, opts = res["environment"], res["options"]
    lines = [f"# Ditto's default GPU path ({env['device_name']}, {env['dtype']}, {env['model']})", "",
             f"- torch {env['torch']}; pass options ({res['options_from']}): {opts}; static KV capacity at the end: "
             f"{res.get('static_capacity_at_end')}; wall {res.get('wall_s')} s", ""]
    if "pass_costs" in res:
        lines += ["| n | best ms | median ms |", "|---|---|---|"]
        lines += [f"| {n} | {v['best_ms']} | {v['median_ms']} |" for n, v in res["pass_costs"].items()]
        lines.append("")
    r = res.get("requests")
    if r:
        lines += [f"Requests with KV reuse: {r['requests']} requests, {r['positions']} positions per system; "
                  f"speculative == plain: **{'yes' if not r['mismatches'] else 'no'}** "
                  f"({len(r['mismatches'])} mismatching requests); prompt tokens reused from the cache: "
                  f"{r['reused_tokens']}.",
                  "",
                  "| system | tokens | decode tokens/s | ms per pass | tokens per pass |", "|---|---|---|---|---|"]
        for n in r["tokens"]:
            tpp = round(r["tokens"][n] / r["passes"][n], 2) if r["passes"][n] else None
            lines.append(f"| {n} | {r['tokens'][n]} | {r['tokens_per_s'][n]} | {r['ms_per_pass'][n]} | {tpp} |")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    t0 = time.monotonic()
    dev = choose_device(args.device)
    dt = choose_dtype(args.dtype, dev)
    out = args.out or Path(os.environ.get("OUT") or "gpudefault-out")
    out.mkdir(parents=True, exist_ok=True)
    arch = TINY_ARCH if args.tiny else QWEN25_CODER_05B
    opts = pass_options(dev, {"DITTO_FIXED_SHAPE": "1"} if args.fixed_shape else {}, dt)
    res = {"environment": {"device": str(dev), "dtype": str(dt).removeprefix("torch."), "torch": torch.__version__,
                           "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                           "model": ("tiny (2 layers)" if args.tiny else "Qwen2.5-Coder-0.5B architecture")
                           + ", random weights"}, "options": opts,
           "options_from": "as DITTO_FIXED_SHAPE=1 sets them" if args.fixed_shape else "the default, no variable set"}
    lm = random_model(arch, dev, dt, seed=args.seed, init_std=0.5 if args.tiny else 0.02).with_options(**opts)
    rng = random.Random(args.seed)
    failure: list[BaseException] = []

    def work():  # the model runs on one worker thread, as under the server's scheduler
        try:
            context = random_ids(rng, lm.vocab_size, args.context)
            res["pass_costs"] = {k: v for k, v in pass_costs(lm, context, context[:9], 9, args.reps).items()
                                 if k in ("1", "9")}
            res["requests"] = requests(lm, rng, args.context, args.edits, args.new_tokens)
            res["static_capacity_at_end"] = getattr(lm, "static_capacity", None)  # grown past 4096 when a pass needed it
            sync(dev)
        except BaseException as err:  # reported below, on the main thread
            failure.append(err)

    worker = threading.Thread(target=work, name="ditto-default-path")
    worker.start()
    worker.join()
    res["wall_s"] = round(time.monotonic() - t0, 1)
    if failure:
        res["error"] = f"{type(failure[0]).__name__}: {failure[0]}"
    (out / "gpudefault.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "gpudefault.md").write_text(markdown(res) + (f"\nerror: {res['error']}\n" if failure else ""))
    print(markdown(res))
    if failure:
        raise failure[0]
    return 0 if not res["requests"]["mismatches"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ditto_bench.gpudefault", description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model (for CI)")
    p.add_argument("--fixed-shape", action="store_true",
                   help="as DITTO_FIXED_SHAPE=1 would set it (the CPU's way to this path; graphs need CUDA)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--edits", type=int, default=8, help="requests in the document")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""The GPU check: pass costs, exactness and tokens/s on the default architecture, in one command.

`python -m ditto_bench.gpucheck --out DIR` (on a GPU machine, from the repository root; docs/gpu.md)
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
  compact copy in docs/perf/data/acceptance-cpu.json) priced at this device's measured cost of an
  n-gram round: a projection, and labelled so.

Writes gpucheck.json and gpucheck.md to --out (default $OUT); both are rewritten after every
phase, so a run cut short still leaves what it measured. Imports torch, transformers (through
lsp_server/backends/torch/model.py), the engine and the drafters only: nothing the device machine
lacks (no pygls, lsprotocol or gguf).

This module holds the plan and the command; the measurements are gpucheck_phases.py (and gputree.py
for trees), what is made of them (goals, decision, projection, report) gpucheck_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ditto_bench.gpucheck_phases import (
    TREES_REPLAY,
    engine_runs,
    graph_vs_eager,
    invariance,
    pass_costs,
    random_ids,
    trees_phase,
)
from ditto_bench.gpucheck_report import compact, decision, goals, markdown, project, replay_record, write
from ditto_bench.hf import QWEN25_CODER_05B, TINY_ARCH, random_model
from lsp_server.backends.torch.loading import choose_device, choose_dtype

DEFAULT_REPLAY = Path(__file__).resolve().parents[1] / "docs" / "perf" / "data" / "acceptance-cpu.json"


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

"""Where the line a developer wrote already stands, at each request of the editor replay.

For every request of `ditto-lsp bench --mode session`'s event script (replay.py `script`), the true
line (stripped) is looked up, as a whole line, in the document above the cursor and in the other open
buffers. It tells what context could have given the model that line: a line just above the cursor
is inside any prompt window; one further above only in a prompt that reaches it (llama.vim's 256
lines above, or something retrieved from there); one in another buffer only through snippets.

    python -m ditto_bench.truth_lines --repo PATH [--since 2023-01-01] [--max-tasks 10]

The sessions are drawn as the bench draws them (the same --since, --max-tasks and seed give the
same requests). No model runs. Left out on purpose: whether a system's prompt held the line
(`ditto/trace` says what Ditto's did).
"""

from __future__ import annotations

import argparse
from collections import Counter

from ditto_bench.replay_script import Ask, Open, script

NEAR_LINES = 20  # about what the default 256-token prompt holds above the cursor (docs/design.md, "Prompt layout and windows")


def where(steps: list, near: int = NEAR_LINES) -> list[dict]:
    """One row per request of `steps`: its kind, the true line, and where it stands ("near" with its
    distance in lines above the cursor, "above" further than `near`, "other" in another buffer,
    "nowhere")."""
    rows, others = [], []
    for step in steps:
        if isinstance(step, Open):
            others = [text.split("\n") for _, text in step.buffers]
        if not isinstance(step, Ask):
            continue
        truth = step.true_line.strip()
        above = step.document.split("\n")[: step.line]
        hits = [i for i, line in enumerate(above) if truth and line.strip() == truth]
        if hits:
            distance = step.line - hits[-1]
            place = "near" if distance <= near else "above"
        else:
            distance = None
            place = "other" if truth and any(line.strip() == truth for o in others for line in o) else "nowhere"
        rows.append({"kind": step.kind, "true_line": truth, "where": place, "distance": distance})
    return rows


def main(argv: list[str] | None = None) -> int:
    from ditto_bench.harvest import HarvestOptions, harvest
    from ditto_bench.session import build_sessions

    p = argparse.ArgumentParser(prog="python -m ditto_bench.truth_lines", description=__doc__.split("\n")[0])
    p.add_argument("--repo", required=True)
    p.add_argument("--since", default=None)
    p.add_argument("--max-tasks", type=int, default=50)
    p.add_argument("--per-commit", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--near", type=int, default=NEAR_LINES, help=f"lines above counted as near (default {NEAR_LINES})")
    args = p.parse_args(argv)
    h = harvest(args.repo, HarvestOptions(since=args.since, max_tasks=10**9, seed=args.seed, languages=("python",),
                                          per_commit=args.per_commit))
    rows = [r for s in build_sessions(h.tasks, args.max_tasks, seed=args.seed) for r in where(script(s), args.near)]
    for r in rows:
        d = "" if r["distance"] is None else f" ({r['distance']} lines up)"
        print(f"{r['kind']:5} {r['where']:8}{d:18} {r['true_line'][:70]}")
    n = Counter(r["where"] for r in rows)
    print(f"{len(rows)} requests: within {args.near} lines above {n['near']}, further above {n['above']}, "
          f"in another open buffer {n['other']}, nowhere {n['nowhere']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

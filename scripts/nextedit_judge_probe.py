"""Can the default model judge which of propagation's proposals a developer meant? docs/nextedit.md
("A judge of places by the model's likelihood") comes from it. For each proposal propagation makes on
the next-edit benchmark's cases (`--max-tasks 80 --per-commit 2`), the model rewrite's chat prompt
(lsp_server/nextedit/rewrite.py `Rewriter.prompt`: the user's edit as the example, the proposal's lines
as the region) is scored with two answers: the lines with the proposal made, and unchanged. A judge is
worth building where the difference of the two log-probabilities separates the exact proposals from the
wrong ones (AUC well above 0.5).

    OMP_NUM_THREADS=1 DITTO_LLAMA_THREADS=1 taskset -c 1 .venv/bin/python scripts/nextedit_judge_probe.py \
        OUT.jsonl /work/.mirror/pallets+click/repo ...        # one line per proposal, appended as it goes
"""
import json
import sys

import numpy as np

from ditto_bench.nextedit import judge, replay
from ditto_bench.nextedit_harvest import cases
from lsp_server.backends.loader import load
from lsp_server.nextedit.learn import edits, line_at
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.rewrite import Rewriter, region_of


def logp(lm, prompt: list[int], answer: list[int]) -> float:
    cache = lm.new_cache()
    lm.forward(prompt[:-1], cache, 1)
    lg = np.asarray(lm.forward([prompt[-1], *answer[:-1]], cache, len(answer)), dtype=np.float64)
    lm.release(cache)
    lg -= lg.max(axis=1, keepdims=True)
    lsm = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
    return float(sum(lsm[i, t] for i, t in enumerate(answer)))


def auc(pos: list[float], neg: list[float]) -> float:
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / max(1, len(pos) * len(neg))


def main(out_path: str, repos: list[str]) -> None:
    lm = load("default", backend="llama.cpp")
    rw = Rewriter(lm)
    rows = []
    with open(out_path, "a") as out:
        for repo in repos:
            for c in cases(repo, max_cases=80, per_commit=2)[0]:
                history, text, cursor = replay(c)
                e = Propagator().propose(history.groups(), c.path, text, cursor, [(p, b) for p, b, _ in c.others])
                if e is None:
                    continue
                doc, target = {c.path: (text, c.after), **{p: (b, a) for p, b, a in c.others}}[e.uri]
                _, exact = judge(doc, target, e.start, e.end, e.new_text)
                a, b = line_at(doc, e.start)[0], line_at(doc, e.end)[1]
                start, end = region_of(doc, doc.count("\n", 0, a), doc.count("\n", 0, b))
                ids, closing = rw.prompt(e.uri, doc, start, end, edits(history.groups(), text, 1)[0])
                made = doc[start : e.start] + e.new_text + doc[e.end : end]
                row = {"repo": repo, "case": c.id, "exact": exact, "why": e.why[:60],
                       "lp_made": logp(lm, ids, lm.encode(made + closing)),
                       "lp_unchanged": logp(lm, ids, lm.encode(doc[start:end] + closing))}
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
    d = [(r["lp_made"] - r["lp_unchanged"], r["exact"]) for r in rows]
    right, wrong = [x for x, ok in d if ok], [x for x, ok in d if not ok]
    print(f"proposals {len(rows)}: exact {len(right)}, wrong {len(wrong)}; AUC {auc(right, wrong):.3f}; the model "
          f"prefers the change made on {sum(x > 0 for x in right)} exact and {sum(x > 0 for x in wrong)} wrong")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""Can the default model judge which of propagation's proposals a developer meant? docs/nextedit.md
("A judge of places by the model's likelihood") comes from it. For each proposal propagation makes on
the next-edit benchmark's cases (`--max-tasks 80 --per-commit 2`), the model rewrite's chat prompt
(lsp_server/nextedit/rewrite.py `Rewriter.prompt`: the user's edit as the example, the proposal's lines
as the region) is scored with two answers: the lines with the proposal made, and unchanged. A judge is
worth building where the difference of the two log-probabilities separates the exact proposals from the
wrong ones (AUC well above 0.5).

    OMP_NUM_THREADS=1 DITTO_LLAMA_THREADS=1 taskset -c 1 .venv/bin/python scripts/nextedit_judge_probe.py \
        OUT.jsonl /work/.mirror/pallets+click/repo ...        # one line per proposal, appended as it goes

With JUDGE=file the judge is the file itself, no chat and no diff (lsp_server/nextedit/judge.py `scores`,
what the `judged` proposer shows by; "The file as the judge" there): the document's last CONTEXT
tokens (default 256) before the proposal's lines, the user's edited lines put first where they lie
outside them, then those lines with the proposal made or unchanged and the two lines after them.

With JUDGE=fim the judge is the file around the lines: a FIM prompt with CONTEXT tokens above them as the
prefix and as many below as the suffix, the lines (made or unchanged) as the middle, ended by end-of-text.

With RELAX=1 (and JUDGE=file) only the cases where propagation proposes nothing are scored, with what
looser rules propose there (`Propagator(loose=True)`, propagate.py `accepts_loosely`: one token of
context agreeing for any change in code, insertions on any number of lines): could the judge turn places
the rules refuse into right proposals? (The `judged` proposer now proposes those places too.) RELAX=text
also takes strings and comments where the user's edit was in one (one neighbouring token agreeing).
RELAX=first scores, on every case, the first place the loose rules find (where the strict rules find one
too, the loose rules' nearest may differ). MODEL names the judge's model (default: `default`; e.g.
`qwen2.5-coder-1.5b`, after `ditto-lsp models pull qwen2.5-coder-1.5b`).
"""
import json
import os
import sys

from ditto_bench.nextedit import judge, replay
from ditto_bench.nextedit_harvest import cases
from lsp_server.backends.loader import load
from lsp_server.nextedit.learn import Kinds, edits, line_at
from lsp_server.nextedit.judge import logps, scores
from lsp_server.nextedit import propagate
from lsp_server.nextedit.propagate import Propagator
from lsp_server.nextedit.rewrite import Rewriter, region_of


JUDGE = os.environ.get("JUDGE", "chat")
CONTEXT = int(os.environ.get("CONTEXT", 256))
RELAX = os.environ.get("RELAX") in ("1", "text")
FIRST = os.environ.get("RELAX") == "first"  # every case: the loose rules' first place, whatever the strict ones find
MODEL = os.environ.get("MODEL", "default")


def accepts_in_text(c, left, right, kind, line) -> bool:
    """RELAX=text: propagate.py `accepts_loosely`, and in strings and comments too (the user's kind of text)."""
    return propagate.free(c) and (kind == "code" or kind == c.kind) or kind == c.kind and left + right >= 1


def loose_propagator() -> Propagator:
    p = Propagator(loose=True)
    if os.environ.get("RELAX") == "text":
        p.rule = accepts_in_text  # this propagator's rule only; the module's stays the product's
    return p


def fim_scores(lm, doc: str, start: int, end: int, new_text: str, user, context: int) -> tuple[float, float]:
    """JUDGE=fim: the proposal's lines as the middle of a FIM prompt, `context` tokens above them as the prefix and
    as many below as the suffix (the user's edited lines put first where they lie outside both), each answer
    ended by end-of-text (the middle ends there): with the change made, and unchanged."""
    a, tail = line_at(doc, start)[0], line_at(doc, end)[1]
    tail = min(len(doc), tail + 1)  # the lines with their newline: the suffix starts on the next line
    above = lm.encode(doc[max(0, a - 32 * context):a])[-context:] if a else []
    below = lm.encode(doc[tail : tail + 32 * context])[:context]
    if user is not None:
        ua, ub = line_at(doc, user[0])[0], line_at(doc, user[1])[1]
        if not (a - len(lm.decode(above)) <= ua and ub <= tail + len(lm.decode(below))):
            above = lm.encode(doc[ua:ub] + "\n\n") + above
    f, eot = lm.fim, lm.vocabulary()["<|endoftext|>"]
    made = doc[a:start] + new_text + doc[end:tail]
    return tuple(logps(lm, [f.prefix, *above, f.suffix, *below, f.middle],
                       [lm.encode(made) + [eot], lm.encode(doc[a:tail]) + [eot]]))


def auc(pos: list[float], neg: list[float]) -> float:
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / max(1, len(pos) * len(neg))


def main(out_path: str, repos: list[str]) -> None:
    lm = load(MODEL, backend="llama.cpp")
    rw = Rewriter(lm)
    rows = []
    with open(out_path, "a") as out:
        for repo in repos:
            for c in cases(repo, max_cases=80, per_commit=2)[0]:
                history, text, cursor = replay(c)
                others = [(p, b) for p, b, _ in c.others]
                e = (Propagator(loose=True) if FIRST else Propagator()).propose(
                    history.groups(), c.path, text, cursor, others)
                if RELAX:
                    if e is not None:
                        continue
                    e = loose_propagator().propose(history.groups(), c.path, text, cursor, others)
                if e is None:
                    continue
                doc, target = {c.path: (text, c.after), **{p: (b, a) for p, b, a in c.others}}[e.uri]
                _, exact = judge(doc, target, e.start, e.end, e.new_text)
                row = {"repo": repo, "case": c.id, "kind": c.kind, "exact": exact, "why": e.why[:60],
                       "text": Kinds(doc).at(e.start)}  # code, string or comment where the proposal lies
                user = edits(history.groups(), text, 1)[0]
                if JUDGE == "fim":
                    at = (user.start, user.end) if e.uri == c.path else None
                    row["lp_made"], row["lp_unchanged"] = fim_scores(lm, doc, e.start, e.end, e.new_text, at, CONTEXT)
                elif JUDGE == "file":
                    at = (user.start, user.end) if e.uri == c.path else None
                    row["lp_made"], row["lp_unchanged"] = scores(lm, doc, e.start, e.end, e.new_text, at, CONTEXT)
                else:
                    a, b = line_at(doc, e.start)[0], line_at(doc, e.end)[1]
                    start, end = region_of(doc, doc.count("\n", 0, a), doc.count("\n", 0, b))
                    ids, closing = rw.prompt(e.uri, doc, start, end, user)
                    made = doc[start : e.start] + e.new_text + doc[e.end : end]
                    row["lp_made"], row["lp_unchanged"] = logps(
                        lm, ids, [lm.encode(made + closing), lm.encode(doc[start:end] + closing)])
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
    d = [(r["lp_made"] - r["lp_unchanged"], r["exact"]) for r in rows]
    right, wrong = [x for x, ok in d if ok], [x for x, ok in d if not ok]
    print(f"proposals {len(rows)}: exact {len(right)}, wrong {len(wrong)}; AUC {auc(right, wrong):.3f}; the model "
          f"prefers the change made on {sum(x > 0 for x in right)} exact and {sum(x > 0 for x in wrong)} wrong")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

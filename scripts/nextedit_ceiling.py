"""Where edit propagation stands against what the next-edit benchmark's cases allow (docs/nextedit.md,
"Where the missing cases are"). For each repository, the cases `ditto-lsp bench --mode next-edit
--max-tasks 80 --per-commit 2` runs, and for the propagation proposer:

- the repeated cases whose commit made the user's exact token-level changes again at a remaining unit
  (the ceiling a proposer that knew the place could reach), or a part of them;
- its proposals by kind (line template, sibling line, deleted lines, inserted lines, token changes; in another
  document), right and wrong over all cases;
- of its wrong proposals in the document, those where another place it found would have been exact
  (what a better choice among its places could win), those at a line the commit changed (location
  right) and the rest;
- for the strict rules (`Propagator()`) and the loose ones (`Propagator(loose=True)`, what the `judged`
  proposer judges), each asked on every case: the repeated cases where the first place is exact, where
  any place found in the document is (a judge that chose perfectly among them), and the proposals
  shown and exact over all cases (docs/nextedit.md, "A fourth held-out set, and what a perfect judge could reach").

    .venv/bin/python scripts/nextedit_ceiling.py /work/.mirror/pallets+click/repo ...   # git checkouts
"""
import sys
from collections import Counter

from ditto_bench.nextedit import judge, replay
from ditto_bench.nextedit_harvest import cases, units
from lsp_server.nextedit import propagate as P
from lsp_server.nextedit.learn import Kinds, edits


def kind_of(why: str, other: bool) -> str:
    k = next((k for k in ("lines", "sibling", "delete", "insert") if why.startswith(k)), "token")
    return k + (" (other document)" if other else "")


def every_place(pr: P.Propagator, groups, uri: str, text: str) -> list:
    """Each place `pr`'s rules find in the document `uri` (as `Propagator.propose` finds them), as the
    proposal it would make were that place the nearest."""
    learnt = edits(groups, text, P.EDITS)
    kinds, out = Kinds(text), {}
    for edit in learnt:
        found = pr.found(edit, learnt, uri, text, kinds)
        for p in found:
            e = P._proposal(found, text, p.start, True, None)
            out.setdefault((e.start, e.end, e.new_text), e)
    return list(out.values())


def reach(c, history, text, cursor, targets, counts: Counter) -> None:
    """The first place and every place of the strict and the loose rules on one case (module docstring)."""
    others = [(p, b) for p, b, _ in c.others]
    for name, pr in (("strict", P.Propagator()), ("loose", P.Propagator(loose=True))):
        e = pr.propose(history.groups(), c.path, text, cursor, others)
        first = False
        if e is not None:
            doc, target = targets[e.uri]
            first = judge(doc, target, e.start, e.end, e.new_text)[1]
            counts[(name, "shown")] += 1
            counts[(name, "exact")] += first
        if c.kind == "repeated":
            counts[(name, "repeated: first place exact")] += first
            counts[(name, "repeated: some place exact")] += first or any(
                judge(text, c.after, a.start, a.end, a.new_text)[1]
                for a in every_place(pr, history.groups(), c.path, text))


def main(repos: list[str]) -> None:
    ceiling, kinds, wrong, both = Counter(), Counter(), Counter(), Counter()
    for repo in repos:
        found_cases, _ = cases(repo, max_cases=80, per_commit=2)
        for c in found_cases:
            us = units(c.before, c.after)
            mine = us[c.first].signature()
            rest = [u.signature() for j, u in enumerate(us) if j != c.first]
            if c.kind == "repeated":
                ceiling["repeated"] += 1
                ceiling["same changes again"] += any(s == mine for s in rest)
                ceiling["some of them again"] += any(s and s <= mine for s in rest)
            history, text, cursor = replay(c)
            targets = {c.path: (text, c.after), **{p: (b, a) for p, b, a in c.others}}
            reach(c, history, text, cursor, targets, both)
            pr = P.Propagator()
            e = pr.propose(history.groups(), c.path, text, cursor, [(p, b) for p, b, _ in c.others])
            if e is None:
                continue
            doc, target = targets[e.uri]
            loc, exact = judge(doc, target, e.start, e.end, e.new_text)
            kinds[(kind_of(e.why, e.uri != c.path), exact)] += 1
            if exact or e.uri != c.path:
                continue
            _, places = pr.last
            better = any(judge(text, c.after, a.start, a.end, a.new_text)[1]
                         for a in (P._proposal(places, text, p.start, True, None) for p in places))
            wrong["another place found was exact" if better else "location right" if loc else "line not changed"] += 1
    n = ceiling["repeated"]
    print(f"repeated cases: {n}")
    for k in ("same changes again", "some of them again"):
        print(f"  {k}: {ceiling[k]} ({ceiling[k] / max(1, n):.0%})")
    print("proposals by kind: right / wrong (all cases)")
    for k in sorted({k for k, _ in kinds}):
        print(f"  {k}: {kinds[(k, True)]} / {kinds[(k, False)]}")
    print("wrong proposals in the document:", dict(wrong))
    for name in ("strict", "loose"):
        shown, exact = both[(name, "shown")], both[(name, "exact")]
        print(f"{name} rules: repeated cases with the first place exact {both[(name, 'repeated: first place exact')]}, "
              f"with some place in the document exact {both[(name, 'repeated: some place exact')]} (of {n}); "
              f"all cases: shown {shown}, exact {exact}, wrong {shown - exact} ({(shown - exact) / max(1, exact):.2f} per right)")


if __name__ == "__main__":
    main(sys.argv[1:])

"""`ditto-lsp bench --mode next-edit`: next-edit proposers on commits of a git repository (docs/nextedit.md).

For each case (nextedit_harvest.py) the user's unit is typed into the parent version of the file as
an editor sends it (a changed run selected and deleted, its replacement typed a character at a
time), every change recorded in a fresh edit history (lsp_server/nextedit/history.py); then each
proposer is asked for the next edit once, with the cursor where the typing ended and the commit's
other changed files open at their parent version.

A proposal is judged against the commit: its **location** is right when it touches lines a
remaining unit changes (in the file it names), its **text** is right (`exact`) when the file with
the proposal applied is the file with one or more neighbouring remaining units applied, exactly
what the commit wrote there. Shown but not exact is `shown_wrong`. Per proposer, over the repeated
cases and over all cases: n, shown, location, exact, shown_wrong and the time to a proposal (p50,
p95: the call, learning included, on whatever cores the run was given: pin it with taskset).

Left out on purpose: the server (the proposers are called in-process, as `ditto/nextEdit` will
call them).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from ditto_bench.nextedit_harvest import Case, apply_units, cases, typing, units
from lsp_server.nextedit.history import EditHistory
from lsp_server.numbers import percentile

from lsp_server.nextedit import DEFAULT_PROPOSER as DEFAULT, PROPOSERS as SYSTEMS  # noqa: E402


def replay(case: Case) -> tuple[EditHistory, str, int]:
    """The case's user edit typed into the parent file: (history, document now, cursor offset)."""
    us = units(case.before, case.after)
    u = us[case.first]
    lines = case.before.splitlines(keepends=True)
    at = sum(len(line) for line in lines[: u.a])
    text, cursor = case.before, at
    history = EditHistory(clock=_Ticks())
    for version, (start, end, new, removed) in enumerate(typing("".join(u.old), "".join(u.new), at), 1):
        assert text[start:end] == removed
        text = text[:start] + new + text[end:]
        history.record(start, end, new, removed, version)
        cursor = start + len(new)
    return history, text, cursor


class _Ticks:
    """A clock that advances one step a call: the replay does not depend on the wall clock."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.1
        return self.t


def _lines_of(text: str, a: int, b: int) -> tuple[int, int]:
    return text.count("\n", 0, a), text.count("\n", 0, b)


def _touches(u, l0: int, l1: int) -> bool:
    """Whether unit `u` changes lines [l0, l1] (an insertion: lands next to them)."""
    return u.a <= l1 and u.b > l0 if u.b > u.a else l0 <= u.a <= l1 + 1


def judge(doc: str, target: str, start: int, end: int, new_text: str) -> tuple[bool, bool]:
    """(location right, exact) of the edit [start, end) -> new_text of `doc`, against `target`, the
    commit's version of that file (module docstring)."""
    us = units(doc, target)
    l0, l1 = _lines_of(doc, start, end)
    near = [i for i, u in enumerate(us) if _touches(u, l0, l1)]
    if not near:
        return False, False
    edited = doc[:start] + new_text + doc[end:]
    for i in near:
        for j in near:
            if j >= i and apply_units(doc, us[i : j + 1]) == edited:
                return True, True
    return True, False


def run_case(case: Case, proposers: dict[str, object]) -> list[dict]:
    """Every proposer once on the case; one record each."""
    history, text, cursor = replay(case)
    others = [(p, b) for p, b, _ in case.others]
    targets = {case.path: (text, case.after), **{p: (b, a) for p, b, a in case.others}}
    remaining = len(units(text, case.after))
    records = []
    for name, proposer in proposers.items():
        t0 = time.perf_counter()
        rewriter = getattr(proposer, "rewriter", proposer if hasattr(proposer, "rewrite") else None)
        if rewriter is not None:
            rewriter.spent = []
        edit = proposer.propose(history.groups(), case.path, text, cursor, others)
        ms = (time.perf_counter() - t0) * 1000
        rec = {"case": case.id, "kind": case.kind, "system": name, "tts_ms": round(ms, 3), "shown": edit is not None,
               "location": False, "exact": False, "remaining_units": remaining}
        if rewriter is not None and rewriter.spent:  # every rewrite the call ran, shown or not
            rec["model"] = _summed(rewriter.spent)
        if edit is not None:
            doc, target = targets.get(edit.uri, (None, None))
            if doc is not None:
                rec["location"], rec["exact"] = judge(doc, target, edit.start, edit.end, edit.new_text)
            rec.update({"uri": edit.uri, "other_file": edit.uri != case.path,
                        "line": (doc or "").count("\n", 0, edit.start),
                        "old_text": edit.old_text, "new_text": edit.new_text, "why": edit.why})
            if edit.stats:
                rec["stats"] = {k: v for k, v in edit.stats.items() if k != "ids"}
        records.append(rec)
    return records


def _summed(spent: list[dict]) -> dict:
    keys = ("generated", "passes", "drafted", "accepted", "prompt_tokens", "prefill_tokens", "ms")
    return {"rewrites": len(spent), **{k: round(sum(s[k] for s in spent), 1) for k in keys}}


def summarise(records: list[dict], default: str = DEFAULT) -> dict:
    out: dict = {}
    for system in dict.fromkeys(r["system"] for r in records):
        mine = [r for r in records if r["system"] == system]
        out[system] = {"repeated": _group([r for r in mine if r["kind"] == "repeated"]), "all": _group(mine)}
    out["default"] = default
    return out


def _group(rs: list[dict]) -> dict:
    shown = sum(r["shown"] for r in rs)
    exact = sum(r["exact"] for r in rs)
    times = [r["tts_ms"] for r in rs]
    out = {"n": len(rs), "shown": shown, "location": sum(r["location"] for r in rs), "exact": exact,
           "shown_wrong": shown - exact, "exact_rate": round(exact / len(rs), 4) if rs else None,
           "precision": round(exact / shown, 4) if shown else None,
           "tts_ms_p50": percentile(times, 50, 3), "tts_ms_p95": percentile(times, 95, 3)}
    model = [r["model"] for r in rs if r.get("model")]
    if model:  # the calls that ran the model (a rewrite): its time and passes
        generated, passes = sum(m["generated"] for m in model), sum(m["passes"] for m in model)
        out.update({"model_calls": len(model), "model_ms_p50": percentile([m["ms"] for m in model], 50, 1),
                    "model_ms_p95": percentile([m["ms"] for m in model], 95, 1),
                    "tokens_per_pass": round(generated / passes, 3) if passes else None,
                    "drafts_accepted": round(sum(m["accepted"] for m in model) / max(1, sum(m["drafted"] for m in model)), 4)})
    return out


def table(summary: dict) -> str:
    rows = ["| proposer | cases | n | shown | location right | exact | shown wrong | wrong per right | "
            "time to proposal p50 / p95 (ms) |", "|---|---|---|---|---|---|---|---|---|"]
    for system, v in summary.items():
        if system == "default":
            continue
        for kind in ("repeated", "all"):
            g = v[kind]
            ratio = f"{g['shown_wrong'] / g['exact']:.2f}" if g["exact"] else ("–" if not g["shown_wrong"] else "∞")
            rows.append(f"| {system}{' (default)' if system == summary.get('default') else ''} | {kind} | {g['n']} | "
                        f"{g['shown']} | {g['location']} | {g['exact']} ({_pct(g['exact_rate'])}) | {g['shown_wrong']} | "
                        f"{ratio} | {_ms(g['tts_ms_p50'])} / {_ms(g['tts_ms_p95'])} |")
    model = [(s, v["all"]) for s, v in summary.items() if s != "default" and v["all"].get("model_calls")]
    if model:
        rows += ["", "| proposer | calls that ran the model | model time p50 / p95 (ms) | tokens per pass "
                     "(the region as the draft) | drafted tokens accepted |", "|---|---|---|---|---|"]
        rows += [f"| {s} | {g['model_calls']} | {_ms(g['model_ms_p50'])} / {_ms(g['model_ms_p95'])} | "
                 f"{g['tokens_per_pass']} | {_pct(g['drafts_accepted'])} |" for s, g in model]
    return "\n".join(rows)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _ms(x) -> str:
    return "–" if x is None else (f"{x:.1f}" if x < 100 else f"{x:.0f}")


def markdown(results: dict) -> str:
    meta = results["meta"]
    out = ["# Ditto benchmark (next-edit mode)", "",
           f"- repository: `{meta['repo']}` at {meta.get('repo_commit')}; {meta['cases']['repeated']} repeated-change "
           f"and {meta['cases']['ordinary']} ordinary cases ({meta['commits_scanned']} commits scanned, skipped "
           f"{meta['commits_skipped']})",
           f"- proposers: {', '.join(meta['systems'])}; default: {results['summary'].get('default')}",
           f"- command: `{meta['command']}`"]
    if meta.get("model"):
        out.append(f"- model: {meta['model']} ({meta.get('backend')}, {meta.get('device')})")
    if meta.get("note"):
        out.append(f"- note: {meta['note']}")
    out += ["", table(results["summary"]), "",
            "Exact: the proposal, applied, gives the file with one or more remaining units of the commit done, exactly "
            "as the commit wrote them. Shown wrong: shown and not exact. Time: the proposer's call on the cores the "
            "run had.", ""]
    wrong = [r for r in results["records"] if r["shown"] and not r["exact"]]
    if wrong:
        out += ["## Shown but wrong", ""]
        for r in wrong[:40]:
            out.append(f"- `{r['case']}` {r['system']} ({r['kind']}): {json.dumps(r.get('old_text'))} -> "
                       f"{json.dumps(r.get('new_text'))}{' in ' + r['uri'] if r.get('other_file') else ''}"
                       f" [{r.get('why')}]")
        out.append("")
    return "\n".join(out)


def proposers(names: list[str], args=None) -> tuple[dict, dict]:
    """The proposers by name, and what meta says of the model (loaded only when a proposer needs it)."""
    from lsp_server.nextedit.propagate import Propagator

    out: dict[str, object] = {}
    meta: dict = {}
    rewriter = None
    lm = None
    if any(n in ("rewrite", "both", "judged") for n in names):
        from lsp_server.commands.options import load_model
        from lsp_server.nextedit.rewrite import Rewriter

        lm = load_model(args)
        rewriter = Rewriter(lm, format=getattr(args, "rewrite_format", "chat"))
        where = lm.describe()
        meta = {"model": lm.name, "backend": where["backend"], "device": where["device"], "dtype": where["dtype"],
                "threads": where.get("threads"), "rewrite_format": rewriter.format}
    for n in names:
        if n == "propagate":
            out[n] = Propagator()
        elif n == "rewrite":
            out[n] = rewriter
        elif n == "both":
            from lsp_server.nextedit.rewrite import Checked

            out[n] = Checked(Propagator(), rewriter)
        elif n == "judged":
            from lsp_server.nextedit.judge import Judged

            out[n] = Judged(Propagator(), lm)
        else:
            raise SystemExit(f"ditto-lsp: error: next-edit proposers are {', '.join(SYSTEMS)} (got {n!r})")
    return out, meta


def run(args, versions: dict | None = None, repo_commit: str | None = None) -> int:
    """The next-edit mode of `ditto-lsp bench` (its options, the versions and the repository's HEAD: ditto_bench/cli.py)."""
    from ditto_bench.harvest import HarvestError

    names = [s.strip() for s in (args.systems or "propagate,rewrite").split(",") if s.strip()]
    print(f"harvesting next-edit cases from {args.repo} ...", file=sys.stderr)
    t0 = time.time()
    try:
        found, info = cases(args.repo, max_cases=args.max_tasks, per_commit=args.per_commit, since=args.since)
    except HarvestError as err:
        raise SystemExit(f"ditto-lsp: {err}") from None
    kinds = {k: sum(1 for c in found if c.kind == k) for k in ("repeated", "ordinary")}
    print(f"{kinds['repeated']} repeated-change and {kinds['ordinary']} ordinary cases", file=sys.stderr)
    chosen, model_meta = proposers(names, args)
    records: list[dict] = []
    partial = ""
    try:
        for i, case in enumerate(found, 1):
            if args.time_limit is not None and time.time() - t0 > args.time_limit:
                partial = f"--time-limit {args.time_limit:g}s reached"
                break
            recs = run_case(case, chosen)
            records.extend(recs)
            marks = " ".join(f"{r['system']}:{'=' if r['exact'] else 'x' if r['shown'] else '-'}" for r in recs)
            print(f"[{i}/{len(found)}] {case.kind[:3]} {case.id} {marks}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        partial = "interrupted (Ctrl-C)"
        done = {r["case"] for r in records}
        records = [r for r in records if r["case"] in done and sum(x["case"] == r["case"] for x in records) == len(chosen)]
    run_ids = list(dict.fromkeys(r["case"] for r in records))
    meta = {"mode": "next-edit", "repo": str(Path(args.repo).resolve()), "repo_commit": repo_commit,
            "since": args.since, "systems": names, "cases": kinds, "cases_run": len(run_ids),
            "command": shlex.join(["ditto-lsp", *sys.argv[1:]]), "versions": versions or {}, "note": args.note,
            "partial": bool(partial), "stopped": partial, "wall_s": round(time.time() - t0, 1), **info, **model_meta}
    default = DEFAULT if DEFAULT in names else names[0]
    results = {"meta": meta, "summary": summarise(records, default),
               "case_list": [c.public() for c in found if c.id in set(run_ids)], "records": records}
    text = markdown(results)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        (args.out / "report.md").write_text(text, encoding="utf-8")
        print(f"wrote {args.out / 'results.json'} and {args.out / 'report.md'}", file=sys.stderr)
    print(text.split("\n## Shown but wrong")[0])
    return 130 if partial.startswith("interrupted") else 0

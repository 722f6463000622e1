"""`ditto-lsp bench --repo PATH`: commit-replay benchmark of Ditto against its peers.

Harvests tasks from the repository (harvest.py), runs the chosen systems on each
(runner.py; session mode groups tasks of one file into sessions, session.py, and can also
replay them on real servers as editors drive them, replay.py), aggregates (metrics.py) and
writes results.json, report.md and PNG plots (report.py). A progress bar shows on stderr;
Ctrl-C or --time-limit stop after the current task and keep everything done so far
(marked partial). `--mode next-edit` is a benchmark of its own (nextedit.py, nextedit_harvest.py).

This module holds the command line and the in-process run; left out on purpose: what a run records
about itself and how it writes its results (runinfo.py), and the editor replay's step (replay_run.py).
Top level stays light (no torch): the command line builds its parser on every call.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from ditto_bench import replay_run, runinfo


def configure(p: argparse.ArgumentParser) -> None:
    from lsp_server.commands.options import add_decode_args, add_model_args

    p.add_argument("--repo", required=True, help="git repository (work tree or bare) whose commits are replayed")
    p.add_argument("--out", type=Path, default=None, help="write results.json, report.md and plots here")
    p.add_argument("--mode", choices=["completion", "keystroke", "session", "next-edit"], default="completion",
                   help="session: several tasks of one file in sequence with one cache, typed like a person "
                        "(moves, keystrokes, Enter); next-edit: one change of a commit typed, then the next edit "
                        "asked for (docs/nextedit.md)")
    p.add_argument("--systems", default=None,
                   help="comma-separated; completion: off,ngram,oracle,hf-greedy,hf-prompt-lookup (default all; hf-* "
                        "only on --backend torch); "
                        "keystroke and session: off|ngram, each optionally -noreuse (default ngram,ngram-noreuse); "
                        "session also: ditto, ditto-nodraft, ditto-whole (wholeFile on; each optionally @N: contextTokens N, "
                        "~SOURCE: snippets, +MODEL, then #KEY=VALUE: any initialization option, e.g. ditto#show=sure) and "
                        "llama-server, "
                        "real servers driven as editors drive them (the editor replay); "
                        "next-edit: propagate, rewrite, both (default propagate,rewrite)")
    p.add_argument("--since", default=None, help="only commits after this date (git log --since)")
    p.add_argument("--max-tasks", type=int, default=50,
                   help="tasks at most (session mode: over all sessions; next-edit mode: repeated-change cases, and "
                        "as many ordinary ones)")
    p.add_argument("--per-commit", type=int, default=3,
                   help="tasks taken from one commit at most (default 3; session mode: blocks of one session; "
                        "next-edit mode: cases, one a file)")
    p.add_argument("--rewrite-format", choices=["chat", "repo"], default="chat",
                   help="next-edit mode: the model rewrite's prompt (docs/nextedit.md; default chat)")
    p.add_argument("--lang", default="python", help="comma-separated languages, or all (default python)")
    p.add_argument("--max-keystrokes", type=int, default=None,
                   help="keystroke mode: type at most this many characters per task; session mode: per line, the "
                        "rest of the line is inserted without a request")
    p.add_argument("--no-idle-prefill", action="store_true",
                   help="session mode: no idle prefill where the user arrives (the server does it by default)")
    r = p.add_argument_group("editor replay (session mode, systems ditto* and llama-server)")
    r.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                   help="the checkout whose server the ditto-base system runs (e.g. a git worktree of an older "
                        "commit), at its own defaults")
    r.add_argument("--cores", default="0,1", metavar="A,B",
                   help="Ditto's core and llama-server's core (each server runs pinned there, one thread; default 0,1)")
    r.add_argument("--ditto-threads", type=int, default=1, metavar="N",
                   help="Ditto's servers run N threads, pinned to N cores from Ditto's core on (default 1; a peer "
                        "in the same run then shares cores: compare models or thread counts without it)")
    r.add_argument("--peer-followup", action="store_true",
                   help="llama-server also gets llama.vim's speculative follow-up request after each suggestion "
                        "(off by default)")
    r.add_argument("--pause-scale", type=float, default=1.0, metavar="F",
                   help="multiply the replay's pauses (1.0 s rest at a block, 0.3 s before a line's request) by F")
    r.add_argument("--open-rest", type=float, default=0.0, metavar="SECONDS",
                   help="after opening a session's file, rest this long before the cursor arrives (a developer "
                        "reads a file before typing; both systems: Ditto's idle work, llama.vim's ring updates)")
    r.add_argument("--check-continuations", action="store_true",
                   help="after each Ditto answer given at its deadline (outside the timing), finish that generation "
                        "and compare it with the same generation uninterrupted; the report counts the identical ones. "
                        "It changes what the server has done by the next request: time a run without it")
    r.add_argument("--answer-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="a replay request not answered by then is recorded as a timeout (default 120)")
    p.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens of hf-prompt-lookup (default 10)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop starting new tasks after this long and write what is done")
    p.add_argument("--note", default=None, help="free text stored in meta (e.g. 'CPU shared with other jobs')")
    p.add_argument("--pass-costs", type=Path, default=None, metavar="FILE",
                   help="price the adaptive policy's passes with another device's measured costs: a gpucheck.json "
                        "(docs/perf/data/gpucheck.json, an H200) as its fixed shape of --pass-rows rows, or a JSON "
                        "{n: ms}; the report says so and adds a projection of tokens/s there (ditto_bench/projection.py)")
    p.add_argument("--pass-rows", type=int, default=16, metavar="R",
                   help="with --pass-costs from a gpucheck.json: the fixed shape's rows (default 16: trees of 15 nodes)")
    add_model_args(p)
    add_decode_args(p)  # its --seed seeds the task sample here (bench decodes greedily)



def run(args) -> int:
    if args.mode == "next-edit":
        from ditto_bench.nextedit import run as run_next_edit

        return run_next_edit(args, versions=runinfo.versions(), repo_commit=runinfo.repo_commit(args.repo))
    from ditto_bench.harvest import HarvestError, HarvestOptions, harvest
    from ditto_bench.systems import parse_systems, replay_system
    from lsp_server.commands.options import decode_options, load_model

    opts = decode_options(args)
    try:
        systems = parse_systems(args.systems or ("ngram,ngram-noreuse" if args.mode in ("keystroke", "session")
                                                 else "off,ngram,oracle,hf-greedy,hf-prompt-lookup"), args.mode)
    except ValueError as err:
        raise SystemExit(f"ditto-lsp: error: {err}") from None
    replayed = [s for s in systems if replay_system(s) is not None]  # real servers (session mode only)
    systems = [s for s in systems if s not in replayed]
    if replayed:
        replay_run.replay_cores(args)  # fail early on a bad --cores
    if args.max_tasks < 1:
        raise SystemExit("ditto-lsp: error: --max-tasks must be at least 1")
    if opts.temperature > 0:
        raise SystemExit("ditto-lsp: error: bench compares outputs token for token; it runs greedy only (--temperature 0)")
    budget = runinfo.budget(args.context_tokens, args.mode)
    started = time.time()
    print(f"harvesting tasks from {args.repo} ...", file=sys.stderr)
    session_mode = args.mode == "session"
    try:
        # Session mode groups the tasks of one file and commit: it needs them all before drawing.
        h = harvest(args.repo, HarvestOptions(since=args.since, max_tasks=10**9 if session_mode else args.max_tasks,
                                              seed=args.seed or 0,
                                              languages=tuple(x.strip() for x in args.lang.split(",") if x.strip()),
                                              per_commit=args.per_commit))
    except HarvestError as err:
        raise SystemExit(f"ditto-lsp: {err}") from None
    sessions = []
    if session_mode:
        from ditto_bench.session import build_sessions

        sessions = build_sessions(h.tasks, args.max_tasks, seed=args.seed or 0)
        if not sessions:
            raise SystemExit(f"ditto-lsp: no session in {args.repo}: no commit added two or more blocks to one file "
                             f"(of {len(h.tasks)} tasks); try --per-commit larger, --lang all or an earlier --since")
        h.tasks = [t for s in sessions for t in s.tasks]
        print(f"{len(sessions)} sessions, {len(h.tasks)} tasks ({h.candidates} candidates in {h.commits_scanned} commits; "
              f"skipped {h.commits_skipped})", file=sys.stderr)
    else:
        print(f"{len(h.tasks)} tasks ({h.candidates} candidates in {h.commits_scanned} commits; skipped {h.commits_skipped})",
              file=sys.stderr)
    if not systems:  # only the editor replay: the servers load the model, this process does not
        return replay_run.run_replay_only(args, h, sessions, replayed, started)
    lm = load_model(args)
    if lm.describe()["backend"] != "torch":
        # hf-* run transformers' generate: they exist on the torch backend only.
        hf = [x for x in systems if x.startswith("hf-")]
        if hf and args.systems:
            raise SystemExit(f"ditto-lsp: error: {', '.join(hf)} need --backend torch (this model runs on "
                             f"{lm.describe()['backend']})")
        systems = [x for x in systems if not x.startswith("hf-")]

    from ditto_bench import metrics
    from ditto_bench.runner import Bench
    from lsp_server.completion.build import build_completer
    from lsp_server.completion.completer import CompleterSettings

    settings = CompleterSettings(drafter="ngram", multiline=not args.single_line, budget=budget,
                                 draft_model=args.draft_model)
    # Completion mode asks once per task and position; type-through belongs to typing.
    settings.type_through = args.mode in ("keystroke", "session")
    adaptive = bool(getattr(opts, "adaptive", False))
    # Pass costs for the adaptive draft length, measured afresh as the server does at load:
    # a benchmark must not run on costs stored under another load or thread count.
    completer = build_completer(lm, settings, calibration="fresh" if adaptive else None)
    pass_costs = completer.pass_costs
    priced = None
    if args.pass_costs is not None:
        priced = runinfo.priced(args, completer)
    bench = Bench(lm, completer, opts, lookup_tokens=args.lookup_tokens)
    meta = {
        "mode": args.mode, "repo": str(Path(args.repo).resolve()), "repo_commit": runinfo.repo_commit(args.repo),
        "since": args.since, "seed": args.seed or 0,
        "languages": args.lang, "per_commit": args.per_commit, "systems": systems, "model": lm.name,
        "model_spec": lm.spec, "dtype": lm.describe()["dtype"], "device": lm.describe()["device"],
        "backend": lm.describe()["backend"],
        "machine": runinfo.machine(lm), "versions": runinfo.versions(), "command": shlex.join(["ditto-lsp", *sys.argv[1:]]),
        "max_tokens": opts.max_new_tokens, "draft_max": opts.draft_max, "adaptive": adaptive, "context_tokens": budget.total,
        "budget": {k: getattr(budget, k) for k in ("total", "above", "below", "snippets", "slack", "chunk_lines")},
        "max_keystrokes": args.max_keystrokes, "idle_prefill": not getattr(args, "no_idle_prefill", False), "time_budget_s": opts.time_budget_s,
        "tasks_harvested": len(h.tasks), "candidates": h.candidates, "commits_scanned": h.commits_scanned,
        "commits_skipped": h.commits_skipped, "note": args.note,
    }
    if adaptive:
        meta["pass_costs_ms"] = {str(n): round(ms, 1) for n, ms in pass_costs.items()}
    if priced is not None:
        meta["priced_with"] = priced
    records: list[dict] = []
    done_tasks: list = []
    done_sessions: list = []
    partial, stopped = False, ""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
    t_run = time.perf_counter()
    # Ctrl-C (even in a background job, where SIGINT starts ignored) and SIGTERM stop the
    # run after keeping what is done.
    import signal

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Progress(*columns, transient=False) as progress:
            units = sessions if session_mode else h.tasks
            bar = progress.add_task("warm-up", total=len(units), info="")
            bench.warm_up(h.tasks[0], systems, args.mode)
            progress.update(bar, description=args.mode)
            for unit in units:
                task = unit
                if args.time_limit is not None and time.perf_counter() - t_run > args.time_limit:
                    partial, stopped = True, f"--time-limit {args.time_limit:g}s reached"
                    break
                if session_mode:
                    records.extend(bench.session(unit, systems, args.max_keystrokes,
                                                 idle_prefill=not args.no_idle_prefill))
                    done_tasks.extend(unit.tasks)
                    done_sessions.append(unit)
                elif args.mode == "keystroke":
                    records.extend(bench.keystroke_task(task, systems, args.max_keystrokes))
                else:
                    recs = bench.completion_task(task, systems)
                    records.extend(recs)
                    for r in recs:
                        if r["system"] != "off" and r["identical"] is False:
                            progress.console.print(f"[red]mismatch[/red] {r['task']} {r['system']}: "
                                                   f"{r['text']!r} vs off {r.get('reference_text')!r}")
                if not session_mode:
                    done_tasks.append(task)
                info = _info(records, args.mode)
                progress.update(bar, advance=1, info=info)
                if not progress.console.is_terminal:  # a log file gets one line per task instead of a bar
                    print(f"[{len(done_sessions) if session_mode else len(done_tasks)}/{len(units)} "
                          f"{time.perf_counter() - t_run:.0f}s] {unit.id}  {info}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        partial, stopped = True, "interrupted (Ctrl-C)"
        done = {t.id for t in done_tasks}
        records = [r for r in records if r["task"] in done]  # drop the half-run task
        print(f"\ninterrupted: keeping {len(done_tasks)} finished tasks", file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    replay_records: list[dict] = []
    if replayed and not stopped.startswith("interrupted"):
        # The editor replay's systems after the in-process ones, on the sessions they finished.
        replay_records, meta["replay"], r_done, r_partial, r_stopped = replay_run.run_replay(args, done_sessions, replayed, t_run)
        meta["systems"] = meta["systems"] + replayed
        if r_partial:
            partial, stopped = True, r_stopped
            done_sessions = r_done
            done_tasks = [t for s in r_done for t in s.tasks]
            keep = {t.id for t in done_tasks}
            records = [r for r in records if r["task"] in keep]
    meta.update({"tasks_run": len(done_tasks), "partial": partial, "stopped": stopped,
                 "wall_s": round(time.time() - started, 1)})
    if session_mode:
        meta.update({"sessions_run": len(done_sessions), "sessions": [s.public() for s in done_sessions]})
    if completer.engine.speculation is not None:  # the policy's live estimates at the end (learned costs, rates)
        meta["speculation"] = completer.engine.speculation.snapshot()
    hybrid = next(iter(completer.hybrids()), None)
    if hybrid is not None:
        st = hybrid.stats
        policy = hybrid.policy
        meta["hybrid"] = {"draft_ms": round(policy.draft_ms, 2), "draft_token_ms": round(policy.draft_token_ms, 3),
                          "draft_scale": round(policy.draft_scale, 3), "model_acceptance": round(policy.model_acceptance(), 3),
                          "steps": {"ngram": st.ngram, "model": st.model, "none": st.none}}
    summary = (metrics.summarise_session(records) if session_mode else metrics.summarise_keystroke(records)
               if args.mode == "keystroke" else metrics.summarise_completion(records))
    summary.update(metrics.summarise_replay(replay_records, timeout_ms=args.answer_timeout * 1000))
    results = {"meta": meta, "summary": summary,
               "task_list": [t.public() for t in done_tasks], "tasks": records + replay_records,
               "mismatches": metrics.mismatches(records)}
    if args.mode == "completion":
        mm = results["mismatches"]
        print(f"identical to off: {sum(1 for r in records if r.get('identical')) }/{len(records)} runs"
              + (f"; {len(mm)} mismatches (listed in report.md)" if mm else ""), file=sys.stderr)
    return runinfo.write_results(args, results, stopped)



def _info(records: list[dict], mode: str) -> str:
    from ditto_bench import metrics

    if mode == "session":
        s = metrics.summarise_session(records)
        return "  ".join(f"{k} tts p95 {v['tts_ms_p95_model']:.0f}ms prefill p95 {v['prefill_tokens_p95_model']:.0f}"
                         for k, v in s.items() if v["tts_ms_p95_model"] is not None)
    if mode == "keystroke":
        s = metrics.summarise_keystroke(records)
        return "  ".join(f"{k} tts p50 {v['tts_ms_p50']:.0f}ms" for k, v in s.items() if v["tts_ms_p50"] is not None)
    s = metrics.summarise_completion(records)
    return "  ".join(f"{k} ×{v['speedup_geomean']:.2f}" for k, v in s.items() if k != "off" and v["speedup_geomean"])

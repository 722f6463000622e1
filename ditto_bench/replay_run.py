"""The editor replay as a step of `ditto-lsp bench`: its servers started once, each session replayed on
every replay system in turn, and the run's meta (`meta.replay`).

`run_replay` runs after the in-process session systems on the sessions they finished (or alone:
`run_replay_only`, where this process loads no model). Ctrl-C, SIGTERM, --time-limit or a server that
fails stop it after the last whole session, and what is done is kept.

Left out on purpose: what a replay sends and when (replay.py, replay_script.py, the drivers in
replay_ditto.py and replay_peer.py) and the summaries (metrics.py).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from ditto_bench.runinfo import machine, repo_commit, versions, write_results


def replay_cores(args) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in args.cores.split(","))
    except ValueError:
        raise SystemExit(f"ditto-lsp: error: --cores takes two core numbers A,B (got {args.cores!r})") from None
    n = os.cpu_count() or 1
    if not (0 <= a < n and 0 <= b < n):
        raise SystemExit(f"ditto-lsp: error: --cores {args.cores}: this machine has cores 0-{n - 1}")
    return a, b


def run_replay(args, sessions: list, systems: list[str], t_run: float):
    """Replay `sessions` on each system's real server, session by session (each system in turn).

    Returns (records, meta, sessions done, partial, stopped)."""
    import signal
    import tempfile

    from ditto_bench import metrics
    from ditto_bench.replay import make_drivers, replay_session
    from ditto_bench.replay_ditto import CURSOR_NOTICE_S
    from ditto_bench.replay_script import ANSWER_TIMEOUT_S, IDLE_WAIT_S, LINE_PAUSE_S, REST_S, ReplayOptions, script

    cores = replay_cores(args)
    log_dir = (args.out / "logs") if args.out else Path(tempfile.mkdtemp(prefix="ditto-replay-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    options = ReplayOptions(model=args.model, backend=args.backend, cores=cores, pause_scale=args.pause_scale,
                            followup=args.peer_followup, answer_timeout_s=args.answer_timeout or ANSWER_TIMEOUT_S,
                            log_dir=log_dir, baseline=args.baseline, check_continuations=args.check_continuations,
                            ditto_threads=max(1, args.ditto_threads), repo=str(Path(args.repo).resolve()))
    meta = {"systems": {}, "cores": {"ditto": cores[0], "llama-server": cores[1]}, "threads": options.ditto_threads,
            "pause_scale": args.pause_scale,
            "pauses_s": {"open_rest": args.open_rest, "rest": REST_S, "line": LINE_PAUSE_S, "cursor_notice": CURSOR_NOTICE_S, "idle_wait": IDLE_WAIT_S},
            "followup": args.peer_followup, "answer_timeout_s": options.answer_timeout_s, "logs": str(log_dir),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()], "opened": []}
    records: list[dict] = []
    done: list = []
    partial, stopped = False, ""

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    drivers = []
    try:
        drivers = make_drivers(systems, options)
        for d in drivers:
            print(f"starting {d.system} ...", file=sys.stderr, flush=True)
            d.start()
            meta["systems"][d.system] = d.info
        for i, session in enumerate(sessions):
            if args.time_limit is not None and time.perf_counter() - t_run > args.time_limit:
                partial, stopped = True, f"--time-limit {args.time_limit:g}s reached"
                break
            steps = script(session, open_rest=args.open_rest)
            mine = []
            for d in drivers:
                run = replay_session(d, session, steps)
                mine.extend(run.records)
                meta["opened"].append({"session": session.id, "system": d.system, **run.opened})
            records.extend(mine)
            done.append(session)
            s = metrics.summarise_replay(records, timeout_ms=options.answer_timeout_s * 1000)
            info = "  ".join(f"{k} cold p50 {v['cold']['tts_ms_p50'] or 0:.0f}ms warm p50 {v['warm']['tts_ms_p50'] or 0:.0f}ms"
                             for k, v in s.items())
            print(f"[replay {i + 1}/{len(sessions)} {time.perf_counter() - t_run:.0f}s] {session.id}  {info}",
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        partial, stopped = True, "interrupted (Ctrl-C)"
        print(f"\ninterrupted: keeping {len(done)} finished sessions", file=sys.stderr)
    except Exception as err:  # noqa: BLE001  (a server that died or failed: keep the sessions done)
        import traceback

        traceback.print_exc()
        partial, stopped = True, f"error: {type(err).__name__}: {err}"
        print(f"replay stopped by an error: keeping {len(done)} finished sessions (server logs in {log_dir})",
              file=sys.stderr)
    finally:
        for d in drivers:
            d.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    keep = {s.id for s in done}
    records = [r for r in records if r["session"] in keep]
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return records, meta, done, partial, stopped


def run_replay_only(args, h, sessions: list, systems: list[str], started: float) -> int:
    """Session mode with only the editor replay's systems: no model in this process."""
    from ditto_bench import metrics

    t_run = time.perf_counter()
    records, replay_meta, done, partial, stopped = run_replay(args, sessions, systems, t_run)
    ditto = next((v for k, v in replay_meta["systems"].items() if k != "llama-server"), {})
    meta = {
        "mode": args.mode, "repo": str(Path(args.repo).resolve()), "repo_commit": repo_commit(args.repo), "since": args.since,
        "seed": args.seed or 0, "languages": args.lang, "per_commit": args.per_commit, "systems": systems,
        "model": ditto.get("model") or args.model, "model_spec": args.model, "backend": ditto.get("backend") or args.backend,
        "dtype": ditto.get("dtype"), "device": ditto.get("device") or "cpu", "machine": machine(),
        "versions": versions(), "command": shlex.join(["ditto-lsp", *sys.argv[1:]]),
        "context_tokens": None, "max_tokens": None, "draft_max": None,
        "tasks_harvested": len(h.tasks), "candidates": h.candidates, "commits_scanned": h.commits_scanned,
        "commits_skipped": h.commits_skipped, "note": args.note, "replay": replay_meta,
        "tasks_run": sum(len(s.blocks) for s in done), "partial": partial, "stopped": stopped,
        "wall_s": round(time.time() - started, 1), "sessions_run": len(done), "sessions": [s.public() for s in done],
    }
    results = {"meta": meta, "summary": metrics.summarise_replay(records, timeout_ms=args.answer_timeout * 1000),
               "task_list": [t.public() for s in done for t in s.tasks], "tasks": records, "mismatches": []}
    return write_results(args, results, stopped)


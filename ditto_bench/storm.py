"""Load tests of `ditto-lsp serve`, driven by the raw client of ditto_bench/client.py.

`storm()` is a bounded load test: several documents, thousands of keystrokes at typing
speed and in bursts, an inline request after most of them (so newer requests supersede
older ones), some `$/cancelRequest`s; it stops by itself and reports requests served,
cancelled, superseded and dropped, p50/p99 time to answer, stale model passes, and the
server's RSS and thread count (from /proc) at start, after warm-up and at the end.

    python -m ditto_bench.storm --model tiny-random --edits 300
    python -m ditto_bench.storm --model default --edits 2000 --json storm.json
    python -m ditto_bench.storm --model default --edits 600 --pause-every 40 --options '{"definitions": false}'

`team_storm()` is the load a team makes on one shared engine (docs/team.md): several
clients at once, each its own `ditto-lsp serve` with a remote model spec, typing its own
storm. It reports per client the time to an answer and to a suggestion (p50/p95) and the
requests lost (no answer at all; must be 0), and for the engine its concurrency as the
clients saw it (streams open at once, streams generating at once, from each request's
start, first piece and end). With `--kill-engine-at F` it kills the engine once client 0
has typed fraction F of its keys, restarts it after `--down-s`, and reports how long each
client took after the restart to get a suggestion again, and that no client process died:

    python -m ditto_bench.storm --engine tiny --clients 4 --edits 500 --kill-engine-at 0.4
    python -m ditto_bench.storm --engine tiny --server llama-server --clients 4 --edits 500 --kill-engine-at 0.4
    python -m ditto_bench.storm --model http://gpu:8000/v1#qwen --clients 4 --remote '{"headers": ...}'

Left out on purpose: pygls (this is the other side of the wire), asserting anything
(tests/lsp/test_fuzz_protocol.py and tests/lsp/test_faults.py do that).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

from ditto_bench.client import RawClient, proc_status
from lsp_server.numbers import percentile

# -- the storm ---------------------------------------------------------------------------------

SOURCE = '''import os
import sys


def read_config(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def write_config(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write(line + "\\n")


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()


def main(argv):
    config = read_config(argv[1])
    write_config(argv[2], config)
    return 0
'''


def storm(model: str = "tiny-random", edits: int = 300, docs: int = 4, seed: int = 0, max_tokens: int = 16,
          warmup: int = 20, cancel_every: int = 7, answer_timeout: float = 600.0, log=None,
          server_env: dict | None = None, serve_args: list[str] | tuple = (), on_key=None,
          stderr=None, more=None, max_extra: int = 3000, init_options: dict | None = None,
          pause_every: int = 0, pause_s: float = 0.6) -> dict:
    """Run the storm; returns its figures (see the module docstring).

    `serve_args`: more `ditto-lsp serve` arguments (e.g. --remote JSON); `on_key(i)` is
    called after every key (i counts the warm-up keys too); `more(client)`, asked every 10
    keys once the `edits` are typed, keeps the storm typing while it says True (at most
    `max_extra` keys; the team storm types on until each client has recovered).
    `init_options`: more initializationOptions (e.g. a debug step delay, with --debug-hooks).
    `pause_every`: every this many keys after the warm-up, a pause of `pause_s` (a user who stops to
    think: the server's pause work, such as resolving the prompt's definitions, runs then). The keys
    and requests are the same with and without pauses (the pauses draw nothing from the seed).
    """
    rng = random.Random(seed)
    say = log or (lambda *a: None)
    env = {"OMP_NUM_THREADS": "1", **(server_env or {})}
    c = RawClient(["--model", model, "--max-tokens", str(max_tokens), *serve_args], env=env, stderr=stderr)
    try:
        c.initialize({"maxTokens": max_tokens, **(init_options or {})})
        mem = {"start": proc_status(c.pid)}  # initialized, model not loaded yet
        end = c.wait_ready(timeout=900)
        if end["params"]["value"].get("message") != "ready":
            raise RuntimeError(f"model {model!r} did not load: {c.stats().get('model_error')}")
        uris = [f"file:///tmp/ditto-storm/doc{i}.py" for i in range(docs)]
        text = {}  # uri -> lines
        cursor = {}
        version = {}
        for u in uris:
            c.open(u, SOURCE)
            text[u] = SOURCE.split("\n")
            cursor[u] = (len(text[u]) - 1, 0)
            version[u] = 1
        # What gets typed: lines of the source, so the n-gram drafter has something to copy.
        typed = [ln for ln in SOURCE.split("\n") if ln.strip()]
        sent: dict = {}  # id -> monotonic send time
        cancelled: set = set()
        base = None
        t_start = time.monotonic()
        i = -1
        while True:
            i += 1
            if i >= edits + warmup and (more is None or i >= edits + warmup + max_extra
                                        or ((i - edits - warmup) % 10 == 0 and not more(c))):
                break
            if i == warmup:
                # Warm-up done: wait for its answers, then sample memory and zero the counters.
                for rid in list(sent):
                    c.wait(rid, answer_timeout)
                mem["after_warmup"] = proc_status(c.pid)
                base = c.stats()
                sent.clear()
                cancelled.clear()
                t_start = time.monotonic()
            u = uris[0] if rng.random() < 0.7 else rng.choice(uris)  # mostly one document, as people type
            line, col = cursor[u]
            target = typed[(i // 40) % len(typed)]
            if col >= len(target) or rng.random() < 0.02:  # end of the line typed: a new line
                ln = text[u][line]
                text[u][line:line + 1] = [ln[:col], ln[col:]]
                change = {"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
                          "text": "\n"}
                line, col = line + 1, 0
            elif rng.random() < 0.1 and col > 0:  # backspace
                ln = text[u][line]
                text[u][line] = ln[:col - 1] + ln[col:]
                change = {"range": {"start": {"line": line, "character": col - 1},
                                    "end": {"line": line, "character": col}}, "text": ""}
                col -= 1
            else:
                ch = target[col]
                ln = text[u][line]
                text[u][line] = ln[:col] + ch + ln[col:]
                change = {"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
                          "text": ch}
                col += 1
            cursor[u] = (line, col)
            version[u] += 1
            c.change(u, version[u], [change])
            if rng.random() < 0.9:
                rid = c.inline(u, line, col)
                sent[rid] = time.monotonic()
                if cancel_every and rng.randrange(cancel_every) == 0:
                    c.notify("$/cancelRequest", {"id": rid})
                    cancelled.add(rid)
            # Typing speed (30-150 ms a key) most of the time, bursts (no pause) otherwise.
            if rng.random() < 0.7:
                time.sleep(rng.uniform(0.03, 0.15))
            if pause_every and i > warmup and (i - warmup) % pause_every == 0:
                time.sleep(pause_s)
            if i % 200 == 0:
                say(f"storm: {i}/{edits + warmup} keys, {len(c.responses)} answers")
            if on_key is not None:
                on_key(i)
        t_typed = time.monotonic()
        answers = {}
        dropped = []
        for rid in sent:
            try:
                answers[rid] = c.wait(rid, max(1.0, answer_timeout - (time.monotonic() - t_typed)))
            except TimeoutError:
                dropped.append(rid)
        t_end = time.monotonic()
        mem["end"] = proc_status(c.pid)
        alive = c.proc.poll() is None
        after = c.call("ditto/stats", {"remoteIntervals": True})["result"]
        delta = {k: after[k] - base[k] for k in ("requests", "completed", "empty", "cancelled", "superseded",
                                                 "dropped_stale", "not_ready", "invalid", "errors", "stale_passes")}
        lat = [(c.responses[r][1] - sent[r]) * 1000 for r in answers]
        # Time to suggestion: the answers that carried one (the others were cancelled, superseded or empty).
        lat_items = [(c.responses[r][1] - sent[r]) * 1000 for r, m in answers.items() if m.get("result")]
        with_items = sum(1 for m in answers.values() if m.get("result"))
        wall = time.time() - time.monotonic()  # monotonic -> wall clock (the engine's intervals are wall clock)
        suggestions_at = sorted(round(c.responses[r][1] + wall, 4) for r, m in answers.items() if m.get("result"))
        null = sum(1 for m in answers.values() if "result" in m and m["result"] is None)
        errors = [m["error"] for m in answers.values() if "error" in m]
        cancel_errors = sum(1 for e in errors if e.get("code") == -32800)
        code = c.shutdown_and_exit()
        growth = (mem["end"]["rss_mib"] - mem["after_warmup"]["rss_mib"]) / mem["after_warmup"]["rss_mib"]
        return {
            "model": model, "edits": edits, "extra_keys": i - edits - warmup, "docs": docs, "warmup_keys": warmup, "max_tokens": max_tokens,
            "requests_sent": len(sent), "cancel_sent": len(cancelled), "answered": len(answers),
            "dropped_no_answer": len(dropped), "answered_with_items": with_items, "answered_null": null,
            "answered_cancelled_error": cancel_errors, "answered_other_error": len(errors) - cancel_errors,
            "server": delta, "stale_passes_max": after["stale_passes_max"],
            "worker_pending_max": after["worker_pending_max"],
            "latency_ms": {"p50": percentile(lat, 50, 1), "p95": percentile(lat, 95, 1), "p99": percentile(lat, 99, 1),
                           "max": percentile(lat, 100, 1)},
            "suggestion_latency_ms": {"p50": percentile(lat_items, 50, 1), "p95": percentile(lat_items, 95, 1),
                                      "count": len(lat_items)},
            "definitions": after.get("definitions"), "recent_edits": after.get("recent_edits"), "pause_every": pause_every,
            "remote": after.get("remote"), "alive_until_shutdown": alive, "suggestions_at": suggestions_at,
            "served_latency_ms": after["latency_ms"],
            "typing_s": round(t_typed - t_start, 1), "drain_s": round(t_end - t_typed, 1),
            "memory": mem, "rss_growth_after_warmup": round(growth, 4), "exit_code": code,
        }
    finally:
        c.kill()


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals [start, end) open at one time."""
    events = sorted([(a, 1) for a, b in spans] + [(b, -1) for a, b in spans], key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def team_storm(model: str, clients: int = 4, edits: int = 500, *, engine=None, kill_at: float | None = None,
               down_s: float = 2.0, serve_args: list[str] | tuple = (), seed: int = 0, max_tokens: int = 16,
               warmup: int = 20, log=None, server_env: dict | None = None, keep_intervals: bool = False) -> dict:
    """Several clients, each its own `ditto-lsp serve`, storming one engine at once (module docstring).

    `engine`: a ditto_bench.engines.LlamaCppServer or LlamaServer to kill and restart (with `kill_at`).
    `keep_intervals`: also return each client's requests to the engine as (start, first
    piece, end, outcome) in wall-clock seconds, and the outage's times.
    """
    say = log or (lambda *a: None)
    results: list = [None] * clients
    failures: list = [None] * clients
    events: dict = {}
    outage_thread = None

    def outage():
        events["kill"] = time.time()
        say(f"team storm: killing the engine (pid {engine.proc.pid})")
        engine.kill()
        time.sleep(down_s)
        events["restart_spawn"] = time.time()
        ready = engine.start()
        events["restart_accepting"] = engine.accepting_at  # recovery is measured from here
        events["restart_ready"] = ready
        say(f"team storm: engine accepts connections {events['restart_accepting'] - events['kill']:.1f} s "
            f"after the kill")

    def on_key(i: int) -> None:
        nonlocal outage_thread
        if kill_at is not None and outage_thread is None and i >= warmup + kill_at * edits:
            outage_thread = threading.Thread(target=outage, daemon=True)
            outage_thread.start()

    def recovery(intervals, suggestions_at) -> tuple[float | None, float | None]:
        """(first piece, first suggestion) of one client after the restart, wall clock.

        The restart is the moment the restarted engine accepts connections. The first piece: the
        engine streams to this client again. The first suggestion: the first answer carrying ghost
        text that the client received after that first piece (so that it came from the restarted
        engine, not from type-through of a suggestion shown before the kill).
        """
        t = events.get("restart_accepting")
        if t is None:
            return None, None
        streamed = min((b for _, b, _, _ in intervals if b is not None and b >= t), default=None)
        if streamed is None:
            return None, None
        return streamed, next((s for s in suggestions_at if s >= streamed), None)

    def recovered(c) -> bool:
        """Whether this client had a suggestion from the restarted engine (True when there is no outage)."""
        if kill_at is None:
            return True
        if "restart_accepting" not in events:
            return False
        intervals = c.call("ditto/stats", {"remoteIntervals": True})["result"]["remote"]["intervals"]
        wall = time.time() - time.monotonic()
        got = [t + wall for t in c.result_times()]
        return recovery(intervals, got)[1] is not None

    def client(k: int) -> None:
        try:
            results[k] = storm(model, edits, seed=seed + k, max_tokens=max_tokens, warmup=warmup,
                               serve_args=serve_args, server_env=server_env,
                               on_key=on_key if k == 0 else None, more=lambda c: not recovered(c),
                               log=(lambda m: say(f"client {k}: {m}")) if k == 0 else None)
        except Exception as err:  # reported, never hidden: a client that fails is a finding
            failures[k] = f"{type(err).__name__}: {err}"

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(k,), name=f"storm-client-{k}") for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if outage_thread is not None:
        outage_thread.join()
    spans_open, spans_busy, per_client = [], [], []
    for k, r in enumerate(results):
        if r is None:
            per_client.append({"client": k, "failed": failures[k]})
            continue
        remote = r.get("remote") or {}
        intervals = remote.pop("intervals", []) if isinstance(remote, dict) else []
        spans_open += [(a, c) for a, _, c, _ in intervals]
        spans_busy += [(b, c) for a, b, c, _ in intervals if b is not None]
        if keep_intervals:
            r["intervals"] = intervals
        row = {"client": k, "extra_keys": r["extra_keys"], "requests": r["requests_sent"], "answered": r["answered"],
               "lost": r["dropped_no_answer"], "with_suggestion": r["answered_with_items"],
               "answer_ms": {q: r["latency_ms"][q] for q in ("p50", "p95")},
               "suggestion_ms": {q: r["suggestion_latency_ms"][q] for q in ("p50", "p95")},
               "engine_errors": remote.get("errors"), "exit_code": r["exit_code"],
               "alive_until_shutdown": r["alive_until_shutdown"]}
        if "restart_accepting" in events:
            t = events["restart_accepting"]
            # The engine streams to this client again (a first piece), and the client shows a suggestion
            # again (an answer with ghost text arrived: a request not superseded by the next keystroke
            # before its end; with four clients in one serial engine's queue, that takes a pause in the
            # typing). Both from the moment the restarted engine accepts connections.
            streamed, shown = recovery(intervals, r["suggestions_at"] if keep_intervals else r.pop("suggestions_at"))
            # Ditto's own share before the engine: the first request this client sent it after the restart
            # (the next keystroke's, as nothing is queued or backed off while the engine is down).
            asked = min((a for a, _, _, _ in intervals if a >= t), default=None)
            row["first_request_s_after_restart"] = round(asked - t, 3) if asked is not None else None
            row["streaming_s_after_restart"] = round(streamed - t, 2) if streamed is not None else None
            row["recovered_s_after_restart"] = round(shown - t, 2) if shown is not None else None
        per_client.append(row)
    return {
        "model": model, "clients": clients, "edits_per_client": edits, "max_tokens": max_tokens,
        "wall_s": round(time.time() - t0, 1),
        "lost": sum(row.get("lost", 0) for row in per_client),
        "failed_clients": [row["client"] for row in per_client if "failed" in row or row.get("exit_code") != 0
                           or not row.get("alive_until_shutdown")],
        "engine_concurrency": {"streams_open_at_once_max": most_at_once(spans_open),
                               "streams_generating_at_once_max": most_at_once(spans_busy),
                               "requests": len(spans_open)},
        "outage": ({"down_s": round(events["restart_spawn"] - events["kill"], 2),
                    "spawn_to_accepting_s": round(events["restart_accepting"] - events["restart_spawn"], 2),
                    "accepting_to_models_answer_s": round(events["restart_ready"] - events["restart_accepting"], 2),
                    # When the restarted engine first streamed to any client: its cold start (the first
                    # completions after a start are slow), which every client's recovery includes.
                    "first_piece_after_accepting_s": min((row["streaming_s_after_restart"] for row in per_client
                                                          if row.get("streaming_s_after_restart") is not None),
                                                         default=None)}
                   if "restart_accepting" in events else None),
        "per_client": per_client,
        **({"intervals": [r.get("intervals") if r else None for r in results], "events": events}
           if keep_intervals else {}),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ditto_bench.storm", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--edits", type=int, default=300)
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures to PATH")
    p.add_argument("--options", default=None, metavar="JSON",
                   help='more initializationOptions, e.g. \'{"definitions": false, "recentEdits": false}\'')
    p.add_argument("--pause-every", type=int, default=0, metavar="N",
                   help="a 0.6 s pause every N keys after the warm-up (the server's pause work runs then; default none)")
    g = p.add_argument_group("team (several clients on one engine; docs/team.md)")
    g.add_argument("--clients", type=int, default=None, help="run the team storm with this many clients")
    g.add_argument("--engine", default=None, metavar="tiny|FILE.gguf",
                   help="start an engine on 127.0.0.1 with this GGUF (tiny: the tiny test model) and point --model at it")
    g.add_argument("--server", default="llama-server", choices=["llama-server", "llama-cpp-python"],
                   help="which engine --engine starts: llama.cpp's own llama-server (the xllamacpp wheel, installed "
                        "with the tests; default) or llama-cpp-python's server (needs `pip install "
                        "'llama-cpp-python[server]'`, a source build), each in its own process")
    g.add_argument("--remote", default=None, metavar="JSON", help="the clients' `remote` setting (headers, TLS)")
    g.add_argument("--kill-engine-at", type=float, default=None, metavar="F",
                   help="kill the --engine once client 0 typed this fraction of its keys, then restart it")
    g.add_argument("--down-s", type=float, default=2.0, help="how long the engine stays down (default 2)")
    a = p.parse_args(argv)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if a.clients is not None or a.engine is not None:
        import tempfile

        from ditto_bench.engines import LlamaCppServer, LlamaServer, tiny_text_gguf

        engine = None
        with tempfile.TemporaryDirectory(prefix="ditto-team-storm-") as tmp:
            model = a.model
            if a.engine is not None:
                gguf = tiny_text_gguf(Path(tmp) / "tiny.gguf") if a.engine == "tiny" else Path(a.engine)
                kind = LlamaServer if a.server == "llama-server" else LlamaCppServer
                engine = kind(gguf, log_dir=tmp, n_ctx=4096)
                say(f"starting {engine.name} on {engine.url} with {gguf.name}")
                engine.start()
                model = engine.spec()
            elif a.kill_engine_at is not None:
                raise SystemExit("--kill-engine-at needs --engine (the storm can only restart an engine it started)")
            try:
                out = team_storm(model, a.clients or 1, a.edits, engine=engine, kill_at=a.kill_engine_at,
                                 down_s=a.down_s, serve_args=["--remote", a.remote] if a.remote else [],
                                 seed=a.seed, max_tokens=a.max_tokens, warmup=a.warmup, log=say)
            finally:
                if engine is not None:
                    engine.stop()
            out["engine"] = engine.name if engine is not None else None
    else:
        out = storm(a.model, a.edits, a.docs, a.seed, a.max_tokens, a.warmup, log=say,
                    init_options=json.loads(a.options) if a.options else None, pause_every=a.pause_every)
        out.pop("suggestions_at")
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

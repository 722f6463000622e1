"""A long day in one editor, simulated (issue 26): many buffers opened and closed, thousands of
edits with an inline request after each, against one `ditto-lsp serve`, driven by the raw client
of ditto_bench/client.py. It reports whether the server stays as small and as fast at the end of
the day as it was in its first quarter, and whether what a closed document held goes with it.

    python -m ditto_bench.longday --model tiny-random                    # the full day (~20,000 edits)
    python -m ditto_bench.longday --model tiny-random --edits 600 --buffers 12 --open 6   # a short one

The day: `--buffers` files (slices of this repository's sources, `--lines` lines each), at most
`--open` of them open at once. The user types in one buffer (characters of its own lines, Enter,
backspace), now and then moves to another open one, and every `--churn` edits closes a buffer and
opens another (a new file, or one closed earlier). Every edit is followed by an inline request,
answered before the next key (an editor showing ghost text), and `ditto/trace` gives the model's
share of it: the rest is the request's *overhead*. Sampled `--samples` times: the server's RSS,
`ditto/stats` (its index of the buffers, its KV caches, one per document).

Reported: RSS at the end of each quarter of the day and the end's ratio to the first quarter's;
overhead p50/p95 per quarter; answers lost (none may be); the KV caches and index entries at the
end, after every document is closed (none may be left), and the most seen at once. Figures are
one run's measurements; compare ratios. tests/bench/test_longday.py runs a short day.

Left out on purpose: pygls (the other side of the wire), asserting anything (the test does).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from ditto_bench.bigfiles import text_of
from ditto_bench.client import RawClient, proc_status
from lsp_server.numbers import percentile


def long_day(model: str = "tiny-random", edits: int = 20000, buffers: int = 60, open_max: int = 20,
             lines: int = 300, churn: int = 50, samples: int = 40, seed: int = 0, max_tokens: int = 8,
             serve_args=(), answer_timeout: float = 120.0, log=None) -> dict:
    say = log or (lambda *a: None)
    rng = random.Random(seed)
    c = RawClient(["--model", model, "--max-tokens", str(max_tokens), *serve_args], env={"OMP_NUM_THREADS": "1"})
    try:
        c.initialize({"maxTokens": max_tokens})
        end = c.wait_ready(timeout=900)
        if end["params"]["value"].get("message") != "ready":
            raise RuntimeError(f"model {model!r} did not load: {c.stats().get('model_error')}")
        uris = [f"file:///tmp/ditto-longday/buf{k}.py" for k in range(buffers)]
        texts = {u: text_of(lines=lines, offset=(lines + 1) * k).split("\n") for k, u in enumerate(uris)}
        version = {u: 0 for u in uris}
        cursor = {u: (lines // 2, 0) for u in uris}
        is_open: list[str] = []

        def open_doc(u: str) -> None:
            version[u] += 1
            c.open(u, "\n".join(texts[u]), version=version[u])
            is_open.append(u)

        def close_doc(u: str) -> None:
            c.close_doc(u)
            is_open.remove(u)

        for u in uris[:open_max]:
            open_doc(u)
        active = is_open[0]
        rows: list[dict] = []  # per request: t, ms, overhead_ms
        snaps: list[dict] = []
        lost = 0
        kv_max = index_max = 0
        t0 = time.monotonic()
        for i in range(edits):
            if churn and i and i % churn == 0:  # close a buffer (not the one typed in) and open another
                close_doc(rng.choice([u for u in is_open if u != active]))
                open_doc(rng.choice([u for u in uris if u not in is_open]))
            if rng.random() < 0.03:  # move to another open buffer
                active = rng.choice(is_open)
            ln, col = cursor[active]
            doc = texts[active]
            target = doc[(ln * 7 + i // 40) % len(doc)].strip() or "value = compute(item)"
            r = rng.random()
            if col >= min(len(target), 60) or r < 0.03:  # Enter: a new line
                doc[ln : ln + 1] = [doc[ln][:col], doc[ln][col:]]
                change = {"start": (ln, col), "end": (ln, col), "text": "\n"}
                ln, col = ln + 1, 0
            elif r < 0.12 and col > 0:  # backspace
                doc[ln] = doc[ln][: col - 1] + doc[ln][col:]
                change = {"start": (ln, col - 1), "end": (ln, col), "text": ""}
                col -= 1
            else:
                ch = target[col]
                doc[ln] = doc[ln][:col] + ch + doc[ln][col:]
                change = {"start": (ln, col), "end": (ln, col), "text": ch}
                col += 1
            if ln > len(doc) - 3:  # the end of the file: back to its middle
                ln, col = len(doc) // 2, 0
            cursor[active] = (ln, col)
            version[active] += 1
            (sl, sc), (el, ec) = change["start"], change["end"]
            sent = time.monotonic()
            c.change(active, version[active], [{"range": {"start": {"line": sl, "character": sc},
                                                           "end": {"line": el, "character": ec}},
                                                 "text": change["text"]}])
            rid = c.inline(active, ln, col)
            try:
                c.wait(rid, answer_timeout)
            except TimeoutError:
                lost += 1
                continue
            ms = (c.responses[rid][1] - sent) * 1000
            trace = c.call("ditto/trace", {"uri": active})["result"] or {}
            model_ms = 0.0
            if trace.get("version") == version[active]:
                st = trace.get("stats", {})
                model_ms = float(st.get("prefill_ms", 0.0)) + float(st.get("decode_ms", 0.0))
            rows.append({"t": time.monotonic() - t0, "i": i, "ms": ms, "overhead_ms": ms - model_ms})
            if i % max(1, edits // samples) == 0 or i == edits - 1:
                stats = c.stats()
                kv = (stats.get("kv_cache") or {}).get("keys", 0)
                idx = stats.get("index") or {}
                kv_max, index_max = max(kv_max, kv), max(index_max, idx.get("buffers", 0))
                snaps.append({"i": i, "t": round(time.monotonic() - t0, 1), "rss_mib": proc_status(c.pid)["rss_mib"],
                              "protocol_futures": stats.get("protocol_futures"),
                              "open": len(is_open), "kv_cache_keys": kv, "index_buffers": idx.get("buffers"),
                              "index_mib": round(idx.get("bytes", 0) / 2**20, 1)})
                say(f"long day: {i + 1}/{edits} edits, RSS {snaps[-1]['rss_mib']} MiB, {kv} KV caches, "
                    f"{idx.get('buffers')} buffers indexed")
        typing_s = time.monotonic() - t0
        for u in list(is_open):  # the end of the day: everything closed
            close_doc(u)
        time.sleep(0.5)
        after = c.stats()
        quarters = []
        for q in range(4):
            lo, hi = q * edits / 4, (q + 1) * edits / 4
            part = [r for r in rows if lo <= r["i"] < hi]
            at = [s for s in snaps if s["i"] < hi]
            quarters.append({"edits": len(part), "rss_mib_end": at[-1]["rss_mib"] if at else None,
                             "ms_p50": percentile([r["ms"] for r in part], 50, 1),
                             "overhead_ms_p50": percentile([r["overhead_ms"] for r in part], 50, 1),
                             "overhead_ms_p95": percentile([r["overhead_ms"] for r in part], 95, 1)})
        code = c.shutdown_and_exit()
        q1 = quarters[0]["rss_mib_end"]
        return {
            "model": model, "edits": edits, "buffers": buffers, "open_max": open_max, "lines": lines, "churn": churn,
            "opened": sum(version[u] > 0 for u in uris), "typing_s": round(typing_s, 1),
            "requests": len(rows) + lost, "lost": lost, "quarters": quarters,
            "rss_end_vs_first_quarter": round(snaps[-1]["rss_mib"] / q1, 3) if q1 else None,
            "overhead_p95_last_vs_first_quarter": round(quarters[3]["overhead_ms_p95"] / quarters[0]["overhead_ms_p95"], 2)
            if quarters[0]["overhead_ms_p95"] else None,
            "kv_cache_keys_max": kv_max, "index_buffers_max": index_max,
            "after_closing_all": {"kv_cache": after.get("kv_cache"), "index": after.get("index"),
                                  "open_documents": after.get("open_documents"),
                                  "protocol_futures": after.get("protocol_futures")},
            "samples": snaps, "exit_code": code,
        }
    finally:
        c.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ditto_bench.longday", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--edits", type=int, default=20000)
    p.add_argument("--buffers", type=int, default=60)
    p.add_argument("--open", dest="open_max", type=int, default=20)
    p.add_argument("--lines", type=int, default=300)
    p.add_argument("--churn", type=int, default=50, help="close one buffer and open another every this many edits")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--serve-arg", action="append", default=[], help="one more `ditto-lsp serve` argument")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures to PATH")
    a = p.parse_args(argv)
    out = long_day(a.model, a.edits, a.buffers, a.open_max, a.lines, a.churn, a.samples, a.seed, a.max_tokens,
                   a.serve_arg, log=lambda m: print(m, file=sys.stderr, flush=True))
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

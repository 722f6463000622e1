"""Big inputs against `ditto-lsp serve` (issue 26): a multi-megabyte file, a one-line file,
hundreds of open buffers. Driven by the raw client of ditto_bench/client.py, so what is
measured is the server as an editor sees it.

    python -m ditto_bench.bigfiles --model tiny-random                  # all scenarios
    python -m ditto_bench.bigfiles --model tiny-random --only big,small --json out.json
    python -m ditto_bench.bigfiles --model default --only big,small     # the default model, once

Scenarios:
- `small` / `big`: a 300-line file / a 5 MB file (80,000 lines): didOpen, the first inline
  request, then `--edits` one-character incremental edits on one line in the middle of the
  file, each followed by an inline request. Per edit: the round trip (change sent to answer
  received) and its *overhead*, the round trip less the model's own time (prefill + decode
  of that completion, from `ditto/trace`): what the server spends on a keystroke before and
  after the model runs. On the tiny model the model's time is a few milliseconds.
- `line`: one 300,000-character line; the first inline request.
- `many`: `--buffers` buffers of 300 lines each, opened one after another as fast as the pipe
  takes them, while a request in a small document is made every `--probe-ms`; then every
  buffer visited once with a request. Reports the RSS before the opens and after indexing
  settled, and the longest time a request waited (its overhead) while the buffers were
  indexed. The texts are slices of this repository's own source files.

Every figure is a measurement of one run on this machine; compare ratios within a run.
Left out on purpose: pygls (the other side of the wire), asserting anything.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ditto_bench.client import RawClient, proc_status
from lsp_server.numbers import percentile

ROOT = Path(__file__).resolve().parents[1]


def corpus() -> str:
    """This repository's Python sources, joined (deterministic order), as ASCII (other characters as
    "?": a generated file is ASCII, and one astral character makes Python hold the whole text at 4
    bytes a character, which makes every copy of it 4 times slower)."""
    parts = []
    for pkg in ("lsp_server", "drafters", "ditto_bench", "tests"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts.append(path.read_text(encoding="utf-8"))
    return "\n".join(parts).encode("ascii", "replace").decode("ascii")


def text_of(chars: int | None = None, lines: int | None = None, offset: int = 0) -> str:
    """A slice of the corpus, repeated as needed: `chars` characters or `lines` lines, from line `offset`."""
    src = corpus().split("\n")
    out: list[str] = []
    size = 0
    i = offset
    while (lines is None or len(out) < lines) and (chars is None or size < chars):
        line = src[i % len(src)]
        out.append(line)
        size += len(line) + 1
        i += 1
    return "\n".join(out) + "\n"


class Session:
    """One server and the helpers the scenarios share."""

    def __init__(self, model: str, max_tokens: int, serve_args=(), env=None):
        self.c = RawClient(["--model", model, "--max-tokens", str(max_tokens), *serve_args],
                           env={"OMP_NUM_THREADS": "1", **(env or {})})
        self.c.initialize({"maxTokens": max_tokens})
        end = self.c.wait_ready(timeout=900)
        if end["params"]["value"].get("message") != "ready":
            raise RuntimeError(f"model {model!r} did not load: {self.c.stats().get('model_error')}")
        self.versions: dict[str, int] = {}

    def rss(self) -> float:
        return proc_status(self.c.pid)["rss_mib"]

    def open(self, uri: str, text: str) -> None:
        self.versions[uri] = 1
        self.c.open(uri, text)

    def request(self, uri: str, line: int, col: int, timeout: float = 600) -> dict:
        """An inline request; {ms, model_ms, overhead_ms, answered}."""
        t0 = time.monotonic()
        rid = self.c.inline(uri, line, col)
        self.c.wait(rid, timeout)
        ms = (self.c.responses[rid][1] - t0) * 1000
        return {"ms": ms, **self._model_ms(uri, ms)}

    def edit_and_request(self, uri: str, line: int, col: int, ch: str, timeout: float = 600) -> dict:
        self.versions[uri] += 1
        t0 = time.monotonic()
        self.c.change(uri, self.versions[uri], [{"range": {"start": {"line": line, "character": col},
                                                           "end": {"line": line, "character": col}}, "text": ch}])
        rid = self.c.inline(uri, line, col + len(ch))
        self.c.wait(rid, timeout)
        ms = (self.c.responses[rid][1] - t0) * 1000
        return {"ms": ms, **self._model_ms(uri, ms)}

    def _model_ms(self, uri: str, ms: float) -> dict:
        trace = self.c.call("ditto/trace", {"uri": uri})["result"] or {}
        if trace.get("version") != self.versions.get(uri):  # type-through or no completion: no model time
            return {"model_ms": 0.0, "overhead_ms": ms}
        st = trace.get("stats", {})
        model = float(st.get("prefill_ms", 0.0)) + float(st.get("decode_ms", 0.0))
        return {"model_ms": model, "overhead_ms": ms - model}

    def close(self) -> None:
        try:
            self.c.shutdown_and_exit()
        finally:
            self.c.kill()


def _summary(rows: list[dict]) -> dict:
    out = {}
    for key in ("ms", "overhead_ms", "model_ms"):
        vals = [r[key] for r in rows]
        out[key] = {"p50": percentile(vals, 50, 1), "p95": percentile(vals, 95, 1), "max": percentile(vals, 100, 1)}
    return out


def settle(s: Session, timeout: float = 120.0, probe_uri: str | None = None) -> float:
    """Wait (polling ditto/stats) until the drafter's index has nothing left to do; returns the seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        idx = s.c.stats().get("index") or {}
        if not idx.get("pending", 0):
            break
        time.sleep(0.05)
    return round(time.monotonic() - t0, 2)


def typing(s: Session, uri: str, text: str, edits: int) -> dict:
    """Open `text`, ask once, wait for the index, then type `edits` characters on a new line in its middle."""
    t0 = time.monotonic()
    s.open(uri, text)
    first = s.request(uri, 0, 0)
    first["ms_since_open"] = (time.monotonic() - t0) * 1000
    first["index_settled_s"] = settle(s)
    mid = text.count("\n") // 2
    s.versions[uri] += 1
    s.c.change(uri, s.versions[uri], [{"range": {"start": {"line": mid, "character": 0},
                                                 "end": {"line": mid, "character": 0}}, "text": "\n"}])
    word = "value = compute(items, key=lambda item: item.name) "
    rows = [s.edit_and_request(uri, mid, i, word[i % len(word)]) for i in range(edits)]
    return {"chars": len(text), "lines": text.count("\n"), "first_request": first, "edits": len(rows),
            "edit_and_request": _summary(rows), "rss_mib": s.rss()}


def many(s: Session, buffers: int, probe_ms: float, settle_s: float = 120.0) -> dict:
    """Open `buffers` buffers back to back while probing with requests; then visit each."""
    probe = "file:///tmp/ditto-big/probe.py"
    s.open(probe, text_of(lines=40))
    s.request(probe, 10, 0)
    rss0 = s.rss()
    texts = [text_of(lines=300, offset=301 * k) for k in range(buffers)]
    uris = [f"file:///tmp/ditto-big/buf{k}.py" for k in range(buffers)]
    probes = []
    t0 = time.monotonic()
    next_probe = t0
    for u, t in zip(uris, texts):
        s.open(u, t)
        if time.monotonic() >= next_probe:
            probes.append(s.request(probe, 10, 0))
            next_probe = time.monotonic() + probe_ms / 1000
    opened_s = time.monotonic() - t0
    first_after = s.request(probe, 10, 0)
    # Keep probing until the index has caught up (ditto/stats "index": nothing left to index).
    settle0 = time.monotonic()
    while time.monotonic() - settle0 < settle_s:
        probes.append(s.request(probe, 10, 0))
        idx = s.c.stats().get("index") or {}
        if not idx.get("pending", 0):
            break
        time.sleep(probe_ms / 1000)
    settled_s = time.monotonic() - t0
    rss_settled = s.rss()
    visits = [s.request(u, 150, 0) for u in uris[:: max(1, buffers // 20)]]
    stats = s.c.stats()
    return {"buffers": buffers, "chars": sum(map(len, texts)), "opened_s": round(opened_s, 2),
            "settled_s": round(settled_s, 2), "first_request_after_opens": first_after,
            "probes": len(probes), "probe": _summary(probes + [first_after]),
            "visits": _summary(visits), "rss_mib_before": rss0, "rss_mib_settled": rss_settled,
            "rss_mib_after_visits": s.rss(), "rss_growth_mib": round(rss_settled - rss0, 1),
            "index": stats.get("index"), "cached_keys": stats.get("cached_keys")}


def run(model: str = "tiny-random", only=("small", "big", "line", "many"), edits: int = 30, buffers: int = 200,
        big_chars: int = 5_300_000, probe_ms: float = 100.0, max_tokens: int = 8, serve_args=(), log=None) -> dict:
    say = log or (lambda *a: None)
    out: dict = {"model": model, "max_tokens": max_tokens}
    s = Session(model, max_tokens, serve_args)
    try:
        out["rss_mib_ready"] = s.rss()
        if "small" in only:
            say("small: a 300-line file")
            out["small"] = typing(s, "file:///tmp/ditto-big/small.py", text_of(lines=300), edits)
        if "big" in only:
            say(f"big: a {big_chars / 1e6:.1f} MB file")
            out["big"] = typing(s, "file:///tmp/ditto-big/big.py", text_of(chars=big_chars), edits)
        if "small" in out and "big" in out:
            a, b = out["big"]["edit_and_request"], out["small"]["edit_and_request"]
            out["big_vs_small_overhead_p50"] = round(a["overhead_ms"]["p50"] / max(b["overhead_ms"]["p50"], 1e-9), 2)
            out["big_vs_small_ms_p50"] = round(a["ms"]["p50"] / max(b["ms"]["p50"], 1e-9), 2)
        if "line" in only:
            say("line: a 300,000-character line")
            uri = "file:///tmp/ditto-big/line.py"
            t0 = time.monotonic()
            s.open(uri, "x = [" + "1, " * 99_998 + "]\n")
            first = s.request(uri, 0, 5)
            first["ms_since_open"] = (time.monotonic() - t0) * 1000
            out["line"] = {"first_request": first}
        if "many" in only:
            say(f"many: {buffers} buffers of 300 lines")
            out["many"] = many(s, buffers, probe_ms)
        out["rss_mib_end"] = s.rss()
    finally:
        s.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ditto_bench.bigfiles", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--only", default="small,big,line,many", help="comma-separated: small,big,line,many")
    p.add_argument("--edits", type=int, default=30)
    p.add_argument("--buffers", type=int, default=200)
    p.add_argument("--big-chars", type=int, default=5_300_000)
    p.add_argument("--probe-ms", type=float, default=100.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--serve-arg", action="append", default=[], help="one more `ditto-lsp serve` argument")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures to PATH")
    a = p.parse_args(argv)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    out = run(a.model, tuple(a.only.split(",")), a.edits, a.buffers, a.big_chars, a.probe_ms, a.max_tokens,
              a.serve_arg, log=say)
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

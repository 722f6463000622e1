"""Issue 40's memory check (docs/perf/README.md): 20 open files of 2,000 lines, whole_file on, the
default model on llama.cpp, one thread. RSS after the model is ready, after one file's prefix KV is
filled, after 20 files are open and six of them were filled in turn (the pool's bound: 16,384
tokens); then a request in a file never filled and one in the last file filled.

    taskset -c 0 .venv/bin/python scripts/wholefile_memory.py REPO   # REPO: a checkout whose *.py make the files
"""
import json
import sys
import time
from pathlib import Path

from ditto_bench.client import RawClient, proc_status

src = sorted(Path(sys.argv[1]).rglob("*.py"))
lines = [l for p in src for l in p.read_text(errors="replace").splitlines()]
files = []
for i in range(20):
    start = (i * 2311) % (len(lines) - 2000)
    files.append((f"file:///tmp/wholefile-memory/f{i:02d}.py", "\n".join(lines[start:start + 2000]) + "\n"))
out = {"source_lines": len(lines)}
c = RawClient(["--model", "default", "--backend", "llama.cpp"], env={"OMP_NUM_THREADS": "1", "DITTO_LLAMA_THREADS": "1"})
c.initialize({"wholeFile": True})
c.wait_ready()
time.sleep(2)
out["rss_ready"] = proc_status(c.pid)["rss_mib"]

def aim(uri, line):
    c.notify("ditto/didMoveCursor", {"textDocument": {"uri": uri}, "position": {"line": line, "character": 0}})

def fill_wait(limit=300):
    """Until the fill tokens grew and then stayed put for 5 s (the file filled, or the pool full)."""
    t0, before = time.monotonic(), c.stats()["whole_file"]["fill_tokens"]
    last, since = before, time.monotonic()
    while time.monotonic() - t0 < limit:
        n = c.stats()["whole_file"]["fill_tokens"]
        if n != last:
            last, since = n, time.monotonic()
        elif n > before and time.monotonic() - since >= 5:
            break
        time.sleep(0.25)
    return c.stats()

c.open(*files[0]); aim(files[0][0], 1000)
s = fill_wait()
out["one_file"] = {"rss": proc_status(c.pid)["rss_mib"], "file_prefix": s["kv_cache"]["file_prefix"]}
print(json.dumps(out), flush=True)
for i, (uri, text) in enumerate(files[1:], 1):
    c.open(uri, text)
    if i < 6:
        aim(uri, 1000)
        s = fill_wait()
        print(i, proc_status(c.pid)["rss_mib"], s["kv_cache"]["file_prefix"], flush=True)
time.sleep(3)
s = c.stats()
out["twenty_files"] = {"rss": proc_status(c.pid)["rss_mib"], "file_prefix": s["kv_cache"]["file_prefix"],
                       "open": s.get("open_documents")}
for name, (uri, _), line in (("never_filled", files[19], 1200), ("filled", files[5], 1010)):
    t = time.monotonic()
    c.wait(c.inline(uri, line, 0), timeout=120)
    ms = (time.monotonic() - t) * 1000
    tr = c.call("ditto/trace", {"uri": uri}).get("result") or {}
    out[f"request_{name}"] = {"ms": round(ms), "whole_file": tr.get("whole_file"),
                              "prompt_tokens": tr.get("prompt_tokens"), "prefill_tokens": (tr.get("stats") or {}).get("prefill_tokens")}
out["rss_end"] = proc_status(c.pid)["rss_mib"]
print(json.dumps(out, indent=1))
c.shutdown_and_exit()

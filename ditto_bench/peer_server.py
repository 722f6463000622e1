"""The peer's server: llama.cpp's own `llama-server` from the prebuilt `xllamacpp` wheel (it embeds it).

`PeerServer` runs it in its own process, pinned with `taskset -c CORE`, configured as llama.vim
recommends (`--cache-reuse 256 -ub 1024 -b 1024`) with one thread; `python -m
ditto_bench.peer_server --model FILE.gguf` is that process (it prints `READY <url>` once /health
answers, and stops on SIGTERM or when its stdin closes).

Left out on purpose: the client (peer.py, llama.vim's port) and when requests are sent (the replay).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def start_server(model_path: str, port: int = 0, n_ctx: int = 32768, n_threads: int = 1, n_batch: int = 1024,
                 n_cache_reuse: int = 256, verbosity: int | None = None):
    """llama-server in this process (xllamacpp), as llama.vim recommends (`--cache-reuse 256 -ub 1024
    -b 1024`); speculative decoding is off (its default). Returns (server, base_url); the server
    stops when `server` is freed."""
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = str(model_path)
    p.n_ctx = n_ctx
    if port:
        p.port = port
    p.cpuparams.n_threads = n_threads
    p.cpuparams_batch.n_threads = n_threads
    p.n_cache_reuse = n_cache_reuse
    p.n_batch = n_batch
    p.n_ubatch = n_batch
    if verbosity is not None:
        p.verbosity = verbosity
    server = xllamacpp.Server(p)
    return server, server.listening_address.rstrip("/")


def _wait_health(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=5).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}/health did not answer in {timeout} s") from None
            time.sleep(0.1)


class PeerServer:
    """`python -m ditto_bench.peer_server` in its own process, pinned with `taskset -c core`."""

    def __init__(self, gguf: str | Path, core: int | None = None, n_ctx: int = 32768, threads: int = 1,
                 batch: int = 1024, cache_reuse: int = 256, log_path: str | Path | None = None):
        self.gguf = Path(gguf)
        self.core = core
        self.args = ["--ctx", str(n_ctx), "--threads", str(threads), "--batch", str(batch),
                     "--cache-reuse", str(cache_reuse)]
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    @property
    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "ditto_bench.peer_server", "--model", str(self.gguf), *self.args, "--stdin-eof"]
        return (["taskset", "-c", str(self.core)] if self.core is not None else []) + cmd

    def start(self, timeout: float = 300.0) -> str:
        """Start it; returns its base URL once the model is loaded and /health answers."""
        err = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        line = ready[0] if ready else ""
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"llama-server did not start ({self.gguf}): {self.log_tail()}")
        self.url = line.split()[1]
        return self.url

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 800) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""
        except OSError:
            return ""


def main(argv: list[str] | None = None) -> int:
    """The server process: start llama-server, print `READY <url>`, serve until SIGTERM (or stdin closes)."""
    import signal

    ap = argparse.ArgumentParser(prog="python -m ditto_bench.peer_server", description=main.__doc__)
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=32768, help="n_ctx (llama.vim: --ctx-size 0, the model's 32768)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1024, help="n_batch = n_ubatch (llama.vim: -b 1024 -ub 1024)")
    ap.add_argument("--cache-reuse", type=int, default=256)
    ap.add_argument("--verbosity", type=int, default=None)
    ap.add_argument("--stdin-eof", action="store_true", help="also stop when stdin closes (the parent went away)")
    a = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server, url = start_server(a.model, port=a.port, n_ctx=a.ctx, n_threads=a.threads, n_batch=a.batch,
                               n_cache_reuse=a.cache_reuse, verbosity=a.verbosity)
    _wait_health(url, 600)
    print(f"READY {url}", flush=True)
    if a.stdin_eof:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.wait(0.5):
        pass
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())

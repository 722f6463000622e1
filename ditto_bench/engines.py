"""Real inference engines run on this machine for the benchmark tools: the team storm's engine
(ditto_bench/storm.py `--engine`), killed and restarted to measure recovery.

`LlamaServer` starts llama.cpp's own `llama-server`, which the prebuilt `xllamacpp` wheel embeds
(nothing to compile), on 127.0.0.1 with a GGUF, waits until it answers, and can kill, pause
(SIGSTOP), resume and restart it: `python -m ditto_bench.engines llama-server` runs it in a
process of its own (xllamacpp runs it in-process, and stops it only when the object is freed: a
process can be killed like a real engine's), with `--parallel` slots so that a team's requests
run side by side, an API key where asked, and the same port after every restart (the wheel's
server has no https: tests/support/local_engine.py puts a TLS front before it).
`LlamaCppServer` does the same with llama-cpp-python's server (``python -m llama_cpp.server``),
which no extra installs any more (it builds llama.cpp from source): `pip install
'llama-cpp-python[server]'` first. `tiny_text_gguf` writes the tiny random model
(lsp_server/backends/tiny_gguf.py) with the rows of some tokens set to zero (the output head
is tied, so their logits are 0 and never the argmax among hundreds of random ones): every
token that is not valid UTF-8 on its own (engines drop or replace invalid bytes each in their
own way) and the FIM markers (llama.cpp ends a stream only at end-of-generation tokens and
shows a marker as no text, where Ditto's local engine stops; a trained FIM model does not
write them in a middle). Only such a model can be compared text for text across runtimes.

Left out on purpose: what only tests need (tests/support/local_engine.py: certificates, the
engine's own log read back); anything a user runs in production (docs/team.md names the engines).
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_text_gguf(path: str | Path) -> Path:
    """The tiny random model as a GGUF whose greedy output is valid UTF-8 (module docstring)."""
    import gguf

    from lsp_server.backends.llama.vocab import GGUFVocab
    from lsp_server.backends.tiny_gguf import write_tiny_gguf

    path = Path(path)
    raw = write_tiny_gguf(path.with_suffix(".raw.gguf"))
    vocab = GGUFVocab(raw)
    bad = []
    for t in range(vocab.n_tokens):
        if vocab.is_control(t) and not vocab.is_eog(t):
            bad.append(t)
            continue
        try:
            vocab.piece(t, special=False).decode("utf-8")
        except UnicodeDecodeError:
            bad.append(t)
    vocab.close()
    shutil.copy(raw, path)
    raw.unlink()
    reader = gguf.GGUFReader(str(path), "r+")
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    emb.data[bad, :] = 0
    del reader, emb  # a writable memory map: the change is in the file once it is closed
    return path


class LlamaCppServer:
    """`python -m llama_cpp.server` on 127.0.0.1:port (see the module docstring)."""

    def __init__(self, gguf: str | Path, port: int | None = None, *, alias: str = "tiny", n_ctx: int = 4096,
                 api_key: str | None = None, log_dir: str | Path | None = None, threads: int = 1,
                 interrupt_requests: bool = False, flash_attn: bool = False,
                 tls: tuple[str, str, str] | None = None):
        self.gguf = Path(gguf)
        self.port = port or free_port()
        self.alias = alias
        self.n_ctx = n_ctx
        self.api_key = api_key
        self.threads = threads
        self.interrupt_requests = interrupt_requests
        # Off by default: llama.cpp's CPU flash attention makes a token's logits depend on how the
        # prompt was split into passes (measured on the tiny model: top logit 10.19 in one pass,
        # 10.07 after a 400-token pass, argmax flipped), and this server splits where its prompt
        # cache ends. Without it, any split gives the same logits to ~1e-5.
        self.flash_attn = flash_attn
        self.log_dir = Path(log_dir or self.gguf.parent)
        self.tls = tls  # (certificate, key, CA that signed it): serve https
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.accepting_at: float | None = None  # time.time() the last start first accepted a connection
        self.stdout_path = self.log_dir / f"engine-{self.port}.out"
        self.stderr_path = self.log_dir / f"engine-{self.port}.err"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    def spec(self, tokenizer: str | None = None, engine: str = "llama.cpp") -> str:
        return f"{self.url}#{self.alias}&tokenizer={tokenizer or self.gguf}&engine={engine}"

    name = "llama_cpp.server"

    def command(self) -> list[str]:
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:
            raise RuntimeError("llama_cpp.server needs llama-cpp-python[server] (pip install 'llama-cpp-python[server]', "
                               "a source build), or use llama-server (LlamaServer, the xllamacpp wheel)")
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf), "--host", "127.0.0.1",
               "--port", str(self.port), "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads),
               "--model_alias", self.alias, "--interrupt_requests", str(self.interrupt_requests),
               "--flash_attn", str(self.flash_attn)]
        if self.api_key:
            cmd += ["--api_key", self.api_key]
        if self.tls:
            cmd += ["--ssl_certfile", str(self.tls[0]), "--ssl_keyfile", str(self.tls[1])]
        return cmd

    def start(self, timeout: float = 180.0) -> float:
        """Start it and wait until /v1/models answers; returns time.time() when it did."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the engine is already running")
        cmd = self.command()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(self.threads), **self.env()}
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        self.starts += 1
        self.accepting_at = None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.stderr_tail()}")
            # Polled every 20 ms: the moment it accepts connections is when a restart counts as done
            # (the team storm measures recovery from it). Both servers load the model before they
            # listen, so /v1/models answers right after.
            if self.accepting_at is None and self.accepts():
                self.accepting_at = time.time()
            if self.accepting_at is not None and self.ready():
                return time.time()
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.name} did not answer in {timeout} s: {self.stderr_tail()}")
            time.sleep(0.02)

    def env(self) -> dict[str, str]:
        """Environment variables the engine's process gets besides this one's."""
        return {}

    def accepts(self) -> bool:
        """Whether a TCP connection to the port succeeds (nothing is sent on it)."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def _connection(self, timeout: float):
        if self.tls:
            import ssl

            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout,
                                               context=ssl.create_default_context(cafile=str(self.tls[2])))
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def ready(self) -> bool:
        try:
            conn = self._connection(2)
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            conn.request("GET", "/v1/models", headers=headers)
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections, nothing answers (a stuck engine)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def stderr_tail(self, n: int = 800) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class LlamaServer(LlamaCppServer):
    """llama.cpp's own `llama-server` (from the xllamacpp wheel) on 127.0.0.1:port, in a process of its
    own (`python -m ditto_bench.engines llama-server`): started, killed, paused and restarted as
    LlamaCppServer is. `parallel` slots of `n_ctx` tokens each (llama-server splits its context
    among them); flash attention off, as for LlamaCppServer (llama.cpp's CPU flash attention is
    not split-invariant); `api_key` (handed over in the environment, never on the command line).
    No `tls`: the wheel's server is built without SSL. It prints a timing block ("eval time = ... / N tokens") for
    every completion that ran to its end and "cancel task" for one whose client went away."""

    name = "llama-server"

    def __init__(self, gguf: str | Path, port: int | None = None, *, alias: str = "tiny", n_ctx: int = 4096,
                 parallel: int = 4, log_dir: str | Path | None = None, threads: int = 1, api_key: str | None = None):
        super().__init__(gguf, port, alias=alias, n_ctx=n_ctx, log_dir=log_dir, threads=threads, api_key=api_key)
        self.parallel = parallel

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ditto_bench.engines", "llama-server", "--model", str(self.gguf),
                "--port", str(self.port), "--ctx", str(self.n_ctx * self.parallel), "--parallel", str(self.parallel),
                "--threads", str(self.threads), "--alias", self.alias]

    def env(self) -> dict[str, str]:
        return {_KEY_ENV: self.api_key} if self.api_key else {}


_KEY_ENV = "DITTO_ENGINE_API_KEY"  # the API key LlamaServer's process requires, if set


def serve_llama_server(argv: list[str] | None = None) -> int:
    """The process of LlamaServer: start llama-server in it, then wait for SIGTERM (SIGKILL needs no help)."""
    import argparse
    import threading

    import xllamacpp

    ap = argparse.ArgumentParser(prog="python -m ditto_bench.engines llama-server")
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ctx", type=int, default=16384, help="n_ctx of all slots together")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--alias", default="tiny")
    a = ap.parse_args(argv)
    p = xllamacpp.CommonParams()
    p.model.path = a.model
    p.n_ctx = a.ctx
    p.n_parallel = a.parallel
    p.port = a.port
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = a.threads
    p.model_alias = {a.alias}
    p.flash_attn_type = 0  # off (see LlamaServer)
    p.cache_ram_mib = 256  # the prompt cache kept in RAM (8 GB by default)
    if os.environ.get(_KEY_ENV):
        p.api_keys = [os.environ[_KEY_ENV]]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xllamacpp.Server(p)
    print(f"llama-server listening on {server.listening_address}", file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    del server
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "llama-server":
        raise SystemExit(serve_llama_server(sys.argv[2:]))
    raise SystemExit("usage: python -m ditto_bench.engines llama-server --model GGUF --port PORT [...]")

"""The local test engine: llama.cpp's own llama-server from the prebuilt xllamacpp wheel, as the tests drive it.

For the remote-backend tests (tests/backends/test_remote.py): the engine of ditto_bench/engines.py
(`LlamaServer`: started, killed, paused, restarted) plus what tests read back from it. llama-server
prints a timing block ("eval time = ... / N tokens") after every completion that ran to its end,
and "cancel task" when it drops a task whose client went away; the tests count those to prove
that a closed connection stops generation. `test_certificates` makes an https engine's
certificates and `TlsFront` serves https before the engine (the wheel's llama-server is built
without SSL): a TLS socket on its own port whose bytes go to and from the engine unchanged.

Left out on purpose: starting and stopping the engine (ditto_bench/engines.py).
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import threading
from pathlib import Path

from ditto_bench.engines import LlamaServer as _Engine
from ditto_bench.engines import free_port, tiny_text_gguf  # noqa: F401  (the tests' names for them)


def test_certificates(directory: str | Path) -> tuple[Path, Path, Path]:
    """(certificate, key, CA) for https on 127.0.0.1, made with the openssl command (tests only)."""
    d = Path(directory)
    ca_key, ca, key, csr, cert, ext = (d / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem",
                                                       "san.cnf"))
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
        "-subj", "/CN=ditto test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-out", str(cert),
        "-days", "2", "-extfile", str(ext))
    return cert, key, ca



class LlamaServer(_Engine):
    """The team storm's engine (ditto_bench/engines.py) with what tests read back: a completion sent
    straight to it, and what it printed about the completions it ran and the tasks it dropped.
    One slot by default: requests run one at a time, as a busy engine answers them."""

    def __init__(self, gguf, port=None, *, parallel: int = 1, **kw):
        super().__init__(gguf, port, parallel=parallel, **kw)

    def complete_directly(self, max_tokens: int, prompt: str = "def f():\n") -> dict:
        """A plain completion sent straight to the engine (not through Ditto): an anchor in its output."""
        conn = self._connection(120)
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"}
                                                           if self.api_key else {})}
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "logit_bias": {str(t): -100.0 for t in range(6)}}  # the tiny model's special tokens
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        out = json.loads(resp.read())
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"engine answered {resp.status}: {out}")
        return out

    # -- what the engine printed ------------------------------------------------------------
    def _log(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def completions_run(self) -> list[int]:
        """Tokens generated ("eval time = ... / N tokens") of every completion that ran to its end, in order."""
        return [int(n) for n in re.findall(r"print_timing: .*\|\s+eval time =.*?/\s*(\d+) tokens", self._log())]

    def disconnects(self) -> int:
        """Tasks the server dropped because the client went away ("cancel task")."""
        return len(re.findall(r"cancel task, id_task = \d+", self._log()))


class TlsFront:
    """https on 127.0.0.1:port with `cert`/`key`, each connection piped to `engine`'s plain port."""

    def __init__(self, engine: _Engine, cert: Path, key: Path):
        self.engine = engine
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert), str(key))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def spec(self) -> str:
        return self.engine.spec().replace(f"http://127.0.0.1:{self.engine.port}/", f"https://127.0.0.1:{self.port}/", 1)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):  # a client that does not trust the certificate: what a test wants
            conn.close()
            return
        plain = socket.create_connection(("127.0.0.1", self.engine.port))
        threading.Thread(target=self._pipe, args=(plain, tls), daemon=True).start()
        self._pipe(tls, plain)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.sock.close()

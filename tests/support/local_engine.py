"""The local test engine: llama-cpp-python's OpenAI-compatible server, as the tests drive it.

For the remote-backend tests (tests/backends/test_remote.py): the engine of ditto_bench/engines.py
(started, killed, paused, restarted) plus what tests read back from it. llama.cpp prints a
timing block ("eval time = ... / N runs") after every completion that ran to its end, and the
server prints "disconnected" when it drops a stream whose client went away; the tests count
those to prove that a closed connection stops generation. `test_certificates` makes an
https engine's certificates.

Left out on purpose: starting and stopping the engine (ditto_bench/engines.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from ditto_bench.engines import LlamaCppServer as _Engine
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



class LlamaCppServer(_Engine):
    """The team storm's engine (ditto_bench/engines.py) with what tests read back: a completion sent
    straight to it, and what it printed about the completions it ran and the streams it dropped."""

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
    def completions_run(self) -> list[int]:
        """Tokens generated ("eval ... / N runs") of every completion that ran to its end, in order."""
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return [int(n) for n in re.findall(r"^llama_perf_context_print:\s+eval time =.*?/\s*(\d+) runs", text, re.M)]

    def requests_started(self) -> int:
        """Completion requests whose response has begun (uvicorn's access log line)."""
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return len(re.findall(r'"POST /v1/completions HTTP/1.1" 200', text))

    def disconnects(self) -> int:
        """Streams the server dropped because the client went away."""
        text = self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""
        return len(re.findall(r"^disconnected$", text, re.M))

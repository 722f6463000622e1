"""Security: loopback-only TCP, no files read beyond the opened ones and the model's, no code
from a model directory, no network for a local model.

- `--tcp` binds 127.0.0.1 unless `--host` says otherwise, and `--help` says so.
- Files: a URI that exists on disk but was never opened is answered None and its content
  never appears; under strace (when ptrace works here) the server opens neither that file
  nor the opened documents' paths.
- `trust_remote_code`: a model directory whose config.json maps AutoConfig /
  AutoModelForCausalLM / AutoTokenizer to its own Python files (which would write a
  marker file on import) is refused with a one-line ModelError and the marker is never
  written; with trust_remote_code=True the same directory does run its code (so the
  test can tell).
- Debug hooks: without `serve --debug-hooks`, a client sending the debug* settings (and
  `debugHooks` itself) gets them ignored with one warning per message in the log:
  ditto/debug/document stays off, model passes are neither slowed, announced nor failed.
- Network: loading a local model directory and completing with it make no socket
  connection (socket.connect patched to fail in-process); `model.py` passes
  `local_files_only=True` for directories, so only a hub id the user named can reach
  the network.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from ditto_bench.client import SERVE, RawClient  # noqa: E402

TIMEOUT = 60
ENV = {"OMP_NUM_THREADS": "1"}


# -- TCP -------------------------------------------------------------------------------------------

def test_help_says_tcp_binds_loopback():
    out = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=TIMEOUT).stdout
    assert "127.0.0.1" in " ".join(out.split())


def listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) in LISTEN state on `port`."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(name):
            continue
        for row in Path(name).read_text().splitlines()[1:]:
            cols = row.split()
            addr, hexport = cols[1].split(":")
            if int(hexport, 16) == port and cols[3] == "0A":
                found.append(addr)
    return found


def test_tcp_binds_127_0_0_1_by_default():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*SERVE, "--model", "tiny-random", "--tcp", str(port)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **ENV})
    try:
        # Connecting is the readiness signal (there is no other event to await): bounded retries.
        conn = None
        for _ in range(300):
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.1)
        assert conn is not None, "the server never listened"
        with conn:
            assert listening(port) == ["0100007F"]  # 127.0.0.1 only, not 0.0.0.0 / ::
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                               "params": {"processId": None, "rootUri": None, "capabilities": {}}}).encode()
            conn.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            conn.settimeout(TIMEOUT)
            data = b""
            while b"capabilities" not in data:
                chunk = conn.recv(65536)
                assert chunk, "connection closed"
                data += chunk
    finally:
        proc.kill()
        proc.wait(TIMEOUT)


def test_host_without_tcp_is_refused():
    r = subprocess.run([*SERVE, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=TIMEOUT,
                       stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "--host needs --tcp" in r.stderr


# -- files ---------------------------------------------------------------------------------------------

SECRET = "SECRET_TOKEN_4f7a9c"


def file_probe(tmp_path: Path, wrapper: list[str]):
    secret = tmp_path / "secret.py"
    secret.write_text(f"API_KEY = '{SECRET}'\n" * 20)
    opened = tmp_path / "opened.py"
    opened.write_text(f"ON_DISK = '{SECRET}'\n")
    c = RawClient(["--model", "tiny-random", "--max-tokens", "8", "--debug-hooks"], env=ENV)
    if wrapper:
        c.kill()
        import ditto_bench.client as storm

        saved = storm.SERVE
        storm.SERVE = [*wrapper, *saved]
        try:
            c = RawClient(["--model", "tiny-random", "--max-tokens", "8", "--debug-hooks"], env=ENV)
        finally:
            storm.SERVE = saved
    try:
        c.initialize({"debugDocuments": True})
        assert c.wait_ready(TIMEOUT)["params"]["value"]["message"] == "ready"
        c.open(opened.as_uri(), "def f(x):\n    return x\n\n")
        answers = [c.wait(c.inline(secret.as_uri(), 0, 5), TIMEOUT),
                   c.wait(c.request("textDocument/completion", {"textDocument": {"uri": secret.as_uri()},
                                                                "position": {"line": 0, "character": 5}}), TIMEOUT),
                   c.wait(c.request("ditto/trace", {"uri": secret.as_uri()}), TIMEOUT),
                   c.wait(c.request("ditto/debug/document", {"uri": secret.as_uri()}), TIMEOUT),
                   c.wait(c.inline(opened.as_uri(), 2, 0, invoked=True), TIMEOUT)]
        assert [a.get("result") for a in answers[:4]] == [None] * 4
        everything = json.dumps([*answers, c.notifications])
        assert SECRET not in everything and "API_KEY" not in everything and "ON_DISK" not in everything
        assert c.stats()["invalid"] == 2
        assert c.shutdown_and_exit() == 0
    finally:
        c.kill()
    return secret, opened


def test_a_never_opened_file_on_disk_is_not_read(tmp_path):
    file_probe(tmp_path, [])


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_under_strace_the_server_opens_no_user_file(tmp_path):
    trace = tmp_path / "openat.txt"
    ok = subprocess.run(["strace", "-f", "-e", "trace=openat", "-o", os.devnull, "true"], capture_output=True)
    if ok.returncode != 0:
        pytest.skip("ptrace is not permitted here")
    secret, opened = file_probe(tmp_path, ["strace", "-f", "-qq", "-e", "trace=openat,open,stat,newfstatat",
                                           "-o", str(trace)])
    log = trace.read_text()
    assert "openat(" in log  # the trace did record opens (of python's own files)
    assert str(secret) not in log and str(opened) not in log


# -- debug hooks ---------------------------------------------------------------------------------------------

DEBUG = {"debugDocuments": True, "debugFailForward": True, "debugNotifySteps": True, "debugStepDelayMs": 1,
         "debugHooks": True}
CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    "


@pytest.mark.parametrize("hooks", [False, True], ids=["plain-serve", "serve-debug-hooks"])
def test_a_client_turns_on_debug_hooks_only_when_serve_has_debug_hooks(tmp_path, hooks):
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        c = RawClient(["--model", "tiny-random", "--max-tokens", "4", *(["--debug-hooks"] if hooks else [])],
                      env=ENV, stderr=stderr)
    try:
        c.initialize(DEBUG)
        assert c.wait_ready(TIMEOUT)["params"]["value"]["message"] == "ready"
        c.notify("workspace/didChangeConfiguration", {"settings": {"ditto": DEBUG}})
        uri = "file:///tmp/ditto-security/debug.py"
        c.open(uri, CODE)
        doc = c.call("ditto/debug/document", {"uri": uri}, TIMEOUT)
        answer = c.wait(c.inline(uri, 5, 4), TIMEOUT)
        steps = [m for m in c.notifications if m["method"] == "ditto/debug/step"]
        if hooks:  # the control: the same client does reach every hook
            assert doc["result"]["text"] == CODE
            assert "out of memory" in answer["error"]["message"] and steps
        else:
            assert doc["error"]["code"] == -32601  # MethodNotFound: debugDocuments stayed off
            assert "error" not in answer and not steps  # no failing, no announced passes
            assert c.stats()["errors"] == 0
        assert not [m for m in c.notifications if m["method"] == "window/showMessage"]
        assert c.shutdown_and_exit() == 0
    finally:
        c.kill()
    warnings = [line for line in err.read_text().splitlines() if "WARNING" in line and "--debug-hooks" in line]
    assert len(warnings) == 2, warnings  # one per message: initializationOptions, didChangeConfiguration
    refused = ["debugHooks"] if hooks else list(DEBUG)
    for line in warnings:
        assert f"ignored {', '.join(refused)} in " in line, line


# -- code from a model directory -----------------------------------------------------------------------------

def malicious_model_dir(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "PWNED"
    d = tmp_path / "evil-model"
    d.mkdir()
    payload = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    (d / "configuration_evil.py").write_text(payload + "from transformers import PretrainedConfig\n"
                                             "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    (d / "modeling_evil.py").write_text(payload)
    (d / "tokenization_evil.py").write_text(payload)
    (d / "config.json").write_text(json.dumps({
        "model_type": "evil", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                     "AutoModelForCausalLM": "modeling_evil.EvilModel"}}))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}, "tokenizer_class": "EvilTokenizer"}))
    return d, marker


def test_a_model_directory_s_own_code_never_runs_unless_trusted(tmp_path, monkeypatch):
    from lsp_server.backends import loader as model
    from lsp_server.backends.base import ModelError

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    d, marker = malicious_model_dir(tmp_path)
    with pytest.raises(ModelError) as info:
        model.load(str(d), device="cpu")
    assert "\n" not in str(info.value) and str(d) in str(info.value)
    assert not marker.exists()
    # The same directory with trust_remote_code: its code does run (the check above can fail).
    with pytest.raises(Exception):
        model.load(str(d), device="cpu", trust_remote_code=True)
    assert marker.exists()


# -- network ------------------------------------------------------------------------------------------------

def test_a_local_model_loads_and_completes_without_any_socket_connection(tmp_path, monkeypatch):
    import torch

    from lsp_server.backends import loader as model
    from lsp_server.backends.base import ModelError
    from lsp_server.completion.completer import Completer
    from lsp_server.decoding.types import DecodeOptions

    torch.set_num_threads(1)
    from lsp_server.backends.tiny import tiny_random

    tiny = tiny_random()
    d = tmp_path / "tiny-local"
    tiny.save_pretrained(d)
    attempts = []

    def refuse(self, address, *a, **k):
        attempts.append(address)
        raise OSError("network access attempted by a test that forbids it")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for spec in (str(d), "tiny-random"):
        lm = model.load(spec, device="cpu")
        sug = Completer(lm).complete("def add(a, b):\n    ", 1, 4, name="/project/a.py",
                                     options=DecodeOptions(max_new_tokens=4))
        assert sug is not None
    assert attempts == []

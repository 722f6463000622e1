"""A raw JSON-RPC client for `ditto-lsp serve`: what the storm and the session replay drive.

`RawClient` speaks LSP framing over a subprocess's stdin/stdout with no LSP library in
between, so the tools (and the protocol tests) can send what a real client never would
(invalid JSON, wrong types, requests before `initialize`). A reader thread files every
message; `wait()` blocks on a condition until the answer with that id arrives, with a
timeout. `proc_status` reads a process's RSS and thread count from /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

SERVE = [sys.executable, "-m", "lsp_server.cli", "serve"]


class RawClient:
    """One `ditto-lsp serve` process and the messages it sent."""

    def __init__(self, args: list[str], env: dict | None = None, stderr=None, cwd: str | None = None,
                 command: list[str] | None = None):
        """`command` runs instead of `ditto-lsp serve` (`args` follow it): a test's own launcher."""
        self.proc = subprocess.Popen([*(command or SERVE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr if stderr is not None else subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, cwd=cwd)
        self.pid = self.proc.pid
        self.responses: dict = {}  # id -> (message, monotonic time received)
        self.notifications: list[dict] = []
        self.server_requests: list[dict] = []
        self.closed = False  # the server closed its stdout
        self._cond = threading.Condition()
        self._ids = 0
        self._write_lock = threading.Lock()
        self._id_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    # -- wire -----------------------------------------------------------------------------
    def send_bytes(self, body: bytes) -> None:
        with self._write_lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.proc.stdin.flush()

    def send(self, message: dict) -> None:
        self.send_bytes(json.dumps(message).encode("utf-8"))

    def _read(self) -> None:
        out = self.proc.stdout
        try:
            while True:
                length = None
                while True:
                    line = out.readline()
                    if not line:
                        return
                    line = line.strip()
                    if not line:
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = out.read(length or 0)
                if len(body) < (length or 0):
                    return
                msg = json.loads(body)
                self._file(msg)
        finally:
            with self._cond:
                self.closed = True
                self._cond.notify_all()

    def _file(self, msg: dict) -> None:
        now = time.monotonic()
        if "method" in msg and "id" in msg:  # a request from the server: accept it
            self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            with self._cond:
                self.server_requests.append(msg)
                self._cond.notify_all()
        elif "method" in msg:
            with self._cond:
                self.notifications.append(msg)
                self._cond.notify_all()
        else:
            with self._cond:
                self.responses[msg.get("id")] = (msg, now)
                self._cond.notify_all()

    # -- requests ---------------------------------------------------------------------------
    def request(self, method: str, params=None, msg_id=None):
        """Send a request; returns its id (answers arrive in `responses`)."""
        if msg_id is None:
            with self._id_lock:
                self._ids += 1
                msg_id = self._ids
        msg = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return msg_id

    def notify(self, method: str, params=None) -> None:
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def wait(self, msg_id, timeout: float = 60.0) -> dict:
        """The answer to request `msg_id`; TimeoutError if none comes, EOFError if the server went away."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while msg_id not in self.responses:
                if self.closed:
                    raise EOFError(f"the server closed its output before answering request {msg_id!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer to request {msg_id!r} in {timeout} s")
                self._cond.wait(left)
            return self.responses[msg_id][0]

    def result_times(self) -> list[float]:
        """When (time.monotonic()) each answer that carried a result arrived, in order."""
        with self._cond:
            return sorted(t for m, t in self.responses.values() if m.get("result"))

    def call(self, method: str, params=None, timeout: float = 60.0) -> dict:
        return self.wait(self.request(method, params), timeout)

    def wait_notification(self, pred, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for msg in self.notifications[seen:]:
                    if pred(msg):
                        return msg
                seen = len(self.notifications)
                if self.closed:
                    raise EOFError("the server closed its output")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching notification in {timeout} s")
                self._cond.wait(left)

    # -- session ----------------------------------------------------------------------------
    def initialize(self, options: dict | None = None, progress: bool = True, timeout: float = 60.0,
                   root: str | None = None) -> dict:
        """`root`: the workspace's root URI (an editor's open folder), also sent as its one workspace folder."""
        caps = {"window": {"workDoneProgress": progress}}
        params = {"processId": os.getpid(), "rootUri": root, "capabilities": caps, "initializationOptions": options or {}}
        if root:
            params["workspaceFolders"] = [{"uri": root, "name": Path(root).name or "workspace"}]
        answer = self.call("initialize", params, timeout)
        self.notify("initialized", {})
        return answer

    def wait_ready(self, timeout: float = 300.0) -> dict:
        """Wait for the model load's end of progress; returns it (message 'ready' or 'failed')."""
        return self.wait_notification(
            lambda m: m.get("method") == "$/progress" and m["params"]["value"].get("kind") == "end", timeout)

    def stats(self, timeout: float = 60.0) -> dict:
        return self.call("ditto/stats", {}, timeout)["result"]

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python",
                                                              "version": version, "text": text}})

    def change(self, uri: str, version: int, changes: list[dict]) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": changes})

    def close_doc(self, uri: str) -> None:
        self.notify("textDocument/didClose", {"textDocument": {"uri": uri}})

    def inline(self, uri: str, line: int, character: int, invoked: bool = False):
        return self.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 1 if invoked else 2}})

    def shutdown_and_exit(self, timeout: float = 30.0) -> int:
        self.call("shutdown", None, timeout)
        self.notify("exit")
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def proc_status(pid: int) -> dict:
    """RSS (MiB) and thread count of a process, from /proc/<pid>/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return {"rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "threads": int(fields["Threads"])}



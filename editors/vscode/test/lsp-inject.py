"""Stands between VS Code and `ditto-lsp serve` in test/e2e.sh's ghost-text scenario, to end the server's
slow model load (`--debug-hooks --debug-load-delay`) when the driver says so rather than after a fixed
time: the driver types while the model loads, however long a busy machine takes to get there, then
creates TRIGGER; this then sends the server `workspace/didChangeConfiguration {"debugLoadDelayS": 0}`
(the hook's own way to end the delay, as tests/editors/test_editor_nvim_plugin.py sends it from Neovim).

    python3 lsp-inject.py TRIGGER DITTO_LSP serve ARGS...

The server's stdout and stderr are its own (inherited); its stdin is relayed message by message, so the
one message added goes between two of the editor's, after its `initialized` notification.
Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time


def read_message(stream) -> bytes | None:
    """One LSP message (its headers and body, as read), or None at the end of the stream."""
    raw, length = b"", None
    while True:
        line = stream.readline()
        if not line:
            return None
        raw += line
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("ascii", "replace").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return raw + stream.read(length or 0)


def is_initialized(msg: bytes) -> bool:
    """Whether `msg` is the editor's `initialized` notification."""
    _, _, body = msg.partition(b"\r\n\r\n")
    try:
        return json.loads(body).get("method") == "initialized"
    except (ValueError, AttributeError):
        return False


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def main() -> int:
    trigger, command = sys.argv[1], sys.argv[2:]
    server = subprocess.Popen(command, stdin=subprocess.PIPE)
    lock = threading.Lock()
    initialized = threading.Event()

    def relay() -> None:
        src = sys.stdin.buffer
        while (msg := read_message(src)) is not None:
            try:
                with lock:
                    server.stdin.write(msg)
                    server.stdin.flush()
            except (BrokenPipeError, ValueError):
                return
            if not initialized.is_set() and is_initialized(msg):
                initialized.set()
        server.stdin.close()

    def inject() -> None:
        initialized.wait()
        while not os.path.exists(trigger):  # the driver's signal: polled, it comes once
            if server.poll() is not None:
                return
            time.sleep(0.1)
        note = {"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration",
                "params": {"settings": {"debugLoadDelayS": 0}}}
        try:
            with lock:
                server.stdin.write(frame(note))
                server.stdin.flush()
        except (BrokenPipeError, ValueError):  # the server has gone (the editor stopped it)
            return
        print("lsp-inject: the model may load now (debugLoadDelayS: 0)", file=sys.stderr, flush=True)

    threading.Thread(target=relay, daemon=True).start()
    threading.Thread(target=inject, daemon=True).start()
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())

"""One streaming HTTP request to an engine, abortable from another thread (cancel, supersede,
time budget), with the engine's failures turned into `RemoteError`s of a few kinds.
"""

from __future__ import annotations

import errno
import http.client
import json
import logging
import os
import select
import socket
import ssl
import threading
import time
from typing import Callable

from lsp_server.backends.remote.spec import Endpoint
from lsp_server.backends.remote.transport import Transport

log = logging.getLogger(__name__)


RESYN_S = 0.25  # while a connection attempt goes unanswered, start a fresh one this often (Request._connect_to)
RESYN_MAX = 8
READ_TIMEOUT_S = 60.0  # the longest wait for the next byte when no time budget bounds a request


class RemoteError(Exception):
    """The engine could not give a completion. `kind` groups errors for reporting once per outage."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Stop(Exception):
    """The request was ended on purpose (cancelled, out of time, stop rule); `reason` says which."""


class Request:
    """One streaming request; `abort()` from another thread closes its socket."""

    def __init__(self, ep: Endpoint, tr: Transport, cancel: threading.Event, deadline: float | None):
        self.ep, self.tr, self.cancel, self.deadline = ep, tr, cancel, deadline
        self.reason: str | None = None  # why it was aborted
        self.answered = False  # the engine sent a 200 response (it is up, whatever happens next)
        self.attempts = 0  # connection attempts started (a fresh one every RESYN_S while none is answered)
        self._sock = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ditto-remote-watch", daemon=True)

    # -- aborting ------------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        """Close the connection: the engine sees the client gone and stops generating."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _watch(self) -> None:
        # Polls: a threading.Event cannot wake two waiters on different events. 20 ms is
        # well under a keystroke and costs nothing while no request is open.
        while not self._finished.wait(0.02):
            if self.cancel.is_set():
                self.abort("cancelled")
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.abort("time")

    def _check(self) -> None:
        if self.reason is not None:
            raise Stop(self.reason)

    # -- connecting ----------------------------------------------------------------------
    def _connect(self):
        ep, tr = self.ep, self.tr
        limit = tr.connect_timeout_s
        if self.deadline is not None:
            limit = min(limit, max(0.05, self.deadline - time.monotonic()))
        give_up = time.monotonic() + limit
        try:
            infos = socket.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)
        except socket.gaierror as err:
            raise RemoteError("unreachable", f"cannot resolve {ep.host}: {err.strerror}") from None
        last = "no address"
        for family, kind, proto, _, addr in infos:
            sock, err = self._connect_to(family, kind, proto, addr, give_up, limit)
            if sock is not None:
                return sock
            last = os.strerror(err)
        raise RemoteError("unreachable", f"cannot connect to {ep.origin}: {last}")

    def _connect_to(self, family, kind, proto, addr, give_up: float, limit: float):
        """(connected socket, 0) or (None, errno) for one address; RemoteError when out of time.

        An attempt the host does not answer (a SYN dropped: the host is rebooting, a firewall, a
        full accept queue) is only retried by the kernel 1, 3, 7 s later. So while attempts wait,
        a fresh one starts every RESYN_S (at most RESYN_MAX at once) and the first to connect
        wins: an engine that comes back is reached within RESYN_S, not at the kernel's next
        retransmission. A refusal ends the attempts at once (the host is there, nothing listens).
        """
        pending: list = []
        next_try = time.monotonic()
        try:
            while True:
                if self.reason is not None:
                    raise Stop(self.reason)
                now = time.monotonic()
                if now >= next_try and len(pending) < RESYN_MAX:
                    sock = socket.socket(family, kind, proto)
                    sock.setblocking(False)
                    pending.append(sock)
                    with self._lock:
                        self._sock = sock
                    self.attempts += 1
                    err = sock.connect_ex(addr)
                    next_try = now + RESYN_S
                    if err == 0:
                        pending.remove(sock)
                        sock.setblocking(True)
                        return sock, 0
                    if err not in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
                        return None, err
                left = give_up - now
                if left <= 0:
                    raise RemoteError("timeout", f"cannot connect to {self.ep.origin} within {limit:.1f} s")
                _, ready, bad = select.select([], pending, pending, min(0.02, left))  # 20 ms: see abort
                for sock in dict.fromkeys(ready + bad):
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err == 0:
                        pending.remove(sock)
                        with self._lock:
                            self._sock = sock
                        sock.setblocking(True)
                        return sock, 0
                    return None, err
        finally:
            for sock in pending:  # the attempts that lost (or all of them)
                sock.close()

    def _tls(self, sock):
        tr = self.tr
        ctx = ssl.create_default_context(cafile=os.path.expanduser(tr.ca_file) if tr.ca_file else None)
        if tr.cert_file:
            ctx.load_cert_chain(os.path.expanduser(tr.cert_file),
                                os.path.expanduser(tr.key_file) if tr.key_file else None)
        try:
            wrapped = ctx.wrap_socket(sock, server_hostname=self.ep.host)
        except ssl.SSLError as err:
            why = getattr(err, "verify_message", None) or err.reason or str(err)
            raise RemoteError("tls", f"TLS with {self.ep.origin} failed: {why}") from None
        with self._lock:
            self._sock = wrapped
        if self.reason is not None:
            wrapped.close()
            raise Stop(self.reason)
        return wrapped

    # -- the exchange --------------------------------------------------------------------
    def run(self, body: dict, on_piece: Callable[[str], bool]) -> str | None:
        """POST `body`, feed each streamed text piece to `on_piece` (True: enough, close).

        Returns the engine's finish reason ("stop", "length", None when the stream just
        ended). Raises Stop when aborted on purpose and RemoteError when the engine failed.
        """
        self._watcher.start()
        conn = None
        try:
            sock = self._connect()
            # A read that waits past the deadline is aborted by the watcher; with no time budget, an
            # engine that sends nothing for READ_TIMEOUT_S is a failure rather than a hang.
            sock.settimeout(READ_TIMEOUT_S if self.deadline is None
                            else max(0.05, self.deadline - time.monotonic()) + 1)
            if self.ep.scheme == "https":
                sock = self._tls(sock)
            conn = http.client.HTTPConnection(self.ep.host, self.ep.port)
            conn.sock = sock  # already connected: http.client uses it as it is
            payload = json.dumps(body).encode("utf-8")
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/x-ndjson",
                       "User-Agent": "ditto-lsp", **self.tr.headers}
            conn.request("POST", self.ep.path, body=payload, headers=headers)
            resp = conn.getresponse()
            self.answered = resp.status == 200
            if resp.status != 200:
                raise RemoteError(f"http {resp.status}", f"{self.ep.url} answered HTTP {resp.status} "
                                  f"{resp.reason}: {_error_text(resp.read(2000))}")
            kind = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
            if kind == "application/json":
                return self._whole(resp, on_piece)
            return self._stream(resp, on_piece)
        except Stop:
            raise
        except RemoteError:
            self._check()
            raise
        except (OSError, http.client.HTTPException) as err:
            self._check()  # our own abort shows up as a socket error
            if isinstance(err, (socket.timeout, TimeoutError)):
                raise RemoteError("timeout", f"{self.ep.url} sent nothing for {READ_TIMEOUT_S:.0f} s") from None
            if isinstance(err, ssl.SSLCertVerificationError):
                raise RemoteError("tls", f"TLS with {self.ep.origin}: {err.verify_message}") from None
            text = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise RemoteError("connection", f"connection to {self.ep.origin} failed: {text}") from None
        finally:
            self._finished.set()
            if conn is not None:
                conn.close()
            with self._lock:
                sock, self._sock = self._sock, None
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass

    def _stream(self, resp, on_piece) -> str | None:
        ollama = self.ep.engine == "ollama"
        finish = None
        while True:
            line = resp.readline(1 << 20)
            if not line:
                self._check()
                if finish is None and not ollama:
                    raise RemoteError("garbage", f"{self.ep.url} ended the stream without [DONE]")
                return finish
            line = line.strip()
            if not line or line.startswith(b":"):
                continue  # SSE comment / keep-alive ping
            if ollama:
                obj = _json(line, self.ep.url)
                if obj.get("error"):
                    raise RemoteError("engine", f"{self.ep.url}: {str(obj['error'])[:200]}")
                if "response" not in obj and "done" not in obj:
                    raise RemoteError("garbage", f"{self.ep.url} sent no Ollama stream: {_snip(line)}")
                if "response" in obj and on_piece(str(obj.get("response") or "")):
                    return "stop-rule"
                if obj.get("done"):
                    return "length" if obj.get("done_reason") == "length" else "stop"
                continue
            name, _, value = line.partition(b":")
            if name not in (b"data", b"event", b"id", b"retry"):
                raise RemoteError("garbage", f"{self.ep.url} sent no event stream: {_snip(line)}")
            if name != b"data":
                continue
            value = value.strip()
            if value == b"[DONE]":
                return finish or "interrupted"
            obj = _json(value, self.ep.url)
            if obj.get("error"):
                err = obj["error"]
                raise RemoteError("engine", f"{self.ep.url}: {str(err.get('message', err) if isinstance(err, dict) else err)[:200]}")
            try:
                choice = obj["choices"][0]
            except (KeyError, IndexError, TypeError):
                raise RemoteError("garbage", f"{self.ep.url} sent no completion: {_snip(value)}") from None
            text = choice.get("text") or ""
            finish = choice.get("finish_reason") or finish
            if on_piece(str(text)):
                return "stop-rule"

    def _whole(self, resp, on_piece) -> str | None:
        obj = _json(resp.read(1 << 24), self.ep.url)
        if self.ep.engine == "ollama":
            text, finish = obj.get("response"), obj.get("done_reason", "stop")
        else:
            try:
                text, finish = obj["choices"][0].get("text"), obj["choices"][0].get("finish_reason")
            except (KeyError, IndexError, TypeError):
                raise RemoteError("garbage", f"{self.ep.url} sent no completion: {_snip(json.dumps(obj))}") from None
        if text:
            on_piece(str(text))
        return finish


def _json(data: bytes, url: str) -> dict:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise RemoteError("garbage", f"{url} sent something that is not JSON: {_snip(data)}") from None
    if not isinstance(obj, dict):
        raise RemoteError("garbage", f"{url} sent JSON that is not an object: {_snip(data)}")
    return obj


def _snip(data) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    text = " ".join(text.split())
    return repr(text[:60] + ("…" if len(text) > 60 else ""))


def _error_text(data: bytes) -> str:
    try:
        obj = json.loads(data)
        err = obj.get("error", obj.get("detail", obj)) if isinstance(obj, dict) else obj
        if isinstance(err, dict):
            err = err.get("message", err)
        return " ".join(str(err).split())[:200]
    except (ValueError, UnicodeDecodeError):
        return _snip(data)

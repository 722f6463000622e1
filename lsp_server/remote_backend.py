"""A remote inference engine: Ditto in front of a team's GPU server (docs/team.md).

The engine (vLLM, llama.cpp's llama-server, llama-cpp-python's server, Ollama) runs the
model, batches users and speculates on its own; Ditto keeps its editor-side parts
(prompts with snippets of the open buffers, type-through, newest-request-wins, ghost-text
stop rules, statistics; lsp_server/completer.py). Here: the model spec, the local
tokenizer that sizes prompts, and `RemoteGenerator`, the generation step that streams a
completion over HTTP and closes the connection as soon as the suggestion has ended or the
request was cancelled or superseded, so the engine stops generating.

Spec: ``http[s]://HOST[:PORT]/PATH#NAME[&tokenizer=TOK][&engine=ENGINE]``

- PATH ending in ``/v1`` (or anything else): an OpenAI-compatible ``POST PATH/completions``
  with ``stream: true``; ending in ``/api``: Ollama's ``POST /api/generate`` with
  ``raw: true`` (its OpenAI endpoint would wrap the FIM prompt in a chat template);
- NAME: the served model's name, sent as ``model`` (optional for single-model engines);
- ``tokenizer``: where prompt budgets are counted (`load_tokenizer`): a packaged model
  (``qwen2.5-coder-0.5b``), a ``.gguf`` file (its vocabulary), ``ollama:NAME[:TAG]`` (the
  GGUF a local Ollama store holds, lsp_server/ollama.py), a ``tokenizer.json``, a local
  model directory, or ``chars`` (an estimate, `CharTokenizer`); ``auto`` (the default)
  takes, for Ollama, the served model from a local Ollama store if it is there, else an
  installed packaged model of the family NAME names, else the estimate;
- ``engine``: ``openai`` (standard fields only), ``llama.cpp`` (adds
  ``repeat_penalty: 1``: llama-cpp-python's server defaults to 1.1, which is not greedy),
  ``vllm`` (adds ``skip_special_tokens: false`` so the FIM stop tokens reach the stop
  strings) or ``ollama`` (the default for ``/api``).

The fragment never leaves this machine (it is not part of an HTTP request). A URL with a
user name or password is refused: credentials go in the ``remote`` setting's headers,
which are never logged. Ditto connects to the spec's host and port only: no redirects, no
proxies from the environment.

Left out on purpose: LSP (the server shows the one-line `notice`), prompts and stop rules
(the Completer passes them in), forward passes (an engine does not expose them).
"""

from __future__ import annotations

import ctypes
import errno
import http.client
import json
import logging
import os
import re
import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence
from urllib.parse import unquote, urlsplit

from .backend import FIM_NAMES, FimTokens, ModelError, Progress, find_fim_tokens, stop_token_ids
from .numbers import percentile

log = logging.getLogger(__name__)

ENGINES = ("openai", "llama.cpp", "vllm", "ollama")
RESYN_S = 0.25  # while a connection attempt goes unanswered, start a fresh one this often (_Request._connect_to)
RESYN_MAX = 8
READ_TIMEOUT_S = 60.0  # the longest wait for the next byte when no time budget bounds a request
REMOTE_KEYS = ("headers", "ca_file", "cert_file", "key_file", "body", "connect_timeout_s")


def is_remote(spec: str | None) -> bool:
    return bool(spec) and spec.strip().lower().startswith(("http://", "https://"))


@dataclass(frozen=True)
class Endpoint:
    """A parsed remote spec (see the module docstring)."""

    spec: str
    scheme: str  # http | https
    host: str
    port: int
    path: str  # the request path, e.g. /v1/completions or /api/generate
    engine: str  # one of ENGINES
    served: str | None  # the model name sent to the engine
    tokenizer: str  # auto | chars | a packaged model | a path

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self.origin + self.path


def parse_spec(spec: str) -> Endpoint:
    """The endpoint a remote spec names; ModelError (one line) when it is malformed."""
    raw = spec.strip()
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as err:
        raise ModelError(f"remote model spec {raw!r}: {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelError(f"remote model spec {raw!r}: use http[s]://HOST[:PORT]/v1#MODEL")
    if parts.username is not None or parts.password is not None:
        raise ModelError("remote model spec: a user or password in the URL would be logged; put credentials in "
                         "the `remote` setting's headers instead (docs/team.md)")
    if parts.query:
        raise ModelError(f"remote model spec {raw.split('#')[0]!r}: no query string; options go after # "
                         "(#MODEL&tokenizer=...&engine=...)")
    served, opts = None, {}
    for i, item in enumerate(p for p in parts.fragment.split("&") if p):
        key, eq, value = item.partition("=")
        if not eq and i == 0:
            served = unquote(item)
        elif eq and key in ("model", "tokenizer", "engine"):
            opts[key] = unquote(value)
        else:
            raise ModelError(f"remote model spec: unknown option {item!r} after #: use #MODEL&tokenizer=...&engine=...")
    served = opts.get("model", served) or None
    base = parts.path.rstrip("/")
    engine = opts.get("engine") or ("ollama" if base.endswith("/api") else "openai")
    if engine not in ENGINES:
        raise ModelError(f"remote model spec: unknown engine {engine!r}: use {', '.join(ENGINES)}")
    if engine == "ollama":
        if not served:
            raise ModelError("remote model spec: Ollama needs the model name after # (e.g. #qwen2.5-coder:1.5b)")
        path = (base if base.endswith("/api") else base + "/api") + "/generate"
    else:
        path = (base or "/v1") + "/completions"
    port = port or (443 if parts.scheme == "https" else 80)
    return Endpoint(raw, parts.scheme, parts.hostname, port, path, engine, served, opts.get("tokenizer", "auto"))


# ------------------------------------------------------------------------------------------
# Transport settings (the `remote` setting)
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transport:
    headers: dict = field(default_factory=dict, repr=False)  # never logged (they carry credentials)
    ca_file: str | None = None  # PEM bundle to verify an https engine (default: the system's)
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None
    body: dict = field(default_factory=dict)  # fields merged into every request body (engine options)
    connect_timeout_s: float = 3.0

    @classmethod
    def from_setting(cls, remote: dict | None) -> "Transport":
        try:
            remote = check_remote_setting(dict(remote or {}))  # camelCase keys too, when called directly
        except ValueError as err:
            raise ModelError(f"setting 'remote': {err}") from None
        return cls(headers=expand_headers(remote.get("headers") or {}), ca_file=remote.get("ca_file"),
                   cert_file=remote.get("cert_file"), key_file=remote.get("key_file"),
                   body=dict(remote.get("body") or {}), connect_timeout_s=float(remote.get("connect_timeout_s", 3.0)))


_ENV = re.compile(r"\$\{(DITTO_[A-Za-z0-9_]*)\}")


def expand_headers(headers: dict) -> dict:
    """Header values with ${DITTO_*} replaced from the environment (so a token need not sit in a settings file).

    Only variables named DITTO_* are read: a workspace's settings cannot send other
    environment variables to the engine. A missing variable is a ModelError naming it.
    """
    out = {}
    for name, value in headers.items():
        def env(m: re.Match) -> str:
            if m.group(1) not in os.environ:
                raise ModelError(f"remote header {name!r} uses ${{{m.group(1)}}}, which is not set in the environment")
            return os.environ[m.group(1)]

        out[str(name)] = _ENV.sub(env, str(value))
    return out


def check_remote_setting(value: dict) -> dict:
    """The `remote` setting normalised (snake_case keys); ValueError naming what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {type(value).__name__}")
    out = {}
    for key, v in value.items():
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", str(key)).lower()
        if name not in REMOTE_KEYS:
            raise ValueError(f"unknown key {key!r}: use {', '.join(REMOTE_KEYS)}")
        if name == "headers":
            if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
                raise ValueError("headers must map header names to strings")
            if any(any(c in s for c in "\r\n") for kv in v.items() for s in kv):
                raise ValueError("headers must not contain line breaks")
        elif name == "body":
            if not isinstance(v, dict):
                raise ValueError("body must be a JSON object")
        elif name == "connect_timeout_s":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 120:
                raise ValueError("connect_timeout_s must be a number in (0, 120]")
        elif v is not None and not isinstance(v, str):
            raise ValueError(f"{name} must be a path")
        out[name] = v
    return out


# ------------------------------------------------------------------------------------------
# Local tokenizers: what sizes the prompt (the engine tokenizes the text again itself)
# ------------------------------------------------------------------------------------------


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json (no transformers import, never the network)."""

    def __init__(self, path: Path, source: str):
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.source = source
        vocab = self.vocabulary()
        self.fim = find_fim_tokens(vocab)
        eos = []
        config = path.parent / "tokenizer_config.json"
        try:
            name = json.loads(config.read_text()).get("eos_token")
            name = name.get("content") if isinstance(name, dict) else name
            if isinstance(name, str) and name in vocab:
                eos.append(vocab[name])
        except (OSError, ValueError):
            pass
        self.stop_ids = stop_token_ids(vocab, eos, self.fim)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    def vocabulary(self) -> dict[str, int]:
        return dict(self._tok.get_vocab(with_added_tokens=True))

    def special_ids(self) -> dict[str, int | None]:
        return {"eos_token_id": min(self.stop_ids) if self.stop_ids else None}


class GGUFTokenizer:
    """A GGUF file's vocabulary through llama.cpp (vocab_only: no weights are read).

    `decode` joins each token's bytes: llama.cpp's own detokenizer also "cleans" spaces
    before punctuation (" ." -> ".") for some vocabularies (those it reads as GPT-2's), which
    would change the prompt text sent to the engine.
    """

    def __init__(self, path: Path):
        try:
            import llama_cpp
        except ImportError:
            raise ModelError(f"reading the tokenizer of {path.name} needs llama-cpp-python: pip install "
                             "llama-cpp-python, or name a tokenizer.json") from None
        try:
            self._llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        except Exception as err:  # llama.cpp raises ValueError / RuntimeError for unreadable files
            raise ModelError(f"cannot read the vocabulary of {path.name}: {err}") from None
        self.source = str(path)
        self._lib = llama_cpp
        self._pieces: dict[int, bytes] = {}
        vocab = self.vocabulary()
        self.fim = find_fim_tokens(vocab)
        eos = [int(self._llm.token_eos()), int(llama_cpp.llama_vocab_eot(self._llm._model.vocab))]
        self.stop_ids = stop_token_ids(vocab, [t for t in eos if t >= 0], self.fim)

    def encode(self, text: str) -> list[int]:
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self._piece(int(t)) for t in ids).decode("utf-8", errors="replace")

    def _piece(self, tid: int) -> bytes:
        piece = self._pieces.get(tid)
        if piece is None:
            buf = ctypes.create_string_buffer(256)
            n = self._lib.llama_token_to_piece(self._llm._model.vocab, tid, buf, 256, 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lib.llama_token_to_piece(self._llm._model.vocab, tid, buf, -n, 0, True)
            piece = self._pieces[tid] = buf.raw[:max(n, 0)]
        return piece

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    def vocabulary(self) -> dict[str, int]:
        n = self._llm.n_vocab()
        return {self._llm._model.token_get_text(i): i for i in range(n)}

    def special_ids(self) -> dict[str, int | None]:
        return {"eos_token_id": int(self._llm.token_eos())}


class CharTokenizer:
    """The fallback when no local copy of the engine's tokenizer is at hand: an estimate.

    One token per: up to 6 ASCII letters (with a blank before them), any other letter,
    digit or punctuation character, up to 4 underscores, up to 16 blanks, up to 16 line
    breaks. Measured against Qwen2.5-Coder's tokenizer on this repository's source and
    docs (docs/team.md): 1.38 times its count overall and at least 1.12 times on every
    file, so a prompt comes out shorter than the budget allows, never longer. Ids pack the
    piece's characters, so `decode(encode(t)) == t` for every text with no table to grow.

    The FIM tokens are the family's that `family` names (qwen, starcoder, deepseek); with
    none, the prompt is plain text before the cursor.
    """

    PIECE = re.compile(r" ?[A-Za-z]{1,6}|[^\W\d_]|\d|_{1,4}|[ \t]{1,16}|\n{1,16}|[^\w\s]|\s")
    BASE = 64  # ids below this are the special tokens

    def __init__(self, family: tuple | None):
        self.source = "chars (an estimate)"
        names = [n for n in (family or ()) if n]
        self._special = {name: i + 1 for i, name in enumerate(names)}
        self._text = {i: name for name, i in self._special.items()}
        if family:
            p, s, m, f = family
            self.fim = FimTokens(self._special[p], self._special[s], self._special[m],
                                 self._special[f] if f else None)
        else:
            self.fim = None
        for name in ("<|endoftext|>",):
            self._special.setdefault(name, len(self._special) + 1)
            self._text[self._special[name]] = name
        self.stop_ids = frozenset(i for n, i in self._special.items() if n not in (family or ())[:3])
        self._split = re.compile("(" + "|".join(re.escape(n) for n in sorted(self._special, key=len, reverse=True))
                                 + ")") if self._special else None

    def encode(self, text: str) -> list[int]:
        ids = []
        parts = self._split.split(text) if self._split else [text]
        for part in parts:
            if part in self._special:
                ids.append(self._special[part])
                continue
            for piece in self.PIECE.findall(part):
                data = piece.encode("utf-32-le", "surrogatepass")
                ids.append(self.BASE + (int.from_bytes(data, "little") << 5 | len(piece)))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for tid in ids:
            if tid < self.BASE:
                out.append(self._text.get(tid, ""))
                continue
            n, v = (tid - self.BASE) & 31, (tid - self.BASE) >> 5
            out.append(v.to_bytes(4 * n, "little").decode("utf-32-le", "surrogatepass"))
        return "".join(out)

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    def vocabulary(self) -> dict[str, int]:
        return dict(self._special)

    def special_ids(self) -> dict[str, int | None]:
        return {"eos_token_id": self._special.get("<|endoftext|>")}


FAMILIES = {"qwen": FIM_NAMES[0], "starcoder": FIM_NAMES[1], "santacoder": FIM_NAMES[1], "deepseek": FIM_NAMES[2]}


def _family(name: str | None) -> tuple | None:
    low = (name or "").lower()
    return next((names for key, names in FAMILIES.items() if key in low), None)


def load_tokenizer(choice: str, served: str | None, say: Progress, engine: str = "openai"):
    """The local tokenizer for a remote model (see the module docstring); never downloads."""
    from .packaged import PACKAGED, cache_dir, converted_dir, is_converted, joined_path

    choice = (choice or "auto").strip()

    def packaged(name: str):
        pm = PACKAGED[name]
        directory = converted_dir(pm.name, pm.sha256)
        if is_converted(directory) and (directory / "tokenizer.json").is_file():
            tok = HFTokenizer(directory / "tokenizer.json", f"{name} (packaged, {directory})")
            return tok
        joined = joined_path(pm)
        if joined.is_file():
            tok = GGUFTokenizer(joined)
            tok.source = f"{name} (packaged, {joined})"
            return tok
        return None

    def ollama(spec: str):
        from .ollama import resolve

        blob, shown = resolve(spec, say)
        tok = GGUFTokenizer(blob)
        tok.source = f"{shown} (Ollama store, {blob})"
        return tok

    if choice == "chars":
        return CharTokenizer(_family(served))
    if choice.startswith("ollama:"):
        return ollama(choice)
    if choice == "auto":
        if engine == "ollama" and served:
            try:
                return ollama(f"ollama:{served}")
            except ModelError:
                pass  # not pulled on this machine: go on
        low = (served or "").lower().replace("_", "-").replace(":", "-")
        if "qwen2.5-coder" in low:
            # Every Qwen2.5-Coder size has the one vocabulary: any installed packaged copy serves.
            order = sorted(PACKAGED, key=lambda n: n.replace(".", "") not in low.replace(".", ""))
            for name in order:
                tok = packaged(name)
                if tok is not None:
                    return tok
        tok = CharTokenizer(_family(served))
        log.info("no local tokenizer for %r: prompt budgets use the character estimate "
                 "(name one with #%s&tokenizer=...; docs/team.md)", served or "the remote model",
                 served or "MODEL")
        return tok
    if choice in PACKAGED:
        tok = packaged(choice)
        if tok is None:
            raise ModelError(f"tokenizer {choice!r} is not installed here: run `ditto-lsp models pull {choice}` "
                             "(then load it once), or use tokenizer=chars")
        return tok
    path = Path(choice).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return HFTokenizer(path / "tokenizer.json", str(path))
    if path.is_file() and path.suffix == ".gguf":
        return GGUFTokenizer(path)
    if path.is_file() and path.suffix == ".json":
        return HFTokenizer(path, str(path))
    known = ", ".join(["auto", "chars", *PACKAGED])
    raise ModelError(f"tokenizer {choice!r}: use {known}, ollama:NAME[:TAG], a .gguf file, a tokenizer.json or a "
                     f"model directory holding one (cache: {cache_dir()})")


# ------------------------------------------------------------------------------------------
# The loaded model: a tokenizer and an endpoint
# ------------------------------------------------------------------------------------------


class RemoteModel:
    """A model a remote engine runs: the text side (a local tokenizer) plus the endpoint.

    It has no tensor side (the engine does not expose forward passes); `generator()`
    gives the Completer its generation step instead of a local Engine.
    """

    kind = "remote"

    def __init__(self, endpoint: Endpoint, tokenizer, transport: Transport):
        self.endpoint = endpoint
        self.tokenizer = tokenizer
        self.transport = transport
        self.spec = endpoint.spec
        self.name = endpoint.served or endpoint.origin
        self.fim = tokenizer.fim
        self.stop_ids = frozenset(tokenizer.stop_ids)
        self.vocab_size = 0
        self.load_seconds = 0.0

    def describe(self) -> dict:
        return {"backend": f"remote ({self.endpoint.engine})", "device": self.endpoint.origin,
                "dtype": "the engine's", "tokenizer": self.tokenizer.source}

    def generator(self) -> "RemoteGenerator":
        return RemoteGenerator(self)

    # -- text side ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def token_text(self, tid: int) -> str:
        return self.tokenizer.token_text(tid)

    def vocabulary(self) -> dict[str, int]:
        return self.tokenizer.vocabulary()

    def special_ids(self) -> dict[str, int | None]:
        return self.tokenizer.special_ids()


def load(spec: str, remote: dict | None, say: Progress) -> RemoteModel:
    endpoint = parse_spec(spec)
    transport = Transport.from_setting(remote)
    for path in (transport.ca_file, transport.cert_file, transport.key_file):
        if path and not Path(path).expanduser().is_file():
            raise ModelError(f"remote TLS file {path!r} does not exist")
    say(f"remote engine {endpoint.url} ({endpoint.engine}); loading the local tokenizer", None)
    tok = load_tokenizer(endpoint.tokenizer, endpoint.served, say, endpoint.engine)
    return RemoteModel(endpoint, tok, transport)


# ------------------------------------------------------------------------------------------
# The generation step: one streaming HTTP request per completion
# ------------------------------------------------------------------------------------------


class RemoteError(Exception):
    """The engine could not give a completion. `kind` groups errors for reporting once per outage."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class _Stop(Exception):
    """The request was ended on purpose (cancelled, out of time, stop rule); `reason` says which."""


class _Request:
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
            raise _Stop(self.reason)

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
                    raise _Stop(self.reason)
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
            raise _Stop(self.reason)
        return wrapped

    # -- the exchange --------------------------------------------------------------------
    def run(self, body: dict, on_piece: Callable[[str], bool]) -> str | None:
        """POST `body`, feed each streamed text piece to `on_piece` (True: enough, close).

        Returns the engine's finish reason ("stop", "length", None when the stream just
        ended). Raises _Stop when aborted on purpose and RemoteError when the engine failed.
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
        except _Stop:
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


class RemoteGenerator:
    """The Completer's generation step for a remote engine (lsp_server/completer.py, `Generator`).

    Streams the completion, hands the Completer's `done(text)` every new piece, and closes
    the connection as soon as it says the suggestion has ended, or when `cancel` is set
    (cancelled or superseded) or the time budget is spent. A failure gives an empty
    suggestion; the first failure of an outage is logged once and carries a `notice`
    (the server shows it once); the next success logs that the engine is back.
    """

    drafts = False  # the engine speculates on its own; Ditto's drafters are not used

    def __init__(self, model: RemoteModel):
        self.model = model
        self.engine = None
        self.problem: str | None = None  # kind of failure that began the current outage, None while healthy
        # ok: the engine answered (whether the suggestion then ran out, was cut by the stop rules, timed
        # out or was cancelled); errors: it failed. cancelled, stop_rule and time say how requests ended.
        self.counts = {"requests": 0, "ok": 0, "errors": 0, "cancelled": 0, "stop_rule": 0, "time": 0}
        self.first_piece_ms: deque = deque(maxlen=1000)
        self.intervals: deque = deque(maxlen=4000)  # (start, first piece or None, end, outcome), wall clock
        self.in_flight = 0
        self.pieces = 0  # streamed pieces received, counted as they arrive (tests wait on it)
        stop_texts = {model.token_text(t) for t in model.stop_ids}
        self.stop_texts = sorted(t for t in stop_texts if t.strip())

    def forget(self, key: str) -> None:
        pass  # the engine keeps its own prefix cache

    def body(self, prompt_text: str, opts) -> dict:
        ep = self.model.endpoint
        if ep.engine == "ollama":
            o = {"num_predict": opts.max_new_tokens, "temperature": opts.temperature, "repeat_penalty": 1.0,
                 "stop": self.stop_texts}
            if not opts.greedy:
                o.update(top_p=opts.top_p, **({"top_k": opts.top_k} if opts.top_k else {}))
            if opts.seed is not None:
                o["seed"] = opts.seed
            body = {"model": ep.served, "prompt": prompt_text, "raw": True, "stream": True, "options": o}
        else:
            body = {"prompt": prompt_text, "max_tokens": opts.max_new_tokens, "temperature": opts.temperature,
                    "stream": True}
            if ep.served:
                body["model"] = ep.served
            if self.stop_texts:
                body["stop"] = self.stop_texts
            if not opts.greedy:
                body["top_p"] = opts.top_p
                if opts.top_k:
                    body["top_k"] = opts.top_k
            if opts.seed is not None:
                body["seed"] = opts.seed
            if ep.engine == "llama.cpp":
                body.update(repeat_penalty=1.0, top_k=opts.top_k if not opts.greedy else 0, min_p=0.0)
                if opts.greedy:
                    body["top_p"] = 1.0
            elif ep.engine == "vllm":
                body["skip_special_tokens"] = False
        return _merge(body, self.model.transport.body)

    def generate(self, prompt, *, options, done: Callable[[str], bool], cancel: threading.Event | None = None,
                 **_ignored):
        from .completer import Generated
        from .engine import Completion, Stats

        opts = options
        t0 = time.perf_counter()
        wall0 = time.time()
        stats = Stats(prefill_tokens=len(prompt.ids))
        cancel = cancel or threading.Event()
        deadline = None if opts.time_budget_s is None else time.monotonic() + opts.time_budget_s
        text = ""
        first = [None]
        pieces = [0]

        def on_piece(piece: str) -> bool:
            nonlocal text
            if cancel.is_set():  # checked here too, so a stream that keeps coming stops at once
                raise _Stop("cancelled")
            if deadline is not None and time.monotonic() >= deadline:
                raise _Stop("time")
            if first[0] is None:
                first[0] = time.perf_counter()
            pieces[0] += 1  # one event is one token on llama.cpp; vLLM may send several in one
            self.pieces += 1
            if not piece:
                return False
            text += piece
            cut = _first_stop(text, self.stop_texts)
            if cut is not None:
                text = text[:cut]
                raise _StopText()
            return done(text)

        self.counts["requests"] += 1
        self.in_flight += 1
        req = _Request(self.model.endpoint, self.model.transport, cancel, deadline)
        notice = None
        outcome = "ok"
        try:
            finish = req.run(self.body(self.model.decode(prompt.ids), opts), on_piece)
            stats.stop_reason = {"stop": "eos", "length": "length", "stop-rule": "stop-rule"}.get(finish or "", finish or "eos")
            if finish == "stop-rule":
                self.counts["stop_rule"] += 1
        except _StopText:
            stats.stop_reason = "eos"
        except _Stop as stop:
            stats.stop_reason = str(stop)
            outcome = stats.stop_reason
            if stats.stop_reason == "time" and first[0] is None:
                # Nothing at all in the whole time budget: the engine is stuck or swamped.
                notice = self._failed(RemoteError("slow", f"{self.model.endpoint.url} sent nothing in "
                                                          f"{opts.time_budget_s:.1f} s"))
                stats.stop_reason, outcome, text = "error", "error", ""
            else:
                self.counts["cancelled" if stats.stop_reason == "cancelled" else "time"] += 1
        except RemoteError as err:
            notice = self._failed(err)
            stats.stop_reason, outcome, text = "error", "error", ""
        finally:
            self.in_flight -= 1
        if outcome != "error" and req.answered:
            # Only an answer ends an outage: a request superseded while it was still connecting to
            # a dead host proves nothing (and must not make the next failure a new message).
            self.counts["ok"] += 1
            if first[0] is not None:
                self.first_piece_ms.append((first[0] - t0) * 1000)
            if self.problem is not None:
                log.info("the engine at %s answers again", self.model.endpoint.url)
                self.problem = None
        end = time.perf_counter()
        stats.tokens = stats.generated = pieces[0]
        stats.wall_ms = (end - t0) * 1000
        stats.prefill_ms = ((first[0] or end) - t0) * 1000
        stats.decode_ms = stats.wall_ms - stats.prefill_ms
        self.intervals.append((round(wall0, 4), None if first[0] is None else round(wall0 + first[0] - t0, 4),
                               round(wall0 + end - t0, 4), outcome))
        return Generated(text, Completion([], stats, []), notice)

    def _failed(self, err: RemoteError) -> str | None:
        """Count a failure; log it and return the notice only when it starts an outage.

        An outage lasts until a request succeeds, whatever its failures are (an engine going
        down resets the open stream, then refuses connections: one outage, one message).
        """
        self.counts["errors"] += 1
        if self.problem is not None:
            log.debug("engine still failing: %s", err)
            return None
        self.problem = err.kind
        msg = f"Ditto: the remote engine failed: {err} (suggestions are empty until it answers)"
        log.error("%s", msg)
        return msg

    def stats(self, intervals: bool = False) -> dict:
        out = {**self.counts, "in_flight": self.in_flight, "pieces": self.pieces, "url": self.model.endpoint.url, "engine": self.model.endpoint.engine,
               "tokenizer": self.model.tokenizer.source, "failing": self.problem,
               "first_piece_ms": {"p50": percentile(self.first_piece_ms, 50, 1),
                                  "p95": percentile(self.first_piece_ms, 95, 1)}}
        if intervals:
            out["intervals"] = list(self.intervals)
        return out


class _StopText(Exception):
    """A stop token's text arrived in the stream."""


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out

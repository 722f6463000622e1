"""A remote model spec, `http[s]://HOST[:PORT]/PATH#NAME[&tokenizer=TOK][&engine=ENGINE]`, parsed
(the package docstring, lsp_server/backends/remote/__init__.py, says what each part means).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from lsp_server.backends.base import ModelError
from lsp_server.backends.specs import is_remote  # noqa: F401  (part of this module's interface)

log = logging.getLogger(__name__)



ENGINES = ("openai", "llama.cpp", "vllm", "ollama")



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

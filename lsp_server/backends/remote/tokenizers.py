"""Local tokenizers for a remote model: what sizes the prompt (the engine tokenizes the text
again itself). Never downloads.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Sequence

from lsp_server.backends.base import (
    FIM_NAMES,
    FimTokens,
    ModelError,
    Progress,
    find_fim_tokens,
    stop_token_ids,
)
from lsp_server.backends.packaged import PACKAGED, cache_dir, converted_dir, is_converted, joined_path
from lsp_server.backends.specs import parse_spec

log = logging.getLogger(__name__)





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
        from lsp_server.backends.llama.vocab import GGUFVocab  # Ditto's llama.cpp binding (the xllamacpp wheel)

        self._vocab = GGUFVocab(path)  # ModelError (one line) if the library or the file cannot be read
        self.source = str(path)
        self._pieces: dict[int, bytes] = {}
        vocab = self.vocabulary()
        self.fim = find_fim_tokens(vocab)
        eos = [self._vocab.eos, self._vocab.eot]
        self.stop_ids = stop_token_ids(vocab, [t for t in eos if t >= 0], self.fim)

    def encode(self, text: str) -> list[int]:
        return self._vocab.tokenize(text, special=True)

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self._piece(int(t)) for t in ids).decode("utf-8", errors="replace")

    def _piece(self, tid: int) -> bytes:
        piece = self._pieces.get(tid)
        if piece is None:
            piece = self._pieces[tid] = self._vocab.piece(tid, special=True)
        return piece

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    def vocabulary(self) -> dict[str, int]:
        return {self._vocab.text(i): i for i in range(self._vocab.n_tokens)}

    def special_ids(self) -> dict[str, int | None]:
        return {"eos_token_id": self._vocab.eos}


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
        from lsp_server.backends.ollama import resolve

        blob, shown = resolve(spec, say)
        tok = GGUFTokenizer(blob)
        tok.source = f"{shown} (Ollama store, {blob})"
        return tok

    if choice == "chars":
        return CharTokenizer(_family(served))
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
    known = ", ".join(["auto", "chars", *PACKAGED])
    unknown = ModelError(f"tokenizer {choice!r}: use {known}, ollama:NAME[:TAG], a .gguf file, a tokenizer.json or a "
                         f"model directory holding one (cache: {cache_dir()})")
    try:
        ms = parse_spec(choice)  # what the name is, decided where every model spec is (lsp_server/backends/specs.py)
    except ModelError:
        raise unknown from None
    if ms.kind == "ollama":
        return ollama(ms.spec)
    if ms.kind == "packaged":
        tok = packaged(ms.spec)
        if tok is None:
            raise ModelError(f"tokenizer {ms.spec!r} is not installed here: run `ditto-lsp models pull {ms.spec}` "
                             "(then load it once), or use tokenizer=chars")
        return tok
    path = ms.path
    if ms.kind == "directory" and (path / "tokenizer.json").is_file():
        return HFTokenizer(path / "tokenizer.json", str(path))
    if ms.kind in ("gguf", "file") and path.is_file() and path.suffix == ".gguf":
        return GGUFTokenizer(path)
    if ms.kind == "file" and path.suffix == ".json":
        return HFTokenizer(path, str(path))
    raise unknown

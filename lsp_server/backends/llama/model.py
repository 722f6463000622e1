"""The llama.cpp backend: GGUF models run as they are (quantised), on llama.cpp's C API.

Implements the interface of lsp_server/backends/base.py over llama.cpp's low-level C API, as
Ditto's own binding exposes it (lsp_server/backends/llama/binding.py: one `llama_context`):

- Caches are sequences. The context holds `slots` KV streams of `slot_tokens` cells each
  (`kv_unified = false`: every sequence id has a stream of its own). A cache handle is
  given a slot when it is first run; when every slot is taken, the least recently used
  other handle is swapped out: its KV bytes are copied out with `llama_state_seq_get_data`
  and copied back into a free slot when it is run again (a memory copy, not a recompute).
  So the engine's per-document caches and its LRU bounds (lsp_server/decoding/engine.py) hold as on
  the torch path, and the KV memory llama.cpp allocates stays `slots * slot_tokens`.
  `crop(cache, keep)` is `llama_memory_seq_rm(seq, keep, -1)`; `release` clears the stream.
- Exactness (docs/backends.md): llama.cpp's passes are not batch-invariant on a CPU (the
  logits of a token differ with how many rows share its pass). So a forward that asks for
  the logits of `last > 1` rows (a verify pass) runs those rows one token per pass, the
  same pass shape as plain decoding; the cells of a sequence are its positions in its own
  stream, whatever else the context holds. A verified draft therefore computes exactly
  what plain decoding computes, and the measured T(n) tells the speculation policy what
  drafting costs on this backend.
- The same holds for prompts: a row's logits and KV depend on how many rows share its pass
  and where it sits among them (default model: a prompt's last logits moved by up to 0.35
  when its first token ran in a pass of its own). So prompt passes are cut at absolute
  positions, multiples of `block` (32): a fresh prefill runs [0, 32), [32, 64), ... and a
  partial last block. A cache records how far its positions were computed in such whole
  blocks (`aligned`), and `reusable(cache, keep, length)` lets the engine keep a cached
  prefix only up to the last whole block within it (or all of it when it is the very prompt
  whose last partial block ran in one pass: `tail`); the rest is recomputed in the blocks a
  fresh prefill uses. Reuse then gives the bits of a fresh prefill (up to 31 more tokens recomputed
  per request; passes of 32 rows cost what passes of 512 cost here; docs/backends.md). After a
  prompt's <fim_middle> the passes are also cut where a line ends, so a line typed at a place
  recomputes that line, not the rest of a block before it (lsp_server/backends/base.py WholeBlocks).
- Text side: llama.cpp's own tokenizer from the GGUF (special tokens in text are parsed
  as the torch backend's tokenizer parses them); FIM tokens and stop ids are read from
  the GGUF's vocabulary (lsp_server/backends/base.py).

Loading is lsp_server/backends/llama/loading.py; the library and its log, library.py (its
binding and checks, binding.py); threads, slots and sizes come from the environment through options.py.
Left out on purpose: decoding (lsp_server/decoding/engine.py), prompts (lsp_server/completion/).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from lsp_server.backends.base import (
    FIM_NAMES,
    STOP_NAMES,
    ModelError,
    TensorBackend,
    find_fim_tokens,
    stop_token_ids,
)
from lsp_server.backends.llama.library import LOG_TAIL, built_with_amx, file_type, lib, load_error
from lsp_server.backends.llama.options import LlamaOptions
from lsp_server.backends.llama.vocab import tokenize

log = logging.getLogger(__name__)


class LlamaCache:
    """One sequence: `n` tokens at positions 0..n-1, resident in `slot` or swapped out to `saved`."""

    __slots__ = ("n", "aligned", "tail", "mid", "cuts", "slot", "saved", "used", "__weakref__")

    def __init__(self):
        self.n = 0
        self.aligned = 0  # positions < aligned were computed in whole-block prompt passes
        self.tail = 0  # the end of a shorter pass that began at `aligned` (a prompt's last block), or 0
        self.mid = 0  # the position after its first <fim_middle>, 0: none (lsp_server/backends/base.py WholeBlocks)
        self.cuts: list[int] = []  # the line cuts (not multiples of the block) up to `aligned`
        self.slot: int | None = None
        self.saved = None  # ctypes byte array from llama_state_seq_get_data while swapped out
        self.used = 0

    def get_seq_length(self) -> int:
        """Tokens held (the name transformers' caches use, so tests read both alike)."""
        return self.n

    def __repr__(self) -> str:
        where = f"slot {self.slot}" if self.slot is not None else ("swapped out" if self.saved is not None else "empty")
        return f"LlamaCache({self.n} tokens, {where})"


class _Native:
    """The llama.cpp objects of one loaded model, freed once when nothing refers to them."""

    def __init__(self, L):
        self.L, self.model, self.ctx, self.batch = L, None, None, None

    def free(self) -> None:
        L = self.L
        if self.batch is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


class ContextFull(RuntimeError):
    """A sequence would grow past the tokens one slot holds."""


class LlamaModel(TensorBackend):
    """A GGUF model in llama.cpp behind the backend interface (lsp_server/backends/base.py)."""

    kind = "llama.cpp"
    serial_rows = True  # verification runs its rows one token per pass (the module docstring)

    def __init__(self, spec: str, name: str, path: Path, *, threads: int | None = None, slots: int | None = None,
                 slot_tokens: int | None = None, gpu: bool = False):
        L = lib()
        self._L = L
        self.spec, self.name, self.path = spec, name, Path(path)
        self.load_seconds = 0.0
        opt = LlamaOptions.from_env()
        self.threads = max(1, int(threads or opt.threads or torch.get_num_threads()))
        self.gpu = gpu
        self._native = _Native(L)  # owns the C objects; shared by copies of this object
        self._model = self._ctx = None
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = -1 if gpu else 0
        if opt.extra_buffers is False or (opt.extra_buffers is None and built_with_amx(L)):
            mp.use_extra_bufts = False  # no repacked / AMX weight layouts (see built_with_amx)
        LOG_TAIL.clear()
        self._model = self._native.model = L.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self._model:
            raise load_error(self.path, list(LOG_TAIL))
        self._vocab = L.llama_model_get_vocab(self._model)
        n_train = int(L.llama_model_n_ctx_train(self._model)) or 4096
        self.slots = max(1, int(slots or opt.slots))
        self.slot_tokens = max(256, min(int(slot_tokens or opt.slot_tokens), n_train))
        cp = L.llama_context_default_params()
        cp.n_seq_max = self.slots
        cp.kv_unified = False  # one KV stream per sequence: a sequence's cells are its positions
        cp.n_ctx = self.slots * self.slot_tokens
        cp.n_batch = cp.n_ubatch = self.batch = 512
        self.block = max(1, min(self.batch, opt.block))  # prompt pass cut
        cp.n_threads = cp.n_threads_batch = self.threads
        # Flash attention off unless DITTO_LLAMA_FLASH_ATTN=1: on the CPU it makes a token's logits
        # depend on how the prompt was split into passes, so a prompt whose prefix came from the KV
        # cache (reuse) got other tokens than the same prompt prefilled fresh (default model, four
        # 600-token prompts with a 400-token prefix reused: 2 of 4 differed within 16 tokens with it,
        # 0 of 4 without; prefill about 10% slower without; docs/backends.md).
        self.flash_attn = opt.flash_attn
        cp.flash_attn_type = getattr(L, "LLAMA_FLASH_ATTN_TYPE_ENABLED" if self.flash_attn
                                     else "LLAMA_FLASH_ATTN_TYPE_DISABLED")
        cp.no_perf = True
        LOG_TAIL.clear()
        self._ctx = self._native.ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            tail = next((l for l in reversed(LOG_TAIL) if l.strip()), "no reason given")
            raise ModelError(f"llama.cpp could not make a context for {self.name} ({tail}): "
                             f"lower DITTO_LLAMA_SLOTS or DITTO_LLAMA_CTX, or free memory")
        self.slot_tokens = int(L.llama_n_ctx_seq(self._ctx)) or self.slot_tokens
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = self._native.batch = L.llama_batch_init(self.batch, 0, 1)
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(self.batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(self.batch,))
        self._nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.batch,))
        self._want = np.ctypeslib.as_array(self._batch.logits, shape=(self.batch,))
        self._seq_of = [None] * self.batch  # the slot batch.seq_id[i][0] holds now
        self._slots: list[weakref.ref | None] = [None] * self.slots
        self._clock = itertools.count(1)
        self._lock = threading.RLock()

        self.vocab_size = int(L.llama_vocab_n_tokens(self._vocab))
        self._vocabulary: dict[str, int] | None = None  # read when first asked for (152k calls)
        self._token_bytes: list[bytes] | None = None
        # FIM and stop tokens by name; the whole vocabulary only if no FIM tokens are found that way.
        named = self._lookup([n for names in FIM_NAMES for n in names if n] + list(STOP_NAMES))
        self.fim = find_fim_tokens(named) or find_fim_tokens(self.vocabulary())
        eos = [int(L.llama_vocab_eos(self._vocab)), int(L.llama_vocab_eot(self._vocab))]
        self.stop_ids = stop_token_ids(named, [t for t in eos if t >= 0], self.fim)
        self.dtype = file_type(L, self._model)
        self.max_sequence = self.slot_tokens
        self.kv_bytes_per_token = self._kv_bytes()

    def _kv_bytes(self) -> int:
        """Bytes of K and V (f16) one token takes, from the GGUF's dimensions; 0 when they are not there."""
        def meta(key: str) -> int:
            buf = ctypes.create_string_buffer(128)
            n = self._L.llama_model_meta_val_str(self._model, key.encode(), buf, 128)
            try:
                return int(buf.value) if n > 0 else 0
            except ValueError:
                return 0
        buf = ctypes.create_string_buffer(64)
        self._L.llama_model_meta_val_str(self._model, b"general.architecture", buf, 64)
        arch = buf.value.decode("utf-8", "replace")
        layers, embd = meta(f"{arch}.block_count"), meta(f"{arch}.embedding_length")
        heads = meta(f"{arch}.attention.head_count")
        kv_heads = meta(f"{arch}.attention.head_count_kv") or heads
        return 2 * 2 * layers * kv_heads * (embd // heads) if heads else 0

    def close(self) -> None:
        """Free the context and the weights now (otherwise when the last reference goes)."""
        native = getattr(self, "_native", None)
        if native is not None:
            native.free()

    def describe(self) -> dict:
        return {"backend": self.kind, "device": "gpu" if self.gpu else "cpu", "dtype": self.dtype,
                "threads": self.threads, "flash_attn": self.flash_attn}

    # -- text side ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return tokenize(self._L, self._vocab, text, special=True)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(t) for t in ids]
        if not ids:
            return ""
        arr = (ctypes.c_int32 * len(ids))(*ids)
        size = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._L.llama_detokenize(self._vocab, arr, len(ids), buf, size, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            size = -n

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    def vocabulary(self) -> dict[str, int]:
        if self._vocabulary is None:
            vocab = {}
            for i in range(self.vocab_size):
                vocab.setdefault(self._text(i), i)
            self._vocabulary = vocab
        return dict(self._vocabulary)

    def token_bytes(self) -> list[bytes]:
        """The bytes each id writes (b"" for control tokens), read once per model."""
        if self._token_bytes is None:
            L, buf, out = self._L, ctypes.create_string_buffer(256), []
            for tid in range(self.vocab_size):
                n = L.llama_token_to_piece(self._vocab, tid, buf, 256, 0, False)
                out.append(buf.raw[:n] if n > 0 else b"")
            self._token_bytes = out
        return self._token_bytes

    def _text(self, tid: int) -> str:
        """A token's text as the GGUF's vocabulary spells it (byte-level BPE: 'Ġ' for a space)."""
        return (self._L.llama_vocab_get_text(self._vocab, tid) or b"").decode("utf-8", "replace")

    def _lookup(self, names: list[str]) -> dict[str, int]:
        """{name: id} for the names that are single tokens of the vocabulary."""
        found = {}
        for name in names:
            data = name.encode("utf-8")
            buf = (ctypes.c_int32 * (len(data) + 8))()
            n = self._L.llama_tokenize(self._vocab, data, len(data), buf, len(data) + 8, False, True)
            if n == 1 and self._text(buf[0]) == name:
                found[name] = int(buf[0])
        return found

    def special_ids(self) -> dict[str, int | None]:
        L, v = self._L, self._vocab
        # bos only where the tokenizer adds it: a transformers tokenizer that adds none reports none.
        bos = L.llama_vocab_bos(v) if L.llama_vocab_get_add_bos(v) else None
        ids = {"eos_token_id": L.llama_vocab_eos(v), "bos_token_id": bos,
               "pad_token_id": L.llama_vocab_pad(v), "unk_token_id": None}
        return {k: (int(t) if t is not None and t >= 0 else None) for k, t in ids.items()}

    # -- tensor side -------------------------------------------------------------------
    def new_cache(self) -> LlamaCache:
        return LlamaCache()

    def forward(self, ids: Sequence[int], cache: LlamaCache, last: int) -> torch.Tensor:
        """Run `ids` (new tokens after what `cache` holds); float32 logits [last, vocab] of the last rows.

        Rows of a multi-row request run one token per pass (see the module docstring).
        """
        ids = [int(t) for t in ids]
        if not 1 <= last <= len(ids):
            raise ValueError(f"last must be in 1..{len(ids)}, got {last}")
        with self._lock:
            if cache.n + len(ids) > self.slot_tokens:
                raise ContextFull(f"a sequence of {cache.n + len(ids)} tokens does not fit the llama.cpp context of "
                                  f"{self.slot_tokens} tokens per document: lower the prompt budget or raise DITTO_LLAMA_CTX")
            slot = self._resident(cache)
            if last == 1:
                return torch.from_numpy(self._run(ids, cache, slot, True)[None, :])
            head = len(ids) - last
            if head:
                self._run(ids[:head], cache, slot, False)
            rows = [self._run([t], cache, slot, True) for t in ids[head:]]
            return torch.from_numpy(np.stack(rows))

    def _run(self, ids: list[int], cache: LlamaCache, slot: int, logits: bool):
        """Decode `ids` into `slot` after cache.n; the last row's logits.

        Passes are cut where the absolute position is a multiple of `block` (the module
        docstring), so a prompt is computed in the same passes whatever the cache held.
        """
        L = self._L
        out = None
        start = 0
        for n in self.pieces(cache, cache.n, ids):
            pos = cache.n
            chunk = ids[start : start + n]
            self._tokens[:n] = chunk
            self._pos[:n] = np.arange(pos, pos + n, dtype=np.int32)
            self._nseq[:n] = 1
            self._want[:n] = 0
            end = start + n == len(ids)
            if logits and end:
                self._want[n - 1] = 1
            for i in range(n):
                if self._seq_of[i] != slot:
                    self._batch.seq_id[i][0] = slot
                    self._seq_of[i] = slot
            self._batch.n_tokens = n
            rc = L.llama_decode(self._ctx, self._batch)
            if rc != 0:
                raise RuntimeError(f"llama.cpp decode failed (code {rc}) at position {cache.n} of slot {slot}")
            cache.n += n
            self.passed(cache, pos, chunk)
            start += n
            if logits and end:
                ptr = L.llama_get_logits_ith(self._ctx, n - 1)
                out = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy()
        return out

    def crop(self, cache: LlamaCache, keep: int) -> None:
        with self._lock:
            keep = max(0, int(keep))
            if keep >= cache.n:
                return
            cache.n = keep
            self.cropped(cache, keep)
            if cache.slot is not None:
                self._L.llama_memory_seq_rm(self._mem, cache.slot, keep, -1)
            elif keep == 0:
                cache.saved = None
            # else: swapped out; the rest is dropped when it is copied back (_resident)

    def clone(self, cache: LlamaCache, keep: int) -> LlamaCache:
        """A new cache holding the first `keep` tokens of `cache`: its sequence's state bytes (copied out
        of its slot, or its swapped-out copy), set into a slot of its own when first run (`_resident`)."""
        with self._lock:
            out = LlamaCache()
            keep = max(0, min(int(keep), cache.n))
            if keep == 0:
                return out
            data = cache.saved
            if cache.slot is not None:
                L = self._L
                size = int(L.llama_state_seq_get_size(self._ctx, cache.slot))
                data = (ctypes.c_uint8 * size)()
                if not int(L.llama_state_seq_get_data(self._ctx, data, size, cache.slot)):
                    raise RuntimeError(f"llama.cpp could not copy the sequence of slot {cache.slot}")
            out.saved, out.n = data, keep
            self.copy_plan(cache, out)
            self.cropped(out, keep)
            return out

    def release(self, cache: LlamaCache) -> None:
        with self._lock:
            if cache.slot is not None and self._native.ctx:
                self._L.llama_memory_seq_rm(self._mem, cache.slot, -1, -1)
                self._slots[cache.slot] = None
            cache.slot, cache.saved, cache.n = None, None, 0
            self.reset_plan(cache)

    # -- slots -----------------------------------------------------------------------------
    def _resident(self, cache: LlamaCache) -> int:
        """The slot holding `cache`, copying it back in (and another one out) if needed."""
        cache.used = next(self._clock)
        if cache.slot is not None:
            return cache.slot
        L = self._L
        slot = self._free_slot()
        if cache.saved is not None:
            data, cache.saved = cache.saved, None
            if not L.llama_state_seq_set_data(self._ctx, data, len(data), slot):
                L.llama_memory_seq_rm(self._mem, slot, -1, -1)
                raise RuntimeError(f"llama.cpp could not restore a swapped-out sequence into slot {slot}")
            L.llama_memory_seq_rm(self._mem, slot, cache.n, -1)  # crops made while it was out
        elif cache.n:
            raise RuntimeError("a llama.cpp cache lost its tokens (released, then used again?)")
        cache.slot = slot
        self._slots[slot] = weakref.ref(cache)
        return slot

    def _free_slot(self) -> int:
        L = self._L
        lru, lru_slot = None, -1
        for slot, ref in enumerate(self._slots):
            holder = ref() if ref is not None else None
            if holder is None or holder.slot != slot:
                if ref is not None:  # its handle was dropped without release()
                    L.llama_memory_seq_rm(self._mem, slot, -1, -1)
                self._slots[slot] = None
                return slot
            if lru is None or holder.used < lru.used:
                lru, lru_slot = holder, slot
        # Every slot is taken: swap the least recently used sequence out to host memory.
        size = int(L.llama_state_seq_get_size(self._ctx, lru_slot))
        data = (ctypes.c_uint8 * size)()
        got = int(L.llama_state_seq_get_data(self._ctx, data, size, lru_slot))
        L.llama_memory_seq_rm(self._mem, lru_slot, -1, -1)
        lru.slot, lru.saved = None, (data if got else None)
        if not got:
            lru.n = 0
            self.reset_plan(lru)
            log.warning("llama.cpp could not save a sequence of slot %d; it will be recomputed", lru_slot)
        self._slots[lru_slot] = None
        return lru_slot

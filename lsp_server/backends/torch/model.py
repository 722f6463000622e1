"""The torch + transformers backend: the reference implementation and the GPU path.

Implements the interface of lsp_server/backends/base.py over a transformers causal LM: a
`DynamicCache` per sequence, `forward` over new tokens with logits for the last rows,
crop by dropping tokens off the end. With lsp_server/backends/tiny.py, the only modules that
import transformers.

Loading: a model directory or hub id directly; a GGUF (a packaged model, joined by
lsp_server/backends/packaged.py, or a user's `.gguf`) is dequantised once to float32 safetensors
in the cache directory (about a minute for the 0.5B), so later starts take seconds.
Device and dtype: CUDA and bfloat16 when a GPU is there, else the CPU in float32 (bf16
on this kind of CPU is far from batch-invariant; float32 is close, and `tie_margin` says how
close: docs/backends.md, "Near-ties").

Pass shape and cache (docs/gpu.md): `pad_to=R` runs every pass over at most R tokens
through one fixed shape of R rows (dummy tokens after the real ones, the real rows'
logits kept, the cache cut back to the real tokens), so plain decoding and verification
multiply matrices of the same shape and row i's logits depend on row i's inputs only,
which is what makes greedy speculation exact in bf16 on a GPU. `static_cache=N` keeps
the KV in preallocated buffers indexed by position (`StaticKV`: crop is a length change,
stale slots are masked until overwritten); `cuda_graphs=True` (CUDA and a static cache
only) replays each pass shape from a captured CUDA graph. The same code runs eagerly on
the CPU, where the tests hold it to the dynamic cache. `with_options` makes such a model;
DITTO_FIXED_SHAPE, DITTO_STATIC_CACHE and DITTO_CUDA_GRAPHS set them at load (`wrap`); on
CUDA in bf16 all three are on unless one is set to 0 (the GPU check's decision, docs/gpu.md).

Also here: `small_batch_matmul` (verify passes over 2-4 tokens through (W @ x.T).T on
the CPU; DITTO_SMALL_BATCH_MATMUL=0 turns it off), `hf_generate`, transformers' own
`generate` on the same prompt, which the benchmark compares against, and `random_model`
(an architecture with random weights, for the GPU check, ditto_bench/gpucheck.py).
Left out on purpose: decoding (engine.py), prompts (context.py).
"""

from __future__ import annotations

import copy
import inspect
import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from lsp_server.backends.base import (
    FimTokens,
    ModelError,
    TensorBackend,
    find_fim_tokens,
    stop_token_ids,
)
from lsp_server.backends.torch.options import (
    TIE_MARGIN,
    pass_options,
    small_batch_matmul,
    small_batch_matmul_on,
    torch_block,
)

log = logging.getLogger(__name__)


class StaticKV:
    """A KV cache in preallocated buffers indexed by position (gpt-fast style).

    keys[l], values[l]: [1, kv_heads, capacity, head_dim]. Slot j holds token j; `length`
    tokens are valid. A pass writes its rows at slots `write_pos` (set by the backend before
    the pass) and attends over the whole buffer under a mask that lets row i see slots up
    to its own position, so stale slots past `length` are never read before a later pass
    overwrites them: cropping is `length = keep`, nothing moves. Buffers keep their
    addresses (CUDA graphs captured over them stay valid) until `grow` replaces them.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device):
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.length = 0
        self.write_pos: torch.Tensor | None = None
        self.graphs: dict[int, "_Graph"] = {}  # pass rows -> graph captured over these buffers
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        layers, kv_heads, head_dim = self.shape
        self.capacity = capacity
        # Zeros, not empty: a masked slot's value is multiplied by an exact 0 and must be finite.
        self.keys = [torch.zeros(1, kv_heads, capacity, head_dim, dtype=self.dtype, device=self.device)
                     for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.slots = torch.arange(capacity, device=self.device)

    def grow(self, capacity: int) -> None:
        """Room for `capacity` tokens: new buffers (what is held is copied), so captured graphs are dropped."""
        if capacity <= self.capacity:
            return
        old_k, old_v = self.keys, self.values
        self._alloc(capacity)
        for new, old in zip(self.keys + self.values, old_k + old_v):
            new[:, :, : old.shape[2]].copy_(old)
        self.graphs.clear()

    # -- what the transformers attention layers call -------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.write_pos, key_states.to(k.dtype))
        v.index_copy_(2, self.write_pos, value_states.to(v.dtype))
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, keep: int) -> None:
        self.length = min(self.length, max(0, keep))


@dataclass
class _Graph:
    """One captured pass shape over one StaticKV's buffers: fill `ids` and `start`, replay, read `out`."""

    graph: object
    ids: torch.Tensor  # [1, rows] token ids
    start: torch.Tensor  # [1] position of row 0
    out: torch.Tensor  # [rows, vocab] float32 logits


class TorchModel(TensorBackend):
    """A transformers causal LM behind the backend interface (lsp_server/backends/base.py)."""

    kind = "torch"
    STATIC_POOL = 16  # released static caches kept for reuse (with their captured graphs)
    GRAPH_ROWS = 32  # passes over more rows than this (prefill chunks) run eagerly
    STATIC_HEADROOM = 512  # tokens of room a static cache keeps after the pass that made it grow

    def __init__(self, spec: str, name: str, module: torch.nn.Module, tokenizer, device: torch.device,
                 dtype: torch.dtype, *, fim: FimTokens | None = None, stop_ids: frozenset[int] | None = None,
                 vocab_size: int | None = None, pad_to: int | None = None, static_cache: int | None = None,
                 cuda_graphs: bool = False):
        if pad_to is not None and pad_to < 1:
            raise ValueError(f"pad_to must be at least 1, got {pad_to}")
        if static_cache is not None and static_cache < 1:
            raise ValueError(f"static_cache must be a capacity of at least 1 token, got {static_cache}")
        if cuda_graphs and (device.type != "cuda" or static_cache is None):
            raise ValueError("cuda_graphs needs a CUDA device and a static cache (static_cache=N)")
        if static_cache is not None:
            kinds = set(getattr(module.config, "layer_types", None) or ["full_attention"])
            if kinds != {"full_attention"}:
                raise ModelError(f"the static KV cache supports full-attention models only, not {sorted(kinds)}")
        self.pad_to = pad_to
        # Whole-block prompt passes (backend.py WholeBlocks) only when asked: on this CPU 32-row
        # passes made a 512-token prefill 2x slower (32 s against 16 s), 64-row 1.5x; without them
        # a reused prefix is close to a fresh prefill's bits, not equal (docs/backends.md).
        self.block = torch_block()
        self.static_cache = static_cache
        self.cuda_graphs = cuda_graphs
        self._pool: list[StaticKV] = []
        self._graph_pool = None
        # One capacity for every static cache of this model: the attended length is part of
        # a pass's shape, so two caches of different capacities need not give the same bits.
        self._capacity = static_cache
        self.spec = spec
        self.name = name
        self._model = module
        self._tok = tokenizer
        self.device = device
        self.dtype = dtype
        vocab = self.vocabulary()
        self.fim = fim if fim is not None else find_fim_tokens(vocab)
        if stop_ids is None:
            eos = []
            for tid in (getattr(tokenizer, "eos_token_id", None), getattr(module.config, "eos_token_id", None)):
                eos.extend(tid if isinstance(tid, (list, tuple)) else [tid])
            stop_ids = stop_token_ids(vocab, [t for t in eos if isinstance(t, int)], self.fim)
        self.stop_ids = frozenset(stop_ids)
        self.vocab_size = int(vocab_size or module.get_output_embeddings().weight.shape[0])
        self.load_seconds = 0.0
        self._token_bytes: list[bytes] | None = None
        cfg = module.config
        heads = getattr(cfg, "num_attention_heads", 0) or 0
        head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else 0)
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        self.kv_bytes_per_token = 2 * (getattr(cfg, "num_hidden_layers", 0) or 0) * kv_heads * head_dim * \
            torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 0
        self.max_sequence = getattr(cfg, "max_position_embeddings", None)
        params = inspect.signature(module.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def module(self) -> torch.nn.Module:
        """The transformers module (for tools that call transformers on it: ditto_bench/hf.py)."""
        return self._model

    @property
    def static_capacity(self) -> int | None:
        """Tokens the static KV cache holds now (it grows when a pass needs more), None without one."""
        return self._capacity

    @property
    def tokenizer(self):
        """The transformers tokenizer."""
        return self._tok

    def with_module(self, module: torch.nn.Module, spec: str) -> "TorchModel":
        """Another model with this one's tokenizer (tests: two sets of weights, one vocabulary)."""
        return TorchModel(spec, spec, module, self._tok, self.device, self.dtype, fim=self.fim,
                          stop_ids=self.stop_ids, vocab_size=self.vocab_size)

    _UNSET = object()

    def with_options(self, *, pad_to=_UNSET, static_cache=_UNSET, cuda_graphs=_UNSET) -> "TorchModel":
        """The same weights and tokenizer with another pass shape / cache (the module docstring)."""
        lm = TorchModel(self.spec, self.name, self._model, self._tok, self.device, self.dtype, fim=self.fim,
                        stop_ids=self.stop_ids, vocab_size=self.vocab_size,
                        pad_to=self.pad_to if pad_to is TorchModel._UNSET else pad_to,
                        static_cache=self.static_cache if static_cache is TorchModel._UNSET else static_cache,
                        cuda_graphs=self.cuda_graphs if cuda_graphs is TorchModel._UNSET else cuda_graphs)
        lm.load_seconds = self.load_seconds
        return lm

    @property
    def fixed_rows(self) -> int | None:
        """Rows of the fixed pass shape, or None. A pass over more tokens than this is not
        padded, so the engine verifies at most fixed_rows - 1 drafts (lsp_server/decoding/engine.py)."""
        return self.pad_to

    def save_pretrained(self, directory) -> None:
        """Write the weights and the tokenizer as a model directory transformers can load."""
        self._model.save_pretrained(directory)
        self._tok.save_pretrained(directory)

    @property
    def tie_margin(self) -> float | None:
        """The logit margin under which a verify pass may decide otherwise than plain decoding.

        float32 on a CPU is not batch-invariant: a row's logits in a pass of several rows differ
        from a one-row pass by up to about 3e-5 on the default model (matrix products and
        attention pick other kernels by row count), and a greedy tie 1.9e-6 wide went the other
        way in one of 34 benchmark tasks (docs/backends.md, "Near-ties"). The engine undoes a verify round
        that decided a token by less than this and decodes it plainly. None where passes have
        one fixed shape (`pad_to`) or the margin would not bound the noise (bf16)."""
        if self.pad_to is not None or self.device.type != "cpu" or self.dtype != torch.float32:
            return None
        return TIE_MARGIN

    def describe(self) -> dict:
        d = {"backend": self.kind, "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch.")}
        if self.pad_to is not None:
            d["pass_rows"] = self.pad_to
        if self.static_cache is not None:
            d["kv_cache"] = "static"
        if self.cuda_graphs:
            d["cuda_graphs"] = True
        return d

    # -- text side ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_text(self, tid: int) -> str:
        return self.decode([tid])

    def vocabulary(self) -> dict[str, int]:
        return dict(self._tok.get_vocab()) if self._tok is not None else {}

    def token_bytes(self) -> list[bytes]:
        """The bytes each id writes (b"" for special tokens and ids past the tokenizer), once per model."""
        if self._token_bytes is None:
            self._token_bytes = hf_token_bytes(self._tok, self.vocab_size) if self._tok is not None else []
        return self._token_bytes

    def special_ids(self) -> dict[str, int | None]:
        return {a: getattr(self._tok, a, None) for a in ("eos_token_id", "bos_token_id", "pad_token_id",
                                                          "unk_token_id")}

    # -- tensor side -------------------------------------------------------------------
    def new_cache(self):
        if self.static_cache is None:
            from transformers import DynamicCache

            return DynamicCache(config=self._model.config)
        if self._pool:
            cache = self._pool.pop()
            cache.length = cache.aligned = cache.tail = 0
            cache.grow(self._capacity)
            return cache
        cfg = self._model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return StaticKV(cfg.num_hidden_layers, kv_heads, head_dim, self._capacity, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], cache, last: int) -> torch.Tensor:
        """Run the model over `ids` (new tokens after what `cache` holds).

        Returns float32 logits [last, vocab] for the last `last` positions, on the model's device.
        With `pad_to`, a pass over n <= pad_to tokens runs over pad_to rows (copies of the
        last token after the real ones; causal attention keeps them out of the real rows),
        with logits for every row (the LM head's shape is fixed too); the cache keeps the n
        real tokens only.
        """
        n = len(ids)
        if not 1 <= last <= n:
            raise ValueError(f"last must be in 1..{n}, got {last}")
        pos = cache.get_seq_length()
        if last == 1 and n > 1:  # a prompt pass: on whole blocks (backend.py WholeBlocks)
            out, start = None, 0
            for size in self.pieces(pos, n):
                out = self._pass(ids[start : start + size], cache, 1)
                self.passed(cache, pos + start, size)
                start += size
            return out
        out = self._pass(ids, cache, last)
        self.passed(cache, pos, n)
        return out

    def _pass(self, ids: Sequence[int], cache, last: int) -> torch.Tensor:
        n = len(ids)
        rows = self.pad_to if self.pad_to is not None and n <= self.pad_to else n
        ids = [*ids, *[ids[-1]] * (rows - n)]
        static = isinstance(cache, StaticKV)
        graphed = static and self.cuda_graphs and rows <= self.GRAPH_ROWS
        keep = 0 if rows != n or graphed else last  # 0: logits for every row
        if static:
            logits = self._static_forward(ids, cache, keep, graphed)
            cache.length += n
        else:
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            logits = self._model(input_ids=x, use_cache=True, logits_to_keep=keep,
                                 **{self._cache_kw: cache}).logits[0]
            if rows > n:
                cache.crop(-(rows - n))
        return logits[n - last : n].float() if keep == 0 else logits[-last:].float()

    def crop(self, cache, keep: int) -> None:
        if isinstance(cache, StaticKV):
            cache.crop(keep)
        else:
            drop = cache.get_seq_length() - keep
            if drop > 0:
                cache.crop(-drop)
        self.cropped(cache, min(keep, cache.get_seq_length()))

    def clone(self, cache, keep: int):
        """A new cache holding the first `keep` tokens of `cache` (its tensors copied)."""
        keep = max(0, min(int(keep), cache.get_seq_length()))
        out = self.new_cache()
        if keep:
            if isinstance(cache, StaticKV):
                out.grow(cache.capacity)
                for new, old in zip(out.keys + out.values, cache.keys + cache.values):
                    new[:, :, :keep].copy_(old[:, :, :keep])
                out.length = keep
            else:
                out = copy.deepcopy(cache)
        out.aligned, out.tail = getattr(cache, "aligned", 0), getattr(cache, "tail", 0)
        self.crop(out, keep)
        return out

    def release(self, cache) -> None:
        # A DynamicCache is plain tensors: garbage collection frees it. A static cache goes
        # back to the pool with its graphs (capturing again would cost more than the buffers).
        if isinstance(cache, StaticKV) and len(self._pool) < self.STATIC_POOL and cache not in self._pool:
            cache.length = 0
            self._pool.append(cache)

    # -- the static cache: one pass, eager or replayed from a CUDA graph ------------------
    def _static_step(self, cache: StaticKV, ids: torch.Tensor, start: torch.Tensor, keep: int) -> torch.Tensor:
        """The pass itself, the same code eagerly and under graph capture: positions
        start..start + rows - 1, written at those slots, each row attending to the slots up
        to its own position. Returns logits [rows or keep, vocab] in the model's dtype."""
        rows = ids.shape[1]
        pos = start + torch.arange(rows, device=self.device)
        cache.write_pos = pos
        visible = (cache.slots[None, :] <= pos[:, None])[None, None]  # [1, 1, rows, capacity]
        if self._model.config._attn_implementation == "sdpa":
            mask = visible
        else:  # eager attention adds the mask
            mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        out = self._model(input_ids=ids, position_ids=pos[None], attention_mask=mask, use_cache=True,
                          logits_to_keep=keep, **{self._cache_kw: cache})
        return out.logits[0]

    def _static_forward(self, ids: list[int], cache: StaticKV, keep: int, graphed: bool) -> torch.Tensor:
        rows = len(ids)
        need = cache.length + rows
        if need > self._capacity:
            # Grow every cache of the model (each when next used), with room for a completion
            # after this pass (usually a prompt's prefill), so that plain and speculative
            # decoding from one prefill run at one capacity. Passes on either side of a growth
            # inside one sequence need not have the same bits in bf16 (docs/gpu.md).
            capacity = self._capacity
            while capacity < need + self.STATIC_HEADROOM:
                capacity *= 2
            log.info("static KV cache: %d -> %d tokens (a pass reaching %d)", self._capacity, capacity, need)
            self._capacity = capacity
        cache.grow(self._capacity)
        if graphed:
            g = cache.graphs.get(rows) or self._capture(cache, ids)
            g.ids.copy_(torch.tensor([ids], dtype=torch.long))
            g.start.fill_(cache.length)
            g.graph.replay()
            return g.out.clone()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        start = torch.tensor([cache.length], dtype=torch.long, device=self.device)
        return self._static_step(cache, x, start, keep)

    def _capture(self, cache: StaticKV, ids: list[int]) -> _Graph:
        """Capture one pass shape over `cache`'s buffers (CUDA only). The warm-up passes run
        the real inputs at the real slots, which the replay then writes again identically;
        every result comes from the replay, never from the eager warm-up."""
        rows = len(ids)
        static_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        start = torch.tensor([cache.length], dtype=torch.long, device=self.device)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._static_step(cache, static_ids, start, 0)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            out = self._static_step(cache, static_ids, start, 0).float()
        g = _Graph(graph, static_ids, start, out)
        cache.graphs[rows] = g
        log.debug("captured a CUDA graph over %d rows", rows)
        return g


def wrap(spec, name, model, tok, dev, dt) -> TorchModel:
    """A loaded transformers module as a TorchModel, with the pass options of the environment (options.py)."""
    lm = TorchModel(spec, name, model, tok, dev, dt, **pass_options(dev, dtype=dt))
    if dev.type == "cpu" and small_batch_matmul_on():
        small_batch_matmul(model)
    return lm


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet read back: the character standing for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def hf_token_bytes(tok, size: int) -> list[bytes]:
    """The bytes of ids 0..size-1 of a transformers tokenizer: byte-level BPE (Qwen, StarCoder,
    DeepSeek) through its byte alphabet, SentencePiece (CodeLlama) through "▁" and <0xNN>
    tokens, else the id's decoded text. Special and added control tokens write b"" (healing
    never lets them stand for typed text; lsp_server/decoding/healing.py)."""
    pieces = tok.convert_ids_to_tokens(list(range(min(size, len(tok)))))
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    decoder = _byte_decoder()
    byte_level = sum(1 for p in pieces[:2000] if p and all(c in decoder for c in p)) > 0.9 * min(2000, len(pieces))
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(b"")
        elif byte_level and all(c in decoder for c in piece):
            out.append(bytes(decoder[c] for c in piece))
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            out.append(bytes([int(piece[3:5], 16)]))
        elif "▁" in piece:
            out.append(piece.replace("▁", " ").encode("utf-8"))
        else:
            text = tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            out.append(b"" if "\ufffd" in text else text.encode("utf-8"))
    return out + [b""] * (size - len(out))

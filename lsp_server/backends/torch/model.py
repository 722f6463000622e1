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
the CPU, where the tests hold it to the dynamic cache. Tree passes (`tree_next`, `keep_rows`;
tree.py) verify a tree of drafts in one pass, where `trees` allows. `with_options` makes such a model;
DITTO_FIXED_SHAPE, DITTO_STATIC_CACHE and DITTO_CUDA_GRAPHS set them at load (`wrap`); on
CUDA in bf16 all three are on unless one is set to 0 (the GPU check's decision, docs/gpu.md).

Also here: `small_batch_matmul` (verify passes over 2-4 tokens through (W @ x.T).T on
the CPU; DITTO_SMALL_BATCH_MATMUL=0 turns it off), `hf_generate`, transformers' own
`generate` on the same prompt, which the benchmark compares against, and `random_model`
(an architecture with random weights, for the GPU check, ditto_bench/gpucheck.py).
The fixed-shape path's cache is in static.py. Left out on purpose: decoding (engine.py), prompts (context.py).
"""

from __future__ import annotations

import copy
import inspect
import logging
from typing import Sequence

import torch

from lsp_server.backends.base import (
    FimTokens,
    ModelError,
    TensorBackend,
    find_fim_tokens,
    stop_token_ids,
)
from lsp_server.backends.torch import tree as trees
from lsp_server.backends.torch.static import StaticKV, Graph
from lsp_server.backends.torch.tokens import hf_token_bytes
from lsp_server.backends.torch.options import (
    TIE_MARGIN,
    pass_options,
    small_batch_matmul,
    small_batch_matmul_on,
    torch_block,
    trees_option,
    with_tree_rows,
)

log = logging.getLogger(__name__)


class TorchModel(TensorBackend):
    """A transformers causal LM behind the backend interface (lsp_server/backends/base.py)."""

    kind = "torch"
    STATIC_POOL = 16  # released static caches kept for reuse (with their captured graphs)
    GRAPH_ROWS = 32  # passes over more rows than this (prefill chunks) run eagerly
    STATIC_HEADROOM = 512  # tokens of room a static cache keeps after the pass that made it grow

    def __init__(self, spec: str, name: str, module: torch.nn.Module, tokenizer, device: torch.device,
                 dtype: torch.dtype, *, fim: FimTokens | None = None, stop_ids: frozenset[int] | None = None,
                 vocab_size: int | None = None, pad_to: int | None = None, static_cache: int | None = None,
                 cuda_graphs: bool = False, tree_passes: bool | None = None):
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
        self.tree_passes = tree_passes  # None: the default of `trees`
        self._pool: list[StaticKV] = []
        # Tree passes armed by `tree_next` for the next forward over a cache: id(cache) -> (cache, parents).
        # The backend's own state, not an attribute on the cache (a transformers object); the entry holds
        # the cache, so its id cannot be reused before the pass or `release` takes the entry out.
        self._armed: dict[int, tuple[object, list[int]]] = {}
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

    def with_options(self, *, pad_to=_UNSET, static_cache=_UNSET, cuda_graphs=_UNSET, trees=_UNSET) -> "TorchModel":
        """The same weights and tokenizer with another pass shape / cache / tree setting (the module docstring)."""
        def pick(new, old):
            return old if new is TorchModel._UNSET else new

        lm = TorchModel(self.spec, self.name, self._model, self._tok, self.device, self.dtype, fim=self.fim,
                        stop_ids=self.stop_ids, vocab_size=self.vocab_size, pad_to=pick(pad_to, self.pad_to),
                        static_cache=pick(static_cache, self.static_cache),
                        cuda_graphs=pick(cuda_graphs, self.cuda_graphs), tree_passes=pick(trees, self.tree_passes))
        lm.load_seconds = self.load_seconds
        return lm

    @property
    def fixed_rows(self) -> int | None:
        """Rows of the fixed pass shape, or None. A pass over more tokens than this is not
        padded, so the engine verifies at most fixed_rows - 1 drafts (lsp_server/decoding/engine.py)."""
        return self.pad_to

    @property
    def trees(self) -> bool:
        """Whether drafts may be verified as trees (tree.py; `tree_passes`, DITTO_TREES, overrides).
        Not by default on the fixed shape in float32 (a tree row whose ancestors are not at
        consecutive slots differs from plain decoding in the last bits on this CPU, and the fixed
        shape has no near-tie guard) nor on CUDA's fixed shape, until the GPU check has found tree
        rows bit-identical there (docs/gpu.md, "Trees"); elsewhere chains and trees are exact alike."""
        if self.tree_passes is not None:
            return self.tree_passes
        return self.pad_to is None or (self.device.type == "cpu" and self.dtype == torch.bfloat16)

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
            cache.length = 0
            self.reset_plan(cache)
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
        armed = self._armed.pop(id(cache), None)  # armed by tree_next for this pass
        tree = None if armed is None else armed[1]
        if tree is not None:
            if len(tree) != n or last != n:
                raise ValueError(f"a tree pass of {len(tree)} rows got {n} tokens and last={last}")
            out = self._pass(ids, cache, last, tree)
            self.passed(cache, pos, ids)
            return out
        if last == 1 and n > 1:  # a prompt pass: on whole blocks (backend.py WholeBlocks)
            out, start = None, 0
            for size in self.pieces(cache, pos, ids):
                out = self._pass(ids[start : start + size], cache, 1)
                self.passed(cache, pos + start, ids[start : start + size])
                start += size
            return out
        out = self._pass(ids, cache, last)
        self.passed(cache, pos, ids)
        return out

    def tree_next(self, cache, parents: Sequence[int]) -> None:
        """Make the next `forward` over `cache` a tree pass (tree.py): row j > 0 continues row
        parents[j] < j, sits at its depth's position and sees only the cache and its ancestors.
        Armed for that cache in the backend's own table, so the pass itself goes through `forward`
        (and any wrapper of it)."""
        self._armed[id(cache)] = (cache, trees.check_parents(parents))

    @torch.inference_mode()
    def keep_rows(self, cache, start: int, rows: Sequence[int]) -> None:
        """After a tree pass that began at `start`: keep, of its rows, those at offsets `rows`
        (increasing, 0 = the root), moved to start, start + 1, ...; drop the rest."""
        if isinstance(cache, StaticKV):
            trees.keep_rows([cache.buffers], start, rows, dynamic=False)
            cache.length = start + len(rows)
        else:
            for layer in cache.layers:
                layer.keys, layer.values = trees.keep_rows([layer.keys, layer.values], start, rows, dynamic=True)
        self.cropped(cache, start + len(rows))

    def _pass(self, ids: Sequence[int], cache, last: int, tree: list[int] | None = None) -> torch.Tensor:
        n = len(ids)
        rows = self.pad_to if self.pad_to is not None and n <= self.pad_to else n
        ids = [*ids, *[ids[-1]] * (rows - n)]
        static = isinstance(cache, StaticKV)
        graphed = static and self.cuda_graphs and rows <= self.GRAPH_ROWS
        keep = 0 if rows != n or graphed or tree is not None else last  # 0: logits for every row
        shape = None if tree is None else trees.layout(tree, rows, self.device)
        if static:
            logits = self._static_forward(ids, cache, keep, graphed, shape)
            cache.length += n
        elif shape is not None:
            held = cache.get_seq_length()
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            mask = trees.dynamic_mask(held, shape[1])
            if self._model.config._attn_implementation != "sdpa":
                mask = trees.additive(mask, self.dtype)
            logits = self._model(input_ids=x, position_ids=(held + shape[0])[None], attention_mask=mask,
                                 use_cache=True, logits_to_keep=0, **{self._cache_kw: cache}).logits[0]
            if rows > n:
                cache.crop(-(rows - n))
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
        self.copy_plan(cache, out)
        self.crop(out, keep)
        return out

    def release(self, cache) -> None:
        # A DynamicCache is plain tensors: garbage collection frees it. A static cache goes
        # back to the pool with its graphs (capturing again would cost more than the buffers).
        # A tree pass armed for it and never run goes (a pooled cache comes back unarmed).
        self._armed.pop(id(cache), None)
        if isinstance(cache, StaticKV) and len(self._pool) < self.STATIC_POOL and cache not in self._pool:
            cache.length = 0
            self._pool.append(cache)

    # -- the static cache: one pass, eager or replayed from a CUDA graph ------------------
    def _static_step(self, cache: StaticKV, ids: torch.Tensor, start: torch.Tensor, keep: int,
                     shape: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The pass itself, the same code eagerly and under graph capture: rows written at slots
        start..start + rows - 1, each row attending to the slots up to its own position. With
        `shape` (depth, ancestors; tree.py; always under graphs) row j sits at start + depth[j]
        and sees the slots before start and its ancestors' (a chain's shape gives the same mask).
        Returns logits [rows or keep, vocab] in the model's dtype."""
        rows = ids.shape[1]
        slot = start + torch.arange(rows, device=self.device)
        cache.write_pos = slot
        if shape is None:
            pos = slot
            visible = (cache.slots[None, :] <= pos[:, None])[None, None]  # [1, 1, rows, capacity]
        else:
            pos = start + shape[0]
            visible = trees.static_visible(cache.slots, start, shape[1])[None, None]
        if self._model.config._attn_implementation == "sdpa":
            mask = visible
        else:  # eager attention adds the mask
            mask = trees.additive(visible, self.dtype)
        out = self._model(input_ids=ids, position_ids=pos[None], attention_mask=mask, use_cache=True,
                          logits_to_keep=keep, **{self._cache_kw: cache})
        return out.logits[0]

    def _static_forward(self, ids: list[int], cache: StaticKV, keep: int, graphed: bool,
                        shape: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
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
            depth, anc = shape if shape is not None else self._chain(rows)
            g.depth.copy_(depth)
            g.anc.copy_(anc)
            g.graph.replay()
            return g.out.clone()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        start = torch.tensor([cache.length], dtype=torch.long, device=self.device)
        return self._static_step(cache, x, start, keep, shape)

    def _chain(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain layout of `rows` rows on the model's device (kept: every graphed pass copies one)."""
        chains = self.__dict__.setdefault("_chains", {})
        if rows not in chains:
            chains[rows] = trees.chain_layout(rows, self.device)
        return chains[rows]

    def _capture(self, cache: StaticKV, ids: list[int]) -> Graph:
        """Capture one pass shape over `cache`'s buffers (CUDA only). The warm-up passes run
        the real inputs at the real slots, which the replay then writes again identically;
        every result comes from the replay, never from the eager warm-up."""
        rows = len(ids)
        static_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        start = torch.tensor([cache.length], dtype=torch.long, device=self.device)
        # Every pass shape is captured with its layout as an input: plain, chain and tree passes
        # over `rows` rows replay one graph (the chain layout gives the causal mask; tree.py).
        depth, anc = (t.clone() for t in self._chain(rows))
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._static_step(cache, static_ids, start, 0, (depth, anc))
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            out = self._static_step(cache, static_ids, start, 0, (depth, anc)).float()
        g = Graph(graph, static_ids, start, out, depth, anc)
        cache.graphs[rows] = g
        log.debug("captured a CUDA graph over %d rows", rows)
        return g


def wrap(spec, name, model, tok, dev, dt) -> TorchModel:
    """A loaded transformers module as a TorchModel, with the pass options of the environment (options.py)."""
    trees = trees_option()
    lm = TorchModel(spec, name, model, tok, dev, dt, **with_tree_rows(pass_options(dev, dtype=dt), trees),
                    tree_passes=trees)
    if dev.type == "cpu" and small_batch_matmul_on():
        small_batch_matmul(model)
    return lm

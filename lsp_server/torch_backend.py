"""The torch + transformers backend: the reference implementation and the GPU path.

Implements the interface of lsp_server/backend.py over a transformers causal LM: a
`DynamicCache` per sequence, `forward` over new tokens with logits for the last rows,
crop by dropping tokens off the end. With lsp_server/tiny.py, the only modules that
import transformers.

Loading: a model directory or hub id directly; a GGUF (a packaged model, joined by
lsp_server/packaged.py, or a user's `.gguf`) is dequantised once to float32 safetensors
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
DITTO_FIXED_SHAPE, DITTO_STATIC_CACHE and DITTO_CUDA_GRAPHS set them at load (`wrap`).

Also here: `small_batch_matmul` (verify passes over 2-4 tokens through (W @ x.T).T on
the CPU; DITTO_SMALL_BATCH_MATMUL=0 turns it off), `hf_generate`, transformers' own
`generate` on the same prompt, which the benchmark compares against, and `random_model`
(an architecture with random weights, for the GPU check, lsp_server/gpucheck.py).
Left out on purpose: decoding (engine.py), prompts (context.py).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .backend import FimTokens, ModelError, Progress, WholeBlocks, find_fim_tokens, stop_token_ids
from .packaged import PackagedModel, converted_dir, is_converted, packaged_gguf, sha256_of

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


class TorchModel(WholeBlocks):
    """A transformers causal LM behind the backend interface (lsp_server/backend.py)."""

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
        self.block = int(os.environ.get("DITTO_TORCH_BLOCK") or 0)
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
        params = inspect.signature(module.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

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
        padded, so the engine verifies at most fixed_rows - 1 drafts (lsp_server/engine.py)."""
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


# ------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------


def choose_device(device: str | None) -> torch.device:
    if device and device != "auto":
        try:
            dev = torch.device(device)
        except RuntimeError as err:
            raise ModelError(f"unknown device {device!r} ({err}): use auto, cpu, cuda or cuda:N") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ModelError(f"device {device!r} asked for, but torch sees no CUDA GPU: use --device cpu")
        return dev
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def choose_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype and dtype != "auto":
        if dtype not in _DTYPES:
            raise ModelError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
        return _DTYPES[dtype]
    # bf16 on a GPU; float32 on a CPU (bf16 there is not batch-invariant; docs/design.md, "Exactness").
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_packaged(pm: PackagedModel, dev, dt, say: Progress) -> TorchModel:
    directory = converted_dir(pm.name, pm.sha256)
    if not is_converted(directory):
        _convert(packaged_gguf(pm, say), directory, pm.title, pm.sha256, say)
    return _load_dir(directory, pm.name, pm.title, dev, dt, False, say)


def load_gguf_file(path: Path, spec: str, dev, dt, say: Progress) -> TorchModel:
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist: give the path of a .gguf file")
    sha = sha256_of([path], say, path.name, path.stat().st_size)
    directory = converted_dir(path.stem, sha)
    if not is_converted(directory):
        _convert(path, directory, path.stem, sha, say)
    return _load_dir(directory, spec, path.stem, dev, dt, False, say)


def load_directory(source, spec: str, dev, dt, trust_remote_code: bool, say: Progress) -> TorchModel:
    """A local model directory (never touches the network) or a hub id."""
    name = Path(str(source)).name if isinstance(source, Path) else str(source)
    return _load_dir(source, spec, name, dev, dt, trust_remote_code, say)


def _load_dir(source, spec: str, name: str, dev, dt, trust_remote_code: bool, say: Progress) -> TorchModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"loading {name}", None)
    offline = not isinstance(source, str)
    try:
        # A local directory never touches the network (local_files_only); only a hub id may.
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(source), trust_remote_code=trust_remote_code,
                                                local_files_only=offline)
            model = AutoModelForCausalLM.from_pretrained(
                str(source), dtype=dt, trust_remote_code=trust_remote_code, low_cpu_mem_usage=True,
                local_files_only=offline,
            )
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = "directory" if offline else "hub id (is it spelled right, and is the hub reachable?)"
        raise ModelError(f"cannot load model {spec!r} from {where}: {first}") from None
    except ValueError as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(f"cannot load model {spec!r}: {first}") from None
    model.to(dev).eval()
    return wrap(spec, name, model, tok, dev, dt)


def wrap(spec, name, model, tok, dev, dt) -> TorchModel:
    lm = TorchModel(spec, name, model, tok, dev, dt, **pass_options(dev))
    if dev.type == "cpu" and os.environ.get("DITTO_SMALL_BATCH_MATMUL", "1") != "0":
        small_batch_matmul(model)
    return lm


TIE_MARGIN = 1e-3  # 30x the largest difference measured between pass shapes (3e-5, float32, CPU)
DEFAULT_PASS_ROWS = 9  # the engine's default draft_max (8) + 1
DEFAULT_STATIC_TOKENS = 4096  # grows (doubling, for every cache of the model) when a sequence needs more


def pass_options(dev: torch.device, env=None) -> dict:
    """TorchModel's pass-shape options from the environment (docs/gpu.md):
    DITTO_FIXED_SHAPE=1 (or a row count R >= 2) pads every decode and verify pass to R rows
    (default 9) and, unless DITTO_STATIC_CACHE=0, keeps the KV in a static cache: the two
    together fix every shape of a pass, rows and attended length, which is what exactness
    in bf16 needs; DITTO_STATIC_CACHE=1 (or a capacity in tokens) alone uses the static
    cache; DITTO_CUDA_GRAPHS=1 (CUDA only) sets both. All are off by default until the GPU
    check (lsp_server/gpucheck.py) has shown they hold there."""
    env = os.environ if env is None else env

    def number(name: str, default: int, least: int) -> int | None:
        raw = env.get(name, "").strip().lower()
        if raw in ("", "0", "off", "no", "false"):
            return None
        if raw in ("1", "on", "yes", "true"):
            return default
        if not raw.isdigit() or int(raw) < least:
            raise ModelError(f"{name}={raw!r}: use 0, 1 or a number of at least {least}")
        return int(raw)

    graphs = number("DITTO_CUDA_GRAPHS", 1, 1) is not None
    if graphs and dev.type != "cuda":
        raise ModelError("DITTO_CUDA_GRAPHS=1 needs a CUDA device: unset it or use --device cuda")
    pad = number("DITTO_FIXED_SHAPE", DEFAULT_PASS_ROWS, 2)
    static = number("DITTO_STATIC_CACHE", DEFAULT_STATIC_TOKENS, 64)
    if graphs:
        pad = pad or DEFAULT_PASS_ROWS
    if pad is not None and static is None and env.get("DITTO_STATIC_CACHE", "").strip() != "0":
        static = DEFAULT_STATIC_TOKENS
    if graphs and static is None:
        raise ModelError("DITTO_CUDA_GRAPHS=1 needs the static KV cache: unset DITTO_STATIC_CACHE or give a capacity")
    return {"pad_to": pad, "static_cache": static, "cuda_graphs": graphs}


def small_batch_matmul(model: torch.nn.Module, rows: tuple[int, int] = (2, 4)) -> int:
    """Compute the linear layers of a verify pass over 2-4 tokens as (W @ x.T).T on the CPU.

    Through F.linear a pass over 2-4 new tokens costs about 2-2.8x a one-token pass on
    this kind of CPU; the transposed product costs 1.6-1.9x (measured on
    Qwen2.5-Coder-0.5B, float32, one thread), which is what decides whether a short
    draft pays. One token and longer passes keep F.linear, which is faster there. The
    logits stay within the batch-invariance the engine relies on (the equivalence tests
    run with this on). Returns how many layers were changed; DITTO_SMALL_BATCH_MATMUL=0
    turns it off.
    """
    lo, hi = rows
    linear = torch.nn.functional.linear

    def forward(self, x):
        n = x.numel() // x.shape[-1] if x.dim() else 0
        if lo <= n <= hi and x.dtype == torch.float32:
            y = (self.weight @ x.reshape(n, x.shape[-1]).T).T.reshape(*x.shape[:-1], self.weight.shape[0])
            return y + self.bias if self.bias is not None else y
        return linear(x, self.weight, self.bias)

    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = forward.__get__(module)
            count += 1
    return count


def _convert(gguf: Path, target: Path, title: str, sha: str, say: Progress) -> None:
    """Dequantise a GGUF with transformers and save it as safetensors (fp32) + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"converting {title} from GGUF (once; about a minute)", None)
    t0 = time.monotonic()
    try:
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:  # gguf parsing raises many kinds; the user needs one line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelError(f"cannot read GGUF {gguf.name}: {first}: is it a complete GGUF file of a supported model?") from None
    # transformers refuses save_pretrained on a GGUF-loaded model until these go.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        with _quiet_transformers():
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "ditto.json").write_text(json.dumps({"title": title, "gguf_sha256": sha, "converted_s": round(time.monotonic() - t0, 1)}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"converted {title} in {time.monotonic() - t0:.0f}s to {target}", None)


def hf_generate(lm: TorchModel, prompt_ids: list[int], max_new_tokens: int, lookup_tokens: int | None = None,
                streamer=None) -> tuple[list[int], int]:
    """transformers `generate`, greedy, on `prompt_ids` (a fresh cache, as a library user calls it).

    Returns (new ids, padding stripped, a stop token included when it ended there; forward passes run).
    `lookup_tokens`: transformers' prompt lookup (`prompt_lookup_num_tokens`).
    """
    model = lm._model
    passes = [0]
    hook = model.register_forward_pre_hook(lambda *a: passes.__setitem__(0, passes[0] + 1))
    x = torch.tensor([prompt_ids], dtype=torch.long, device=lm.device)
    pad = getattr(lm._tok, "pad_token_id", None)
    if pad is None and lm.stop_ids:
        pad = min(lm.stop_ids)
    kwargs = dict(max_new_tokens=max(1, max_new_tokens), do_sample=False, temperature=None, top_p=None, top_k=None,
                  repetition_penalty=None, attention_mask=torch.ones_like(x), eos_token_id=sorted(lm.stop_ids) or None,
                  pad_token_id=pad)
    if lookup_tokens:
        kwargs["prompt_lookup_num_tokens"] = lookup_tokens
    try:
        with torch.inference_mode():
            out = model.generate(x, streamer=streamer, **kwargs)
    finally:
        hook.remove()
    new = out[0, len(prompt_ids) :].tolist()
    while new and pad is not None and new[-1] == pad and pad not in lm.stop_ids:
        new.pop()
    return new, passes[0]


# Qwen2.5-Coder-0.5B's architecture (its config.json), written out so that the GPU check
# needs no download: the weights are random there (lsp_server/gpucheck.py, docs/gpu.md).
QWEN25_CODER_05B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False, bos_token_id=151643, eos_token_id=151643,
)


def random_model(config: dict, device: torch.device, dtype: torch.dtype, seed: int = 0, init_std: float = 0.02,
                 name: str = "random", stop_ids: frozenset[int] = frozenset()) -> TorchModel:
    """A Qwen2 causal LM of the given architecture with random weights, built on `device`
    (no tokenizer: the engine and the GPU check need ids only). Pass costs, batch
    invariance and oracle speed depend on shapes and kernels, not on weight values."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**{**config, "initializer_range": init_std})
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.to(dtype).eval()
    model.generation_config.eos_token_id = None  # fixed-length runs: no token ends a random model's text
    return TorchModel(name, name, model, None, device, dtype, stop_ids=frozenset(stop_ids))


@contextlib.contextmanager
def _quiet_transformers():
    """No transformers progress bars or info chatter on stderr while loading: Ditto reports
    its own progress (to the terminal, or as $/progress to the editor)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()

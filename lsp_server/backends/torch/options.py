"""The torch backend's options from the environment, read here only: the pass shape and cache
(DITTO_FIXED_SHAPE, DITTO_STATIC_CACHE, DITTO_CUDA_GRAPHS; docs/gpu.md), tree passes (DITTO_TREES) and the CPU matmul
for short verify passes (DITTO_SMALL_BATCH_MATMUL), with the near-tie margin of float32 on a CPU.
"""


import logging
import os

import torch

from lsp_server.backends.base import ModelError

log = logging.getLogger(__name__)



TIE_MARGIN = 1e-3  # 30x the largest difference measured between pass shapes (3e-5, float32, CPU)
DEFAULT_PASS_ROWS = 9  # the engine's default draft_max (8) + 1
DEFAULT_STATIC_TOKENS = 4096  # grows (doubling, for every cache of the model) when a sequence needs more


def pass_options(dev: torch.device, env=None, dtype: torch.dtype | None = None) -> dict:
    """TorchModel's pass-shape options from the environment (docs/gpu.md):
    DITTO_FIXED_SHAPE=1 (or a row count R >= 2) pads every decode and verify pass to R rows
    (default 9) and, unless DITTO_STATIC_CACHE=0, keeps the KV in a static cache: the two
    together fix every shape of a pass, rows and attended length, which is what exactness
    in bf16 needs; DITTO_STATIC_CACHE=1 (or a capacity in tokens) alone uses the static
    cache; DITTO_CUDA_GRAPHS=1 (CUDA only) sets both.

    On CUDA in bfloat16 (what Ditto picks on an NVIDIA GPU) CUDA graphs, and with them the
    fixed shape and the static cache, are the default: the GPU check met every condition of
    its decision rule there (docs/gpu.md, "The first run on a GPU"). Any of the three set to
    0 turns that default off. Elsewhere all three are off unless set."""
    env = os.environ if env is None else env
    off = {name for name in ("DITTO_CUDA_GRAPHS", "DITTO_FIXED_SHAPE", "DITTO_STATIC_CACHE")
           if env.get(name, "").strip().lower() in ("0", "off", "no", "false")}
    if dev.type == "cuda" and dtype == torch.bfloat16 and not off and not env.get("DITTO_CUDA_GRAPHS", "").strip():
        env = {**env, "DITTO_CUDA_GRAPHS": "1"}

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


def trees_option(env=None) -> bool | None:
    """DITTO_TREES: 1 verifies drafts as trees wherever the backend runs them, 0 never; unset (None)
    leaves it to TorchModel.trees (docs/gpu.md, "Trees")."""
    raw = (os.environ if env is None else env).get("DITTO_TREES", "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("1", "on", "yes", "true", "0", "off", "no", "false"):
        return raw in ("1", "on", "yes", "true")
    raise ModelError(f"DITTO_TREES={raw!r}: use 0 or 1")


TREE_PASS_ROWS = 16  # the fixed shape for trees: the largest the H200 measured flat (docs/gpu.md, "Trees")


def with_tree_rows(opts: dict, trees: bool | None, env=None) -> dict:
    """`pass_options` for trees: with DITTO_TREES=1 the default fixed shape has TREE_PASS_ROWS rows
    (trees of 15 nodes; T(16) 3.71 ms against T(9) 3.66 ms on the H200, docs/perf/data/gpucheck.json),
    unless DITTO_FIXED_SHAPE names a row count."""
    raw = (os.environ if env is None else env).get("DITTO_FIXED_SHAPE", "").strip()
    if trees and opts.get("pad_to") == DEFAULT_PASS_ROWS and not (raw.isdigit() and int(raw) >= 2):
        return {**opts, "pad_to": TREE_PASS_ROWS}
    return opts


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


def torch_block(env=None) -> int:
    """DITTO_TORCH_BLOCK: whole-block prompt passes of this many positions (0, the default: off;
    lsp_server/backends/base.py WholeBlocks)."""
    env = os.environ if env is None else env
    return int(env.get("DITTO_TORCH_BLOCK") or 0)


def small_batch_matmul_on(env=None) -> bool:
    """DITTO_SMALL_BATCH_MATMUL=0 turns `small_batch_matmul` off (on by default, CPU only)."""
    env = os.environ if env is None else env
    return env.get("DITTO_SMALL_BATCH_MATMUL", "1") != "0"

"""The llama.cpp backend's options, read from the environment here only (docs/backends.md).

- DITTO_LLAMA_THREADS: threads (default: torch's thread count, which follows OMP_NUM_THREADS);
- DITTO_LLAMA_SLOTS: KV streams of the context (default 3; more documents are swapped out);
- DITTO_LLAMA_CTX: tokens per stream (default 4096, at most the model's trained context);
- DITTO_LLAMA_BLOCK: prompt passes cut at multiples of this (default 32);
- DITTO_LLAMA_FLASH_ATTN=1: flash attention on (off by default: on the CPU it made logits depend
  on how a prompt was split into passes);
- DITTO_LLAMA_EXTRA_BUFFERS: 0 or 1 forces the repacked / AMX weight layouts off or on (default:
  off only for a build with AMX kernels, lsp_server/backends/llama/library.py);
- DITTO_LLAMA_LIB: the path of a llama.cpp library of one's own build (libllama.so of b11549) to
  load instead of the xllamacpp wheel's (lsp_server/backends/llama/binding.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaOptions:
    threads: int | None = None  # None: torch's thread count
    slots: int = 3
    slot_tokens: int = 4096
    block: int = 32
    flash_attn: bool = False
    extra_buffers: bool | None = None  # None: decided by the build (AMX or not)
    library: str | None = None  # None: the xllamacpp wheel's

    @classmethod
    def from_env(cls, env=None) -> "LlamaOptions":
        env = os.environ if env is None else env
        extra = env.get("DITTO_LLAMA_EXTRA_BUFFERS")
        return cls(threads=int(env["DITTO_LLAMA_THREADS"]) if env.get("DITTO_LLAMA_THREADS") else None,
                   slots=int(env.get("DITTO_LLAMA_SLOTS") or 3), slot_tokens=int(env.get("DITTO_LLAMA_CTX") or 4096),
                   block=int(env.get("DITTO_LLAMA_BLOCK") or 32), flash_attn=env.get("DITTO_LLAMA_FLASH_ATTN", "0") == "1",
                   extra_buffers=None if extra is None else extra != "0",
                   library=(env.get("DITTO_LLAMA_LIB") or "").strip() or None)

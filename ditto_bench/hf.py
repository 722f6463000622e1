"""transformers' own generation and a randomly initialised architecture: the benchmark's and the
GPU check's peers (ditto_bench/systems.py, ditto_bench/gpucheck.py), not used by the server.

`hf_generate` is `model.generate` greedy on the same prompt, with a fresh cache, as a library
user calls it (optionally with transformers' prompt lookup); `random_model` builds an
architecture with random weights on a device, which is all the GPU check needs (pass costs,
batch invariance and oracle speed depend on shapes and kernels, not on weight values).
"""

from __future__ import annotations

import time

import torch

from lsp_server.backends.torch.model import TorchModel


def hf_generate(lm: TorchModel, prompt_ids: list[int], max_new_tokens: int, lookup_tokens: int | None = None,
                streamer=None) -> tuple[list[int], int]:
    """transformers `generate`, greedy, on `prompt_ids` (a fresh cache, as a library user calls it).

    Returns (new ids, padding stripped, a stop token included when it ended there; forward passes run).
    `lookup_tokens`: transformers' prompt lookup (`prompt_lookup_num_tokens`).
    """
    model = lm.module
    passes = [0]
    hook = model.register_forward_pre_hook(lambda *a: passes.__setitem__(0, passes[0] + 1))
    x = torch.tensor([prompt_ids], dtype=torch.long, device=lm.device)
    pad = getattr(lm.tokenizer, "pad_token_id", None)
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
# needs no download: the weights are random there (ditto_bench/gpucheck.py, docs/gpu.md).
QWEN25_CODER_05B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False, bos_token_id=151643, eos_token_id=151643,
)
# A 2-layer model of the same family (`--tiny`: the GPU check on CI).
TINY_ARCH = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=8192, rope_theta=10000.0, tie_word_embeddings=True,
                 use_sliding_window=False)


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


class FirstTokenClock:
    """A generate() streamer that notes when the first new tokens arrive (put #1 is the prompt)."""

    def __init__(self):
        self.calls = 0
        self.first = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass

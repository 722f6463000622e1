"""`tiny-random`: a tiny randomly initialised Qwen2 model for tests and protocol demos.

Built in-process in well under a second, no download: a byte-level BPE tokenizer trained
on a fixed corpus (deterministic across processes, so token ids are stable and text
round-trips) and a 2-layer Qwen2 with random weights. Its suggestions are noise; the
tests use it for exactness (speculative == plain), the protocol and the editors.
Left out on purpose: real models (lsp_server/backends/torch/model.py, lsp_server/backends/llama/model.py).
"""

from __future__ import annotations

import torch

from lsp_server.backends.packaged import TINY
from lsp_server.backends.torch.model import TorchModel
from lsp_server.backends.torch.model import wrap as wrap_module

_TINY_CORPUS = '''
import os
import sys
from dataclasses import dataclass


@dataclass
class Point:
    x: float
    y: float

    def distance(self, other: "Point") -> float:
        return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5


def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def read_lines(path):
    with open(path) as handle:
        for line in handle:
            yield line.rstrip("\\n")


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def __len__(self):
        return len(self.items)


if __name__ == "__main__":
    for i in range(10):
        print(i, fibonacci(i))
'''

TINY_SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|file_sep|>"]


def tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer trained in-process on a fixed corpus (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator([_TINY_CORPUS] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=TINY_SPECIALS[1:])


def tiny_random_model(vocab_size: int, seed: int = 0, hidden: int = 64, layers: int = 2, init_std: float = 0.5):
    """A Qwen2 causal LM with random weights, built in-process (no download).

    init_std is large on purpose: with the usual 0.02 every logit is nearly equal and
    greedy decoding would ride on near-ties; peaked distributions make outputs
    structured and ties rare.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, initializer_range=init_std,
        tie_word_embeddings=True, rope_theta=10000.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float().eval()


def tiny_random(device: torch.device | None = None, seed: int = 0, vocab_size: int = 512) -> TorchModel:
    """The `tiny-random` model on the torch backend (float32; on `device`, the CPU by default)."""
    tok = tiny_tokenizer(vocab_size)
    model = tiny_random_model(len(tok), seed=seed)
    dev = device or torch.device("cpu")
    model.to(dev)
    lm = wrap_module(TINY, TINY, model, tok, dev, torch.float32)
    lm.calibrated = False  # random weights: nothing to judge a suggestion by (base.py)
    return lm

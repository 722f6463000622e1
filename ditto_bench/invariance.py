"""Rows of one 9-token pass against 9 one-token passes, per pass shape and dtype, on the CPU.

The table in docs/gpu.md ("Padding alone ... is not enough") comes from this module:
    OMP_NUM_THREADS=1 python -m ditto_bench.invariance
It prints max |Δlogit| for today's path (unpadded, dynamic cache), padded passes on the
dynamic cache, the static cache unpadded, and static + padded (the fixed shape), on 2-layer
random models of the default model's family (hidden sizes 256 and 896, bf16 and float32).

Left out on purpose: the GPU's own measurement of the same (gpucheck.py, "batch invariance").
"""

import random

import torch

from lsp_server.backends.tiny import tiny_random, tiny_random_model
from lsp_server.backends.torch.model import TorchModel


def probe(lm: TorchModel, ids: list[int], k: int = 9) -> float:
    c1 = lm.new_cache()
    lm.forward(ids[:-k], c1, last=1)
    together = lm.forward(ids[-k:], c1, last=k)
    c2 = lm.new_cache()
    lm.forward(ids[:-k], c2, last=1)
    one = torch.cat([lm.forward([t], c2, last=1) for t in ids[-k:]])
    return float((together - one).abs().max())


def main() -> None:
    torch.set_num_threads(1)
    base = tiny_random()
    rng = random.Random(1)
    ids = [rng.randrange(6, base.vocab_size) for _ in range(60)]
    print("| dtype, hidden size | unpadded, dynamic | padded (9), dynamic | static, unpadded | static + padded (9) |")
    print("|---|---|---|---|---|")
    for dt in (torch.bfloat16, torch.float32):
        for hidden in (256, 896):
            m = tiny_random_model(base.vocab_size, hidden=hidden, layers=2, init_std=0.05).to(dt)
            lm = TorchModel("probe", "probe", m, base.tokenizer, base.device, dt)
            cells = [probe(v, ids) for v in (lm, lm.with_options(pad_to=9), lm.with_options(static_cache=128),
                                              lm.with_options(pad_to=9, static_cache=128))]
            print(f"| {str(dt).removeprefix('torch.')}, {hidden} | " + " | ".join(f"{c:.3g}" for c in cells) + " |")


if __name__ == "__main__":
    main()

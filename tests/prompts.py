"""Random prompts for the engine's equivalence tests (test_engine.py, test_fixed_shape.py).

`random_prompt` mixes random tokens with a repeated span, so the n-gram drafter finds
matches; `edited_prompts` follows one prompt through a user's kind of edits (append,
change in the middle, delete the tail, change the first token), so a cache reused across
them must crop and re-prefill correctly.
"""

from __future__ import annotations


def random_prompt(rng, lm) -> list[int]:
    span = [rng.randrange(6, lm.vocab_size) for _ in range(rng.randrange(2, 10))]
    parts = []
    for _ in range(rng.randrange(1, 6)):
        parts += [rng.randrange(6, lm.vocab_size) for _ in range(rng.randrange(0, 12))]
        parts += span
    return parts or [7]


def edited_prompts(rng, lm, edits: int) -> list[list[int]]:
    """A random prompt and `edits` successive edits of it (each edit applies to the one before)."""
    prompts = [random_prompt(rng, lm) + random_prompt(rng, lm)]
    for _ in range(edits):
        p = list(prompts[-1])
        op = rng.choice(["append", "edit-middle", "delete-tail", "edit-start"])
        if op == "append":
            p += [rng.randrange(6, lm.vocab_size) for _ in range(rng.randrange(1, 4))]
        elif op == "edit-middle":
            p[len(p) // 2] = rng.randrange(6, lm.vocab_size)
        elif op == "delete-tail":
            p = p[: max(1, len(p) - rng.randrange(1, 4))]
        else:
            p[0] = rng.randrange(6, lm.vocab_size)
        prompts.append(p)
    return prompts

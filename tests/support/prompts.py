"""Random prompts and scripted drafters for the engine's equivalence tests (test_engine.py,
test_fixed_shape.py: the same harness over the plain engine and the fixed-shape one).

`random_prompt` mixes random tokens with a repeated span, so the n-gram drafter finds
matches; `edited_prompts` follows one prompt through a user's kind of edits (append,
change in the middle, delete the tail, change the first token), so a cache reused across
them must crop and re-prefill correctly. `drafters_for` gives every kind of draft the
acceptance rule must handle: real n-gram drafts (plain and healing split tokens), random
ones, entirely right ones, ones wrong at the first token and ones wrong after a random
number of right tokens.
"""

from __future__ import annotations

from drafters import NGramDrafter, Proposal


class ListDrafter:
    """Proposes from a callable (context, k) -> tokens; records what it proposed."""

    def __init__(self, name, fn):
        self.name = name
        self.fn = fn
        self.proposed = 0

    def propose(self, context, k):
        toks = list(self.fn(list(context), k))[:k]
        self.proposed += len(toks)
        return Proposal(toks, source=self.name, match_len=6)  # "confident", for the adaptive length

    def update_source(self, name, tokens):
        pass

    def forget_source(self, name):
        pass


def drafters_for(lm, prompt, reference, rng):
    """Drafters for `prompt`, whose drafting-off continuation is `reference`."""
    n = len(prompt)

    def right(ctx, k):
        done = len(ctx) - n
        return reference[done : done + k]

    def wrong_first(ctx, k):
        good = right(ctx, k)
        if not good:
            return [rng.randrange(lm.vocab_size) for _ in range(k)]
        return [(good[0] + 1) % lm.vocab_size, *good[1:]]

    def half_right(ctx, k):  # right for a random number of tokens, then wrong
        good = right(ctx, k)
        cut = rng.randrange(0, len(good) + 1)
        return good[:cut] + [(t + 1) % lm.vocab_size for t in good[cut:]]

    return [
        NGramDrafter(),
        NGramDrafter(token_text=lm.token_text, encode=lm.encode),  # heals split tokens (mostly: as plain)
        ListDrafter("random", lambda ctx, k: [rng.randrange(lm.vocab_size) for _ in range(k)]),
        ListDrafter("right", right),
        ListDrafter("wrong-first", wrong_first),
        ListDrafter("half-right", half_right),
    ]


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

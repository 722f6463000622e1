"""The drafters by name: the one list of names, and how each is built (as vLLM's create_proposer).

Adding a drafter is its module plus one entry in `FACTORIES`. Every list of drafter names
(the `--drafter` choices, the `drafter` setting, the editors' settings checked by
tests/lsp/test_settings_paths.py) is `DRAFTERS`.

A factory gets a `DraftContext`: the n-gram drafter the caller keeps up to date with the
open buffers (the `ngram` drafter itself, drafters/suffix.py; the hybrid asks its chain `lookup`), the target model, and callables that load the draft model, give the
engine's speculation policy, time a draft model's passes and build another drafter by name,
each at most once, so a drafter that costs something to build (a draft model) is built on
first use only.

Left out on purpose: anything of lsp_server (the completer builds the context and hands in the
policy and the timing; lsp_server/completion/drafting.py), torch at import time (the model
drafter imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from drafters.ngram import NGramDrafter


@dataclass
class DraftContext:
    ngram: NGramDrafter  # the lookup drafter over the open buffers, the prompt and accepted completions (a SuffixDrafter)
    target: object  # the target model (a draft model must tokenize as it does)
    draft_model: Callable[[], object]  # the draft model of the settings, loaded once
    policy: Callable[[], object]  # the engine's speculation policy (lsp_server/decoding/speculation.py), calibrated
    get: Callable[[str], object]  # another drafter by name, built once (the hybrid shares the model drafter)
    # A draft model's pass costs, (ms of a one-token pass, ms per further token of a first pass):
    # lsp_server/decoding/speculation.py `measure_draft_costs`, handed in with the policy it prices for.
    draft_costs: Callable[[object], tuple[float, float]]


def _model(ctx: DraftContext):
    from drafters.model_drafter import ModelDrafter

    return ModelDrafter(ctx.draft_model(), target=ctx.target)


def _hybrid(ctx: DraftContext):
    from drafters.model_drafter import HybridDrafter

    model = ctx.get("model")
    # One policy for the engine and the hybrid: the engine's, with the draft model's pass
    # costs added (measured once per draft model).
    policy = ctx.policy()
    if policy.draft_ms is None:
        policy.set_draft_costs(*ctx.draft_costs(model.lm))
    return HybridDrafter(ctx.ngram, model, policy)


FACTORIES: dict[str, Callable[[DraftContext], object]] = {
    "none": lambda ctx: None,  # plain decoding
    "ngram": lambda ctx: ctx.ngram,  # suffix matches in every source, as a tree (drafters/suffix.py)
    "model": _model,  # a small draft model with the target's tokenizer (drafters/model_drafter.py)
    "hybrid": _hybrid,  # lookup where it is confident, else the draft model
}
DRAFTERS = tuple(FACTORIES)


def make_drafter(name: str, ctx: DraftContext):
    """The drafter called `name` (None for "none"); ValueError for an unknown name."""
    if name not in FACTORIES:
        raise ValueError(f"unknown drafter {name!r}: use one of {', '.join(DRAFTERS)}")
    return FACTORIES[name](ctx)

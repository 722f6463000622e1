"""The Drafter protocol: what the engine asks of anything that proposes tokens.

A drafter proposes; it never decides acceptance. The engine verifies every proposal
against the target model, so a wrong draft costs time, never correctness.

Left out on purpose: torch, LSP, tokenizers. Drafters see plain lists of token ids.
(A draft head reading the target's hidden state, such as Medusa or EAGLE, would need the
engine to hand that state over; docs/drafters.md says how. Nothing needs it today.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable


@dataclass
class Proposal:
    """Draft tokens, and how the drafter came by them.

    `probs` is None for a deterministic drafter (n-gram lookup: q is one-hot on each
    draft token); a model drafter fills it with one distribution per draft token (a
    sequence of torch tensors over the vocabulary), which the engine's general
    acceptance rule needs. `match_len` is the length of the n-gram that matched (0 when
    not applicable); `source` names where the draft came from, for traces and stats.
    `agreement` (n-gram lookup) is the fraction of matched positions whose continuation
    starts with the first draft token; None when not applicable. `paid` says the draft's
    cost is already spent (a draft model ran a pass per token): the engine verifies it
    whole instead of trimming it to the length that pays (lsp_server/decoding/speculation.py).
    `healed` (n-gram lookup) is the number of the context's last tokens matched by their
    text rather than their ids (0: an exact match): the cursor split a token, so the draft
    starts with the rest of a longer token's text, re-encoded (drafters/ngram.py); the
    policy learns such drafts' acceptance apart from exact matches.
    `tree` (None: a chain) makes the draft a tree: token i continues token tree[i] (-1: the
    context's last token); tokens are listed best first, each after its parent, so that every
    prefix of the list is a tree (lsp_server/decoding/tree.py verifies one in a single pass).
    `weights` (trees and chains from the suffix drafter) is each token's share of the
    continuations seen where its parent occurs: how the policy ranks and prices the nodes.
    """

    tokens: list[int] = field(default_factory=list)
    source: str = ""
    match_len: int = 0
    probs: object | None = None
    agreement: float | None = None
    paid: bool = False
    healed: int = 0
    tree: list[int] | None = None
    weights: list[float] | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class NoOwnSources:
    """For a drafter that keeps no sources of its own (what it drafts from was given when it was made,
    or belongs to another drafter) and drafts the same whatever the decoding options: the engine's
    source updates and options change nothing."""

    def update_source(self, name: str, tokens: Sequence[int]) -> None:
        pass

    def forget_source(self, name: str) -> None:
        pass

    def set_options(self, options) -> None:
        pass


@runtime_checkable
class Drafter(Protocol):
    """Proposes up to k next tokens for a context.

    `context` is the whole token sequence so far (prompt + generated). Sources other
    than the context are named buffers the drafter keeps itself (`update_source`,
    `forget_source`); the context is passed on every call, never stored by the engine.
    """

    name: str

    def propose(self, context: Sequence[int], k: int) -> Proposal: ...

    def update_source(self, name: str, tokens: Sequence[int]) -> None: ...

    def forget_source(self, name: str) -> None: ...

    def set_options(self, options) -> None:
        """The request's decoding options (a model drafter samples its drafts as the target
        samples; a lookup drafter ignores them)."""

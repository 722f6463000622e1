"""Drafters: things that propose the next tokens for the engine to verify.

Plain Python on token ids; no torch, no LSP. See `base.Drafter` for the protocol.
"""

from drafters.base import Drafter, Proposal
from drafters.ngram import NGramDrafter, NGramIndex

__all__ = ["Drafter", "Proposal", "NGramDrafter", "NGramIndex"]

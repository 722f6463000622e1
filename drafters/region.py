"""The region drafter: a region being rewritten is its own best draft.

A next-edit rewrite (lsp_server/nextedit/rewrite.py) asks the model to write a few lines anew after
seeing the user's recent edit; most of what it writes is a copy of the original lines. This drafter
proposes the original region's tokens, aligned with what has been written so far: after the
longest run of the last written tokens (`MAX_MATCH` down to 1) that stands in the region, nearest
the point the last draft reached, it proposes what follows there; before anything is written, the
region's start; when nothing matches, the region at the same offset as the tokens written so far.
Zed's Zeta serves its rewrites with n-gram speculation on the same idea.

A drafter proposes and never decides: the engine verifies every token, so what is written is what
the model alone writes (tests/nextedit/test_rewrite.py checks it token for token). Left out on
purpose: prompts, text, LSP (plain token ids, as every drafter).
"""

from __future__ import annotations

from typing import Sequence

from drafters.base import NoOwnSources, Proposal

MAX_MATCH = 4  # last written tokens matched against the region


class RegionDrafter(NoOwnSources):  # the region is its only source; drafts are deterministic
    name = "region"

    def __init__(self, region: Sequence[int], prompt_len: int):
        self.region = list(region)
        self.prompt_len = prompt_len
        self.at = 0  # where in the region the last proposal started ...
        self.seen = 0  # ... and how many tokens were written then

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        written = list(context[self.prompt_len :])
        region = self.region
        if k <= 0 or not region:
            return Proposal([], source="region")
        if not written:
            self.at = self.seen = 0
            return Proposal(region[:k], source="region", match_len=0)
        expected = self.at + len(written) - self.seen  # where the region would be, had the last draft held
        for n in range(min(MAX_MATCH, len(written)), 0, -1):
            tail = written[-n:]
            ends = [i + n for i in range(len(region) - n) if region[i : i + n] == tail]
            if ends:
                end = min(ends, key=lambda e: (abs(e - expected), e))
                return self._from(end, len(written), k, n)
        return self._from(min(len(written), len(region)), len(written), k, 0)  # no match: the same offset

    def _from(self, end: int, seen: int, k: int, n: int) -> Proposal:
        self.at, self.seen = end, seen
        return Proposal(self.region[end : end + k], source="region", match_len=n)

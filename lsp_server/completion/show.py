"""What to show of a suggestion (`ShowRule`, `shown_length`): the part the model is sure of
(docs/design.md, "What to show").

The engine reads, for every token it writes, the model's probability of it and its lead over the
runner-up (lsp_server/decoding/accept.py `sureness`). A small logistic model (`WEIGHTS`, nine numbers)
turns each token of the suggestion, in order, into the chance that the suggestion goes wrong at that
token, given that it was right so far (a hazard): from the token's probability and lead, whether it
is the first, whether the line held no code yet, how sure the tokens before it were, and what kind
of text it is (blanks, a word, a line break). The suggestion is shown up to the first token whose
hazard passes the rule's `limit`, and not at all when that is its first token. What is shown is
always a prefix of what the model alone writes: the tokens are the same, fewer reach the screen.

The weights and each setting's limit (`RULES`: `all`, `sure`, `surest`) were fitted and chosen on
editor replays of four tuning repositories only (`python -m ditto_bench.showtune --fit`, which
prints them; docs/design.md has the table). The server moves the limit by a bounded bias learnt from
what this user keeps (lsp_server/lsp/shown.py). A model that runs elsewhere (a remote engine) reports
no probabilities: its suggestions are shown whole.
Left out on purpose: where the text comes from (place.py), the stop rules (stops.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

# bias, log p, lead, first token, the line holds no code yet, log p of the tokens before, a blank
# piece, a piece that starts a word, a piece with a line break (ditto_bench/showtune.py `--fit`)
WEIGHTS = (-0.674, -1.317, -2.151, -0.094, 0.716, -0.048, 0.464, 0.46, -1.463)
BIAS_LIMIT = 0.1  # the most what a user keeps moves a limit (lsp_server/lsp/shown.py)


@dataclass(frozen=True)
class ShowRule:
    limit: float | None = None  # cut at the first token whose hazard passes this; None: show everything

    def biased(self, bias: float) -> "ShowRule":
        """The limit moved by `bias` (bounded by BIAS_LIMIT; positive shows more). `all` stays `all`."""
        if self.limit is None:
            return self
        b = max(-BIAS_LIMIT, min(BIAS_LIMIT, bias))
        return ShowRule(min(0.95, max(0.05, self.limit + b)))


# The `show` setting's values (module docstring). With limit 0.55 the tuning replays kept 0.48x the
# wrong answers of showing everything, 0.87x the characters kept and 0.91x the first lines right.
RULES = {"all": ShowRule(), "sure": ShowRule(0.55), "surest": ShowRule(0.4)}
SHOW_CHOICES = tuple(RULES)


def features(piece: str, p: float, lead: float, first: bool, blank_line: bool, logp_before: float) -> tuple:
    """One token's features for `WEIGHTS` (the same in the server and in the fit)."""
    word = piece.strip()[:1]
    return (1.0, math.log(max(p, 1e-6)), lead, float(first), float(blank_line), logp_before,
            float(not piece.strip()), float(word.isalnum() or word == "_"), float("\n" in piece))


def hazard(x: Sequence[float], weights: Sequence[float] = WEIGHTS) -> float:
    z = sum(w * v for w, v in zip(weights, x))
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))


def shown_length(pieces: Sequence[str], probs: Sequence[float], leads: Sequence[float], rule: ShowRule,
                 skip: int, blank_line: bool, weights: Sequence[float] = WEIGHTS) -> int | None:
    """Characters of the suggestion to show: the text `pieces` make (one piece per token) from character
    `skip` on (what comes before is text the user has: typed, healed or accepted). None: all of it."""
    if rule.limit is None:
        return None
    at, logp, first = 0, 0.0, True
    for piece, p, lead in zip(pieces, probs, leads):
        end = at + len(piece)
        if end > skip:  # a token of the suggestion (the first one may start inside the skipped text)
            if hazard(features(piece, p, lead, first, blank_line, logp), weights) > rule.limit:
                return max(0, at - skip)
            logp += math.log(max(p, 1e-6))
            first = False
        at = end
    return None

"""The prompt budget that fits this machine (the `context_tokens` setting at 0, its default): the
rule (`fitting_budget`) and the fit a Completer holds (`Fit`).

The costs come from a measurement when the model loads (lsp_server/completion/build.py
`prompt_costs`: the best of the last few loads, so that one load on a busy machine does not keep the
budget small) and from the requests themselves: a prefill of at least `Fit.OBSERVE_MIN` tokens that
cost less per token than the fit's costs (the machine was busier when it was measured) fits the budget
again (`Fit.observe`). A budget only grows so; a machine that became slower for good is seen at the
next loads, once the slower measurements are all that is kept.
Left out on purpose: measuring (build.py), prompts (context.py).
"""

from __future__ import annotations

# The prompt budget that fits this machine (`context_tokens` 0, the default). A place not visited yet
# costs the part of its prompt that is not cached (the file's head is: about 45% of the budget is
# processed there, 111 of 256, 172 of 384 and 214 of 512 tokens at p50 in the replays of
# docs/perf/README.md) plus its first line (about 6 tokens). The budget is the largest step of
# BUDGET_STEPS whose place not visited yet is predicted to be answered within COLD_GOAL_MS, 85% of
# the 3 s goal of time to a suggestion there; never less than ContextBudget.DEFAULT_TOTAL. On one
# core of the development machine (12.5 ms a prompt token, 26 ms a generated one) that is 384; on a
# GPU, 2048. A bigger prompt is more often right: on pypa/packaging 10/39 first lines at 256, 14/39
# at 384, 16/39 at 512 (docs/perf/README.md, 2026-12-04, fifth stop).
BUDGET_STEPS = (256, 384, 512, 768, 1024, 1536, 2048)
COLD_GOAL_MS = 2550.0
COLD_SHARE = 0.45  # of the budget processed at a place not visited yet
FIRST_LINE_TOKENS = 6


def fitting_budget(prefill_ms_per_token: float, decode_ms: float) -> int:
    """The largest of BUDGET_STEPS whose predicted time at a place not visited yet is within COLD_GOAL_MS."""
    best = BUDGET_STEPS[0]
    for total in BUDGET_STEPS:
        if COLD_SHARE * total * prefill_ms_per_token + FIRST_LINE_TOKENS * decode_ms <= COLD_GOAL_MS:
            best = total
    return best


class Fit:
    """The budget fitted to this machine, the costs it was fitted to, and where they came from."""

    OBSERVE_MIN = 64  # prompt tokens a request's prefill must have to count as a measurement

    def __init__(self, tokens: int, costs: dict[str, float] | None = None):
        self.tokens = tokens
        self.costs: dict[str, float] | None = dict(costs) if costs else None

    def fit(self, costs: dict[str, float]) -> None:
        self.costs = {"prefill_ms_per_token": float(costs["prefill_ms_per_token"]), "decode_ms": float(costs["decode_ms"])}
        self.tokens = fitting_budget(self.costs["prefill_ms_per_token"], self.costs["decode_ms"])

    def observe(self, prefill_tokens: int, prefill_ms: float) -> bool:
        """A request's prefill: fit again where it shows a prompt token cheaper than the fit's costs
        (True when the budget changed)."""
        if self.costs is None or prefill_tokens < self.OBSERVE_MIN or prefill_ms <= 0:
            return False
        per = prefill_ms / prefill_tokens
        if per >= self.costs["prefill_ms_per_token"]:
            return False
        before = self.tokens
        self.fit({**self.costs, "prefill_ms_per_token": round(per, 3)})
        return self.tokens != before

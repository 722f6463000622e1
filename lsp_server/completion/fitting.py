"""The prompt budget that fits this machine (the `context_tokens` setting at 0, its default): the
rule (`fitting_budget`) and the fit a Completer holds (`Fit`).

The costs come from a measurement when the model loads (lsp_server/completion/build.py
`prompt_costs`: the best of the last few loads, so that one load on a busy machine does not keep the
budget small) and from the requests themselves: a prefill of at least `Fit.OBSERVE_MIN` tokens that
cost less per token than the fit's costs (the machine was busier when it was measured) fits the budget
again (`Fit.observe`, where that grows it by `Fit.OBSERVE_GROWTH` tokens or more). A budget only grows
so; a machine that became slower for good is seen at the next loads, once the slower measurements are
all that is kept.
Left out on purpose: measuring (build.py), prompts (context.py).
"""

from __future__ import annotations

from lsp_server.completion.context import ContextBudget

# The prompt budget that fits this machine (`context_tokens` 0, the default). A place not visited yet
# costs the part of its prompt that is not cached (the file's head is: about 45% of the budget is
# processed there, 111 of 256, 172 of 384 and 214 of 512 tokens at p50 in the replays of
# the held-out runs) plus its first line (about 6 tokens). The budget is the largest multiple of
# BUDGET_GRAIN tokens whose place not visited yet is predicted to be answered within COLD_GOAL_MS, 85% of
# the 3 s goal of time to a suggestion there, between BUDGET_MIN (ContextBudget.DEFAULT_TOTAL) and
# BUDGET_MAX. On one core of the development machine (12.8 ms a prompt token, 54 ms a generated one)
# that is 384; on a GPU, 2048. A bigger prompt is more often right: on pypa/packaging 10/39 first lines
# at 256, 14/39 at 384, 16/39 at 512 (docs/design.md, "Prompt layout and windows").
# The budget is proportional, not a choice among a few steps: with steps of 128 tokens the same quiet
# machine fitted 256 at 13.0 ms a prompt token and 384 at 12.7 (the same section), so
# a few percent of timing moved a third of the prompt; now it moves by what the timing moves.
BUDGET_MIN = ContextBudget.DEFAULT_TOTAL  # 256
BUDGET_MAX = 2048
BUDGET_GRAIN = 32  # the llama.cpp backend's prompt block (lsp_server/backends/llama/model.py)
COLD_GOAL_MS = 2550.0
COLD_SHARE = 0.45  # of the budget processed at a place not visited yet
FIRST_LINE_TOKENS = 6


def fitting_budget(prefill_ms_per_token: float, decode_ms: float) -> int:
    """The largest multiple of BUDGET_GRAIN (within BUDGET_MIN..BUDGET_MAX) whose predicted time at a place
    not visited yet is within COLD_GOAL_MS."""
    room = COLD_GOAL_MS - FIRST_LINE_TOKENS * max(0.0, decode_ms)
    per = COLD_SHARE * max(0.0, prefill_ms_per_token)
    tokens = BUDGET_MAX if per <= 0 else int(max(0.0, room) / per) // BUDGET_GRAIN * BUDGET_GRAIN
    return max(BUDGET_MIN, min(BUDGET_MAX, tokens))


class Fit:
    """The budget fitted to this machine, the costs it was fitted to, and where they came from."""

    OBSERVE_MIN = 64  # prompt tokens a request's prefill must have to count as a measurement
    # A request's cheaper prefill changes the budget only when it grows it by this much: every change
    # of the budget moves the prompt's window, so the next request at each open place recomputes it.
    OBSERVE_GROWTH = 64

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
        per = round(prefill_ms / prefill_tokens, 3)
        if per >= self.costs["prefill_ms_per_token"]:
            return False
        if fitting_budget(per, self.costs["decode_ms"]) < self.tokens + self.OBSERVE_GROWTH:
            return False  # too small a gain to move every open place's window for
        self.fit({**self.costs, "prefill_ms_per_token": per})
        return True

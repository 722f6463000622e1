"""The prompt budget fitted to the machine (`context_tokens` 0, the default; lsp_server/completion/build.py
`fitting_budget`): what it picks from measured costs, that it is measured and used at build, stored for
one-shot commands, and that a budget the user sets wins."""

import json

import pytest

from lsp_server.backends.tiny import tiny_random
from lsp_server.completion import build
from lsp_server.completion.build import build_completer, fitting_budget, measure_prompt_costs
from lsp_server.completion.completer import CompleterSettings
from lsp_server.completion.context import ContextBudget
from lsp_server.settings import Settings, SettingsError


def test_the_fitted_budget_is_the_largest_answering_a_new_place_within_the_goal():
    # one core of the development machine (12.8 ms a prompt token, 54 a generated one): 384 (512 would be ~3 s)
    assert fitting_budget(12.77, 53.7) == 384
    assert fitting_budget(0.05, 5) == 2048  # a GPU: a prompt token costs next to nothing
    assert fitting_budget(40, 90) == 256  # a slow machine keeps the smallest budget, never less
    prev = build.BUDGET_MAX
    for p in (0.5, 2, 5, 8, 11, 12.5, 12.8, 13.1, 14, 20, 30):  # dearer prompt tokens never give a bigger budget
        b = fitting_budget(p, 26)
        assert b % build.BUDGET_GRAIN == 0 and build.BUDGET_MIN <= b <= prev
        prev = b
        predicted = build.COLD_SHARE * b * p + build.FIRST_LINE_TOKENS * 26
        assert predicted <= build.COLD_GOAL_MS or b == build.BUDGET_MIN
        # the largest: one grain more would miss the goal
        over = build.COLD_SHARE * (b + build.BUDGET_GRAIN) * p + build.FIRST_LINE_TOKENS * 26
        assert over > build.COLD_GOAL_MS or b == build.BUDGET_MAX


def test_a_few_percent_of_timing_moves_the_budget_by_a_few_percent():
    # The same quiet machine measured 12.7 and 13.0 ms a prompt token at two loads: steps of 128 tokens
    # gave it 384 at one and 256 at the other (docs/design.md, "Prompt layout and windows").
    a, b = fitting_budget(12.7, 54.0), fitting_budget(13.0, 54.0)
    assert 384 >= a >= b >= a - build.BUDGET_GRAIN
    for p in (6.0, 9.0, 12.0, 18.0):
        lo, hi = fitting_budget(p * 1.03, 54.0), fitting_budget(p, 54.0)
        assert hi - lo <= max(build.BUDGET_GRAIN, 0.04 * hi)


def test_settings_leave_the_budget_to_the_machine_unless_one_is_given():
    assert Settings.context_tokens == 0 and Settings().completer_settings().budget is None
    assert Settings().merged({"contextTokens": 512, "definitions": True}).completer_settings().budget == \
        ContextBudget.scaled(512, definitions=Settings.definitions_share, edits=Settings.edits_share)
    off = Settings().merged({"contextTokens": 512, "definitions": False, "recentEdits": False})
    assert off.completer_settings().budget == ContextBudget.scaled(512)  # no share for a section turned off
    with pytest.raises(SettingsError, match="0 \\(fitted\\) or >= 64"):
        Settings().merged({"contextTokens": 32})


def test_build_measures_the_costs_and_the_completer_prompts_with_the_fitted_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    lm = tiny_random()
    costs = measure_prompt_costs(lm, tokens=16, reps=1)
    assert costs["prefill_ms_per_token"] > 0 and costs["decode_ms"] > 0
    monkeypatch.setattr(build, "measure_prompt_costs", lambda lm: {"prefill_ms_per_token": 12.77, "decode_ms": 53.7})
    c = build_completer(lm, CompleterSettings(budget=None), calibration="fresh")
    assert c.fit.tokens == 384 and c.budget == ContextBudget.scaled(384)
    assert c.fit.costs == {"prefill_ms_per_token": 12.77, "decode_ms": 53.7}
    doc = "".join(f"value_{i} = compute({i}, 'x' * {i})\n" for i in range(200)) + "result = val"
    ids = c.prompt_for(doc, 200, 12).ids
    small = build_completer(lm, CompleterSettings(budget=ContextBudget.scaled(256)), calibration=None)
    assert len(small.prompt_for(doc, 200, 12).ids) < len(ids) <= 384  # the long file fills the fitted budget
    # stored for one-shot commands: a second build reads it instead of measuring
    stored = json.loads((tmp_path / "calibration.json").read_text())
    assert any(k.endswith("|prompt") for k in stored)
    monkeypatch.setattr(build, "measure_prompt_costs", lambda lm: pytest.fail("measured again"))
    assert build_completer(lm, CompleterSettings(budget=None), calibration="stored").fit.tokens == 384
    # a budget the user set wins and nothing is fitted
    mine = build_completer(lm, CompleterSettings(budget=ContextBudget.scaled(320)), calibration=None)
    assert mine.budget.total == 320 and mine.fit.costs is None


def test_the_budget_is_the_best_of_the_last_loads_not_of_the_busiest(tmp_path, monkeypatch):
    """A load on a busy machine measures a prompt token dearer: the stored costs are the best of the
    last PROMPT_COSTS_KEPT loads, so one busy load does not shrink the budget, and a lasting
    slowdown is seen once the faster measurements have left the window."""
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    lm = tiny_random()
    measured = []

    def fits(prefill: float) -> int:
        measured.append(prefill)
        monkeypatch.setattr(build, "measure_prompt_costs", lambda lm: {"prefill_ms_per_token": prefill, "decode_ms": 53.7})
        return build_completer(lm, CompleterSettings(budget=None), calibration="fresh").fit.tokens

    assert fits(12.77) == 384
    assert fits(40.0) == 384  # busy at this load: the quiet load's costs still hold
    assert build_completer(lm, CompleterSettings(budget=None), calibration="stored").fit.tokens == 384
    for _ in range(build.PROMPT_COSTS_KEPT - 1):
        fits(40.0)
    assert fits(40.0) == 256  # slower for the last PROMPT_COSTS_KEPT loads: that is the machine now
    stored = json.loads((tmp_path / "calibration.json").read_text())
    (entry,) = [v for k, v in stored.items() if k.endswith("|prompt")]
    assert len(entry["recent"]) == build.PROMPT_COSTS_KEPT


def test_a_cheaper_prefill_in_a_request_fits_the_budget_again():
    """Measured at load on a busy machine (40 ms a prompt token: 256), the budget grows once a
    request's prefill of at least Fit.OBSERVE_MIN tokens shows the machine is faster; a short prefill
    or a dearer one changes nothing, and a budget the user set is never refitted."""
    from lsp_server.completion.completer import Completer
    from lsp_server.completion.fitting import Fit
    from lsp_server.decoding.types import DecodeOptions

    fit = Fit(256)
    fit.fit({"prefill_ms_per_token": 40.0, "decode_ms": 26.0})
    assert fit.tokens == 256
    assert not fit.observe(Fit.OBSERVE_MIN - 1, 1.0)  # too short to tell
    assert not fit.observe(200, 200 * 45.0) and fit.costs["prefill_ms_per_token"] == 40.0  # dearer: kept
    assert fit.observe(200, 200 * 12.5) and fit.tokens == fitting_budget(12.5, 26.0) > 256
    assert fit.costs["prefill_ms_per_token"] == 12.5
    # A little cheaper: a budget that would grow by less than OBSERVE_GROWTH stays (each change moves
    # every open place's window), and so do the costs it was fitted to.
    assert fitting_budget(12.3, 26.0) < fit.tokens + Fit.OBSERVE_GROWTH
    assert not fit.observe(200, 200 * 12.3) and fit.costs["prefill_ms_per_token"] == 12.5
    lm = tiny_random()
    doc = "".join(f"value_{i} = compute({i}, 'x' * {i})\n" for i in range(200)) + "result = val"
    # Fitted to a prompt token of 100 s: any real prefill is cheaper, however busy the machine.
    c = Completer(lm, settings=CompleterSettings(budget=None))
    c.fit.fit({"prefill_ms_per_token": 1e5, "decode_ms": 26.0})
    sug = c.complete(doc, 200, 12, options=DecodeOptions(max_new_tokens=2, draft_max=0))
    assert sug.completion.stats.prefill_tokens >= Fit.OBSERVE_MIN
    st = sug.completion.stats
    assert c.fit.costs["prefill_ms_per_token"] == round(st.prefill_ms / st.prefill_tokens, 3) < 1e5
    assert c.fit.tokens == fitting_budget(c.fit.costs["prefill_ms_per_token"], 26.0) >= 256
    mine = Completer(lm, settings=CompleterSettings(budget=ContextBudget.scaled(320)))
    mine.fit.fit({"prefill_ms_per_token": 1e5, "decode_ms": 26.0})
    mine.complete(doc, 200, 12, options=DecodeOptions(max_new_tokens=2, draft_max=0))
    assert mine.fit.tokens == 256 and mine.budget.total == 320

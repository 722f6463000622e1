"""What to show (lsp_server/completion/show.py, place.py `Place.sure_length`): the sure prefix of a
suggestion, judged token by token, and never anything but a prefix of what the model alone writes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lsp_server.backends.llama import library as llama_library
from lsp_server.backends.tiny import tiny_random
from lsp_server.completion.completer import Completer, CompleterSettings
from lsp_server.completion.show import RULES, WEIGHTS, ShowRule, features, hazard, shown_length
from lsp_server.decoding.types import DecodeOptions

ROOT = Path(__file__).resolve().parents[2]
SURE, UNSURE = (0.99, 0.98), (0.08, 0.01)  # (probability, lead) of a token the model is sure / unsure of


def lengths(pieces, marks, rule, skip=0, blank=False):
    return shown_length(pieces, [m[0] for m in marks], [m[1] for m in marks], rule, skip, blank)


def test_a_sure_suggestion_is_shown_whole_and_all_shows_everything():
    pieces = ["self", ".", "width"]
    assert lengths(pieces, [SURE] * 3, RULES["sure"]) is None
    assert lengths(pieces, [UNSURE] * 3, RULES["all"]) is None


def test_it_is_cut_before_the_first_unsure_token_and_withheld_when_that_is_the_first():
    pieces = ["self", ".", "width", " *", " height"]
    assert lengths(pieces, [SURE, SURE, SURE, UNSURE, SURE], RULES["sure"]) == len("self.width")
    assert lengths(pieces, [UNSURE, SURE, SURE, SURE, SURE], RULES["sure"]) == 0


def test_healed_text_is_not_judged_and_counts_from_the_cursor():
    # The user typed "sel"; the model wrote "self" again under healing's constraint (its first piece).
    pieces = ["sel", "f", ".", "width"]
    assert lengths(pieces, [UNSURE, SURE, SURE, UNSURE], RULES["sure"], skip=3) == len("f.")
    assert lengths(pieces, [UNSURE, SURE, SURE, SURE], RULES["sure"], skip=3) is None


def test_hazard_is_the_logistic_model_of_its_features():
    x = features(" width", 0.5, 0.2, True, False, 0.0)
    z = sum(w * v for w, v in zip(WEIGHTS, x))
    assert hazard(x) == pytest.approx(1 / (1 + math.exp(-z)))
    # surer tokens are less likely to be where a suggestion goes wrong
    assert hazard(features("x", 0.9, 0.8, True, False, 0.0)) < hazard(features("x", 0.2, 0.05, True, False, 0.0))


def test_the_bias_moves_the_limit_within_bounds_and_all_stays_all():
    sure = RULES["sure"]
    assert sure.biased(0.05).limit == pytest.approx(sure.limit + 0.05)
    assert sure.biased(1.0).limit == pytest.approx(sure.limit + 0.1)
    assert sure.biased(-1.0).limit == pytest.approx(sure.limit - 0.1)
    assert RULES["all"].biased(0.3) == RULES["all"]
    assert RULES["surest"].limit < RULES["sure"].limit  # surest shows less


@pytest.fixture(scope="module", params=["torch", "llama.cpp"])
def lm(request, tmp_path_factory):
    if request.param == "torch":
        model = tiny_random()
    else:
        if not llama_library.available():
            pytest.skip(f"no llama.cpp library: {llama_library.problem()}")
        from lsp_server.backends.loader import load
        from lsp_server.backends.tiny_gguf import write_tiny_gguf

        model = load(str(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")), backend="llama.cpp")
    model.calibrated = True  # (its probabilities are noise, which is what this test needs: many cuts)
    return model


def test_what_is_shown_is_a_prefix_of_what_the_model_alone_writes(lm):
    """At every position, with every rule, drafting on: the shown text is a prefix of the suggestion
    that drafting off and showing everything gives (exactness is unchanged)."""
    text = (ROOT / "lsp_server/decoding/accept.py").read_text()
    lines = text.split("\n")
    positions = [(i, c) for i in range(20, 70, 2) for c in (0, len(lines[i]) // 2)]
    plain = Completer(lm)
    rules = [RULES["sure"], RULES["surest"], ShowRule(0.9), ShowRule(0.97)]
    shown = {r: Completer(lm) for r in rules}
    cut = 0
    for line, col in positions:
        reference = plain.complete(text, line, col, cache_key="plain", settings=CompleterSettings(),
                                   options=DecodeOptions(max_new_tokens=16, draft_max=0)).text
        for rule, completer in shown.items():
            s = completer.complete(text, line, col, cache_key="shown", settings=CompleterSettings(show=rule),
                                   options=DecodeOptions(max_new_tokens=16, draft_max=8, adaptive=False)).text
            assert reference.startswith(s), (line, col, rule, s, reference)
            cut += len(s) < len(reference)
    assert cut >= len(positions)  # the rules did cut (else this test would say nothing)

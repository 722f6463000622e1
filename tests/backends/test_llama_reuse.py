"""Reuse on the llama.cpp backend computes what a fresh prefill computes: the default model.

llama.cpp's CPU passes are not batch-invariant: a row's logits depend on how many rows share
its pass. On the tiny model the difference does not show; on the default model (Q4_K_M) a
prompt whose first token ran in a pass of its own ended with logits up to 0.35 away from the
same prompt in one pass, enough to change a greedy token (the session replay of
`ditto-lsp bench --mode session` found 3 suggestions of 28 that way). The backend cuts prompt
passes at whole blocks of absolute positions and keeps a cached prefix only up to its last
whole block (lsp_server/backends/llama/model.py); these tests fail without that.

Marked `model`: needs the default model the README's set-up installs (skipped when absent).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lsp_server.backends.llama import library as llama_library
from lsp_server.decoding.types import DecodeOptions
from lsp_server.decoding.engine import Engine

pytestmark = [pytest.mark.model, pytest.mark.skipif(not llama_library.available(), reason="no llama.cpp library")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lm():
    from lsp_server.backends.base import ModelError
    from lsp_server.backends.loader import load

    try:
        return load("default", backend="llama.cpp")
    except ModelError as err:
        pytest.skip(f"the default model is not installed ({err}); the README's first command installs it")


@pytest.fixture(scope="module")
def ids(lm):
    return lm.encode((ROOT / "lsp_server/decoding/engine.py").read_text())[:150]


def fresh_logits(lm, want: list[int], last: int) -> torch.Tensor:
    """The last token's logits after `want` prefilled on a cache of its own (the engine's way: all but
    the prompt's last token, then that token)."""
    fresh = lm.new_cache()
    try:
        lm.forward(want, fresh, last=1)
        return lm.forward([last], fresh, last=1)
    finally:
        lm.release(fresh)


def test_a_prompt_after_any_cached_prefix_has_the_logits_of_a_fresh_prefill(lm, ids):
    """As the engine runs a prompt: all but its last token prefilled (`want`), then the last token."""
    want, last = ids[:-1], ids[-1]
    expected = fresh_logits(lm, want, last)
    for before in (1, 45, len(want) - 1, len(want)):  # where an earlier prompt ended (the last: idle prefill)
        c = lm.new_cache()
        try:
            lm.forward(want[:before], c, last=1)
            keep = lm.reusable(c, before, len(want))
            lm.crop(c, keep)
            if keep < len(want):
                lm.forward(want[keep:], c, last=1)
            got = lm.forward([last], c, last=1)
            assert torch.equal(got, expected), f"cached prefix of {before} tokens (kept {keep}): " \
                                               f"{(got - expected).abs().max().item():.3g} apart"
        finally:
            lm.release(c)


def test_suggestions_through_the_cache_equal_fresh_ones(lm, ids):
    """The engine's path: a document's cached prompt, then prompts that share part of it."""
    engine = Engine(lm)
    opts = DecodeOptions(max_new_tokens=6)
    engine.generate(ids[:1], options=opts, cache_key="doc")
    for prompt in (ids[:120], ids[:60] + ids[100:140], ids):
        through_cache = engine.generate(prompt, options=opts, cache_key="doc")
        assert through_cache.tokens == engine.generate(prompt, options=opts).tokens


def test_lines_typed_in_the_middle_keep_the_lines_before_them_and_stay_exact(lm):
    """After <fim_middle> the plan also cuts where a line ends (lsp_server/backends/base.py WholeBlocks): a
    prompt with one more typed line keeps the cached lines before it (the old plan kept only whole
    32-token blocks, a line and a half more to recompute on average), and computes a fresh prefill's logits."""
    fim = lm.fim
    src = (ROOT / "lsp_server/decoding/engine.py").read_text().splitlines()
    src = [l for l in src if l.strip()]
    head = [fim.prefix, *[t for l in src[:12] for t in lm.encode(l + "\n")], fim.suffix,
            *lm.encode(src[30] + "\n"), fim.middle]
    lines = [lm.encode(l + "\n") for l in src[12:20]]  # each line tokenized on its own, as context.py does

    def prompt(k: int) -> list[int]:  # k lines typed at the place, then the start of the next one
        return [*head, *[t for l in lines[:k] for t in l], *lm.encode(src[12 + k][:6])]

    gained = 0
    for k in range(1, 7):
        earlier, want, last = prompt(k - 1)[:-1], prompt(k)[:-1], prompt(k)[-1]
        expected = fresh_logits(lm, want, last)
        c = lm.new_cache()
        try:
            lm.forward(earlier, c, last=1)
            common = next((i for i, (x, y) in enumerate(zip(earlier, want)) if x != y), min(len(earlier), len(want)))
            keep = lm.reusable(c, common, len(want))
            line_start = len(head) + sum(map(len, lines[: k - 1]))
            assert keep >= line_start, f"{k} lines: kept {keep}, the lines before end at {line_start}"
            gained += int(keep > common - common % lm.block)
            lm.crop(c, keep)
            lm.forward(want[keep:], c, last=1)
            got = lm.forward([last], c, last=1)
            assert torch.equal(got, expected), f"{k} lines (kept {keep}): {(got - expected).abs().max().item():.3g} apart"
        finally:
            lm.release(c)
    assert gained >= 3  # most lines kept more than whole blocks would


def test_typing_line_after_line_through_the_engine_equals_fresh(lm):
    """The engine's path with the middle growing a line at a time (the session replay's warm requests)."""
    fim = lm.fim
    src = [l for l in (ROOT / "lsp_server/completion/context.py").read_text().splitlines() if l.strip()]
    head = [fim.prefix, *[t for l in src[40:52] for t in lm.encode(l + "\n")], fim.suffix, fim.middle]
    engine = Engine(lm)
    opts = DecodeOptions(max_new_tokens=6)
    typed: list[int] = []
    for k in range(5):
        prompt = [*head, *typed, *lm.encode(src[52 + k][:5])]
        through_cache = engine.generate(prompt, options=opts, cache_key="doc")
        assert through_cache.tokens == engine.generate(prompt, options=opts).tokens
        typed += lm.encode(src[52 + k] + "\n")

"""The whole file above the cursor from a file's prefix KV (lsp_server/completion/wholefile.py,
lsp_server/decoding/prefix.py): exact, cut back on an edit, bounded, and unchanged until filled.

Exactness: a request whose cache starts from a copy of the file's KV computes what a fresh prefill
of the same prompt computes, bit for bit, on the tiny random model on torch (float32, whole-block
passes) and on llama.cpp (the tiny GGUF), and so gives the same greedy tokens.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from lsp_server.backends.llama import library as llama_library
from lsp_server.backends.tiny import tiny_random
from lsp_server.completion.completer import Completer, CompleterSettings
from lsp_server.completion.wholefile import WholeFile
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.prefix import PrefixKV, PrefixPool, fill, seed
from lsp_server.decoding.types import DecodeOptions

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "lsp_server/decoding/engine.py").read_text().split("\n")[:140]


def _torch():
    lm = tiny_random()
    lm.block = 32  # whole-block prompt passes (DITTO_TORCH_BLOCK): reuse is then bit-exact on a CPU
    return lm


def _llama(tmp_path_factory):
    if not llama_library.available():
        pytest.skip(f"no llama.cpp library: {llama_library.problem()}")
    from lsp_server.backends.loader import load
    from lsp_server.backends.tiny_gguf import write_tiny_gguf

    return load(str(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")), backend="llama.cpp")


@pytest.fixture(scope="module", params=["torch", "llama.cpp"])
def lm(request, tmp_path_factory):
    return _torch() if request.param == "torch" else _llama(tmp_path_factory)


def ids_of(n: int, seed_: int) -> list[int]:
    rng = random.Random(seed_)
    return [rng.randrange(6, 400) for _ in range(n)]


def test_a_request_from_a_copied_prefix_computes_a_fresh_prefill(lm):
    engine = Engine(lm)
    pool = PrefixPool(lm)
    kv = PrefixKV()
    file = ids_of(300, 1)
    st = fill(engine, pool, kv, file, chunk=32)
    assert kv.ids == file and st.prefill_tokens == 300
    greedy = DecodeOptions(max_new_tokens=12, draft_max=0)
    for cut in (40, 64, 131, 300):
        prompt = file[:cut] + ids_of(23, cut)
        copied = seed(engine, f"k{cut}", kv, prompt, pool)
        assert copied == cut - cut % 32 and copied > 0
        assert engine.cached_ids(f"k{cut}") == file[:copied]
        # The logits after the prompt, computed on the copy and fresh.
        mine = lm.clone(kv.cache, copied)
        fresh = lm.new_cache()
        try:
            got = lm.forward(prompt[copied:], mine, last=1)
            want = lm.forward(prompt, fresh, last=1)
        finally:
            lm.release(mine)
            lm.release(fresh)
        assert torch.equal(got, want)
        out = engine.generate(prompt, options=greedy, cache_key=f"k{cut}")
        assert out.stats.reused_tokens == copied
        assert out.tokens == Engine(lm).generate(prompt, options=greedy).tokens
    assert kv.ids == file  # the file's KV is copied from, never cut
    again = fill(engine, pool, kv, file, chunk=32)
    assert again.prefill_tokens == 0


def test_an_edit_refills_from_the_first_changed_block(lm):
    engine, pool, kv = Engine(lm), PrefixPool(lm), PrefixKV()
    file = ids_of(200, 2)
    fill(engine, pool, kv, file)
    edited = file[:100] + [7, 8] + file[101:]
    st = fill(engine, pool, kv, edited)
    assert st.reused_tokens == 96 and st.prefill_tokens == len(edited) - 96
    assert kv.ids == edited


def test_a_fill_stopped_by_a_request_keeps_its_chunks():
    import threading

    lm = _torch()
    engine, pool, kv = Engine(lm), PrefixPool(lm), PrefixKV()
    cancel = threading.Event()
    calls = []

    class Stop:
        def before_pass(self, ctx, n):
            calls.append(n)
            if len(calls) == 2:
                cancel.set()

        def after_pass(self, ctx, n):
            pass

    engine.hooks = Stop()
    st = fill(engine, pool, kv, ids_of(200, 3), cancel=cancel, chunk=32)
    assert st.stop_reason == "cancelled" and kv.ids == ids_of(200, 3)[:64]


def test_the_pool_keeps_its_bound_least_recently_used_first():
    lm = _torch()
    engine, pool = Engine(lm), PrefixPool(lm, max_tokens=500)
    a, b, c = PrefixKV(), PrefixKV(), PrefixKV()
    fill(engine, pool, a, ids_of(200, 4))
    fill(engine, pool, b, ids_of(200, 5))
    seed(engine, "x", a, ids_of(200, 4) + [9], pool)  # a used last: b goes first
    fill(engine, pool, c, ids_of(200, 6))
    assert b.ids == [] and b.cache is None and len(a.ids) == 200 and len(c.ids) == 200
    st = pool.stats()
    assert st["tokens"] == 400 and st["evicted"] == 1 and st["mb"] == round(400 * lm.kv_bytes_per_token / 2**20, 1)
    del a
    assert pool.tokens() == 200  # a file's KV goes with its state


def _fill_all(completer, text, line, key):
    while completer.fill(text, line, name="m.py", key=key) is not None:
        pass


def test_a_filled_file_serves_the_whole_file_above_and_an_unfilled_one_the_window():
    lm = _torch()
    completer = Completer(lm, settings=CompleterSettings(whole_file=True))  # (off by default)
    completer.whole = WholeFile(tokens=8192)  # (the tiny model's tokenizer writes ~35 tokens a line)
    text = "\n".join(TEXT)
    line = 120
    col = len(TEXT[line]) - len(TEXT[line].lstrip())
    cold = completer.prompt_for(text, line, col, name="m.py", cache_key="k")
    assert not cold.whole and cold.start_line > 0  # not filled: today's window
    _fill_all(completer, text, line, "m.py")
    state = completer.files.get("m.py")
    assert state.prefix.start == 0 and len(state.prefix.kv.ids) > 1000
    opts = DecodeOptions(max_new_tokens=16, draft_max=0)
    sug = completer.complete(text, line, col, name="m.py", cache_key="k", options=opts)
    p = sug.prompt
    assert p.whole and p.start_line == 0
    above = sum(len(lm.encode(l + "\n")) for l in TEXT[:line])
    assert len(p.ids) > above  # every line above the place is in the prompt ...
    st = sug.completion.stats
    assert st.reused_tokens >= above - 32 and st.prefill_tokens < len(p.ids) - above + 32  # ... and cost nothing
    # What a fresh prefill of the same prompt generates (the healing constraint and stop rules aside).
    from lsp_server.decoding.healing import Healing

    heal = Healing(completer.vocab_bytes(), p.healed.encode()) if p.healed else None
    fresh = Engine(lm).generate(p.ids, options=opts, constraint=heal).tokens
    assert fresh[: len(sug.completion.tokens)] == sug.completion.tokens


def test_an_edit_above_falls_back_to_the_window_until_refilled_and_a_long_file_anchors():
    lm = _torch()
    completer = Completer(lm, settings=CompleterSettings(whole_file=True))  # (off by default)
    completer.whole = WholeFile(tokens=1500, gap=64)
    text = "\n".join(TEXT)
    _fill_all(completer, text, 12, "m.py")
    prefix = completer.files.get("m.py").prefix
    assert prefix.start == 0 and len(prefix.kv.ids) <= 1500
    assert completer.prompt_for(text, 12, 0, name="m.py", cache_key="k").whole
    edited = "\n".join(["# a long new comment line " * 8] * 4 + TEXT)
    assert not completer.prompt_for(edited, 16, 0, name="m.py", cache_key="k").whole  # the gap is too big
    _fill_all(completer, edited, 16, "m.py")
    assert completer.prompt_for(edited, 16, 0, name="m.py", cache_key="k").whole
    # Far below: the sequence starts again at a multiple of 64 lines, holding the cursor's place.
    _fill_all(completer, text, 130, "m.py")
    assert prefix.start % 64 == 0 and prefix.start > 0
    assert completer.prompt_for(text, 130, 0, name="m.py", cache_key="k").whole


@pytest.fixture(scope="module", params=["llama.cpp", "torch"])
def default_lm(request):
    from lsp_server.backends.base import ModelError
    from lsp_server.backends.loader import load

    if request.param == "llama.cpp" and not llama_library.available():
        pytest.skip("no llama.cpp library")
    try:
        if request.param == "torch":
            lm = load("default", backend="torch", device="cpu", dtype="float32")
            lm.block = 32  # whole-block passes: reuse is bit-exact (DITTO_TORCH_BLOCK)
            return lm
        return load("default", backend="llama.cpp")
    except ModelError as err:
        pytest.skip(f"the default model is not installed ({err})")


@pytest.mark.model
def test_the_default_model_from_a_copied_prefix_writes_what_a_fresh_prefill_writes(default_lm):
    """The issue's exactness check on the default model: a request's prompt whose start is copied from
    the file's KV (filled in 32-token chunks) gives the greedy tokens of the same prompt prefilled fresh."""
    lm = default_lm
    engine, pool, kv = Engine(lm), PrefixPool(lm), PrefixKV()
    file = lm.encode((ROOT / "lsp_server/completion/context.py").read_text())[:400]
    fill(engine, pool, kv, file, chunk=32)
    fim = lm.fim
    greedy = DecodeOptions(max_new_tokens=16, draft_max=0)
    for cut in (150, 333):
        prompt = [*file[:cut], fim.suffix, *lm.encode("\n\n"), fim.middle]
        assert seed(engine, f"k{cut}", kv, prompt, pool) == cut - cut % 32
        got = engine.generate(prompt, options=greedy, cache_key=f"k{cut}").tokens
        assert got == Engine(lm).generate(prompt, options=greedy).tokens and got

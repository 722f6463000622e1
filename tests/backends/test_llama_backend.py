"""The llama.cpp backend (lsp_server/backends/llama/model.py) on the tiny GGUF (lsp_server/backends/tiny_gguf.py).

Interface conformance against the torch backend's tiny-random (same weights, same vocabulary),
caches as llama.cpp sequences (crop, release, more caches than slots), exactness of multi-row
passes, the backend choice, and the one-line errors. Greedy speculative == drafting-off runs
for both backends in test_engine.py; the Ollama store is tested in test_ollama.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from lsp_server.backends.base import Backend, ModelError, Tokenizer

from lsp_server.backends.llama import library as llama_library
from lsp_server.backends.llama import model as llama_model
from lsp_server.backends.loader import choose_backend, load
from lsp_server.settings import Settings, SettingsError
from lsp_server.backends.tiny_gguf import write_tiny_gguf

needs_llama = pytest.mark.skipif(not llama_library.available(), reason=f"no llama.cpp library: {llama_library.problem()}")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    if not llama_library.available():
        pytest.skip(f"no llama.cpp library: {llama_library.problem()}")
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def lm(gguf):
    return load(str(gguf), backend="llama.cpp")


@pytest.fixture(scope="module")
def ref():
    return load("tiny-random", backend="torch")


def ids_of(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(6, 400) for _ in range(n)]


def one_by_one(lm, ids: list[int], start: int) -> torch.Tensor:
    """Logits of ids[start:], each token in a pass of its own, on a fresh cache."""
    c = lm.new_cache()
    try:
        lm.forward(ids[:start], c, last=1)
        return torch.cat([lm.forward([t], c, last=1) for t in ids[start:]])
    finally:
        lm.release(c)


def test_it_is_a_backend_and_a_tokenizer_like_the_torch_one(lm, ref):
    assert isinstance(lm, Backend) and isinstance(lm, Tokenizer)
    assert lm.describe() == {"backend": "llama.cpp", "device": "cpu", "dtype": "F32", "threads": lm.threads,
                             "flash_attn": False}
    assert lm.vocab_size == ref.vocab_size
    assert lm.vocabulary() == ref.vocabulary()
    assert lm.fim == ref.fim and lm.fim is not None
    assert lm.stop_ids == ref.stop_ids
    assert lm.special_ids() == ref.special_ids()
    text = "def f(x):\n    return x * 2  # héllo 🙂\n<|fim_prefix|>"
    assert lm.encode(text) == ref.encode(text)
    assert lm.decode(lm.encode(text)) == text
    assert [lm.token_text(t) for t in lm.encode(text)] == [ref.token_text(t) for t in ref.encode(text)]
    assert lm.encode("") == [] and lm.decode([]) == ""


def test_forward_returns_float32_logits_of_the_last_rows(lm, ref):
    ids = ids_of(20)
    c = lm.new_cache()
    out = lm.forward(ids, c, last=3)
    assert out.shape == (3, lm.vocab_size) and out.dtype == torch.float32
    assert c.get_seq_length() == 20
    rc = ref.new_cache()
    want = ref.forward(ids, rc, last=3)
    # Different arithmetic (ggml vs torch, a float16 KV cache): close, and the same argmax here.
    assert torch.equal(out.argmax(-1), want.argmax(-1))
    assert (out - want).abs().max() < 0.5
    with pytest.raises(ValueError):
        lm.forward([1, 2], c, last=3)
    lm.release(c)


def test_multi_row_passes_equal_one_token_at_a_time_exactly(lm):
    """What makes verification exact on llama.cpp (docs/backends.md): bit-equal, not just close."""
    ids = ids_of(40, seed=3)
    c = lm.new_cache()
    lm.forward(ids[:30], c, last=1)
    together = lm.forward(ids[30:], c, last=10)
    assert torch.equal(together, one_by_one(lm, ids, 30))
    # with some rows run before the rows whose logits are asked for
    c2 = lm.new_cache()
    lm.forward(ids[:25], c2, last=1)
    assert torch.equal(lm.forward(ids[25:], c2, last=10), together)


def test_a_reused_prefix_gives_the_logits_of_a_fresh_prefill(lm):
    """KV reuse must not change a result: the prompt's last logits after a cached prefix (split
    passes) equal those of the prompt in one pass. With llama.cpp's CPU flash attention they did
    not (the tiny model's top logit 10.19 in one pass, 10.07 after a split; argmax flipped), so the
    backend turns it off (lsp_server/backends/llama/model.py); without it a split changes them by ~1e-5."""
    assert lm.describe()["flash_attn"] is False
    ids = ids_of(700, seed=5)
    whole = lm.new_cache()
    split = lm.new_cache()
    try:
        one_pass = lm.forward(ids, whole, last=1)
        lm.forward(ids[:400], split, last=1)
        lm.forward(ids[400:650], split, last=1)
        after_split = lm.forward(ids[650:], split, last=1)
        assert torch.allclose(one_pass, after_split, atol=1e-3, rtol=0)
        assert int(one_pass.argmax()) == int(after_split.argmax())
    finally:
        lm.release(whole)
        lm.release(split)


def spy_on_passes(lm, monkeypatch) -> list[tuple[int, int]]:
    """(first position, rows) of every llama_decode `lm` runs from now on."""
    passes = []
    real = lm._L

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def llama_decode(self, ctx, batch):
            passes.append((int(lm._pos[0]), int(batch.n_tokens)))
            return real.llama_decode(ctx, batch)

    monkeypatch.setattr(lm, "_L", Spy())
    return passes


def test_prompt_passes_are_cut_at_whole_blocks_and_only_whole_blocks_are_reused(lm, monkeypatch):
    """A row's logits depend on the rows sharing its pass (the default model: up to 0.35 apart,
    tests/backends/test_llama_reuse.py), so prompt passes are cut at multiples of `block` of the absolute
    position, and a cached prefix is kept only up to the last block computed whole: what is
    recomputed then runs in the passes a fresh prefill runs."""
    passes = spy_on_passes(lm, monkeypatch)
    b = lm.block
    assert b == 32
    ids = ids_of(3 * b + 10, seed=3)
    c = lm.new_cache()
    try:
        lm.forward(ids[: b + 5], c, last=1)
        assert passes == [(0, b), (b, 5)]
        assert lm.reusable(c, b + 5) == b  # the partial block is not kept by another prompt
        assert lm.reusable(c, b + 5, b + 6) == b
        assert lm.reusable(c, b + 5, b + 5) == b + 5  # but it is by this very prompt (one pass, as fresh)
        assert lm.reusable(c, b - 1) == 0  # nor part of a whole one
        passes.clear()
        lm.forward(ids[b + 5 : 3 * b + 10], c, last=1)  # continuing mid-block: cut at 2b and 3b
        assert passes == [(b + 5, b - 5), (2 * b, b), (3 * b, 10)]
        assert lm.reusable(c, 3 * b + 10) == b  # [b, 2b) ran in two passes: not a fresh prefill's
        lm.crop(c, b)
        lm.forward(ids[b : 3 * b + 10], c, last=1)
        assert lm.reusable(c, 3 * b + 10) == 3 * b
        assert lm.reusable(c, 3 * b + 10, 3 * b + 10) == 3 * b + 10
        lm.crop(c, 2 * b + 3)
        assert lm.reusable(c, 2 * b + 3, 2 * b + 3) == 2 * b  # the tail pass was cut
        passes.clear()
        lm.forward(ids[2 * b + 3 : 2 * b + 4], c, last=1)  # a decode step
        assert passes == [(2 * b + 3, 1)] and lm.reusable(c, 2 * b + 4, 2 * b + 4) == 2 * b
    finally:
        lm.release(c)
    assert lm.reusable(c, 10) == 0


def test_after_fim_middle_passes_are_also_cut_where_a_line_ends(lm, monkeypatch):
    """The lines typed at a place sit after <fim_middle> (lsp_server/completion/context.py): the plan
    cuts there after every token that ends a line too (lsp_server/backends/base.py WholeBlocks), so a
    prompt with one more line keeps the lines before it, not only whole 32-token blocks. Whether a
    position is a cut depends only on the tokens up to it: the same plan for every prompt sharing them."""
    passes = spy_on_passes(lm, monkeypatch)
    b, nl = lm.block, lm.encode("\n")[-1]
    assert "\n" in lm.token_text(nl) and lm.fim is not None
    head = ids_of(40, seed=7)
    assert nl not in head
    line = [*ids_of(6, seed=8), nl]  # a line of the middle: 7 tokens, the last one ends it
    prompt = [*head, lm.fim.middle, *line, *line, *ids_of(3, seed=9)]  # 41 | 7 | 7 | 3
    c = lm.new_cache()
    try:
        lm.forward(prompt, c, last=1)
        assert passes == [(0, b), (b, 9), (41, 7), (48, 7), (55, 3)]
        assert lm.reusable(c, len(prompt)) == 55  # the last line's end, where the old plan kept 32
        assert lm.reusable(c, 52) == 48 and lm.reusable(c, 47) == 41 and lm.reusable(c, 40) == b
        assert lm.reusable(c, len(prompt), len(prompt)) == len(prompt)  # this very prompt
        lm.crop(c, 50)
        assert lm.reusable(c, 50) == 48 and c.cuts == [41, 48]
        lm.crop(c, 40)  # <fim_middle> cropped: no line cuts until it comes again
        assert c.mid == 0 and c.cuts == [] and lm.reusable(c, 40) == b
        passes.clear()
        lm.forward([*ids_of(4, seed=10), nl, 7], c, last=1)  # a newline before any <fim_middle>: no cut
        assert passes == [(40, 6)]
    finally:
        lm.release(c)
    assert c.mid == 0 and c.cuts == [] and c.aligned == 0


def test_the_engine_keeps_only_what_the_backend_calls_reusable(lm):
    from lsp_server.decoding.types import DecodeOptions
    from lsp_server.decoding.engine import Engine

    engine = Engine(lm)
    ids = ids_of(100, seed=4)
    opts = DecodeOptions(max_new_tokens=4)
    engine.generate(ids, options=opts, cache_key="doc")
    again = ids[:70] + ids_of(20, seed=5)  # shares 70 tokens with the cached prompt
    reused = engine.generate(again, options=opts, cache_key="doc")
    assert reused.stats.reused_tokens == 64
    assert reused.tokens == engine.generate(again, options=opts).tokens


def test_crop_keeps_the_first_tokens(lm):
    ids = ids_of(30, seed=1)
    c = lm.new_cache()
    first = lm.forward(ids, c, last=5)
    lm.crop(c, 25)
    assert c.get_seq_length() == 25
    assert torch.equal(lm.forward(ids[25:], c, last=5), first)  # the dropped rows are recomputed alike
    lm.crop(c, 40)  # past the end: nothing
    assert c.get_seq_length() == 30
    lm.crop(c, 0)
    assert torch.equal(lm.forward(ids, c, last=5), first)
    lm.release(c)
    assert c.get_seq_length() == 0
    assert torch.equal(lm.forward(ids, c, last=5), first)  # a released cache starts again empty


def test_more_caches_than_slots_swap_out_and_back_exactly(lm):
    seqs = [ids_of(10 + i, seed=10 + i) for i in range(lm.slots * 2 + 1)]
    caches = [lm.new_cache() for _ in seqs]
    for s, c in zip(seqs, caches):
        lm.forward(s[:-2], c, last=1)
    assert sum(c.slot is not None for c in caches) == lm.slots
    assert any(c.saved is not None for c in caches)
    lm.crop(caches[0], 5)  # cropped while swapped out
    for s, c in zip(seqs, caches):
        keep = c.get_seq_length()
        got = lm.forward(s[keep:], c, last=2)
        assert torch.equal(got, one_by_one(lm, s, len(s) - 2)), f"sequence of {len(s)} tokens"
    for c in caches:
        lm.release(c)


def test_a_dropped_cache_frees_its_slot(lm):
    import gc

    for i in range(lm.slots + 2):
        c = lm.new_cache()
        lm.forward(ids_of(8, seed=i), c, last=1)
        del c
        gc.collect()
    kept = lm.new_cache()
    lm.forward(ids_of(12, seed=99), kept, last=1)
    assert kept.slot is not None and kept.saved is None
    lm.release(kept)


def test_a_sequence_longer_than_a_slot_is_a_clear_error(gguf):
    small = llama_model.LlamaModel("t", "t", gguf, slots=1, slot_tokens=256)
    c = small.new_cache()
    small.forward(ids_of(200), c, last=1)
    with pytest.raises(llama_model.ContextFull, match="DITTO_LLAMA_CTX"):
        small.forward(ids_of(100), c, last=1)


def test_copies_share_the_model_and_do_not_free_it(lm):
    import copy
    import gc

    other = copy.copy(lm)
    del other
    gc.collect()
    c = lm.new_cache()
    assert lm.forward([7, 8, 9], c, last=1).shape == (1, lm.vocab_size)
    lm.release(c)


# -- choosing a backend ------------------------------------------------------------------------


@needs_llama
def test_auto_picks_llama_cpp_for_gguf_models_on_the_cpu(monkeypatch):
    monkeypatch.delenv("DITTO_BACKEND", raising=False)
    for spec in ("default", "qwen2.5-coder-1.5b", "x.gguf", "ollama:qwen2.5-coder"):
        assert choose_backend("auto", spec, "cpu") == "llama.cpp"
    assert choose_backend("auto", "tiny-random", "cpu") == "torch"
    assert choose_backend("auto", "some/dir", "auto") == "torch"
    assert choose_backend("auto", "default", "cuda") == "torch"
    assert choose_backend("torch", "default", "cpu") == "torch"
    assert choose_backend("llama.cpp", "tiny-random", "cpu") == "llama.cpp"
    monkeypatch.setenv("DITTO_BACKEND", "torch")
    assert choose_backend(None, "default", "cpu") == "torch"
    with pytest.raises(ModelError, match="unknown backend"):
        choose_backend("onnx", "default", "cpu")


def test_backend_is_a_setting_that_reloads_the_model():
    s = Settings().merged({"backend": "llama.cpp"})
    assert s.backend == "llama.cpp" and s.model_key() != Settings().model_key()
    with pytest.raises(SettingsError, match="'backend' must be auto, torch or llama.cpp"):
        Settings().merged({"backend": "onnx"})


def test_without_a_usable_llama_cpp_library_auto_is_torch(monkeypatch):
    monkeypatch.delenv("DITTO_BACKEND", raising=False)
    monkeypatch.setattr(llama_library, "problem", lambda: "no library here")
    assert choose_backend("auto", "default", "cpu") == "torch"


# -- one-line errors ---------------------------------------------------------------------------


def one_line(err: ModelError) -> str:
    text = str(err)
    assert "\n" not in text and text
    return text


@needs_llama
def test_a_missing_file_names_what_to_give(tmp_path):
    with pytest.raises(ModelError) as e:
        load(str(tmp_path / "nope.gguf"), backend="llama.cpp")
    assert "does not exist" in one_line(e.value)


def test_a_corrupt_or_truncated_gguf_says_to_get_it_again(tmp_path, gguf):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + random.Random(0).randbytes(4096))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04 a zip file, not a model")
    for path in (bad, cut, other):
        with pytest.raises(ModelError) as e:
            load(str(path), backend="llama.cpp")
        text = one_line(e.value)
        assert "get it again" in text and path.name in text, text


@needs_llama
def test_an_architecture_llama_cpp_does_not_know_is_named(tmp_path):
    path = write_tiny_gguf(tmp_path / "odd.gguf", architecture="nonesuch")
    with pytest.raises(ModelError) as e:
        load(str(path), backend="llama.cpp")
    text = one_line(e.value)
    assert "does not support the architecture 'nonesuch'" in text and "--backend torch" in text


def test_the_wheel_not_installed_says_how_to_install_it(monkeypatch, tmp_path):
    from lsp_server.backends.llama import binding

    path = write_tiny_gguf(tmp_path / "t.gguf")
    monkeypatch.delenv(binding.LIB_ENV, raising=False)
    monkeypatch.setattr(binding, "wheel_library", lambda: None)  # as if xllamacpp were not installed
    monkeypatch.setattr(llama_library, "_LOADED", [])
    with pytest.raises(ModelError) as e:
        load(str(path), backend="llama.cpp")
    text = one_line(e.value)
    assert f"pip install {binding.INSTALL}" in text and "--backend torch" in text


@needs_llama
def test_a_model_directory_is_not_for_llama_cpp(tmp_path):
    with pytest.raises(ModelError) as e:
        load(str(tmp_path), backend="llama.cpp")
    assert "runs GGUF files" in one_line(e.value)

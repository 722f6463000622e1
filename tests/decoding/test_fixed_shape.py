"""The fixed pass shape and the static KV cache (lsp_server/backends/torch/model.py; docs/gpu.md).

On the CPU with the tiny model in float32:
- padded plain decoding (every pass over pad_to rows) equals unpadded plain decoding;
- speculative decoding equals padded plain decoding, whatever the drafts;
- the static cache (crop = a length change, stale slots masked) equals the dynamic cache,
  KV reuse across requests and crops included, and a pooled cache never leaks what it held;
- padded passes on the static cache fix every shape, and then a verify pass's rows are
  bit-identical to one-token passes: the mechanism the GPU check measures in bf16.
CUDA graph capture runs on CUDA only and is not tested here (the GPU check runs it).
"""

import random

import pytest
import torch

from drafters import NGramDrafter
from lsp_server.decoding.speculation import Speculation
from lsp_server.backends.base import ModelError
from lsp_server.decoding.types import DecodeOptions
from lsp_server.decoding.engine import Engine
from lsp_server.backends.tiny import tiny_random
from lsp_server.backends.torch.model import StaticKV, TorchModel
from lsp_server.backends.torch.options import pass_options

from support.prompts import drafters_for, edited_prompts, random_prompt


@pytest.fixture(scope="module")
def lm(one_thread):
    return tiny_random()


def variants(lm):
    """Every pass-shape configuration the CPU can run (graphs need CUDA)."""
    return {
        "padded": lm.with_options(pad_to=9),
        "static": lm.with_options(static_cache=32),  # small: the sequences make it grow
        "static+padded": lm.with_options(static_cache=32, pad_to=9),
    }


def plain(engine, prompt, n=40, **kw):
    return engine.generate(prompt, options=DecodeOptions(max_new_tokens=n, draft_max=0), **kw)


@pytest.mark.parametrize("seed", range(4))
def test_padded_plain_decoding_equals_unpadded(lm, seed):
    rng = random.Random(seed)
    ref_engine = Engine(lm)
    for name, v in variants(lm).items():
        engine = Engine(v)
        for _ in range(3):
            prompt = random_prompt(rng, lm)
            ref = plain(ref_engine, prompt)
            out = plain(engine, prompt)
            assert out.tokens == ref.tokens, name
            assert out.stats.target_passes == ref.stats.target_passes


@pytest.mark.parametrize("seed", range(6))
def test_speculative_equals_padded_plain(lm, seed):
    rng = random.Random(100 + seed)
    for name, v in variants(lm).items():
        engine = Engine(v)
        if seed % 2:
            engine.speculation = Speculation({1: 1.0, 2: 1.3, 4: 1.9, 9: 3.5}, learn=False)  # adaptive lengths, fixed costs
        prompt = random_prompt(rng, lm)
        ref = plain(engine, prompt, n=48)
        for drafter in drafters_for(lm, prompt, ref.tokens, rng):
            k = rng.choice([1, 3, 8, 12])  # 12 > pad_to - 1: the engine must cap it

            def check(rnd, new, engine=engine):
                st = engine.active
                assert st.cache.get_seq_length() == len(st.ids)
                if v.fixed_rows is not None:
                    assert len(rnd.proposed) <= v.fixed_rows - 1

            out = engine.generate(prompt, drafter=drafter, options=DecodeOptions(max_new_tokens=48, draft_max=k),
                                  on_round=check)
            assert out.tokens == ref.tokens, f"{name}: {drafter.name} k={k} diverged"
            if drafter.name == "right" and ref.stats.stop_reason == "length" and k > 1:
                assert out.stats.target_passes < ref.stats.target_passes


def test_static_and_padded_passes_are_bit_identical_to_one_token_passes(lm):
    """With every shape fixed (pad_to rows, a static cache's attended length), row i of a
    verify pass is computed exactly as a plain pass computes that token: same bits."""
    v = lm.with_options(static_cache=128, pad_to=9)
    ids = random_prompt(random.Random(2), lm) + random_prompt(random.Random(3), lm)
    for k in (1, 4, 9):
        c1 = v.new_cache()
        v.forward(ids[:-k], c1, last=1)
        together = v.forward(ids[-k:], c1, last=k)
        c2 = v.new_cache()
        v.forward(ids[:-k], c2, last=1)
        one_by_one = torch.cat([v.forward([t], c2, last=1) for t in ids[-k:]])
        assert torch.equal(together, one_by_one), k
        assert c1.get_seq_length() == c2.get_seq_length() == len(ids)


def test_padded_pass_keeps_only_the_real_tokens(lm):
    ids = random_prompt(random.Random(4), lm)
    for name, v in variants(lm).items():
        cache = v.new_cache()
        v.forward(ids[:5], cache, last=1)
        out = v.forward(ids[5:8], cache, last=3)
        assert out.shape == (3, lm.vocab_size) and out.dtype == torch.float32
        assert cache.get_seq_length() == 8, name
        ref_cache = lm.new_cache()
        ref = lm.forward(ids[:8], ref_cache, last=3)
        assert torch.allclose(out, ref, atol=1e-4), name
        with pytest.raises(ValueError):
            v.forward(ids[:2], cache, last=3)


def test_static_crop_equals_dynamic_crop(lm):
    """Crop is a length change: what follows a crop sees only the kept tokens."""
    rng = random.Random(5)
    ids = [rng.randrange(6, lm.vocab_size) for _ in range(60)]
    static = lm.with_options(static_cache=16)
    for keep in (0, 1, 17, 40):
        a, b = static.new_cache(), lm.new_cache()
        static.forward(ids[:50], a, last=1)
        lm.forward(ids[:50], b, last=1)
        static.crop(a, keep)
        lm.crop(b, keep)
        assert a.get_seq_length() == b.get_seq_length() == keep
        if keep == 0:
            continue
        tail = ids[keep:keep + 6]
        assert torch.allclose(static.forward(tail, a, last=6), lm.forward(tail, b, last=6), atol=1e-4)
    static.crop(a, 999)  # cropping past the end keeps everything
    assert a.get_seq_length() == keep + 6


def test_static_cache_grows_and_pooled_caches_leak_nothing(lm):
    static = lm.with_options(static_cache=8)
    rng = random.Random(6)
    long_ids = [rng.randrange(6, lm.vocab_size) for _ in range(70)]
    cache = static.new_cache()
    static.forward(long_ids[:30], cache, last=1)
    for t in long_ids[30:]:
        static.forward([t], cache, last=1)
    assert isinstance(cache, StaticKV) and cache.capacity >= 70 and cache.get_seq_length() == 70
    # One capacity for all of a model's caches (the attended length is part of the pass shape).
    other = static.new_cache()
    assert other.capacity == cache.capacity
    small = lm.with_options(static_cache=8)
    pooled, grower = small.new_cache(), small.new_cache()
    small.release(pooled)
    small.forward(long_ids[:40], grower, last=1)  # grows the model's capacity; `pooled` is smaller
    assert pooled.capacity == 8 and grower.capacity >= 40 + TorchModel.STATIC_HEADROOM
    assert small.new_cache() is pooled and pooled.capacity >= 40  # grown when handed out again
    static.release(cache)
    again = static.new_cache()
    assert again is cache and again.get_seq_length() == 0  # the pool hands it back, empty
    short = long_ids[40:52]  # stale slots beyond 12 hold the old sequence: they must stay unseen
    ref = lm.forward(short, lm.new_cache(), last=12)
    assert torch.allclose(static.forward(short, again, last=12), ref, atol=1e-4)


def test_static_cache_reuse_across_requests_equals_fresh_prefill(lm):
    rng = random.Random(11)
    for name, v in variants(lm).items():
        if v.static_cache is None:
            continue
        reuse, fresh = Engine(v), Engine(lm)
        prompts = edited_prompts(rng, lm, 6)
        for p in prompts:
            for drafter in (None, NGramDrafter()):
                opts = DecodeOptions(max_new_tokens=24, draft_max=4 if drafter else 0, prefill_chunk=7)
                a = reuse.generate(p, drafter=drafter, options=opts, cache_key="doc")
                b = fresh.generate(p, drafter=drafter, options=DecodeOptions(max_new_tokens=24,
                                                                             draft_max=opts.draft_max))
                assert a.tokens == b.tokens, name
        assert reuse.cached_keys() == ["doc"]
        second = reuse.generate(prompts[-1], options=DecodeOptions(max_new_tokens=4, draft_max=0), cache_key="doc")
        assert second.stats.reused_tokens == len(prompts[-1]) - 1


def test_calibration_runs_through_the_fixed_shape(lm):
    """measure_pass_costs runs through the padded shape without leaving anything cached."""
    engine = Engine(lm.with_options(static_cache=64, pad_to=9))
    costs = engine.calibrate(n_max=9, reps=1)
    assert sorted(costs) == [1, 2, 3, 4, 6, 9]
    assert engine.cached_keys() == []


def test_options_are_checked(lm):
    with pytest.raises(ValueError):
        lm.with_options(cuda_graphs=True)  # no CUDA here, and no static cache
    with pytest.raises(ValueError):
        lm.with_options(pad_to=0)
    with pytest.raises(ValueError):
        lm.with_options(static_cache=0)
    assert lm.with_options(pad_to=9).fixed_rows == 9 and lm.fixed_rows is None
    assert lm.with_options(pad_to=9, static_cache=64).describe()["kv_cache"] == "static"
    assert isinstance(lm, TorchModel)


def test_pass_options_from_the_environment():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pass_options(cpu, {}) == {"pad_to": None, "static_cache": None, "cuda_graphs": False}
    assert pass_options(cpu, {"DITTO_FIXED_SHAPE": "1"}) == {"pad_to": 9, "static_cache": 4096, "cuda_graphs": False}
    assert pass_options(cpu, {"DITTO_FIXED_SHAPE": "17", "DITTO_STATIC_CACHE": "0"})["static_cache"] is None
    assert pass_options(cpu, {"DITTO_STATIC_CACHE": "2048"}) == {"pad_to": None, "static_cache": 2048,
                                                                  "cuda_graphs": False}
    assert pass_options(cuda, {"DITTO_CUDA_GRAPHS": "1"}) == {"pad_to": 9, "static_cache": 4096, "cuda_graphs": True}
    for env in ({"DITTO_CUDA_GRAPHS": "1"}, {"DITTO_FIXED_SHAPE": "x"}, {"DITTO_FIXED_SHAPE": "1 0"},
                {"DITTO_STATIC_CACHE": "8"}):
        with pytest.raises(ModelError) as err:
            pass_options(cpu, env)
        assert "\n" not in str(err.value)
    with pytest.raises(ModelError):
        pass_options(cuda, {"DITTO_CUDA_GRAPHS": "1", "DITTO_STATIC_CACHE": "0"})
    # CUDA in bf16: graphs, the fixed shape and the static cache by default (the GPU check's
    # decision, docs/gpu.md); any of the three set to 0 turns that off; other dtypes and the CPU keep the old path
    bf16, graphed = torch.bfloat16, {"pad_to": 9, "static_cache": 4096, "cuda_graphs": True}
    assert pass_options(cuda, {}, bf16) == graphed
    assert pass_options(cuda, {"DITTO_STATIC_CACHE": "8192"}, bf16) == {**graphed, "static_cache": 8192}
    for name in ("DITTO_CUDA_GRAPHS", "DITTO_FIXED_SHAPE", "DITTO_STATIC_CACHE"):
        assert pass_options(cuda, {name: "0"}, bf16)["cuda_graphs"] is False
    assert pass_options(cuda, {"DITTO_CUDA_GRAPHS": "0"}, bf16) == {"pad_to": None, "static_cache": None,
                                                                     "cuda_graphs": False}
    assert pass_options(cuda, {}, torch.float16)["cuda_graphs"] is False
    assert pass_options(cpu, {}, bf16) == {"pad_to": None, "static_cache": None, "cuda_graphs": False}


def test_the_static_pass_reads_no_tensor_value_on_the_host(lm, monkeypatch):
    """CUDA graph capture fails on a host read of a device value (.item(), bool(t), ...).
    The static pass must make none, in whatever transformers version runs it: checked here
    on the CPU by making every such read fail during one pass."""
    v = lm.with_options(static_cache=64, pad_to=9)
    cache = v.new_cache()
    v.forward(list(range(10, 30)), cache, last=1)
    reads = []
    for name in ("item", "__bool__", "tolist", "__int__", "__float__", "__index__", "numpy"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _name=name, _real=real, **k):
            reads.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    with torch.inference_mode():
        ids = torch.tensor([[11] * 9])
        start = torch.tensor([cache.get_seq_length()])
        logits = v._static_step(cache, ids, start, 0)
    monkeypatch.undo()
    assert logits.shape == (9, lm.vocab_size)
    assert reads == []

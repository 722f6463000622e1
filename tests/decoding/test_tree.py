"""Tree drafts (lsp_server/decoding/tree.py, lsp_server/backends/torch/tree.py; docs/drafters.md, "Trees").

- a tree pass's rows are what chain passes over each root-to-node path compute, and after
  `keep_rows` the cache holds what a chain pass over the kept path leaves;
- through the fixed shape and the static cache in bf16, every tree row is bit-identical to plain
  one-token decoding of its path (the property the GPU check measures on CUDA);
- the engine's greedy output with tree drafts equals drafting off, token for token: float32 on
  the dynamic cache (with the near-tie guard) and bf16 through the fixed shape and static cache,
  for trees that hold the right path at any depth, among wrong siblings, or not at all;
- sampling, token healing and backends without tree passes verify a tree's main path instead.
"""

import random

import pytest
import torch

from drafters.base import Proposal
from lsp_server.decoding.speculation import Speculation
from lsp_server.backends.tiny import tiny_random
from lsp_server.backends.torch.model import TorchModel
from lsp_server.decoding.engine import Engine
from lsp_server.decoding.tree import as_chain, fit, main_path, parents_of
from lsp_server.decoding.types import DecodeOptions

from support.prompts import random_prompt


@pytest.fixture(scope="module")
def lm(one_thread):
    return tiny_random()


@pytest.fixture(scope="module")
def bf16(lm):
    module = tiny_random()._model.to(torch.bfloat16)
    return TorchModel("tiny-bf16", "tiny-bf16", module, lm._tok, lm.device, torch.bfloat16, fim=lm.fim,
                      stop_ids=lm.stop_ids, vocab_size=lm.vocab_size)


ROWS = [-1, 0, 0, 1, 2, 3, 1]  # root; a, b under it; c under a; d under b; e under c; f under a
PATHS = ([0, 1, 3, 5], [0, 2, 4], [0, 1, 6])


def _tree_pass(v, prompt, toks):
    cache = v.new_cache()
    v.forward(prompt[:-1], cache, last=1)
    v.tree_next(cache, ROWS)
    return v.forward([prompt[-1], *toks], cache, last=len(ROWS)), cache


@pytest.mark.parametrize("kind", ["dynamic", "static", "static+padded"])
def test_tree_rows_are_the_chain_passes_of_their_paths(lm, kind):
    v = {"dynamic": lm, "static": lm.with_options(static_cache=32),
         "static+padded": lm.with_options(static_cache=32, pad_to=9)}[kind]
    rng = random.Random(1)
    prompt = random_prompt(rng, lm) + [rng.randrange(6, lm.vocab_size) for _ in range(5)]
    toks = [rng.randrange(6, lm.vocab_size) for _ in range(len(ROWS) - 1)]
    out, cache = _tree_pass(v, prompt, toks)
    assert out.shape == (len(ROWS), lm.vocab_size) and cache.get_seq_length() == len(prompt) - 1 + len(ROWS)
    ids = [prompt[-1], *toks]
    for path in PATHS:
        ref_cache = lm.new_cache()
        lm.forward(prompt[:-1], ref_cache, last=1)
        ref = lm.forward([ids[r] for r in path], ref_cache, last=len(path))
        assert torch.allclose(out[path], ref, atol=1e-4), path
    # Keep the path root, b, d: the cache then continues as after a chain over it.
    v.keep_rows(cache, len(prompt) - 1, [0, 2, 4])
    assert cache.get_seq_length() == len(prompt) + 2
    nxt = v.forward([9], cache, last=1)
    ref = lm.forward([*prompt, toks[1], toks[3], 9], lm.new_cache(), last=1)
    assert torch.allclose(nxt, ref, atol=1e-4)


def test_tree_rows_through_the_fixed_shape_are_bit_identical_in_bf16(bf16):
    """Every row of a tree pass, through 9 padded rows on a static cache in bf16, has the bits
    of plain one-token decoding of its path (measured on this CPU; the GPU check measures CUDA)."""
    v = bf16.with_options(static_cache=64, pad_to=9)
    assert v.trees
    for seed in range(3):
        rng = random.Random(seed)
        prompt = random_prompt(rng, bf16) + [rng.randrange(6, bf16.vocab_size) for _ in range(5)]
        toks = [rng.randrange(6, bf16.vocab_size) for _ in range(len(ROWS) - 1)]
        out, _ = _tree_pass(v, prompt, toks)
        ids = [prompt[-1], *toks]
        for path in PATHS:
            cache = v.new_cache()
            v.forward(prompt[:-1], cache, last=1)
            plain = torch.cat([v.forward([ids[r]], cache, last=1) for r in path])
            assert torch.equal(out[path], plain), (seed, path)


class TreeOracle:
    """Trees around the reference continuation: the right path cut at a random depth (or wrong
    from its first token), wrong siblings at every level, listed best first."""

    name = "tree-oracle"

    def __init__(self, prompt_len, reference, rng, vocab, right=True):
        self.n, self.ref, self.rng, self.vocab, self.right = prompt_len, reference, rng, vocab, right

    def propose(self, context, k):
        done = len(context) - self.n
        good = self.ref[done : done + k] if self.right else []
        depth = self.rng.randrange(0, len(good) + 1) if good else 0
        tokens, tree, weights = [], [], []
        parent = -1
        for d in range(max(depth, 1) if k else 0):
            sib = (good[d] + 1 + self.rng.randrange(3)) % self.vocab if d < len(good) else self.rng.randrange(self.vocab)
            if self.rng.random() < 0.5 and d < depth:  # the wrong sibling first, sometimes
                tokens += [sib, good[d]]
                tree += [parent, parent]
                parent = len(tokens) - 1
            else:
                tokens += [good[d] if d < depth else sib, sib]
                tree += [parent, parent]
                parent = len(tokens) - 2
            weights += [0.5, 0.5]
        return Proposal(tokens, source="context", match_len=4, tree=tree, weights=weights)

    def update_source(self, name, tokens):
        pass

    def forget_source(self, name):
        pass

    def set_options(self, options):
        pass


def _check_equal(v, seeds, adaptive):
    for seed in seeds:
        rng = random.Random(seed)
        engine = Engine(v)
        if adaptive:
            engine.speculation = Speculation({1: 1.0, 9: 1.0, 16: 1.0}, learn=False)  # flat costs: whole trees
        prompt = random_prompt(rng, v)
        plain = engine.generate(prompt, options=DecodeOptions(max_new_tokens=40, draft_max=0))
        for right in (True, False):
            drafter = TreeOracle(len(prompt), plain.tokens + [0] * 16, rng, v.vocab_size, right)
            out = engine.generate(prompt, drafter=drafter,
                                  options=DecodeOptions(max_new_tokens=40, draft_max=rng.choice([3, 8]),
                                                        adaptive=adaptive))
            assert out.tokens == plain.tokens, (seed, right)
            trees = [r for r in out.rounds if r.nodes]
            assert trees, "no tree pass ran"
            if right and plain.stats.stop_reason == "length":
                assert out.stats.target_passes < plain.stats.target_passes
            assert all(len(r.proposed) <= r.nodes and r.accepted <= len(r.proposed) for r in trees)


def test_speculative_with_trees_equals_plain_float32(lm):
    _check_equal(lm, range(6), adaptive=False)
    _check_equal(lm, range(6, 9), adaptive=True)


def test_speculative_with_trees_equals_plain_bf16_fixed_shape(bf16):
    _check_equal(bf16.with_options(static_cache=64, pad_to=9), range(6), adaptive=False)


def test_trees_are_off_on_the_fixed_shape_in_float32_and_when_sampling(lm):
    assert lm.trees and lm.with_options(static_cache=64).trees
    assert not lm.with_options(static_cache=64, pad_to=9).trees  # no near-tie guard there (TorchModel.trees)
    assert lm.with_options(static_cache=64, pad_to=9, trees=True).trees
    rng = random.Random(3)
    prompt = random_prompt(rng, lm)
    fixed = Engine(lm.with_options(static_cache=64, pad_to=9))
    plain = fixed.generate(prompt, options=DecodeOptions(max_new_tokens=30, draft_max=0))
    out = fixed.generate(prompt, drafter=TreeOracle(len(prompt), plain.tokens + [0] * 16, rng, lm.vocab_size),
                         options=DecodeOptions(max_new_tokens=30, draft_max=8, adaptive=False))
    assert out.tokens == plain.tokens and not any(r.nodes for r in out.rounds)
    # Sampling: the main path, the same tokens as a chain drafter proposing it, for one seed.
    eng = Engine(lm)
    opts = DecodeOptions(max_new_tokens=30, draft_max=6, adaptive=False, temperature=0.8, seed=5)
    a = eng.generate(prompt, drafter=TreeOracle(len(prompt), plain.tokens + [0] * 16, random.Random(9),
                                                lm.vocab_size), options=opts)
    assert not any(r.nodes for r in a.rounds)
    b = eng.generate(prompt, drafter=_Chained(TreeOracle(len(prompt), plain.tokens + [0] * 16, random.Random(9),
                                                         lm.vocab_size)), options=opts)
    assert a.tokens == b.tokens


class _Chained:
    """A tree drafter's proposals as chains (its main path), for the sampling comparison."""

    name = "chained"

    def __init__(self, inner):
        self.inner = inner

    def propose(self, context, k):
        return as_chain(self.inner.propose(context, k))

    def update_source(self, name, tokens):
        pass

    def forget_source(self, name):
        pass


def test_fit_keeps_a_best_first_prefix_within_the_limits():
    p = Proposal([10, 11, 12, 13, 14, 15], tree=[-1, -1, 0, 2, 3, 1], weights=[0.6, 0.4, 1, 1, 1, 1])
    assert main_path(p.tokens, p.tree) == [0, 2, 3, 4]
    q = fit(Proposal(list(p.tokens), tree=list(p.tree), weights=list(p.weights)), depth=2, nodes=4, trees=True)
    assert q.tokens == [10, 11, 12, 15] and q.tree == [-1, -1, 0, 1] and q.weights == [0.6, 0.4, 1, 1]
    c = fit(Proposal(list(p.tokens), tree=list(p.tree), weights=list(p.weights)), depth=3, nodes=9, trees=False)
    assert c.tree is None and c.tokens == [10, 12, 13]
    assert parents_of(Proposal([1, 2], tree=[-1, 0])) is None  # a chain is verified as one
    assert parents_of(Proposal([1, 2], tree=[-1, -1])) == [-1, -1]
    with pytest.raises(ValueError):
        tiny_random().tree_next(object(), [0, -1])


def test_trees_on_take_the_sixteen_row_fixed_shape():
    from lsp_server.backends.torch.options import pass_options, trees_option, with_tree_rows

    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    assert trees_option({}) is None and trees_option({"DITTO_TREES": "1"}) is True
    assert trees_option({"DITTO_TREES": "0"}) is False
    with pytest.raises(Exception):
        trees_option({"DITTO_TREES": "maybe"})
    opts = pass_options(cuda, {}, bf16)
    assert with_tree_rows(opts, True, {})["pad_to"] == 16 and with_tree_rows(opts, None, {})["pad_to"] == 9
    env = {"DITTO_FIXED_SHAPE": "12"}
    assert with_tree_rows(pass_options(cuda, env, bf16), True, env)["pad_to"] == 12


class RandomTrees:
    """Random weighted trees over a small vocabulary (the sampling test's)."""

    name = "random-trees"

    def __init__(self, seed, vocab):
        self.rng, self.vocab = random.Random(seed), vocab

    def propose(self, context, k):
        n = self.rng.randrange(1, 7)
        tree = [self.rng.randrange(-1, i) for i in range(n)]
        return Proposal([self.rng.randrange(self.vocab) for _ in range(n)], source="context", match_len=2, tree=tree,
                        weights=[0.5] * n)

    def update_source(self, name, tokens):
        pass

    def forget_source(self, name):
        pass


@pytest.mark.parametrize("kind", ["random-trees", "suffix"])
def test_sampling_with_tree_drafts_keeps_the_distribution(kind):
    """Sampling verifies a tree's main path with the one-hot rejection rule: the output is
    distributed as plain sampling's (chi-square, as tests/decoding/test_sampling.py)."""
    from drafters.suffix import SuffixDrafter
    from lsp_server.backends.tiny import tiny_random_model

    from support.sampling import LENGTH, N, PROMPT, V, chi_square_pvalue, exact_distribution

    model = tiny_random_model(V, seed=3, hidden=32, init_std=0.15)
    lm = TorchModel("tiny-v8", "tiny-v8", model, None, torch.device("cpu"), torch.float32, stop_ids=frozenset(),
                    vocab_size=V)
    kw = dict(temperature=1.0, draft_max=3)
    dist = exact_distribution(lm, DecodeOptions(temperature=1.0))
    engine, counts = Engine(lm), {}
    for i in range(N):
        drafter = RandomTrees(i, V) if kind == "random-trees" else SuffixDrafter()
        out = engine.generate(PROMPT, drafter=drafter, options=DecodeOptions(max_new_tokens=LENGTH, seed=10_000 + i, **kw),
                              cache_key="prompt")
        assert not any(r.nodes for r in out.rounds)
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
    assert chi_square_pvalue(counts, dist, N) > 1e-3, counts

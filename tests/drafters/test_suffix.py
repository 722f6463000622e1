"""The default drafter (drafters/suffix.py) and the pricing of weighted drafts (lsp_server/decoding/nodes.py)."""

import random

from drafters.base import Drafter, Proposal
from drafters.ngram import NGramDrafter
from lsp_server.decoding.nodes import NodeRates, NodeScorer, depths, order_and_count
from lsp_server.decoding.speculation import Speculation
from drafters.suffix import SEPARATOR, SuffixDrafter


def _valid_tree(p: Proposal, k: int, nodes: int) -> None:
    assert len(p.tokens) == len(p.tree) == len(p.weights) <= nodes
    assert all(-1 <= par < i for i, par in enumerate(p.tree))  # each node after its parent
    assert max(depths(p.tree)) <= k
    assert all(0 < w <= 1 for w in p.weights)
    assert SEPARATOR not in p.tokens


def test_a_repeated_line_is_drafted_as_a_tree_of_its_continuations():
    d = SuffixDrafter()
    assert isinstance(d, Drafter) and d.name == "ngram"
    # "1 2 3" continues with 4 twice and with 9 once: 4 comes first, 9 is its sibling.
    ctx = [1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 9, 8, 0, 1, 2, 3, 4, 5, 7, 0, 1, 2, 3]
    p = d.propose(ctx, 4)
    _valid_tree(p, 4, d.max_nodes)
    assert p.tokens[0] == 4 and p.tree[0] == -1 and p.match_len >= 4 and p.source == "context"
    first = [t for t, par in zip(p.tokens, p.tree) if par == -1]
    assert first[:2] == [4, 9]
    assert p.weights[0] > p.weights[p.tokens.index(9)]
    # The main path follows the heavier branch: 4 5 then 6 or 7.
    assert p.tokens[p.tree.index(0)] == 5


def test_one_matching_token_is_enough_and_longer_matches_weigh_more():
    d = SuffixDrafter()
    p = d.propose([5, 6, 7, 8, 9, 10, 7], 3)  # "7" was followed by 8 once
    assert p.tokens[0] == 8 and p.match_len == 1
    # A 3-token match outweighs four 1-token ones.
    ctx = [3, 4, 5, 50] + [5, 60] * 4 + [3, 4, 5]
    p = d.propose(ctx, 2)
    assert p.tokens[0] == 50 and p.match_len == 3
    assert d.propose([100, 101, 102], 4).tokens == []  # nothing seen before: no draft


def test_open_buffers_and_earlier_generations_are_sources():
    d = SuffixDrafter()
    d.update_source("other.py", [40, 41, 42, 43, 44, 45])
    p = d.propose([1, 2, 40, 41], 3)
    assert p.tokens[:3] == [42, 43, 44] and p.source == "other.py"
    # A generation: the prompt, then tokens appended over three steps.
    prompt = [7, 8, 9, 20, 21]
    d.propose(prompt, 3)
    d.propose(prompt + [22, 23], 3)
    d.propose(prompt + [22, 23, 24, 25], 3)
    assert d.memory() == []  # remembered once a generation with another prompt starts
    d.propose([1, 1, 1], 3)
    assert d.memory()[-1] == SEPARATOR and d.memory()[:-1][-4:] == [22, 23, 24, 25]
    p = d.propose([60, 61, 21, 22], 3)  # earlier generated tokens continue
    assert p.tokens[:2] == [23, 24]
    # The same prompt again is decoded as the first time (the last generation is not fed back).
    e = SuffixDrafter()
    e.propose(prompt, 3)
    e.propose(prompt + [22, 23], 3)
    e.propose(prompt, 3)
    assert e.memory() == []
    other = d.sharing()
    assert other.source_names() == d.source_names() and other.memory() == []
    d.forget_memory()
    assert d.memory() == []


def test_trees_stay_within_the_limits_and_sampling_gets_a_chain():
    rng = random.Random(0)
    ctx = [rng.randrange(12) for _ in range(400)]
    d = SuffixDrafter(max_nodes=9)
    for k in (1, 3, 8):
        for end in range(50, 400, 37):
            p = d.propose(ctx[:end], k)
            if p.tokens:
                _valid_tree(p, k, 9)

    class Sampling:
        greedy = False

    d.set_options(Sampling())
    p = d.propose(ctx, 5)
    assert p.tree == list(range(-1, len(p.tokens) - 1)) and len(p.tokens) <= 5


def test_lookup_is_todays_chain_drafter():
    ctx = [1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    assert SuffixDrafter().lookup(ctx, 4).tokens == NGramDrafter().propose(ctx, 4).tokens == [4, 5, 6, 0]


def test_flat_pass_costs_verify_every_likely_node_and_steep_ones_few():
    p = Proposal([4, 9, 5, 6, 7], tree=[-1, -1, 0, 2, 3], weights=[0.6, 0.4, 1.0, 1.0, 0.5], source="context",
                 match_len=6)
    flat = Speculation({1: 1.0, 16: 1.0}, learn=False)
    assert flat.choose(Proposal(list(p.tokens), tree=list(p.tree), weights=list(p.weights), source="context",
                                match_len=6)) == 5
    steep = Speculation({1: 1.0, 2: 1.9, 4: 3.8, 9: 8.5}, learn=False)
    assert steep.choose(Proposal(list(p.tokens), tree=list(p.tree), weights=list(p.weights), source="context",
                                 match_len=6)) <= 1
    # The count is of the best-first list, reordered by each node's chance (parents first).
    q = Proposal([4, 9, 5], tree=[-1, -1, 0], weights=[0.2, 0.8, 1.0], source="context", match_len=6)
    n, pos = order_and_count(q, NodeRates().path_probs(q), lambda e, n: e - 1.0)
    assert q.tokens == [9, 4, 5] and q.tree == [-1, -1, 1] and pos >= 1


def test_node_rates_are_learned_from_every_offered_node():
    rates = NodeRates()
    scorer = NodeScorer(rates)
    p = Proposal([4, 9, 5], tree=[-1, -1, 0], weights=[0.95, 0.05, 1.0], source="context", match_len=6)
    key_right, key_wrong, key_later = rates.keys(p)
    before = rates.rate(key_right), rates.rate(key_wrong), rates.rate(key_later)
    for _ in range(40):
        scorer.offer(p, 10)
        scorer.settle([0] * 10 + [4])  # only the first level is known: the later node waits
        assert scorer.pending
        scorer.settle([0] * 10 + [4, 8])  # now the later node is known: wrong
        assert not scorer.pending
    assert rates.rate(key_right) > before[0] and rates.rate(key_wrong) < before[1]
    assert rates.rate(key_later) < before[2]
    assert rates.observed[key_right] == rates.observed[key_later] == 40

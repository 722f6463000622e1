"""The default-path GPU check (ditto_bench/gpudefault.py) end to end on the CPU with the tiny model:
a document's requests with KV reuse, drafting off against n-gram, right and corrupted drafts, on
today's CPU path and on the fixed shape (padded passes, static cache) that CUDA in bf16 uses by
default. No timing is asserted."""

import json

import pytest

from ditto_bench import gpudefault


@pytest.mark.parametrize("fixed", [False, True])
def test_default_path_requests_with_reuse_give_the_plain_tokens(tmp_path, fixed):
    argv = ["--tiny", "--device", "cpu", "--context", "48", "--edits", "4", "--new-tokens", "12", "--reps", "1",
            "--out", str(tmp_path)] + (["--fixed-shape"] if fixed else [])
    assert gpudefault.main(argv) == 0
    res = json.loads((tmp_path / "gpudefault.json").read_text())
    assert res["options"]["static_cache"] == (4096 if fixed else None)
    assert res["options"]["pad_to"] == (9 if fixed else None)
    r = res["requests"]
    assert r["requests"] == 4 and r["mismatches"] == []
    assert r["reused_tokens"] > 0  # later requests start from the cache of the earlier ones
    assert set(r["tokens"].values()) == {r["positions"]}
    # all-right drafts make each verify pass carry more than one token: speculation really ran
    assert r["passes"]["right-drafts"] < r["passes"]["off"]
    assert "speculative == plain: **yes**" in (tmp_path / "gpudefault.md").read_text()

"""A short long day (ditto_bench/longday.py, issue 26) against `ditto-lsp serve --model tiny-random`:
buffers opened and closed while typing with a request after every key. Nothing is timed; what is
checked is counted: every request answered, no KV cache or index entry left once the documents
are closed and never more than the open documents, and no memory growth beyond a loose bound
(a leak detector: the full day's figures are measured by the command, docs/big-inputs.md)."""

from ditto_bench.longday import long_day


def test_a_short_day_leaves_nothing_behind():
    out = long_day("tiny-random", edits=300, buffers=10, open_max=5, churn=20, samples=6, max_tokens=4)
    assert out["lost"] == 0 and out["requests"] == 300 and out["exit_code"] == 0
    assert out["opened"] == 10  # every buffer was opened at some point, some of them twice
    after = out["after_closing_all"]
    assert after["open_documents"] == 0
    kv = after["kv_cache"]
    assert (kv["keys"], kv["tokens"]) == (0, 0)  # closing a document releases its KV cache
    assert (kv["file_prefix"]["files"], kv["file_prefix"]["tokens"]) == (0, 0)  # and its file's prefix KV
    assert after["index"]["buffers"] == 0 and after["index"]["bytes"] == 0
    assert after["protocol_futures"] == 0  # pygls kept one per didChange (lsp_server/lsp/protocol.py)
    assert out["kv_cache_keys_max"] <= 5 and out["index_buffers_max"] <= 5
    assert out["rss_end_vs_first_quarter"] < 1.3

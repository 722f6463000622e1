"""Faults: a model pass that raises, a missing or corrupt model file, a client that goes away.

Over stdio with the raw client (ditto_bench/storm.py) on the tiny random model, except the
packaged-model hash check, which runs `model.load` in-process against a fake packaged
model whose single part is a small corrupt file. (shutdown/exit codes are checked in
test_fuzz_protocol.py.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from ditto_bench.client import RawClient  # noqa: E402

TIMEOUT = 60
CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    "
END = (5, 4)
ENV = {"OMP_NUM_THREADS": "1"}


def configure(c: RawClient, **options) -> None:
    c.notify("workspace/didChangeConfiguration", {"settings": {"ditto": options}})


def test_a_failing_model_pass_answers_an_error_is_logged_once_and_the_next_request_is_served(tmp_path):
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        c = RawClient(["--model", "tiny-random", "--max-tokens", "8", "--debug-hooks"], env=ENV, stderr=stderr)
    try:
        c.initialize({"maxTokens": 8})
        assert c.wait_ready(TIMEOUT)["params"]["value"]["message"] == "ready"
        uri = "file:///tmp/ditto-faults/oom.py"
        c.open(uri, CODE)
        before = c.wait(c.inline(uri, *END), TIMEOUT)
        assert before["result"] is not None  # the tiny model suggests something here
        configure(c, debugFailForward=True)
        failed = c.wait(c.inline(uri, *END), TIMEOUT)
        assert failed["error"]["code"] == -32603 and "out of memory" in failed["error"]["message"]
        configure(c, debugFailForward=False)
        # The failed pass had already extended the KV cache: the next answer must not notice.
        after = c.wait(c.inline(uri, *END), TIMEOUT)
        assert after["result"] == before["result"]
        s = c.stats()
        assert s["errors"] == 1 and s["completed"] == 2 and s["model_state"] == "ready"
        assert c.shutdown_and_exit() == 0
    finally:
        c.kill()
    log = err.read_text()
    assert log.count("RuntimeError: out of memory (simulated") == 1, log[-3000:]  # one traceback


def test_a_corrupt_gguf_is_a_clear_message_and_the_server_keeps_answering(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    missing = tmp_path / "missing.gguf"
    c = RawClient(["--model", str(bad)], env={**ENV, "DITTO_CACHE_DIR": str(tmp_path / "cache")})
    try:
        c.initialize()
        assert c.wait_ready(TIMEOUT)["params"]["value"]["message"] == "failed"
        shown = c.wait_notification(lambda m: m.get("method") == "window/showMessage", TIMEOUT)["params"]
        assert shown["type"] == 1 and "broken.gguf" in shown["message"] and "\n" not in shown["message"]
        assert "cannot read GGUF" in shown["message"]
        uri = "file:///tmp/ditto-faults/corrupt.py"
        c.open(uri, CODE)
        assert c.wait(c.inline(uri, *END), TIMEOUT)["result"] is None
        s = c.stats()
        assert s["model_state"] == "failed" and "cannot read GGUF" in s["model_error"]
        # A missing file: the same, with its own message.
        configure(c, model=str(missing))
        shown = c.wait_notification(lambda m: m.get("method") == "window/showMessage"
                                    and "missing.gguf" in m["params"]["message"], TIMEOUT)["params"]
        assert "does not exist" in shown["message"]
        assert c.wait(c.inline(uri, *END), TIMEOUT)["result"] is None
        assert c.shutdown_and_exit() == 0
    finally:
        c.kill()
    assert not list((tmp_path / "cache").glob("models/*"))  # nothing half-converted left behind


def test_a_packaged_model_with_a_hash_mismatch_is_refused_with_a_one_line_message(tmp_path, monkeypatch):
    from lsp_server.backends import loader as model
    from lsp_server.backends import packaged
    from lsp_server.backends.base import ModelError

    part = tmp_path / "part01.bin"
    part.write_bytes(b"not the model" * 100)
    fake = packaged.PackagedModel(name="fake-model", title="Fake", package="fake-part{i}", module="fake_part{i}",
                               count=1, version="1.0", sha256="0" * 64, size=part.stat().st_size)
    monkeypatch.setitem(packaged.PACKAGED, "fake-model", fake)
    monkeypatch.setattr(packaged.PackagedModel, "part_paths", lambda self: [part])
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelError) as info:
        model.load("fake-model", device="cpu")
    msg = str(info.value)
    assert "sha256" in msg and "fake-model" in msg and "--force" in msg and "\n" not in msg
    assert not (tmp_path / "cache" / "models").exists() and not list((tmp_path / "cache").glob("gguf/*.gguf"))


def test_a_packaged_model_with_a_missing_part_names_the_fix(monkeypatch):
    from lsp_server.backends import loader as model
    from lsp_server.backends import packaged
    from lsp_server.backends.base import ModelError

    fake = packaged.PackagedModel(name="fake-model", title="Fake", package="ditto-no-such-dist-part{i}",
                               module="ditto_no_such_dist_part{i}", count=2, version="1.0", sha256="0" * 64, size=1)
    monkeypatch.setitem(packaged.PACKAGED, "fake-model", fake)
    with pytest.raises(ModelError) as info:
        model.load("fake-model", device="cpu")
    assert "ditto-lsp models pull fake-model" in str(info.value) and "ditto-no-such-dist-part1" in str(info.value)


def children(pid: int) -> set[int]:
    """Processes whose parent is `pid` (from /proc)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d.name))
    return out


def test_the_server_exits_promptly_when_the_client_goes_away_mid_generation():
    c = RawClient(["--model", "tiny-random", "--max-tokens", "64", "--debug-hooks"], env=ENV)
    try:
        c.initialize({"debugStepDelayMs": 500, "debugNotifySteps": True, "timeBudgetS": None})
        assert c.wait_ready(TIMEOUT)["params"]["value"]["message"] == "ready"
        uri = "file:///tmp/ditto-faults/gone.py"
        c.open(uri, CODE)
        c.inline(uri, *END)
        c.wait_notification(lambda m: m.get("method") == "ditto/debug/step", TIMEOUT)  # the worker is busy
        kids = children(c.pid)
        c.proc.stdin.close()  # the editor went away
        code = c.proc.wait(15)  # 64 tokens x 500 ms would be 32 s: the generation must be abandoned
        assert code == 1  # no shutdown request came (LSP: exit code 1)
        assert not any(Path(f"/proc/{k}").exists() for k in kids)
    finally:
        c.kill()


def test_the_stdin_reader_pool_never_starts_a_second_thread():
    # pygls reads stdin through the server's thread pool, one read after another (its
    # `StdinAsyncReader`). A read submitted before the last one's thread went idle started a new
    # thread with pygls's default pool size, so a typing storm on a busy machine grew the server's
    # threads (the storm test below). Here every job is submitted while the others still run.
    import threading
    from lsp_server.lsp.server import DittoServer

    server = DittoServer()
    gate = threading.Event()
    idents = []
    jobs = [server.thread_pool.submit(lambda: (gate.wait(5), idents.append(threading.get_ident()))) for _ in range(4)]
    gate.set()
    for j in jobs:
        j.result(10)
    server.thread_pool.shutdown()
    assert len(idents) == 4 and len(set(idents)) == 1


def test_a_small_typing_storm_answers_everything_and_holds_memory_and_threads():
    from ditto_bench.storm import storm

    # Every pass waits 10 ms (ended at once by a cancellation): a request lasts at least 80 ms
    # on any backend, so the storm's bursts supersede and its cancellations catch requests
    # still running. Without it a fast backend (llama.cpp's tiny GGUF) could answer every
    # request before the next key, and the check below would fail on an idle machine.
    r = storm("tiny-random", edits=150, docs=3, seed=1, max_tokens=8, warmup=15,
              serve_args=["--debug-hooks"], init_options={"debugStepDelayMs": 10})
    assert r["dropped_no_answer"] == 0 and r["answered"] == r["requests_sent"]
    assert r["answered_other_error"] == 0 and r["server"]["errors"] == 0
    # A stale request runs at most one model pass (the one racing its cancellation).
    assert r["stale_passes_max"] <= 1
    assert r["server"]["superseded"] > 0 and r["answered_cancelled_error"] > 0  # the storm did supersede and cancel
    assert r["rss_growth_after_warmup"] < 0.10
    assert r["memory"]["end"]["threads"] <= r["memory"]["after_warmup"]["threads"] + 2
    assert r["exit_code"] == 0

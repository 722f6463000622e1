"""llama.cpp's own llama-server as the team storm's engine (ditto_bench/engines.py LlamaServer, from
the xllamacpp wheel; issue 26): it starts in its own process, answers, is killed and restarted on
the same port, and a short team storm against it loses no request and has every client served
again after the restart (counted, never timed: the full storm's times are docs/big-inputs.md's)."""

import json
import urllib.request

import pytest

pytest.importorskip("xllamacpp")

from ditto_bench.engines import LlamaServer, tiny_text_gguf  # noqa: E402
from ditto_bench.storm import team_storm  # noqa: E402


def complete(engine: LlamaServer) -> str:
    body = json.dumps({"model": "tiny", "prompt": "def f():\n", "max_tokens": 4}).encode()
    req = urllib.request.Request(engine.url + "/completions", body, {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama-server")
    eng = LlamaServer(tiny_text_gguf(d / "tiny.gguf"), log_dir=d, parallel=4)
    eng.start()
    yield eng
    eng.stop()


def test_it_answers_dies_and_comes_back_on_its_port(engine):
    assert isinstance(complete(engine), str)
    engine.kill()
    assert not engine.accepts()
    engine.start()
    assert engine.starts == 2 and isinstance(complete(engine), str)


def test_a_team_storm_loses_nothing_and_every_client_is_served_after_a_restart(engine):
    out = team_storm(engine.spec(), clients=2, edits=80, engine=engine, kill_at=0.4, down_s=0.5, max_tokens=4,
                     warmup=5)
    assert out["lost"] == 0 and out["failed_clients"] == []
    assert all(row["recovered_s_after_restart"] is not None for row in out["per_client"])

"""The thread stress test: the event loop and the model worker share nothing mutable
(lsp_server/lsp/threads.py), checked under load.

Edits, cursor moves, opens and closes of several documents arrive on the event loop while idle work,
generation and next-edit proposals (the `judged` proposer: the model on the worker) run on the model
worker, which is slowed at random points of its own code (tests/support/slow_worker.py: a sleep between
two lines lets the loop run there). Requests are sent without waiting for their answers. At the end:

- every request was answered, and with no error but a cancellation's;
- at rest, the server's text of every open document (`ditto/debug/document`) equals an independent
  model of the edits, and so does what the worker holds of it (`ditto/debug/worker`: its copy of the
  text and the Completer's open buffer), and the worker holds nothing of a closed one;
- no idle job is lost: at rest nothing is left to warm or to finish (the idle plan is empty) and no
  document has a generation paused at its deadline;
- the server's log has no traceback (an idle job that failed is logged, not answered).

The edits are plain ASCII with "\\n" only (tests/lsp/test_fuzz_protocol.py covers the encodings), so the
model is a string splice. The default run is derandomized (seeds 1..DITTO_STRESS_SEQUENCES, default 3);
DITTO_FUZZ_RANDOM=1 draws new seeds, printed (pytest -s) and in the failure message.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from ditto_bench.client import RawClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = [sys.executable, str(ROOT / "tests" / "support" / "slow_worker.py"), "serve"]
SEQUENCES = int(os.environ.get("DITTO_STRESS_SEQUENCES", "3"))
STEPS = int(os.environ.get("DITTO_STRESS_STEPS", "70"))
SEEDS = ([random.SystemRandom().randrange(1 << 30) for _ in range(SEQUENCES)]
         if os.environ.get("DITTO_FUZZ_RANDOM") == "1" else list(range(1, SEQUENCES + 1)))
URIS = [f"file:///tmp/ditto-stress/doc{i}.py" for i in range(5)]
LINES = ["def handler(value):", "    return value * 2", "class Store:", "    def get_items(self, key):",
         "        items = self.cache.get(key)", "        return items", "", "for item in items:",
         "    total += item.price", "import os", "x = compute(a, b)"]
WAIT_S = 120  # only so a broken server cannot hang the run; a healthy one answers in well under a second
CANCELLED = -32800


def some_text(rng: random.Random, lines: int) -> str:
    return "\n".join(rng.choice(LINES) for _ in range(lines)) + "\n"


def position(text: str, offset: int) -> dict:
    before = text[:offset]
    return {"line": before.count("\n"), "character": len(before) - (before.rfind("\n") + 1)}


def run_sequence(seed: int, tmp: Path) -> None:
    rng = random.Random(seed)
    log = tmp / f"stderr-{seed}.txt"
    with open(log, "w") as stderr:
        client = RawClient(["--model", "tiny-random", "--max-tokens", "10", "--debug-hooks"], cwd=str(ROOT),
                           env={"DITTO_SLOW_SEED": str(seed)}, stderr=stderr, command=LAUNCHER)
        try:
            client.initialize({"debugDocuments": True, "nextEditProposer": "judged"})
            assert client.wait_ready(WAIT_S)["params"]["value"]["message"] == "ready"
            model: dict[str, str] = {}
            versions: dict[str, int] = {}
            asked: list[int] = []
            for _ in range(STEPS):
                r = rng.random()
                closed = [u for u in URIS if u not in model]
                if not model or (r < 0.12 and closed):
                    uri = rng.choice(closed)
                    model[uri], versions[uri] = some_text(rng, rng.randrange(1, 30)), 1
                    client.open(uri, model[uri], 1)
                    continue
                uri = rng.choice(sorted(model))
                text = model[uri]
                if r < 0.2:
                    client.close_doc(uri)
                    del model[uri]
                elif r < 0.55:  # an edit: typing, a paste, or a deletion
                    a = rng.randrange(len(text) + 1)
                    b = min(len(text), a + rng.choice([0, 0, 1, 5, 40]))
                    new = rng.choice(["x", "(", "\n", "    ", "self.items", rng.choice(LINES) + "\n", ""])
                    versions[uri] += 1
                    client.change(uri, versions[uri], [{"range": {"start": position(text, a), "end": position(text, b)},
                                                        "text": new}])
                    model[uri] = text[:a] + new + text[b:]
                elif r < 0.65:
                    client.notify("ditto/didMoveCursor", {"textDocument": {"uri": uri},
                                                          "position": position(text, rng.randrange(len(text) + 1))})
                elif r < 0.88:
                    p = position(text, rng.randrange(len(text) + 1))
                    asked.append(client.inline(uri, p["line"], p["character"]))
                else:
                    p = position(text, rng.randrange(len(text) + 1))
                    asked.append(client.request("ditto/nextEdit", {"textDocument": {"uri": uri}, "position": p}))
                if rng.random() < 0.3:
                    time.sleep(rng.choice([0.001, 0.01, 0.06, 0.2]))  # pauses: idle work starts 50 ms after an aim
            for rid in asked:
                answer = client.wait(rid, WAIT_S)
                assert "result" in answer or answer["error"]["code"] == CANCELLED, answer
            view = at_rest(client)
            for uri, text in model.items():
                assert client.call("ditto/debug/document", {"uri": uri})["result"]["text"] == text, uri
            assert sorted(view["documents"]) == sorted(model)
            for uri, held in view["documents"].items():
                assert held["text"] == model[uri] and held["buffer"] == model[uri], uri
                assert not held["pending"], uri  # a generation paused at its deadline, never finished
            assert view["idle"] == {"aim": None, "finish": None}
        finally:
            client.kill()
    server_log = log.read_text()
    assert "Traceback" not in server_log and "idle job failed" not in server_log, server_log[-3000:]


def at_rest(client: RawClient) -> dict:
    """The worker's view once the server has had nothing to do twice in a row (idle work done)."""
    deadline = time.monotonic() + WAIT_S
    quiet = 0
    while time.monotonic() < deadline:
        s = client.stats()
        view = client.call("ditto/debug/worker", {}, WAIT_S)["result"]
        if not s["worker_busy"] and not s["worker_idle_work"] and view["idle"] == {"aim": None, "finish": None}:
            quiet += 1
            if quiet == 2:
                return view
        else:
            quiet = 0
        time.sleep(0.2)
    return view  # (the checks say what was left)


@pytest.mark.parametrize("seed", SEEDS)
def test_loop_and_worker_share_nothing_under_a_slowed_worker(seed, tmp_path):
    print(f"thread stress seed {seed}")
    try:
        run_sequence(seed, tmp_path)
    except AssertionError as err:
        raise AssertionError(f"seed {seed} (DITTO_STRESS_SEQUENCES/DITTO_FUZZ_RANDOM): {err}") from err

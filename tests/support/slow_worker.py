"""`ditto-lsp serve` with its model worker slowed at random points: the injected delay hook of the
thread stress test (tests/lsp/test_thread_stress.py).

Run as `python tests/support/slow_worker.py serve ...` (the server's own arguments follow). Before the
server starts, `threading.settrace` installs a tracer in every thread started later; in the model
worker (the thread named `ditto-model`, lsp_server/lsp/scheduler.py) and only in code under
lsp_server/, each line about to run sleeps with probability DITTO_SLOW_P (default 0.03) for up to
DITTO_SLOW_MS milliseconds (default 4), from a generator seeded by DITTO_SLOW_SEED. A sleep releases
the GIL, so the event loop runs between any two statements of the worker's code: a write of shared
state that is not the worker's own shows up as a document the worker got wrong, an answer lost or an
idle job forgotten. Needs nothing of the server's API, so it slows any version of it alike.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = str(ROOT / "lsp_server") + os.sep
WORKER = "ditto-model"


def install(seed: int, p: float, max_ms: float) -> None:
    rng = random.Random(seed)  # drawn from on the worker thread only

    def on_line(frame, event, arg):
        if event == "line" and rng.random() < p:
            time.sleep(rng.random() * max_ms / 1000)
        return on_line

    def on_call(frame, event, arg):
        if threading.current_thread().name != WORKER or not frame.f_code.co_filename.startswith(CODE):
            return None  # not traced further: other threads, and torch's and the libraries' own code
        return on_line

    threading.settrace(on_call)


if __name__ == "__main__":
    install(int(os.environ.get("DITTO_SLOW_SEED", "0")), float(os.environ.get("DITTO_SLOW_P", "0.03")),
            float(os.environ.get("DITTO_SLOW_MS", "4")))
    sys.path.insert(0, str(ROOT))
    from lsp_server.cli import main

    sys.exit(main(sys.argv[1:]))

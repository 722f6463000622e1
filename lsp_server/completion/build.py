"""Building a completer: the one way the command line and the server go from a loaded model
to a Completer ready to serve (Engine, pass costs, open buffers, drafter).

`ditto-lsp complete` / `trace` / `bench` (lsp_server/commands/) and the language server
(lsp_server/lsp/lifecycle.py) both call `build_completer`; what differs between them is
passed in (the engine with the server's step hooks, whether pass costs are measured afresh
or read from the cache directory, which drafter to build at once).

`calibrate` measures the pass costs T(1..n) the speculation policy prices drafts with
(drafters/speculation.py), stored per model, backend, device, dtype and thread count.
Left out on purpose: loading (lsp_server/backends/loader.py), LSP.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

import torch

from lsp_server.backends.loader import load
from lsp_server.backends.packaged import cache_dir
from lsp_server.completion.completer import Completer, CompleterSettings
from lsp_server.decoding.engine import Engine


def build_completer(lm, settings: CompleterSettings | None = None, *, engine: Engine | None = None,
                    calibration: str | None = "stored", buffers: Iterable[tuple[str, str]] = (),
                    drafter: str | None = None) -> Completer:
    """A Completer for the loaded model `lm`.

    - `engine`: the engine to decode with (default: a new Engine; the server passes one whose
      model is wrapped in its step hooks, lsp_server/lsp/scheduler.py `StepHook`);
    - `calibration`: "fresh" measures the pass costs now (the server, at every load), "stored"
      reuses the ones the cache directory holds for this model and machine (a one-shot
      command), None measures nothing (drafting off or fixed draft lengths). Costs are
      measured on a plain engine, without the server's hooks;
    - `buffers`: (name, text) of the other open buffers, indexed for the drafters and the
      prompt's snippets;
    - `drafter`: a drafter to build now (a draft model loads once), so that the first
      completion's latency is its own. Raises ModelError or ValueError (a draft model whose
      tokenizer is not the target's) from there.
    """
    completer = Completer(lm, engine=engine, settings=settings, load_model=load)
    if calibration is not None and completer.engine is not None:
        completer.pass_costs = calibrate(Engine(lm), lm, fresh=calibration == "fresh")
        completer.engine.use_costs(completer.pass_costs)
    if completer.generator.constrains:
        completer.vocab_bytes()  # token healing's table (152k tokens: ~1 s), now rather than in the first request
    for name, text in buffers:
        completer.set_buffer(name, text)
    if drafter is not None:
        completer.drafter_for(drafter)  # after calibrate: the hybrid reuses the engine's pass costs
    return completer


def calibrate(engine: Engine, lm, fresh: bool = False, n_max: int = 9) -> dict[int, float]:
    """Measure the pass costs T(1..n_max) for adaptive draft lengths, or reuse stored ones.

    Results are kept in the cache directory per model, device and dtype, so a one-shot
    `ditto-lsp complete` does not pay a few seconds of measuring every time; the server
    measures afresh (`fresh=True`) when it loads a model and stores the result.
    """
    path = cache_dir() / "calibration.json"
    where = lm.describe()
    key = (f"{lm.spec}|{where['backend']}|{where['device']}|{where['dtype']}|cpus={os.cpu_count()}"
           f"|threads={torch.get_num_threads()}")
    stored: dict = {}
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = {}
    if not fresh and key in stored:
        costs = {int(n): float(ms) for n, ms in stored[key].items()}
        if len(costs) >= 2:
            engine.use_costs(costs)
            return costs
    costs = engine.calibrate(n_max=n_max)
    stored[key] = {str(n): round(ms, 3) for n, ms in costs.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stored, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next run a measurement
    return costs

"""Building a completer: the one way the command line and the server go from a loaded model
to a Completer ready to serve (Engine, pass costs, open buffers, drafter).

`ditto-lsp complete` / `trace` / `bench` (lsp_server/commands/) and the language server
(lsp_server/lsp/loading.py) both call `build_completer`; what differs between them is
passed in (the engine, with the server's debug hooks when it has them, whether pass costs are measured afresh
or read from the cache directory, which drafter to build at once).

`calibrate` measures the pass costs T(1..n) the speculation policy prices drafts with
(drafters/speculation.py), and `prompt_costs` what a prompt token and a generated token cost,
from which `fitting_budget` picks the prompt budget (the `context_tokens` setting at 0, its
default); both are stored per model, backend, device, dtype and thread count.
Left out on purpose: loading (lsp_server/backends/loader.py), LSP.
"""

from __future__ import annotations

import json
import os
import time
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

    - `engine`: the engine to decode with (default: a new Engine; a server started with
      `--debug-hooks` passes one with its pass hooks, lsp_server/lsp/debug.py);
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
    if completer.engine is not None and completer.settings.budget is None:
        costs = prompt_costs(lm, fresh=calibration == "fresh")
        completer.fit_budget(fitting_budget(costs["prefill_ms_per_token"], costs["decode_ms"]), costs)
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
    def read(v: dict):
        costs = {int(n): float(ms) for n, ms in v.items()}
        return costs if len(costs) >= 2 else None

    costs = _stored(lm, "", fresh, lambda: engine.calibrate(n_max=n_max), read, lambda c: {str(n): round(ms, 3)
                                                                                      for n, ms in c.items()})
    if not fresh:
        engine.use_costs(costs)
    return costs


def _stored(lm, kind: str, fresh: bool, measure, read, write=lambda v: v):
    """A measurement of this model on this machine, from calibration.json in the cache directory
    (unless `fresh`), else measured and stored there. `kind` names it ("" = the pass costs)."""
    path = cache_dir() / "calibration.json"
    where = lm.describe()
    key = (f"{lm.spec}|{where['backend']}|{where['device']}|{where['dtype']}|cpus={os.cpu_count()}"
           f"|threads={torch.get_num_threads()}" + (f"|{kind}" if kind else ""))
    stored: dict = {}
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = {}
    if not fresh and isinstance(stored.get(key), dict):
        try:
            value = read(stored[key])
        except (TypeError, ValueError):
            value = None
        if value is not None:
            return value
    value = measure()
    stored[key] = write(value)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stored, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next run a measurement
    return value


# The prompt budget that fits this machine (`context_tokens` 0, the default). A place not visited yet
# costs the part of its prompt that is not cached (the file's head is: about 45% of the budget is
# processed there, 111 of 256, 172 of 384 and 214 of 512 tokens at p50 in the replays of
# docs/perf/README.md) plus its first line (about 6 tokens). The budget is the largest step of
# BUDGET_STEPS whose place not visited yet is predicted to be answered within COLD_GOAL_MS, 85% of
# the 3 s goal of time to a suggestion there; never less than ContextBudget.DEFAULT_TOTAL. On one
# core of the development machine (12.5 ms a prompt token, 26 ms a generated one) that is 384; on a
# GPU, 2048. A bigger prompt is more often right: on pypa/packaging 10/39 first lines at 256, 14/39
# at 384, 16/39 at 512 (docs/perf/README.md, 2026-12-04, fifth stop).
BUDGET_STEPS = (256, 384, 512, 768, 1024, 1536, 2048)
COLD_GOAL_MS = 2550.0
COLD_SHARE = 0.45  # of the budget processed at a place not visited yet
FIRST_LINE_TOKENS = 6


def fitting_budget(prefill_ms_per_token: float, decode_ms: float) -> int:
    """The largest of BUDGET_STEPS whose predicted time at a place not visited yet is within COLD_GOAL_MS."""
    best = BUDGET_STEPS[0]
    for total in BUDGET_STEPS:
        if COLD_SHARE * total * prefill_ms_per_token + FIRST_LINE_TOKENS * decode_ms <= COLD_GOAL_MS:
            best = total
    return best


def measure_prompt_costs(lm, tokens: int = 64, reps: int = 2) -> dict[str, float]:
    """ms per prompt token (a prefill of `tokens`, best of `reps`) and ms per generated token (best of 4)."""
    ids = [(7 + 13 * i) % max(2, lm.vocab_size - 1) + 1 for i in range(tokens + 4)]
    prefill = decode = float("inf")
    for _ in range(reps):
        cache = lm.new_cache()
        try:
            t = time.perf_counter()
            float(lm.forward(ids[:tokens], cache, last=1).reshape(-1)[0])  # read back: a GPU has finished
            prefill = min(prefill, (time.perf_counter() - t) * 1000 / tokens)
            for i in range(2):
                t = time.perf_counter()
                float(lm.forward([ids[tokens + i]], cache, last=1).reshape(-1)[0])
                decode = min(decode, (time.perf_counter() - t) * 1000)
        finally:
            lm.release(cache)
    return {"prefill_ms_per_token": round(prefill, 3), "decode_ms": round(decode, 3)}


def prompt_costs(lm, fresh: bool = False) -> dict[str, float]:
    """`measure_prompt_costs`, stored beside the pass costs (calibration.json) like them: the server
    measures afresh at every load (fresh=True), a one-shot command reuses what was stored."""
    return _stored(lm, "prompt", fresh, lambda: measure_prompt_costs(lm),
                   lambda v: {k: float(x) for k, x in v.items()} if {"prefill_ms_per_token", "decode_ms"} <= set(v)
                   else None)

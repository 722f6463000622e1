"""Building a completer: the one way the command line and the server go from a loaded model
to a Completer ready to serve (Engine, pass costs, open buffers, drafter).

`ditto-lsp complete` / `trace` / `bench` (lsp_server/commands/) and the language server
(lsp_server/lsp/loading.py) both call `build_completer`; what differs between them is
passed in (the engine, with the server's debug hooks when it has them, whether pass costs are measured afresh
or read from the cache directory, which drafter to build at once).

`calibrate` measures the pass costs T(1..n) the speculation policy prices drafts with
(lsp_server/decoding/speculation.py), and `prompt_costs` what a prompt token and a generated token cost,
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
from lsp_server.completion.completer import Completer
from lsp_server.completion.settings import CompleterSettings
from lsp_server.completion.fitting import (  # noqa: F401  (re-exported: the budget's rule lives there)
    BUDGET_GRAIN, BUDGET_MAX, BUDGET_MIN, COLD_GOAL_MS, COLD_SHARE, FIRST_LINE_TOKENS, fitting_budget)
from lsp_server.decoding.engine import Engine


def build_completer(lm, settings: CompleterSettings | None = None, *, engine: Engine | None = None,
                    calibration: str | None = "stored", buffers: Iterable[tuple[str, str]] = (),
                    drafter: str | None = None) -> Completer:
    """A Completer for the loaded model `lm`.

    - `engine`: the engine to decode with (default: a new Engine; a server started with
      `--debug-hooks` passes one with its pass hooks, lsp_server/lsp/worker/debug.py);
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
        completer.fit.fit(costs)
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

    costs = read(_stored(lm, "", fresh, lambda: engine.calibrate(n_max=n_max), read,
                         lambda c, old: {str(n): round(ms, 3) for n, ms in c.items()}))
    if not fresh:
        engine.use_costs(costs)
    return costs


def _stored(lm, kind: str, fresh: bool, measure, read, write=lambda v, old: v):
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
    value = write(measure(), stored.get(key))  # what is stored (`write` may merge it with the old entry)
    stored[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stored, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next run a measurement
    return value


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


PROMPT_COSTS_KEPT = 8  # the server's measurements at load kept per model and machine; the budget fits the best


def prompt_costs(lm, fresh: bool = False) -> dict[str, float]:
    """`measure_prompt_costs`, stored beside the pass costs (calibration.json) like them: the server
    measures afresh at every load (fresh=True), a one-shot command reuses what was stored. What is
    stored and returned is the best (lowest) of the last PROMPT_COSTS_KEPT measurements, so that one
    load on a busy machine does not keep the budget small (lsp_server/completion/fitting.py)."""
    keys = ("prefill_ms_per_token", "decode_ms")

    def best_of(value: dict, old) -> dict:
        recent = [r for r in ((old or {}).get("recent") or []) if isinstance(r, dict) and set(keys) <= set(r)]
        recent = [*recent[-(PROMPT_COSTS_KEPT - 1):], value]
        return {**{k: min(float(r[k]) for r in recent) for k in keys}, "recent": recent}

    costs = _stored(lm, "prompt", fresh, lambda: measure_prompt_costs(lm),
                    lambda v: {k: float(v[k]) for k in keys} if set(keys) <= set(v) else None, best_of)
    return {k: float(costs[k]) for k in keys}

"""The systems a benchmark compares, each run on the same prompt and token budget.

Completion mode (one request per task):

- ``off``: Ditto's engine with drafting off (the reference for identical output and speedup);
- ``ngram``: Ditto with the n-gram drafter over the prompt and the open buffers;
- ``model`` / ``hybrid``: Ditto with the draft-model drafter (``--draft-model``) / the
  hybrid of n-gram lookup and the draft model (drafters/model_drafter.py); the draft
  model's own prefill of the prompt counts in their decode time;
- ``ngram-v1``: today's lookup before issue 42 (drafters/ngram.py: one chain from the longest
  n-gram, n >= 2), over the same sources, priced by the same policy; ``ngram`` is the default
  drafter (drafters/suffix.py: weighted suffix matches as a tree);
- ``ngram-kN`` / ``ngram-v1-kN``: the drafter with every draft verified at a fixed length N (no
  adaptive choice; a tree whole, at most N deep), to compare the adaptive length with a fixed one;
- ``oracle``: Ditto with a drafter that proposes the model's own greedy continuation (what
  ``off`` produced), so every draft is accepted: the ceiling of speculation on this hardware;
- ``hf-greedy``: transformers ``generate`` greedy, a fresh cache per call, as a library user
  would call it;
- ``hf-prompt-lookup``: transformers ``generate(prompt_lookup_num_tokens=N)``, its defaults
  otherwise.

The Ditto systems of one task share one cache key, so the prompt is prefilled once (by
``off``, which runs first) and the others reuse it; prefill and decode are measured
apart and the comparable end-to-end latency of a Ditto system is the task's prefill time
plus its own decode time. The transformers systems get the token budget ``off`` used
(so they do the same work, ``off``'s stop rule included) and are timed end to end, with
the time to their first new token as their prefill.

Keystroke mode: one request per typed character through the same Completer path the
server uses, with the document's cache key (KV reuse); a ``-noreuse`` suffix runs the
same system without a cache key. Session mode (session.py) takes the same systems, and
the editor-replay systems of replay.py: ``ditto``, ``ditto-nodraft``, ``ditto-whole`` (the
whole_file setting on; each optionally ``@N``, a context budget of N tokens, and ``#KEY=VALUE``, any
initialization option) and ``llama-server``, real servers in their own processes (`replay_system`
and `name_options` parse their names).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Sequence

from drafters.base import NoOwnSources, Proposal

DITTO = ("off", "ngram", "model", "hybrid", "oracle", "ngram-v1")
HF = ("hf-greedy", "hf-prompt-lookup")
COMPLETION_SYSTEMS = DITTO + HF
KEYSTROKE_BASE = ("off", "ngram", "ngram-v1")
REPLAY_PEER = "llama-server"  # llama.cpp's own server, driven as llama.vim drives it (replay.py)


def replay_system(name: str) -> tuple[str, int | None] | None:
    """(base, context tokens) of an editor-replay system name, else None:
    ``ditto``, ``ditto-nodraft``, ``ditto-whole`` (the whole_file setting on), any with ``@N`` (contextTokens N), ``~SOURCE`` (the snippets
    setting: heads, similar or none; `replay_snippets`), ``+MODEL`` (another model spec than the
    bench's --model, e.g. ``ditto@512~similar+qwen2.5-coder-1.5b``) and last any number of ``#KEY=VALUE``
    (one initialization option each, `name_options`: ``ditto#show=sure``), ``ditto-base`` (the server of
    another checkout, `--baseline DIR`, at its own defaults but for its `#KEY=VALUE`s, which that checkout's
    settings check: ``ditto-base#context_tokens=384`` pins the prompt budget that each server otherwise fits
    to the machine's speed at load, so two checkouts' prompts can be compared token for token) and
    ``llama-server``."""
    options = name_options(name)
    name = name.split("#", 1)[0]
    if options is None or (options and name == REPLAY_PEER):
        return None
    m = _REPLAY.fullmatch(name)
    if m is not None and ("+" in name or m.group(3)) and m.group(1) in (REPLAY_PEER, "ditto-base"):
        return None
    if m is None or (m.group(1) in (REPLAY_PEER, "ditto-base") and m.group(2)) or (m.group(2) and int(m.group(2)) < 64):
        return None
    return m.group(1), int(m.group(2)) if m.group(2) else None


def is_base(system: str) -> bool:
    """Whether a replay system runs the `--baseline` checkout's server (``ditto-base``, with or without `#KEY=VALUE`s)."""
    return system.split("#", 1)[0] == "ditto-base"


_REPLAY = re.compile(r"(ditto|ditto-nodraft|ditto-whole|ditto-base|llama-server)(?:@(\d+))?(?:~(heads|similar|none))?(?:\+[\w.:/-]+)?")


def replay_snippets(name: str) -> str | None:
    """The snippets setting a replay system's ``~SOURCE`` names, or None (the server's default)."""
    m = _REPLAY.fullmatch(name.split("#", 1)[0])
    return m.group(3) if m is not None else None


_OPTION = re.compile(r"([A-Za-z_][\w.]*)=([^#,]*)")


def name_options(name: str) -> dict | None:
    """The initialization options a replay system's ``#KEY=VALUE`` suffixes set, in order (VALUE as
    JSON where it parses, `true`, `512`, `"x"`, else the string itself: ``#show=sure``); {} where
    there are none, None where one is not KEY=VALUE. A value holds no `#` and no comma (--systems
    is split at commas)."""
    out: dict = {}
    for part in name.split("#")[1:]:
        m = _OPTION.fullmatch(part)
        if m is None:
            return None
        try:
            out[m.group(1)] = json.loads(m.group(2))
        except ValueError:
            out[m.group(1)] = m.group(2)
    return out


def parse_systems(spec: str, mode: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError("--systems is empty")
    if mode in ("keystroke", "session"):
        for n in names:
            if mode == "session" and replay_system(n) is not None:
                continue
            if mode == "session" and n == "oracle":
                if "off" not in names[: names.index(n)]:
                    raise ValueError("session-mode oracle needs off before it (--systems off,...,oracle): "
                                     "it drafts off's tokens of the same request")
                continue
            if n.removesuffix("-noreuse") not in KEYSTROKE_BASE:
                raise ValueError(f"unknown {mode}-mode system {n!r}: use off, ngram, each optionally with -noreuse"
                                 + ("; or ditto, ditto-nodraft, ditto-whole (optionally @N: a context budget of N tokens, "
                                    "~SOURCE, +MODEL, then #KEY=VALUE: an initialization option), "
                                    "ditto-base (with --baseline DIR; #KEY=VALUE too), llama-server (real servers, replay.py)"
                                    if mode == "session" else ""))
        return list(dict.fromkeys(names))
    for n in names:
        if n not in COMPLETION_SYSTEMS and fixed_k(n) is None:
            raise ValueError(f"unknown system {n!r}: use {', '.join(COMPLETION_SYSTEMS)}, or ngram-kN "
                             "(n-gram drafts of a fixed length N, no adaptive choice)")
    # off is the reference (identical output, speedup, oracle's target, hf budgets): always first.
    return ["off", *[n for n in dict.fromkeys(names) if n != "off"]]


def fixed_k(system: str) -> int | None:
    """N for a system named ngram-kN or ngram-v1-kN (a fixed draft length), else None."""
    for head in ("ngram-k", "ngram-v1-k"):
        if system.startswith(head) and system[len(head):].isdigit() and int(system[len(head):]) > 0:
            return int(system[len(head):])
    return None


class V1Drafter(NoOwnSources):
    """Today's lookup before issue 42 over the default drafter's sources (drafters/suffix.py `lookup`)."""

    name = "ngram-v1"

    def __init__(self, suffix):
        self.suffix = suffix

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        return self.suffix.lookup(context, k)


class Timed:
    """A drafter whose proposals are timed: the drafting time per pass of a run (the projection
    on a GPU's pass costs adds it, ditto_bench/projection.py)."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.name = drafter.name
        self.ms = 0.0
        self.calls = 0

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        t = time.perf_counter()
        try:
            return self.drafter.propose(context, k)
        finally:
            self.ms += (time.perf_counter() - t) * 1000
            self.calls += 1

    def update_source(self, name, tokens) -> None:
        self.drafter.update_source(name, tokens)

    def forget_source(self, name) -> None:
        self.drafter.forget_source(name)

    def set_options(self, options) -> None:
        self.drafter.set_options(options)


def bench_drafter(completer, system: str, store: dict):
    """The drafter a drafting system runs (timed): `ngram` the Completer's own, as the server's;
    every other n-gram system (fixed lengths, -noreuse, a second run) one of its own over the same
    sources, so that no system sees what another generated (the default drafter remembers
    generations, drafters/suffix.py); `ngram-v1*` today's lookup."""
    base = system.removesuffix("-noreuse")
    if system not in store:
        if base.startswith("ngram-v1"):
            store[system] = V1Drafter(completer.ngram)
        elif system == "ngram":
            store[system] = completer.drafter_for("ngram")
        elif base.startswith("ngram"):
            store[system] = completer.ngram.sharing()
        else:
            store[system] = completer.drafter_for(base)
    return Timed(store[system])


class OracleDrafter(NoOwnSources):
    """Proposes the reference continuation while the context still follows it."""

    name = "oracle"

    def __init__(self, prompt_len: int, target: Sequence[int], prompt: Sequence[int] | None = None):
        self.prompt_len = prompt_len
        self.target = list(target)
        self.prompt = None if prompt is None else list(prompt)  # given: propose only after this very prompt

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        done = list(context[self.prompt_len :])
        if k <= 0 or done != self.target[: len(done)] or (
                self.prompt is not None and list(context[: self.prompt_len]) != self.prompt):
            return Proposal([], source="oracle", match_len=0)
        # Paid: the ceiling verifies every draft it has (no adaptive trimming).
        return Proposal(self.target[len(done) : len(done) + k], source="oracle", match_len=len(done), paid=True)


def generated_ids(completion) -> list[int]:
    """Every token the loop produced, the final stop token included (rebuilt from the rounds)."""
    out: list[int] = []
    for r in completion.rounds:
        out.extend(r.proposed[: r.accepted])
        out.append(r.token)
    return out


@dataclass
class Run:
    """One system on one request; the raw numbers metrics.py aggregates."""

    text: str
    tokens: list[int]
    generated: int
    latency_ms: float
    prefill_ms: float
    decode_ms: float
    prefill_tokens: int
    reused_tokens: int
    prompt_tokens: int
    target_passes: int
    drafted: int | None
    accepted: int | None
    drafted_at: list[int]
    accepted_at: list[int]
    stop_reason: str
    steps: dict | None = None  # target passes by draft source: {"ngram": n, "model": n, "plain": n}
    # per target pass: [match_len, offered, verified, accepted, ms, tree nodes (0: a chain)] (Ditto systems)
    rounds: list | None = None
    tie_replays: int = 0  # verify rounds undone at a near-tie (lsp_server/decoding/engine.py; docs/backends.md)
    draft_ms: float | None = None  # time spent in the drafter's proposals (n-gram systems)

    def as_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        for k in ("latency_ms", "prefill_ms", "decode_ms"):
            d[k] = round(d[k], 2)
        return d


def run_ditto(completer, task, system: str, options, cache_key: str | None, reference=None,
              text=None, line=None, col=None, drafters: dict | None = None, name: str | None = None) -> tuple[Run, object]:
    """Run a Ditto system; returns (Run, Suggestion). `reference` is off's Suggestion (oracle needs it).
    `drafters` keeps the drafting systems' drafters (`bench_drafter`) under their names (`name`,
    default `system`)."""
    text = task.document if text is None else text
    line = task.line if line is None else line
    col = task.col if col is None else col
    base = system.removesuffix("-noreuse")
    if base in ("off", "oracle"):
        # The reference and the ceiling neither ask nor teach the speculation policy (its
        # pass costs and acceptance estimates): only the systems under test do.
        from dataclasses import replace

        options = replace(options, adaptive=False)
    if base == "oracle":
        if reference is None:
            raise ValueError("oracle needs off's completion of the same task")
        prompt_len = len(reference.prompt.ids)
        drafter = OracleDrafter(prompt_len, generated_ids(reference.completion), reference.prompt.ids)
        sug = _complete_with(completer, drafter, task, text, line, col, options, cache_key)
    elif base.startswith("ngram"):
        k = fixed_k(base)
        if k is not None:
            from dataclasses import replace

            options = replace(options, draft_max=k, adaptive=False)
        timed = bench_drafter(completer, name or system, {} if drafters is None else drafters)
        sug = _complete_with(completer, timed, task, text, line, col, options, cache_key, "ngram")
    else:
        if base in ("model", "hybrid"):
            # Each run pays its draft model's own prefill of the prompt (no head start from a previous system).
            completer.drafter_for(base).reset()
        sug = completer.complete(text, line, col, name=task.path, options=options,
                                 drafter="none" if base == "off" else base, cache_key=cache_key,
                                 others=list(task.buffers))
    s = sug.completion.stats
    run = Run(sug.text, list(sug.completion.tokens), s.generated, sug.latency_ms, s.prefill_ms, s.decode_ms,
              s.prefill_tokens, s.reused_tokens, len(sug.prompt.ids), s.target_passes,
              s.drafted, s.accepted, list(s.drafted_at), list(s.accepted_at), s.stop_reason,
              steps_by_source(sug.completion.rounds),
              [[r.match_len, r.offered, len(r.proposed), r.accepted, r.ms, r.nodes] for r in sug.completion.rounds],
              s.tie_replays)
    if base.startswith("ngram"):
        run.draft_ms = round(timed.ms, 3)
    return run, sug


def steps_by_source(rounds) -> dict:
    """Target passes by what drafted them: "model", "ngram" (any lookup source), "oracle", "plain" (no draft)."""
    out = {"ngram": 0, "model": 0, "oracle": 0, "plain": 0}
    for r in rounds:
        kind = "plain" if not r.proposed else r.source if r.source in ("model", "oracle") else "ngram"
        out[kind] += 1
    return out


def _complete_with(completer, drafter, task, text, line, col, options, cache_key, name: str = "oracle"):
    """Completer.complete with a drafter object that is not one of the Completer's names (`name`:
    the one the Completer records, which decides whether the open buffers are indexed)."""
    original = completer.drafter_for
    completer.drafter_for = lambda name, draft_model=None: drafter
    try:
        sug = completer.complete(text, line, col, name=task.path, options=options, drafter=name,
                                 cache_key=cache_key, others=list(task.buffers))
    finally:
        completer.drafter_for = original
    return sug


def run_hf(lm, prompt_ids: list[int], system: str, max_new_tokens: int, lookup_tokens: int = 10) -> tuple[list[int], Run]:
    """transformers generate on the same prompt ids; returns (new ids incl. a stop token, Run).

    Only on the torch backend (lsp_server/backends/torch/model.py hf_generate)."""
    from ditto_bench.hf import FirstTokenClock, hf_generate
    from lsp_server.backends.torch.model import TorchModel

    if not isinstance(lm, TorchModel):
        raise ValueError(f"{system} runs transformers' generate: it needs the torch backend")
    clock = FirstTokenClock()
    t0 = time.perf_counter()
    new, passes = hf_generate(lm, prompt_ids, max_new_tokens,
                              lookup_tokens if system == "hf-prompt-lookup" else None, streamer=clock)
    wall = (time.perf_counter() - t0) * 1000
    tokens = []
    for t in new:
        if t in lm.stop_ids:
            break
        tokens.append(t)
    first = ((clock.first or time.perf_counter()) - t0) * 1000
    run = Run("", tokens, len(new), wall, first, wall - first, len(prompt_ids), 0, len(prompt_ids), passes,
              None, None, [], [], "eos" if len(tokens) < len(new) else "length")
    return new, run

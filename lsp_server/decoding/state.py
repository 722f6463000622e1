"""The decode loop's state (lsp_server/decoding/engine.py): what one loop keeps between passes (`Loop`,
so a paused generation resumes exactly where it stopped), what one call into the engine is for
(`Call`), a document's cache (`KV`), and the `Completion` a loop gives so far.

Plain dataclasses; the engine alone changes them. Left out on purpose: passes and rules (engine.py,
accept.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from drafters.base import Drafter
from lsp_server.decoding.speculation import Speculation
from lsp_server.decoding.healing import Healing
from lsp_server.decoding.types import Completion, DecodeOptions, RequestContext, Round, Stats, StopRule


@dataclass
class Loop:
    """A decode loop's state between passes: what `resume` needs to go on exactly where it paused."""

    seq: list[int]  # prompt + generated tokens; the cache holds all but the last
    out: list[int]  # generated tokens
    stats: Stats
    rounds: list[Round]
    opts: DecodeOptions
    drafter: Drafter | None
    stop: StopRule | None
    gen: torch.Generator | None  # the sampling generator: its stream goes on where it stopped
    on_round: Callable | None
    spec: Speculation | None
    scorer: object | None
    constraint: Healing | None
    rest: bytes | None  # healed bytes still to write
    start: int  # the cache held seq[:start] when decoding began (a near-tie replays from there)
    sure: list[tuple[float, float]] = field(default_factory=list)  # per generated token: (probability, lead)
    plain_until: int = 0
    decoded_s: float = 0.0  # decoding time spent so far (the time budget counts it, not pauses)


@dataclass
class Call:
    """One call into the engine (generate, resume, warm): what its passes are for."""

    stats: Stats
    cancel: threading.Event | None
    ctx: RequestContext | None


@dataclass
class KV:
    ids: list[int]  # the tokens the cache holds, in order
    cache: object
    loop: Loop | None = None  # a generation paused on this cache, resumable until the cache is taken


def completion(loop: Loop) -> Completion:
    """The completion so far: its tokens (the stop rules may have cut the last pass's), their statistics
    and rounds, and how sure the model was of each token."""
    out = loop.out
    sure = loop.sure[: len(out)]  # `out` is a prefix of the tokens the passes appended, in order
    return Completion(list(out), loop.stats, loop.rounds, [p for p, _ in sure], [m for _, m in sure])


"""The plain types of decoding: options in, statistics, rounds and completions out.

A leaf module (no torch, no other Ditto module), so that backends, the completer, the
server and the benchmark can all name these types without importing the engine
(lsp_server/decoding/engine.py) or each other.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

StopRule = Callable[[list[int]], "int | None"]  # generated ids -> length to keep, or None to go on


@dataclass
class DecodeOptions:
    max_new_tokens: int = 64  # token budget of one completion
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0  # nucleus sampling; 1 keeps every token
    top_k: int = 0  # 0 keeps every token
    draft_max: int = 8  # k_max, the longest draft verified in one pass; 0 turns drafting off
    seed: int | None = None  # sampling seed; None draws one
    # Stop decoding after this long, counted from the end of prefill. Prefill itself always
    # finishes unless cancelled (its work stays in the cache either way): on a CPU a first
    # request on a large file spends more than any budget in prefill, and answering nothing
    # after that work is the worst outcome (docs/design.md, "Prompt layout and windows").
    time_budget_s: float | None = None
    prefill_chunk: int = 512  # tokens per prefill pass; cancellation is checked between chunks
    adaptive: bool = True  # choose each draft's length from measured pass costs (needs Engine.calibrate)
    # Answer as soon as the suggestion's first line is complete, or this long into decoding, and
    # finish the rest later (lsp_server/completion/place.py `Place`); None: answer at the end.
    first_answer_s: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Round:
    """One propose-and-verify step: what was proposed, what survived, what was added."""

    proposed: list[int]
    source: str
    match_len: int
    accepted: int
    token: int  # the target's own token appended after the accepted drafts
    kind: str  # "bonus" (all drafts accepted), "correction" (a draft rejected), "plain" (no draft)
    ms: float
    offered: int = 0  # draft tokens the drafter offered before the engine chose how many to verify
    healed: int = 0  # n-gram lookup: context tokens matched by text, not id (Proposal.healed)
    nodes: int = 0  # a tree pass: the draft tokens it verified (`proposed` is the path it kept); 0: a chain


@dataclass
class Stats:
    tokens: int = 0  # tokens in the returned completion
    generated: int = 0  # tokens the loop produced (before stop-rule truncation)
    target_passes: int = 0  # verify/decode forward passes (prefill not counted)
    drafted: int = 0
    accepted: int = 0
    prefill_tokens: int = 0  # prompt tokens run through the model for this request
    reused_tokens: int = 0  # prompt tokens whose KV came from the cache
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    wall_ms: float = 0.0
    stop_reason: str = ""
    tie_replays: int = 0  # verify passes undone at a near-tie and decoded again one token per pass
    tie_passes: int = 0  # passes those cost (the undone pass and the replay), not in target_passes
    # Model passes begun after `cancel` was set. One can race the engine's check of the flag; more than
    # one for a request means the flag is not checked (the server's `ditto/stats` reports the most).
    stale_passes: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position: proposals
    accepted_at: list[int] = field(default_factory=list)  # per draft position: acceptances

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.generated / self.target_passes if self.target_passes else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["acceptance_rate"] = round(self.acceptance_rate, 4)
        d["tokens_per_pass"] = round(self.tokens_per_pass, 4)
        return d


@dataclass
class Completion:
    tokens: list[int]
    stats: Stats
    rounds: list[Round]
    # Per token of `tokens`: the model's probability of it, and its lead over the runner-up (the top
    # probability less the second). Read from the rows that decided the tokens, never used to decide
    # them: what lsp_server/completion/show.py cuts a suggestion by. Empty where the model runs
    # elsewhere (a remote engine).
    probs: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RequestContext:
    """Who a piece of model work is for: passed down from the server's request or idle job, through
    the Completer and the engine, to the engine's pass hooks (lsp_server/lsp/worker/debug.py), never kept
    on a shared object."""

    key: str | None = None  # the document (the server's URI)
    idle: bool = False  # idle work (prefill, a suggestion made ahead), not a request
    cancel: threading.Event | None = None  # set when the work is no longer wanted


class PassHooks(Protocol):
    """Called by the engine around every model pass (lsp_server/decoding/engine.py `Engine(hooks=)`)."""

    def before_pass(self, ctx: RequestContext | None, rows: int) -> None: ...

    def after_pass(self, ctx: RequestContext | None, rows: int) -> None: ...


class Cancelled(Exception):
    """Raised inside the loop when the stop flag is set; generate() turns it into a result."""


@dataclass
class Generated:
    """What a generation step returns (lsp_server/completion/completer.py, `Generator`)."""

    text: str  # everything generated (before the ghost-text stop rules cut it)
    completion: Completion  # statistics (and, from the local engine, tokens and rounds)
    notice: str | None = None  # one line for the user, set once per problem

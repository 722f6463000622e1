"""The server's counters (`Counters`, kept by the completion service, lsp_server/lsp/suggest.py) and the
`ditto/stats` answer built from the server's parts (`report`).

On the event loop (lsp_server/lsp/threads.py): the counters are written there only; what the worker
counts reaches them through `Counters.add`, posted to the loop, and what `ditto/stats` says of the
model, the index and the caches is the report the worker last published (worker/state.py `report`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from lsp_server.numbers import percentile


@dataclass
class Counters:
    requests: int = 0  # inline + completion requests received
    completed: int = 0  # answered with the model's result (empty or not)
    empty: int = 0  # of which the suggestion was empty (answered None)
    cancelled: int = 0  # $/cancelRequest
    superseded: int = 0  # replaced by a newer request for the same document
    dropped_stale: int = 0  # the document changed while computing
    not_ready: int = 0  # no model: its load failed, or took longer than load_wait_s (answered None)
    invalid: int = 0  # unknown document or position outside it (answered None)
    errors: int = 0  # the engine raised
    stale_passes: int = 0  # model passes begun for a request already cancelled or superseded
    stale_passes_max: int = 0  # the most such passes for one request
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    target_passes: int = 0
    typethrough: int = 0  # answered with the rest of the suggestion on screen, without the model
    idle_prefills: int = 0  # idle prefills that ran (the worker had nothing else to do)
    idle_prefill_tokens: int = 0  # prompt tokens they prefilled
    idle_prefills_stopped: int = 0  # of which stopped early by a request or a newer aim (their chunks stay cached)
    idle_hits: int = 0  # requests whose prompt was at least 90% in the cache right after an idle prefill
    idle_continuations: int = 0  # suggestions answered at their deadline and finished while idle
    idle_ahead: int = 0  # suggestions generated while idle where the user is, before a request (Completer.ahead)
    served_ahead: int = 0  # requests answered from such a suggestion
    file_fills: int = 0  # idle runs that filled a file's prefix KV (lsp_server/completion/wholefile.py)
    file_fill_tokens: int = 0  # tokens they prefilled
    whole_file: int = 0  # requests answered by the model with the whole file above the place
    paused: int = 0  # requests answered at the deadline (first complete line), the rest generated later
    served_by_continuation: int = 0  # requests answered with text generated after an earlier answer's deadline
    resumed: int = 0  # of which the request resumed the paused generation itself (it was not finished yet)
    prompted: int = 0  # requests the model answered from a prompt of their own (not typed through)
    with_definitions: int = 0  # of which the prompt held definitions (lsp_server/completion/extras.py)
    with_edits: int = 0  # of which it held recent edits
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=1000))

    def add(self, increments: dict) -> None:
        """The worker's counts (worker/state.py `Worker.count`); `stale_passes` as `stale`."""
        for name, n in increments.items():
            if name == "stale_passes":
                self.stale(n)
            else:
                setattr(self, name, getattr(self, name) + n)

    def stale(self, passes: int) -> None:
        """A request's passes begun after it was cancelled or superseded (the engine counts them). One
        can race the engine's check of the flag; more than one per request means it is not checked."""
        self.stale_passes += passes
        self.stale_passes_max = max(self.stale_passes_max, passes)


def report(service, worker: dict, *, open_documents: int, protocol_futures: int) -> dict:
    """`ditto/stats`: counters, latency percentiles, the model, the speculation policy, the worker.
    `service` is the completion service (suggest.py), `worker` the report the worker last published;
    the other two are the protocol's counts."""
    c, loader, scheduler = service.counters, service.loader, service.scheduler
    settings = service.settings
    ready = loader.state == "ready"
    return {
        "requests": c.requests,
        "completed": c.completed,
        "empty": c.empty,
        "cancelled": c.cancelled,
        "superseded": c.superseded,
        "dropped_stale": c.dropped_stale,
        "not_ready": c.not_ready,
        "waited": loader.waited,
        "waiting": loader.waiting,
        "invalid": c.invalid,
        "errors": c.errors,
        "stale_passes": c.stale_passes,
        "stale_passes_max": c.stale_passes_max,
        "latency_ms": {"p50": percentile(c.latencies_ms, 50, 1), "p95": percentile(c.latencies_ms, 95, 1),
                       "count": len(c.latencies_ms)},
        "acceptance_rate": round(c.accepted / c.drafted, 4) if c.drafted else None,
        "tokens_per_target_pass": round(c.generated / c.target_passes, 4) if c.target_passes else None,
        "drafted": c.drafted,
        "accepted": c.accepted,
        "typethrough": c.typethrough,
        "idle_prefill": {"runs": c.idle_prefills, "tokens": c.idle_prefill_tokens,
                         "stopped": c.idle_prefills_stopped, "hits": c.idle_hits,
                         "ahead": c.idle_ahead, "served_ahead": c.served_ahead},
        "whole_file": {"requests": c.whole_file, "fills": c.file_fills, "fill_tokens": c.file_fill_tokens},
        "deadline": {"answered_at_deadline": c.paused, "finished_while_idle": c.idle_continuations,
                     "served_by_continuation": c.served_by_continuation, "resumed_by_request": c.resumed},
        "model": loader.info.get("model") if ready else settings.model,
        "device": loader.info.get("device") if ready else None,
        "dtype": loader.info.get("dtype") if ready else None,
        "backend": loader.info.get("backend") if ready else None,
        "model_state": loader.state,
        # The prompt budget in use, and the costs it was fitted to when the setting leaves it to the machine.
        **worker["budget"],
        "model_error": loader.error,
        "speculation": worker["speculation"],
        # A remote engine's counts; with {"remoteIntervals": true}, each request's (start, first piece,
        # end, outcome) in wall-clock seconds (ditto_bench/storm.py measures the engine's concurrency).
        "remote": worker["remote"],
        "worker_busy": scheduler.busy,
        "worker_idle_work": scheduler.idle_busy,
        "worker_pending": scheduler.pending,
        "worker_pending_max": scheduler.max_pending,
        "open_documents": open_documents,
        # The drafter's index of the open buffers (completion/buffers.py) and the engine's KV caches
        # (one per document; a closed document's goes at once).
        "index": worker["index"],
        "protocol_futures": protocol_futures,  # requests under way (protocol.py)
        "kv_cache": worker["kv_cache"],
        # What the prompts held beside the document (docs/design.md, "Definitions and recent edits in the prompt"):
        # the resolver's jobs (lsp_server/lsp/definitions.py) and the share of prompts with each section.
        "definitions": {**service.definitions.report(), "prompts": c.prompted, "prompts_with": c.with_definitions,
                        "share": round(c.with_definitions / c.prompted, 4) if c.prompted else None},
        "recent_edits": {"enabled": settings.recent_edits, "prompts": c.prompted, "prompts_with": c.with_edits,
                         "share": round(c.with_edits / c.prompted, 4) if c.prompted else None},
    }

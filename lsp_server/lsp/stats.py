"""The server's counters and the `ditto/stats` answer (a mixin of DittoServer, lsp_server/lsp/server.py)."""

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
    waited: int = 0  # arrived while the model loaded, and waited for it
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
    paused: int = 0  # requests answered at the deadline (first complete line), the rest generated later
    served_by_continuation: int = 0  # requests answered with text generated after an earlier answer's deadline
    resumed: int = 0  # of which the request resumed the paused generation itself (it was not finished yet)
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=1000))



class StatsMixin:
    """`ditto/stats`: counters, latency percentiles, the model, the speculation policy, the worker."""

    def stats(self, intervals: bool = False) -> dict:
        c = self.counters
        return {
            "requests": c.requests,
            "completed": c.completed,
            "empty": c.empty,
            "cancelled": c.cancelled,
            "superseded": c.superseded,
            "dropped_stale": c.dropped_stale,
            "not_ready": c.not_ready,
            "waited": c.waited,
            "waiting": sum(not f.done() for f in self._waiting.values()),
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
            "deadline": {"answered_at_deadline": c.paused, "finished_while_idle": c.idle_continuations,
                         "served_by_continuation": c.served_by_continuation, "resumed_by_request": c.resumed},
            "model": self.model_info.get("model") if self.model_state == "ready" else self.settings.model,
            "device": self.model_info.get("device") if self.model_state == "ready" else None,
            "dtype": self.model_info.get("dtype") if self.model_state == "ready" else None,
            "backend": self.model_info.get("backend") if self.model_state == "ready" else None,
            "model_state": self.model_state,
            # The prompt budget in use, and the costs it was fitted to when the setting leaves it to the machine.
            **(self.completer.budget_report() if self.completer is not None
               else {"context_tokens": None, "context_fitted_to": None}),
            "model_error": self.model_error,
            "speculation": (self.completer.engine.speculation.snapshot()
                            if self.completer is not None and self.completer.engine is not None
                            and self.completer.engine.speculation else None),
            # A remote engine's counts; with {"remoteIntervals": true}, each request's (start, first piece,
            # end, outcome) in wall-clock seconds (ditto_bench/storm.py measures the engine's concurrency).
            "remote": self.completer.generator.stats(intervals) if self.completer is not None else None,
            "worker_busy": self.scheduler.busy,
            "worker_idle_work": self.scheduler.idle_busy,
            "worker_pending": self.scheduler.pending,
            "worker_pending_max": self.scheduler.max_pending,
            "open_documents": len(self.workspace.text_documents) if self.protocol._workspace else 0,
            # The drafter's index of the open buffers (completion/buffers.py) and the engine's KV caches
            # (one per document; a closed document's goes at once).
            "index": self.index_stats(),
            "protocol_futures": len(self.protocol._request_futures),  # requests under way (protocol.py)
            "kv_cache": ({"keys": len(self.completer.engine.cached_keys()),
                          "tokens": self.completer.engine.cached_tokens()}
                         if self.completer is not None and self.completer.engine is not None else None),
        }
